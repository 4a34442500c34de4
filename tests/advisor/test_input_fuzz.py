"""Malformed traces and spec files through the command line (`workload describe`, `simulate -w`):
every one ends with exit status 2 and one message naming the file and the line or field, never a
traceback, changes no file, and is refused before any large allocation (tracemalloc's peak stays
under `PEAK_LIMIT_BYTES` although the inputs ask for billions of tokens or 10^12 requests)."""

from __future__ import annotations

import json
import os
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from costline.cli import app

REPO = Path(__file__).resolve().parents[2]
PEAK_LIMIT_BYTES = 64 << 20
runner = CliRunner()
FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CASES: set[tuple[str, ...]] = set()  # distinct (command, file, content) refused, counted at the end
MIN_DISTINCT_CASES = 100
COMMANDS = st.sampled_from([("workload", "describe"), ("simulate", "-w")])


# What a refused command could touch: the packages (their shipped profiles, traces and caches) and
# the repository's top level (where a default output path would land). Benchmarks and docs are left
# out so that editing them while the suite runs does not fail it.
PACKAGES = ("advisor", "app", "engine", "kernels", "sim")


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    skip = {"__pycache__"}
    # Top-level names only, so that a new output file shows up; tool caches (.hypothesis, ...) are
    # hidden and may appear while the suite runs, and so may out/ (other tests' artifacts, e.g. the
    # browser test's screenshots, written by another worker when the suite runs in parallel).
    out = {p.name: (0, 0) for p in root.iterdir() if not p.name.startswith(".") and p.name != "out"}
    for package in PACKAGES:
        for dirpath, dirnames, files in os.walk(root / package):
            dirnames[:] = [d for d in dirnames if d not in skip]
            for f in files:
                st_ = os.stat(os.path.join(dirpath, f))
                out[os.path.join(dirpath, f)] = (st_.st_mtime_ns, st_.st_size)
    return out


@pytest.fixture(scope="module", autouse=True)
def repo_untouched(request: pytest.FixtureRequest) -> Iterator[None]:
    before = _tree(REPO)
    yield
    assert _tree(REPO) == before, "a refused input changed a file in the packages or added one"
    # the corpus size is the hypothesis generators' doing: held to it when they ran (`-m "not slow"`
    # leaves them out)
    if any(i.module is request.module and i.get_closest_marker("slow") for i in request.session.items):
        assert len(CASES) >= MIN_DISTINCT_CASES, f"only {len(CASES)} distinct malformed inputs were tried"


def refuse(command: tuple[str, str], name: str, data: bytes, *expected: str) -> str:
    """Run `command` on a file `name` holding `data` in a fresh folder; assert the refusal."""
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            Path(name).write_bytes(data)
            tracemalloc.start()
            res = runner.invoke(app, [*command, name], terminal_width=400)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert sorted(os.listdir(tmp)) == [name] and Path(name).read_bytes() == data
        finally:
            os.chdir(cwd)
    out = " ".join(res.output.split())
    assert res.exit_code == 2, out
    assert "Traceback" not in out and "unexpected" not in out, out
    assert f"{name}" in out, out
    for e in expected:
        assert e in out, (e, out)
    assert peak < PEAK_LIMIT_BYTES, peak
    CASES.add((*command, name, data.hex()))
    return out


# --------------------------------------------------------------------------- Mooncake JSONL
def _mooncake_row(t_ms: int, n_in: int) -> dict:
    return {"timestamp": t_ms, "input_length": n_in, "output_length": 5, "hash_ids": list(range(-(-n_in // 512)))}


MOONCAKE_BAD = st.one_of(
    st.integers(10_000_001, 10**30).map(lambda n: (f'"input_length": {n}', "input_length")),
    st.integers(10_000_001, 10**30).map(lambda n: (f'"output_length": {n}', "output_length")),
    st.integers(-10**20, 0).map(lambda n: (f'"output_length": {n}', "output_length")),
    st.sampled_from(['"timestamp": NaN', '"timestamp": Infinity', '"timestamp": -1', '"timestamp": "x"',
                     '"timestamp": 1' + "0" * 400]).map(lambda s: (s, "timestamp")),
    st.integers(2**63, 10**25).map(lambda h: (f'"hash_ids": [{h}]', "hash_ids")),
    st.sampled_from(['"input_length": 1.5', '"input_length": true', '"input_length": null']).map(
        lambda s: (s, "input_length")),
)


@FUZZ
@given(rows=st.integers(1, 4), where=st.data(), bad=MOONCAKE_BAD, command=COMMANDS)
def test_mooncake_bad_field(rows, where, bad, command):
    text, field = bad
    k = where.draw(st.integers(0, rows - 1))
    lines = [json.dumps(_mooncake_row(1000 * i, 100 + i)) for i in range(rows)]
    key = text.split(":")[0]
    row = json.loads(lines[k])
    row.pop(key.strip('"'))
    lines[k] = "{" + text + ", " + json.dumps(row)[1:]
    refuse(command, "t.jsonl", ("\n".join(lines) + "\n").encode(), f"line {k + 1}", field)


@FUZZ
@given(rows=st.integers(1, 4), where=st.data(), command=COMMANDS,
       damage=st.sampled_from(["cut", "utf8", "array", "nest", "digits"]))
def test_mooncake_bad_line(rows, where, command, damage):
    k = where.draw(st.integers(0, rows - 1))
    lines = [json.dumps(_mooncake_row(1000 * i, 100 + i)).encode() for i in range(rows)]
    lines[k] = {"cut": lines[k][:-3], "utf8": lines[k].replace(b'"output_length"', b'"output\xff_length"'),
                "array": b"[1, 2, 3]", "nest": b"{" + b'"a": [' * 5000 + b"]" * 5000 + b"}",
                "digits": b'{"timestamp": ' + b"9" * 5000 + b"}"}[damage]
    refuse(command, "t.jsonl", b"\n".join(lines) + b"\n", f"line {k + 1}")


# --------------------------------------------------------------------------- Azure and BurstGPT CSV
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURST_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
CSV_BAD = st.one_of(
    st.integers(10_000_001, 10**40).map(str), st.integers(-10**20, 0).map(str),
    st.sampled_from(["", "abc", "1.5", "1e400", "NaN", "12345678901234567890", "\xe9"]),
)


def _csv(head: str, row: str, rows: int, k: int, bad: str, col: int) -> bytes:
    body = [row.format(i=i).split(",") for i in range(rows)]
    body[k][col] = bad
    return ("\n".join([head] + [",".join(r) for r in body]) + "\n").encode("latin-1")


@FUZZ
@given(rows=st.integers(1, 4), where=st.data(), bad=CSV_BAD, command=COMMANDS,
       col=st.sampled_from([1, 2]))
def test_azure_bad_count(rows, where, bad, command, col):
    k = where.draw(st.integers(0, rows - 1))
    data = _csv(AZURE_HEAD, "2023-11-16 18:15:4{i}.1234567,100,10", rows, k, bad, col)
    field = "" if bad == "\xe9" else AZURE_HEAD.split(",")[col]
    refuse(command, "a.csv", data, f"line {k + 2}", field)


@FUZZ
@given(rows=st.integers(1, 4), where=st.data(), bad=CSV_BAD, command=COMMANDS,
       col=st.sampled_from([0, 2, 3]))
def test_burstgpt_bad_field(rows, where, bad, command, col):
    if col == 3 and bad == "0":
        bad = "-1"  # 0 response tokens is BurstGPT's marker of a failed request, not an error
    if col == 0 and bad in ("12345678901234567890", "1.5") or (col == 0 and bad.lstrip("-").isdigit() and int(bad) >= 0):
        bad = "-5"  # a large or fractional timestamp in seconds is valid
    k = where.draw(st.integers(0, rows - 1))
    data = _csv(BURST_HEAD, "{i},ChatGPT,100,10,110,Conversation log", rows, k, bad, col)
    field = "" if bad == "\xe9" else BURST_HEAD.split(",")[col]
    refuse(command, "b.csv", data, f"line {k + 2}", field)


# --------------------------------------------------------------------------- spec files
BASE_SPEC = {"name": "fuzz", "num_requests": 5, "arrival": {"kind": "poisson", "rate_rps": 2.0},
             "prompt_tokens": {"kind": "fixed", "tokens": 100}, "output_tokens": {"kind": "fixed", "tokens": 10}}
SPEC_BAD = st.sampled_from([
    ("num_requests", "1e12"), ("num_requests", "10000000000000000000000"), ("num_requests", "0"),
    ("num_requests", "NaN"), ("arrival.rate_rps", "Infinity"), ("arrival.rate_rps", "NaN"),
    ("arrival.rate_rps", "-Infinity"), ("arrival.rate_rps", "0"), ("arrival.rate_rps", '"fast"'),
    ("prompt_tokens.tokens", "2000000000"), ("prompt_tokens.tokens", "1e300"), ("output_tokens.tokens", "NaN"),
    ("hash_block_size", "1e20"), ("seed", "-1"), ("arrival.kind", '"sometimes"'), ("bogus", "1"),
])


@FUZZ
@given(bad=SPEC_BAD, command=COMMANDS, name=st.sampled_from(["s.json", "spec"]))
def test_spec_bad_field(bad, command, name):
    path, value = bad
    spec = json.loads(json.dumps(BASE_SPEC))
    *outer, last = path.split(".")
    node = spec
    for p in outer:
        node = node[p]
    node[last] = "@@"
    text = json.dumps(spec, indent=2).replace('"@@"', value)
    refuse(command, name, text.encode(), f"field '{path}'")


@FUZZ
@given(cut=st.integers(1, 200), command=COMMANDS, name=st.sampled_from(["s.json", "spec"]))
def test_spec_syntax_error_names_line_and_column(cut, command, name):
    text = json.dumps(BASE_SPEC, indent=2)
    cut = min(cut, len(text) - 1)
    out = refuse(command, name, text[:cut].encode(), "line ", "column ", "not valid JSON")
    assert "trace" not in out


def test_spec_not_utf8_names_the_line():
    text = json.dumps(BASE_SPEC, indent=2).replace("fuzz", "f\xe9zz").encode("latin-1")
    refuse(("workload", "describe"), "s.json", text, "line 2", "UTF-8")


def test_spec_onoff_cycle_too_small():
    spec = {**BASE_SPEC, "arrival": {"kind": "onoff", "on_rate_rps": 1e-300, "mean_on_s": 1, "mean_off_s": 1}}
    refuse(("workload", "describe"), "s.json", json.dumps(spec).encode(), "field 'arrival'", "0.001")


# --------------------------------------------------------------------------- not regular files
@pytest.mark.parametrize("command", [("workload", "describe"), ("simulate", "-w")])
@pytest.mark.parametrize("kind", ["directory", "device", "pipe"])
def test_not_a_regular_file(tmp_path, monkeypatch, kind, command):
    monkeypatch.chdir(tmp_path)
    if kind == "directory":
        target, said = "d.jsonl", "is a directory"
        Path(target).mkdir()
    elif kind == "device":
        target, said = "/dev/zero", "is a character device"
    else:
        target, said = "p", "is a pipe"
        os.mkfifo(target)
    res = runner.invoke(app, [*command, target], terminal_width=400)
    assert res.exit_code == 2 and said in res.output and "no such file" not in res.output, res.output
    assert "Traceback" not in res.output


def test_spec_sessions_with_absurd_turns():
    spec = {**BASE_SPEC, "sessions": {"turns": {"kind": "fixed", "tokens": 10_000_000}, "mean_think_time_s": 1,
                                      "user_message_tokens": {"kind": "fixed", "tokens": 5}}}
    refuse(("workload", "describe"), "s.json", json.dumps(spec).encode(), "field 'sessions'", "10,000")


@pytest.mark.parametrize("args, words", [
    (["--speedup", "inf"], "--speedup inf: must be a finite number"),
    (["--rate", "nan"], "--rate nan: must be"),
    (["--start-s", "nan"], "--start-s nan: must be a finite number"),
    (["-n", "100000000000"], "error: -n 100000000000: must be <= 10000000"),  # named as typed
    (["--num-requests", "100000000000"], "error: --num-requests 100000000000: must be <= 10000000"),
    (["--hash-block-size", "100000000000"], "--hash-block-size 100000000000: must be <= 10000000"),
])
def test_source_options_refuse_non_finite_and_huge(args, words):
    res = runner.invoke(app, ["workload", "describe", "lab-poisson", *args], terminal_width=400)
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output, res.output
