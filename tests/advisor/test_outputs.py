"""Nothing is overwritten by accident, outputs are checked before the work, and a failed or
interrupted write leaves the previous results whole (engine/core/outputs.py and the commands)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import advisor.commands.simulate as simulate_cmd
from costline.cli import app
from engine.core.outputs import (
    RUN_FILES,
    OutputPathError,
    check_output_dir,
    check_output_file,
    staged_dir,
    staged_file,
)

runner = CliRunner()
TRACE = "".join(f'{{"timestamp": {i * 100}, "input_length": 40, "output_length": 5, "hash_ids": [{i}]}}\n'
                for i in range(20))


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], terminal_width=300)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden leftovers included) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    for n in needles:
        assert n in res.output, (n, res.output)


# --------------------------------------------------------------------------- output files
def test_export_onto_its_own_input_is_refused_even_with_force(tmp_path):
    trace = tmp_path / "x.jsonl"
    trace.write_text(TRACE)
    for extra in ([], ["--force"]):
        refused(invoke("workload", "export", trace, "-o", trace, *extra), "--output", "is also the input")
        assert trace.read_text() == TRACE


def test_export_and_fit_refuse_an_existing_file_unless_force(tmp_path):
    trace = tmp_path / "x.jsonl"
    trace.write_text(TRACE)
    for cmd in ("export", "fit"):
        target = tmp_path / f"{cmd}.out"
        target.write_text("keep me")
        refused(invoke("workload", cmd, trace, "-o", target), "--output", "already exists", "--force")
        assert target.read_text() == "keep me"
        ok = invoke("workload", cmd, trace, "-o", target, "--force")
        assert ok.exit_code == 0, ok.output
        assert target.read_text() != "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.out", "fit.out", "x.jsonl"]  # no temp left
    assert len((tmp_path / "export.out").read_text().splitlines()) == 20


def test_an_empty_file_may_be_written_without_force(tmp_path):
    target = tmp_path / "empty.jsonl"
    target.touch()
    assert check_output_file(target, flag="-o") == target


@pytest.mark.parametrize("make, needle", [
    (lambda t: t / "missing" / "x.jsonl", "does not exist"),
    (lambda t: t / "afile" / "x.jsonl", "is a file"),
    (lambda t: t, "is a folder"),
])
def test_a_bad_output_file_location_is_named(tmp_path, make, needle):
    (tmp_path / "afile").write_text("x")
    refused(invoke("workload", "export", "lab-poisson", "-n", "5", "-o", make(tmp_path)), "--output", needle)


def test_staged_file_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "spec.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), staged_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert snapshot(tmp_path) == {"spec.json": b"old"}
    with staged_file(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith("spec.json")  # same folder, same suffix
        tmp.write_text("new")
    assert snapshot(tmp_path) == {"spec.json": b"new"}
    assert (target.stat().st_mode & 0o777) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --------------------------------------------------------------------------- run folders
def test_simulate_refuses_an_earlier_run_and_force_replaces_it_whole(tmp_path):
    out = tmp_path / "a"
    first = invoke("simulate", "-w", "lab-poisson", "-n", "30", "--out", out, "--json")
    assert first.exit_code == 0, first.output
    before = snapshot(out)
    refused(invoke("simulate", "-w", "lab-poisson", "-n", "40", "--out", out), "--out", "--force")
    assert snapshot(out) == before
    (out / "scheduler_stats.json").write_text("{}")  # a file an older run left, not this one's
    again = invoke("simulate", "-w", "lab-poisson", "-n", "40", "--out", out, "--force", "--json")
    assert again.exit_code == 0, again.output
    assert set(snapshot(out)) == set(before)  # no stale file mixed in
    assert '"num_prompts": 40' in (out / "summary.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # nothing aside left over


def test_force_replaces_only_a_folder_a_run_wrote(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    refused(invoke("simulate", "-w", "lab-poisson", "-n", "5", "--out", tmp_path, "--force"),
            "--out", "notes.txt", "choose another --out")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_output_folder_holding_the_input_is_refused(tmp_path):
    trace = tmp_path / "x.jsonl"
    trace.write_text(TRACE)
    refused(invoke("simulate", "-w", trace, "--out", tmp_path, "--force"), "--out", "holds the input")
    assert trace.read_text() == TRACE


@pytest.mark.parametrize("make, needle", [
    (lambda t: t / "afile", "is a file"),
    (lambda t: t / "afile" / "run", "is a file, so no folder can be made"),
])
def test_a_bad_out_is_refused_before_the_simulation(tmp_path, monkeypatch, make, needle):
    (tmp_path / "afile").write_text("x")

    def no_work(*args, **kwargs):
        raise AssertionError("the simulation ran before --out was checked")

    monkeypatch.setattr(simulate_cmd, "run", no_work)
    monkeypatch.setattr(simulate_cmd, "load", no_work)
    t = time.perf_counter()
    refused(invoke("simulate", "-w", "chat-production", "-n", "200000", "--out", make(tmp_path)), "--out", needle)
    assert time.perf_counter() - t < 1.0


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_out_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        refused(invoke("simulate", "-w", "lab-poisson", "-n", "5", "--out", ro / "run"), "--out", "cannot write")
    finally:
        ro.chmod(0o700)


def test_the_api_save_refuses_too(tmp_path):
    from sim.run import SimConfig, run
    from sim.workload_source import SourceOptions

    result = run("lab-poisson", SimConfig(), source=SourceOptions(num_requests=20))
    paths = result.save(tmp_path / "r")
    assert {p.name for p in paths.values()} <= RUN_FILES and all(p.is_file() for p in paths.values())
    with pytest.raises(OutputPathError, match="out_dir .* already holds a run; pass force=True"):
        result.save(tmp_path / "r")
    assert result.save(tmp_path / "r", force=True) == paths


names = st.sampled_from(sorted(RUN_FILES))


@settings(max_examples=40, deadline=None)
@given(old=st.dictionaries(names, st.binary(max_size=20), max_size=5),
       new=st.dictionaries(names, st.binary(max_size=20), min_size=1, max_size=5),
       fail_after=st.one_of(st.none(), st.integers(0, 5)))
def test_staged_dir_gives_the_old_run_or_the_new_one_never_a_mix(tmp_path_factory, old, new, fail_after):
    base = tmp_path_factory.mktemp("staged")
    out = base / "run"
    out.mkdir()
    for name, data in old.items():
        (out / name).write_bytes(data)
    check_output_dir(out, flag="--out", force=True)
    fails = fail_after is not None and fail_after < len(new)
    try:
        with staged_dir(out) as tmp:
            for i, (name, data) in enumerate(new.items()):
                if i == fail_after:
                    raise KeyboardInterrupt
                (tmp / name).write_bytes(data)
    except KeyboardInterrupt:
        assert fails
    assert snapshot(base) == {f"run/{k}": v for k, v in (old if fails else new).items()}
    assert [p.name for p in base.iterdir()] == ["run"]


# --------------------------------------------------------------------------- engine run
def test_engine_run_checks_its_outputs_first(tmp_path):
    trace = tmp_path / "x.jsonl"
    trace.write_text(TRACE)
    refused(invoke("engine", "run", "--model", "tiny", "--device", "cpu", "-w", trace, "--out", tmp_path / "e",
                   "--metrics-file", trace, "--force"), "--metrics-file", "is also the input")
    run_dir = tmp_path / "e"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    refused(invoke("engine", "run", "--model", "tiny", "--device", "cpu", "-w", trace, "--out", run_dir),
            "--out", "already holds a run; pass --force")
    assert snapshot(run_dir) == {"summary.json": b"{}"} and trace.read_text() == TRACE


# --------------------------------------------------------------------------- metrics server
def test_metrics_server_listens_on_loopback_unless_told(tmp_path):
    import urllib.request

    from engine.metrics import EngineMetrics

    metrics = EngineMetrics("m", 128)
    server = metrics.serve(0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert b"vllm:num_requests_running" in reply.read()
    finally:
        server.shutdown()
        server.server_close()
    anywhere = metrics.serve(0, host="0.0.0.0")
    try:
        assert anywhere.server_address[0] == "0.0.0.0"
    finally:
        anywhere.shutdown()
        anywhere.server_close()


def test_engine_run_passes_metrics_host_and_force_replaces_a_run(tmp_path, monkeypatch):
    from engine.metrics import EngineMetrics

    seen: list[tuple[int, str]] = []
    monkeypatch.setattr(EngineMetrics, "serve", lambda self, port, host="127.0.0.1": seen.append((port, host)))
    trace = tmp_path / "x.jsonl"
    trace.write_text(TRACE)
    out = tmp_path / "e"
    # a small budget and context keep the warm-up's prompts short (its 2,000-token ones cost ~10 CPU s a run)
    args = ["engine", "run", "--model", "tiny", "--device", "cpu", "-w", trace, "--first", "2", "--speedup", "1000",
            "--max-model-len", "256", "--max-num-batched-tokens", "64", "--out", out, "--metrics-port", "9999"]
    assert invoke(*args).exit_code == 0
    assert invoke(*args, "--metrics-host", "0.0.0.0", "--force").exit_code == 0
    assert seen == [(9999, "127.0.0.1"), (9999, "0.0.0.0")]
    assert set(snapshot(out)) == {"requests.jsonl", "steps.jsonl", "summary.json", "metrics.prom",
                                  "scheduler_stats.json"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "x.jsonl"]


# --------------------------------------------------------------------------- --compare inputs
@pytest.mark.parametrize("content, needle", [
    (b'{"completed": 3, "dura', "line 1, column 18: not valid JSON"),
    (b"\xff\xfe{}", "is not UTF-8"),
    (b"[1, 2]", "must be a JSON object ({...}), not a list"),
    (b"", "not valid JSON"),
])
def test_compare_names_a_damaged_summary(tmp_path, content, needle):
    good = tmp_path / "good"
    assert invoke("simulate", "-w", "lab-poisson", "-n", "10", "--out", good, "--json").exit_code == 0
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "summary.json").write_bytes(content)
    refused(invoke("simulate", "--compare", good, bad), str(bad / "summary.json"), needle)


# --------------------------------------------------------------------------- fuzz: data lost
STATES = ("missing", "empty_file", "file", "empty_dir", "run_dir", "foreign_dir", "the_input",
          "parent_missing", "parent_is_file")


def _make_state(base: Path, state: str) -> Path:
    """Set up the output location in `state`; returns the path to pass as the output."""
    trace = base / "in.jsonl"
    out = base / "target"
    if state == "the_input":
        return trace
    if state == "empty_file":
        out.touch()
    elif state == "file":
        out.write_text("precious")
    elif state in ("empty_dir", "run_dir", "foreign_dir"):
        out.mkdir()
        if state == "run_dir":
            (out / "summary.json").write_text('{"old": 1}')
        if state == "foreign_dir":
            (out / "thesis.tex").write_text("precious")
    elif state == "parent_missing":
        return base / "nowhere" / "target"
    elif state == "parent_is_file":
        (base / "plain").write_text("precious")
        return base / "plain" / "target"
    return out


def _expected_ok(kind: str, state: str, force: bool) -> bool:
    """The rules, stated once per kind of output: a file, or a run folder."""
    if kind == "file":
        return state in ("missing", "empty_file") or (state == "file" and force)
    return state in ("missing", "empty_dir", "parent_missing") or (state == "run_dir" and force)


COMMANDS = {  # command line before the output option, the option, the kind of output
    "export": (["workload", "export", "{trace}"], "-o", "file"),
    "fit": (["workload", "fit", "{trace}"], "-o", "file"),
    "simulate": (["simulate", "-w", "{trace}", "--json"], "--out", "dir"),
}


@settings(max_examples=60, deadline=None)
@given(command=st.sampled_from(sorted(COMMANDS)), state=st.sampled_from(STATES), force=st.booleans())
def test_fuzz_an_output_is_never_lost(tmp_path_factory, command, state, force):
    base = tmp_path_factory.mktemp("fuzz")
    trace = base / "in.jsonl"
    trace.write_text(TRACE)
    target = _make_state(base, state)
    words, option, kind = COMMANDS[command]
    before = snapshot(base)
    res = invoke(*(w.format(trace=trace) for w in words), option, target, *(["--force"] if force else []))
    if not _expected_ok(kind, state, force):
        refused(res, option)
        assert snapshot(base) == before  # nothing changed, nothing left behind
        return
    assert res.exit_code == 0, res.output
    after = snapshot(base)
    written = {k for k in after if Path(k).parts[0] == target.relative_to(base).parts[0]}
    assert {k: v for k, v in after.items() if k not in written} == {
        k: v for k, v in before.items() if k not in written}  # only the output changed
    assert written and all(not Path(k).name.startswith(".") for k in after)  # no temporary left
    if kind == "dir":
        rel = target.relative_to(base).as_posix()
        assert {Path(k).name for k in written} <= RUN_FILES and f"{rel}/summary.json" in written
        assert json.loads((target / "summary.json").read_text())["num_prompts"] == 20  # the new run, whole


def test_a_linked_run_folder_is_replaced_where_the_link_points(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "summary.json").write_text("{}")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    ok = invoke("simulate", "-w", "lab-poisson", "-n", "7", "--out", link, "--force", "--json")
    assert ok.exit_code == 0, ok.output
    assert link.is_symlink() and json.loads((real / "summary.json").read_text())["num_prompts"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_a_failed_swap_keeps_the_previous_run_and_says_where_the_new_one_is(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("old")
    real_replace = os.replace

    def fail_second(src, dst):
        if Path(src).name.startswith(".run.partial-"):
            raise OSError(13, "Permission denied")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_second)
    with pytest.raises(OutputPathError, match=r"the results are in .*\.run\.partial-"), staged_dir(out) as tmp:
        (tmp / "summary.json").write_text("new")
    assert (out / "summary.json").read_text() == "old"
    leftovers = [p for p in tmp_path.iterdir() if p.name != "run"]
    assert len(leftovers) == 1 and (leftovers[0] / "summary.json").read_text() == "new"
