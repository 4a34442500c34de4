"""A corpus of hostile inputs across every command, the Python API and the dashboard's URL (issue 32).

Each input must be refused clearly, or (where marked) accepted with bounded work:
- the command line: exit status 2 (or the status given), the expected words, one message and no
  traceback; nothing reaches the catch-all handler of advisor/cli.py (the exception CliRunner
  records is the clean SystemExit, never an escaped error); no input file changed, no output
  left behind; within `TIME_LIMIT_S` and `PEAK_LIMIT_BYTES` of Python allocations (tracemalloc,
  numpy included);
- the API: an input error (advisor/errors.py `is_input_error`) naming the request, field or file;
- the dashboard's URL: every parameter that would name a server path, leave its bounds or make
  the deployment fail is ignored and named, and what remains is a scenario a page may simulate.

`test_the_corpus_is_large_enough` checks the count at the end (`MIN_CASES`).
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from contextlib import chdir
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from advisor.errors import is_input_error
from costline.cli import app
from engine.core.request import Request

runner = CliRunner()
TIME_LIMIT_S = 10.0
PEAK_LIMIT_BYTES = 512 << 20
MIN_CASES = 300
SEEN: set[str] = set()  # ids of the cases that ran and passed
WORST = {"wall_s": 0.0, "peak_bytes": 0}  # over the cases that measured them
CLEAN = ("Traceback", "unexpected", "internal error", "errors.pydantic.dev")

# --------------------------------------------------------------------------- assets
TRACE = "".join(json.dumps({"timestamp": 100 * i, "input_length": 40 + i, "output_length": 5, "hash_ids": [i]}) + "\n"
                for i in range(12))
SPEC = json.dumps({"name": "s", "num_requests": 5, "arrival": {"kind": "poisson", "rate_rps": 2.0},
                   "prompt_tokens": {"kind": "fixed", "tokens": 100}, "output_tokens": {"kind": "fixed", "tokens": 10}})
YEARS = "".join(json.dumps({"timestamp": int(t), "input_length": 30, "output_length": 3, "hash_ids": [i]}) + "\n"
                for i, t in enumerate((0, 4.0e10, 9.4e10)))  # three requests over three years (ms)
FAR = YEARS.replace("94000000000", "1000000000000000000")  # 1e18 ms: beyond any clock


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    """Files the cases copy into their folder: an engine run folder, a model folder, a profile."""
    from tests.advisor.test_validate_cli import write_run

    root = tmp_path_factory.mktemp("assets")
    out = {"run": write_run(root / "RUN")}
    import torch  # noqa: F401 - the engine's model folder

    from engine.core.model_spec import get_model
    from engine.loader import save_model
    from engine.model import LlamaModel

    save_model(LlamaModel(get_model("tiny"), max_positions=64, seed=0), root / "model")
    out["model"] = root / "model"
    out["profile"] = Path(__file__).resolve().parents[2] / "sim" / "profiles" / "default.json"
    return out


def _snapshot(folder: Path) -> dict[str, Any]:
    """Every entry under `folder`: a file's bytes, a link's target (what must not change)."""
    snap: dict[str, Any] = {}
    for dirpath, dirnames, files in os.walk(folder):
        for name in dirnames + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(folder))
            snap[rel] = ("link", os.readlink(p)) if p.is_symlink() else (p.read_bytes() if p.is_file() else "dir")
    return snap


@dataclass(frozen=True)
class Cli:
    """One command line in a fresh folder holding `files` (name -> text | bytes | '@asset' |
    ('link', target)); it must end with `code` and show every `expect` fragment."""

    id: str
    args: tuple[str, ...]
    expect: tuple[str, ...] = ()
    files: tuple[tuple[str, Any], ...] = ()
    code: int = 2
    env: tuple[tuple[str, str], ...] = ()


def _place(folder: Path, files: tuple[tuple[str, Any], ...], assets: dict[str, Path]) -> None:
    for name, what in files:
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(what, tuple):
            p.symlink_to(what[1])
        elif isinstance(what, str) and what.startswith("@"):
            src = assets[what[1:]]
            shutil.copytree(src, p) if src.is_dir() else shutil.copyfile(src, p)
        elif isinstance(what, bytes):
            p.write_bytes(what)
        elif callable(what):
            what(p)
        else:
            p.write_text(what)


def _measured(wall: float, peak: int) -> None:
    WORST["wall_s"] = max(WORST["wall_s"], wall)
    WORST["peak_bytes"] = max(WORST["peak_bytes"], peak)


def run_cli(case: Cli, assets: dict[str, Path]) -> str:
    """Run `case` (see Cli) and check everything the module's docstring promises."""
    with tempfile.TemporaryDirectory() as tmp, chdir(tmp), \
            pytest.MonkeyPatch.context() as mp:
        folder = Path(tmp)
        _place(folder, case.files, assets)
        before = _snapshot(folder)
        mp.setattr("sys.argv", ["costline", *case.args])  # an alias is named as typed (advisor.options)
        for k, v in case.env:
            mp.setenv(k, v)
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            res = runner.invoke(app, list(case.args), terminal_width=400)
        finally:
            wall = time.perf_counter() - t0
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        after = _snapshot(folder)
    out = " ".join(res.output.split())
    assert res.exception is None or isinstance(res.exception, SystemExit), (case.id, repr(res.exception), out)
    assert res.exit_code == case.code, (case.id, res.exit_code, out)
    assert not any(w in out for w in CLEAN), (case.id, out)
    missing = [e for e in case.expect if e not in out]
    assert not missing, (case.id, missing, out)
    assert after == before, (case.id, "an input changed or an output was left behind",
                             sorted(set(after) ^ set(before)))
    assert wall <= TIME_LIMIT_S, (case.id, wall)
    assert peak <= PEAK_LIMIT_BYTES, (case.id, peak)
    _measured(wall, peak)
    SEEN.add(f"{'cli' if case.code else 'cli-accepted'}:{case.id}")
    return out


# --------------------------------------------------------------------------- outputs: one rule
CAL = ("calibrate", "RUN", "--model", "llama-3.2-1b", "--gpu", "h200")
SAME, HOLDS, INSIDE = "is also the input", "holds the input", "is inside the input"


def _output_cases() -> list[Cli]:
    trace = (("t.jsonl", TRACE),)
    run_ = (("RUN", "@run"),)
    model = (("model", "@model"),)
    base = [
        Cli("export-onto-input", ("workload", "export", "t.jsonl", "-o", "t.jsonl"), ("--output", SAME), trace),
        Cli("fit-onto-input", ("workload", "fit", "t.jsonl", "-o", "t.jsonl"), ("--output", SAME), trace),
        Cli("fit-spec-onto-input", ("workload", "fit", "s.json", "-o", "s.json"), ("--output", SAME),
            (("s.json", SPEC),)),
        Cli("export-onto-link-to-input", ("workload", "export", "t.jsonl", "-o", "l.jsonl"), ("--output", SAME),
            (*trace, ("l.jsonl", ("link", "t.jsonl")))),
        Cli("export-into-input-dir-via-link", ("workload", "export", "d/t.jsonl", "-o", "ld/t.jsonl"),
            ("--output", SAME), (("d/t.jsonl", TRACE), ("ld", ("link", "d")))),
        Cli("simulate-out-onto-trace", ("simulate", "-w", "t.jsonl", "--out", "t.jsonl"), ("--out", SAME), trace),
        Cli("simulate-out-holds-trace", ("simulate", "-w", "d/t.jsonl", "--out", "d"), ("--out", HOLDS),
            (("d/t.jsonl", TRACE),)),
        Cli("simulate-out-holds-profile", ("simulate", "-w", "lab-poisson", "-n", "3", "--profile", "p/x.json",
                                           "--out", "p"), ("--out", HOLDS), (("p/x.json", "@profile"),)),
        Cli("simulate-out-link-to-trace-dir", ("simulate", "-w", "d/t.jsonl", "--out", "l"), ("--out", HOLDS),
            (("d/t.jsonl", TRACE), ("l", ("link", "d")))),
        Cli("advise-out-holds-trace", ("advise", "-w", "d/t.jsonl", "--out", "d"), ("--out", HOLDS),
            (("d/t.jsonl", TRACE),)),
        Cli("advise-out-holds-profile", ("advise", "-w", "lab-poisson", "--profile", "p/x.json", "--out", "p"),
            ("--out", HOLDS), (("p/x.json", "@profile"),)),
        Cli("calibrate-out-inside-run", (*CAL, "--out", "RUN/steps.jsonl"), ("--out", INSIDE), run_),
        Cli("calibrate-out-new-file-inside-run", (*CAL, "--out", "RUN/p.json"), ("--out", INSIDE), run_),
        Cli("calibrate-out-is-run", (*CAL, "--out", "RUN"), ("--out", SAME), run_),
        Cli("calibrate-steps-onto-itself", ("calibrate", "RUN/steps.jsonl", "--model", "llama-3.2-1b", "--gpu", "h200",
                                            "--out", "RUN/steps.jsonl"), ("--out", SAME), run_),
        Cli("calibrate-scaled-inside-run", (*CAL, "--out", "RUN/p.json", "--scaled"), ("--out", INSIDE), run_),
        Cli("validate-out-is-run", ("validate", "RUN", "--out", "RUN"), ("--out", SAME), run_),
        Cli("validate-out-inside-run", ("validate", "RUN", "--out", "RUN/report"), ("--out", INSIDE), run_),
        Cli("validate-out-link-to-run", ("validate", "RUN", "--out", "l"), ("--out", SAME),
            (*run_, ("l", ("link", "RUN")))),
        Cli("validate-out-holds-run", ("validate", "d/RUN", "--out", "d"), ("--out", HOLDS), (("d/RUN", "@run"),)),
        Cli("validate-out-holds-profile", ("validate", "RUN", "--profile", "p/x.json", "--out", "p"), ("--out", HOLDS),
            (*run_, ("p/x.json", "@profile"))),
        Cli("engine-out-is-model", ("engine", "run", "--model", "model", "--out", "model"), ("--out", SAME), model),
        Cli("engine-out-inside-model", ("engine", "run", "--model", "model", "--out", "model/run"), ("--out", INSIDE),
            model),
        Cli("engine-out-link-to-model", ("engine", "run", "--model", "model", "--out", "l"), ("--out", SAME),
            (*model, ("l", ("link", "model")))),
        Cli("engine-out-holds-trace", ("engine", "run", "-w", "d/t.jsonl", "--out", "d"), ("--out", HOLDS),
            (("d/t.jsonl", TRACE),)),
        Cli("engine-metrics-onto-trace", ("engine", "run", "-w", "t.jsonl", "--out", "r", "--metrics-file", "t.jsonl"),
            ("--metrics-file", SAME), trace),
        Cli("engine-metrics-inside-model", ("engine", "run", "--model", "model", "--out", "r", "--metrics-file",
                                            "model/m.prom"), ("--metrics-file", INSIDE), model),
    ]
    cases = base + [Cli(c.id + "+force", (*c.args, "--force"), c.expect, c.files) for c in base]
    empty = [  # outputs that name nothing of their own, or standard output where a folder is written
        *(Cli(f"{cmd[0]}-{cmd[1] if len(cmd) > 1 else ''}-out-{name}", (*cmd, flag, value), (flag, words))
          for cmd, flag in ((("simulate", "-w", "lab-poisson", "-n", "3"), "--out"),
                            (("advise", "-w", "lab-poisson"), "--out"),
                            (("engine", "run"), "--out"),
                            (("workload", "export", "lab-poisson", "-n", "3"), "--output"),
                            (("workload", "fit", "lab-poisson"), "--output"))
          for name, value, words in (("empty", "", "names no"), ("dot", ".", "names no"), ("dotdot", "..", "names no"))),
        Cli("simulate-out-stdout", ("simulate", "-w", "lab-poisson", "-n", "3", "--out", "-"), ("--out -", "standard output")),
        Cli("advise-out-stdout", ("advise", "--out", "-"), ("--out -", "standard output")),
        Cli("engine-out-stdout", ("engine", "run", "--out", "-"), ("--out -", "standard output")),
        Cli("engine-metrics-stdout", ("engine", "run", "--out", "r", "--metrics-file", "-"),
            ("--metrics-file -", "standard output")),
        Cli("calibrate-out-stdout", (*CAL, "--out", "-"), ("--out -", "standard output"), (("RUN", "@run"),)),
        Cli("validate-out-empty", ("validate", "RUN", "--out", ""), ("--out",), (("RUN", "@run"),)),
    ]
    return cases + empty


OUTPUT_CASES = _output_cases()


@pytest.mark.parametrize("case", OUTPUT_CASES, ids=lambda c: c.id)
def test_an_output_never_replaces_or_enters_an_input(case, assets):
    run_cli(case, assets)


def test_export_to_standard_output(assets):
    """`-o -` writes the trace to standard output (and no file named '-')."""
    out = run_cli(Cli("export-stdout", ("workload", "export", "lab-poisson", "-n", "2", "-o", "-"), ('"timestamp": 0',),
                      code=0), assets)
    assert out.count('"timestamp"') == 2
    run_cli(Cli("fit-stdout", ("workload", "fit", "lab-poisson", "-o", "-"), ('"arrival"',), code=0), assets)


# --------------------------------------------------------------------------- hostile files
@functools.cache
def _gzip_bomb_bytes() -> bytes:
    """~100 KB of gzip that inflates to 96 MB of one repeated trace row (a real bomb inflates to
    gigabytes; this one is refused as early, after 16 MB, and is quicker to make)."""
    row = (json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}) + "\n").encode()
    return gzip.compress(row * ((96 << 20) // len(row)), 9)


def _gzip_bomb(p: Path) -> None:
    p.write_bytes(_gzip_bomb_bytes())


def _json(obj: Any) -> str:
    return json.dumps(obj)


def _run_with(file: str, edit: Callable[[Any], Any] | str | bytes) -> Callable[[Path], None]:
    """An engine run folder whose `file` is rewritten by `edit` (a function of its JSON, or text)."""
    def make(p: Path) -> None:
        from tests.advisor.test_validate_cli import write_run  # written once per module below

        shutil.copytree(_ASSETS["run"], p)
        target = p / file
        if callable(edit):
            target.write_text(json.dumps(edit(json.loads(target.read_text()))))
        elif isinstance(edit, bytes):
            target.write_bytes(edit)
        else:
            target.write_text(edit)
        del write_run

    return make


def _summary(**changes: Any) -> Callable[[Any], Any]:
    return lambda s: s | changes


def _info(**changes: Any) -> Callable[[Any], Any]:
    return lambda s: s | changes


def _model_with(config: Any, weights: bytes | None = None, index: Any = None) -> Callable[[Path], None]:
    """A model folder: the tiny model's files, its config.json replaced (text or JSON), its weights
    replaced by `weights`, or an index written."""
    def make(p: Path) -> None:
        shutil.copytree(_ASSETS["model"], p)
        if config is not None:
            (p / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        if weights is not None:
            (p / "model.safetensors").write_bytes(weights)
        if index is not None:
            (p / "model.safetensors").unlink()
            (p / "model.safetensors.index.json").write_text(json.dumps(index))

    return make


_ASSETS: dict[str, Path] = {}
HUGE_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 1 << 24, "intermediate_size": 1 << 24,
               "num_hidden_layers": 1 << 12, "num_attention_heads": 1 << 10, "vocab_size": 1 << 24}
LLAMA_405B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 16384, "intermediate_size": 53248,
              "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256,
              "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
BILLION_LAUGHS = "\n".join(["a: &a [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]",
                            *(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]"
                              for i in range(9)), "num_requests: 5"])
SPEC_YAML = ("name: y\nnum_requests: 5\narrival: {kind: poisson, rate_rps: 2.0}\n"
             "prompt_tokens: {kind: fixed, tokens: 100}\noutput_tokens: {kind: fixed, tokens: 10}\n")
PROFILE_OK = (Path(__file__).resolve().parents[2] / "sim" / "profiles" / "default.json").read_text()


def _profile(**changes: Any) -> str:
    return json.dumps(json.loads(PROFILE_OK) | changes)


WORKLOAD_CMDS = {"describe": ("workload", "describe"), "simulate": ("simulate", "-w"), "fit": ("workload", "fit"),
                 "export": ("workload", "export", "-o", "out.jsonl"), "advise": ("advise", "-w")}


def _file_cases() -> list[Cli]:
    cases: list[Cli] = []
    bad_traces = [  # (id, file name, content, expected words)
        ("far-future-timestamp", "far.jsonl", FAR, ("far.jsonl", "line 3", "timestamp", "1e+09 s")),
        ("gzip-bomb", "bomb.jsonl.gz", _gzip_bomb, ("bomb.jsonl.gz", "compression bomb")),
        ("binary-as-trace", "bin.csv", bytes(range(128, 256)) * 4096, ("bin.csv", "not UTF-8 text")),
        ("nan-timestamp", "n.jsonl", TRACE.replace('"timestamp": 300', '"timestamp": NaN'), ("line 4", "timestamp")),
        ("inf-timestamp", "i.jsonl", TRACE.replace('"timestamp": 300', '"timestamp": Infinity'), ("line 4", "timestamp")),
        ("list-row", "l.jsonl", TRACE + "[1, 2, 3]\n", ("line 13", "not an object")),
        ("deep-row", "d.jsonl", TRACE + "{" + '"a": [' * 3000 + "]" * 3000 + "}\n", ("line 13",)),
        ("azure-far-future", "a.csv", ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,10,5\n"
                                       "2100-01-01 00:00:00,10,5\n"), ("a.csv", "line 3", "TIMESTAMP", "1e+09 s")),
        ("azure-year-9999", "a.csv", ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,10,5\n"
                                      "9999-01-01 00:00:00,10,5\n"), ("a.csv", "line 3", "TIMESTAMP")),
        ("burstgpt-far-future", "b.csv", ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                          "0,ChatGPT,10,5,15,Conversation log\n1e300,ChatGPT,10,5,15,Conversation log\n"),
         ("b.csv", "line 3", "Timestamp", "1e+09 s")),
        ("spec-arrivals-beyond-clock", "s.json", _json(json.loads(SPEC) | {"arrival": {"kind": "poisson",
                                                                                         "rate_rps": 1e-12}}),
         ("s.json", "beyond the 1e+09 s")),
        ("yaml-billion-laughs", "s.yaml", BILLION_LAUGHS, ("s.yaml", "aliases")),
        ("yaml-deep", "s.yaml", "a: " + "[" * 200 + "]" * 200 + "\n", ("s.yaml", "nested")),
        ("yaml-too-long", "s.yaml", SPEC_YAML + "# " + "x" * (1 << 21) + "\n", ("s.yaml", "bytes of YAML")),
        ("yaml-syntax", "s.yaml", "name: [1, 2\n", ("s.yaml", "line", "not valid YAML")),
        ("yaml-inf-rate", "s.yaml", SPEC_YAML.replace("2.0", ".inf"), ("s.yaml", "arrival.rate_rps")),
        ("yaml-list", "s.yaml", "- 1\n- 2\n", ("s.yaml", "invalid workload spec")),
        ("yaml-binary-tag", "s.yaml", SPEC_YAML + "extra: !!python/object:os.system ls\n", ("s.yaml",)),
        ("spec-huge-file", "s.json", '{"name": "' + "x" * (17 << 20) + '"}', ("s.json", "bytes")),
        ("spec-deep-json", "s.json", '{"a": ' + "[" * 100 + "]" * 100 + "}", ("s.json", "nested")),
        ("spec-name-markup", "s.json", _json(json.loads(SPEC) | {"name": "[/]", "num_requests": "x"}),
         ("s.json", "num_requests")),
    ]
    for tid, name, content, words in bad_traces:
        for cmd, argv in WORKLOAD_CMDS.items():
            if cmd == "export":
                args = (*argv[:2], name, *argv[2:])
            elif cmd == "advise":
                args = (*argv, name)
            else:
                args = (*argv, name)
            cases.append(Cli(f"{tid}/{cmd}", args, words, ((name, content),)))
    bounded = [  # accepted: the statistics and the run cost what three requests cost, whatever the span
        Cli("three-years/describe", ("workload", "describe", "y.jsonl"), ("requests 3",), (("y.jsonl", YEARS),), 0),
        Cli("three-years/fit", ("workload", "fit", "y.jsonl"), ('"arrival"',), (("y.jsonl", YEARS),), 0),
        Cli("three-years/simulate", ("simulate", "-w", "y.jsonl"), ("3 completed",), (("y.jsonl", YEARS),), 0),
        Cli("three-years/describe-json", ("workload", "describe", "y.jsonl", "--json"), ('"requests": 3',),
            (("y.jsonl", YEARS),), 0),
    ]
    return cases + bounded


FILE_CASES = _file_cases()


@pytest.fixture(scope="module", autouse=True)
def _share_assets(assets) -> None:
    _ASSETS.update(assets)


@pytest.mark.parametrize("case", FILE_CASES, ids=lambda c: c.id)
def test_hostile_workload_files(case, assets):
    run_cli(case, assets)


# --------------------------------------------------------------------------- run folders, profiles, models
def _run_cases() -> list[Cli]:
    run_ = (("RUN", "@run"),)
    val = ("validate", "RUN", "--profile", "default")
    edits = [  # (id, file, edit, words)
        ("run-json-list", "run.json", "[1, 2]", ("run.json", "must be a JSON object")),
        ("run-json-nan", "run.json", '{"schema": NaN}', ("run.json", "NaN")),
        ("run-json-truncated", "run.json", '{"schema": "costline-engine-run/1", ', ("run.json", "line 1")),
        ("run-json-not-utf8", "run.json", b'{"name": "\xff"}', ("run.json", "not UTF-8")),
        ("summary-list", "summary.json", "[]", ("summary.json", "must be a JSON object")),
        ("summary-p50-above-p99", "summary.json", _summary(median_ttft_ms=1e6), ("summary.json", "impossible")),
        ("summary-negative", "summary.json", _summary(mean_tpot_ms=-3.0), ("summary.json", "never negative")),
        ("summary-counts", "summary.json", _summary(completed=400), ("summary.json", "impossible")),
        ("summary-prompts", "summary.json", _summary(num_prompts=7), ("summary.json", "impossible")),
        ("summary-throughput", "summary.json", _summary(request_throughput=1e6), ("summary.json", "impossible")),
        ("summary-string", "summary.json", _summary(completed="all"), ("summary.json", "completed")),
        ("summary-hits", "summary.json", _summary(prefix_cache_hits_tokens=10**12), ("summary.json", "impossible")),
        ("summary-ttft-after-e2e", "summary.json", _summary(mean_ttft_ms=1e7, median_ttft_ms=1e7, p90_ttft_ms=1e7,
                                                            p99_ttft_ms=1e7), ("summary.json", "impossible")),
        ("steps-list-row", "steps.jsonl", "[1, 2]\n", ("steps.jsonl", "line 1", "JSON object")),
        ("steps-string-value", "steps.jsonl", '{"gpu_s": "fast"}\n', ("steps.jsonl", "line 1", "gpu_s")),
        ("steps-nan", "steps.jsonl", '{"total_s": NaN}\n', ("steps.jsonl", "line 1")),
    ]
    cases = []
    for tid, file, edit, words in edits:
        files = (("RUN", _run_with(file, edit)),)
        cases.append(Cli(f"{tid}/validate", val, words, files))
        if file != "summary.json":
            cases.append(Cli(f"{tid}/calibrate", CAL, words, files))
    cases += [
        Cli("engine-args-list/calibrate", CAL, ("run.json", "engine_args", "object"),
            (("RUN", _run_with("run.json", _info(engine_args=[1]))),)),
        Cli("engine-args-string-seqs/calibrate", CAL, ("run.json", "engine_args.max_num_seqs", "integer"),
            (("RUN", _run_with("run.json", lambda i: i | {"engine_args": i["engine_args"] | {"max_num_seqs": "16"}})),)),
        Cli("run-model-number/calibrate", CAL, ("run.json", "'model'", "string"),
            (("RUN", _run_with("run.json", _info(model=5))),)),
        Cli("calibrate-other-model", ("calibrate", "RUN", "--model", "tiny", "--gpu", "h200"),
            ("llama-3.2-1b", "--model tiny"), run_),
        Cli("calibrate-other-gpu", ("calibrate", "RUN", "--model", "llama-3.2-1b", "--gpu", "a100-80gb"),
            ("'h200'", "--gpu a100-80gb"), run_),
        Cli("calibrate-missing", ("calibrate", "nope", "--model", "tiny", "--gpu", "h200"), ("nope", "no such")),
        Cli("calibrate-unknown-model", ("calibrate", "RUN", "--model", "nope", "--gpu", "h200"), ("nope",), run_),
        Cli("calibrate-markup-name", ("calibrate", "[/]", "--model", "tiny", "--gpu", "h200"), ("[/]",)),
        Cli("validate-other-model-profile", ("validate", "RUN", "--profile", "h200-llama-3.1-8b"),
            ("measured on model llama-3.1-8b",), run_),
        Cli("validate-other-gpu-profile", ("validate", "RUN", "--profile", "a100-80gb-llama-3.2-1b"),
            ("measured on GPU a100-80gb",), run_),
        Cli("validate-not-a-folder", ("validate", "[/]"), ("[/]", "not a folder")),
        Cli("validate-no-summary", ("validate", "RUN", "--profile", "default"), ("summary.json",),
            (("RUN", lambda p: (shutil.copytree(_ASSETS["run"], p), (p / "summary.json").unlink())),)),
        Cli("compare-list", ("simulate", "--compare", "a", "a"), ("a/summary.json", "JSON object"),
            (("a/summary.json", "[1]"),)),
        Cli("compare-string", ("simulate", "--compare", "a", "a"), ("a/summary.json", "completed", "number"),
            (("a/summary.json", '{"completed": "x"}'),)),
        Cli("compare-nan", ("simulate", "--compare", "a", "a"), ("a/summary.json", "completed"),
            (("a/summary.json", '{"completed": NaN}'),)),
        Cli("compare-missing", ("simulate", "--compare", "a", "b"), ("a",)),
    ]
    bad_profiles = [  # (id, content, words)
        ("profile-list", "[1, 2]", ("p.json", "must be a JSON object")),
        ("profile-name-number", _profile(name=5), ("p.json", "'name'", "string")),
        ("profile-nan", PROFILE_OK.replace("0.7", "NaN", 1), ("p.json", "NaN")),
        ("profile-schema", _profile(schema_version=7), ("p.json", "schema_version")),
        ("profile-negative", _profile(cpu_step_s=-1), ("p.json", "cpu_step_s")),
        ("profile-decode-list", _profile(schema_version=2, decode=[1]), ("p.json", "decode")),
        ("profile-truncated", PROFILE_OK[:40], ("p.json", "line", "not valid JSON")),
        ("profile-not-utf8", b"\xff\xfe{}", ("p.json", "UTF-8")),
        ("profile-huge", '{"name": "' + "x" * (5 << 20) + '"}', ("p.json", "bytes")),
        ("profile-unknown-key", _profile(bogus=1), ("p.json", "bogus")),
    ]
    for tid, content, words in bad_profiles:
        files = (("p.json", content),)
        cases += [Cli(f"{tid}/simulate", ("simulate", "-w", "lab-poisson", "-n", "3", "--profile", "p.json"), words,
                      files),
                  Cli(f"{tid}/advise", ("advise", "-w", "lab-poisson", "--profile", "p.json"), words, files),
                  Cli(f"{tid}/validate", ("validate", "RUN", "--profile", "p.json"), words, (*files, *run_))]
    cases += [Cli(f"profile-path-{i}/simulate", ("simulate", "-w", "lab-poisson", "-n", "3", "--profile", p),
                  ("not found",)) for i, p in enumerate(("[/]", "/nonexistent/p.json", "../../x.json", ""))
              if p]
    return cases


RUN_CASES = _run_cases()


@pytest.mark.parametrize("case", RUN_CASES, ids=lambda c: c.id)
def test_hostile_run_folders_profiles_and_summaries(case, assets):
    run_cli(case, assets)


# --------------------------------------------------------------------------- engine, flags and options
def _engine_cases() -> list[Cli]:
    run = ("engine", "run", "--first", "2", "--out", "r")
    bench = ("engine", "bench", "--num-prompts", "2")
    cases = []
    for cmd, base in (("run", run), ("bench", bench)):
        cases += [
            Cli(f"{cmd}-device-banana", (*base, "--device", "banana"), ("--device 'banana'", "cpu")),
            Cli(f"{cmd}-device-missing-gpu", (*base, "--device", "cuda:99"), ("--device cuda:99",)),
            Cli(f"{cmd}-device-empty", (*base, "--device", ""), ("--device",)),
            Cli(f"{cmd}-triton-without-gpu", (*base, "--device", "cpu", "--attention-backend", "triton"),
                ("--attention-backend triton", "GPU"), env=(("TRITON_INTERPRET", "0"),)),
            Cli(f"{cmd}-backend-banana", (*base, "--attention-backend", "banana"), ("--attention-backend",)),
            Cli(f"{cmd}-cpu-kv-100T", (*base, "--device", "cpu", "--cpu-kv-cache-bytes", "100T"),
                ("--cpu-kv-cache-bytes", "memory")),
            Cli(f"{cmd}-cpu-kv-zero", (*base, "--cpu-kv-cache-bytes", "0"), ("--cpu-kv-cache-bytes",)),
            Cli(f"{cmd}-model-huge-config", (*base, "--device", "cpu", "--model", "m"), ("--model m", "weights need"),
                (("m", _model_with(HUGE_CONFIG)),)),
            Cli(f"{cmd}-model-config-list", (*base, "--device", "cpu", "--model", "m"), ("config.json", "JSON object"),
                (("m", _model_with("[1]")),)),
            Cli(f"{cmd}-model-config-string-size", (*base, "--device", "cpu", "--model", "m"),
                ("config.json", "'hidden_size'", "integer"), (("m", _model_with(LLAMA_405B | {"hidden_size": "x"})),)),
            Cli(f"{cmd}-model-config-absurd-vocab", (*base, "--device", "cpu", "--model", "m"),
                ("config.json", "'vocab_size'"), (("m", _model_with(LLAMA_405B | {"vocab_size": 10**12})),)),
            Cli(f"{cmd}-model-config-arch-string", (*base, "--device", "cpu", "--model", "m"),
                ("config.json", "'architectures'", "list"),
                (("m", _model_with(LLAMA_405B | {"architectures": "LlamaForCausalLM"})),)),
            Cli(f"{cmd}-model-config-missing-key", (*base, "--device", "cpu", "--model", "m"),
                ("config.json", "'num_hidden_layers'", "missing"),
                (("m", _model_with({k: v for k, v in LLAMA_405B.items() if k != "num_hidden_layers"})),)),
            Cli(f"{cmd}-model-config-truncated", (*base, "--device", "cpu", "--model", "m"),
                ("config.json", "line 1", "not valid JSON"), (("m", _model_with('{"hidden_size": 4')),)),
            Cli(f"{cmd}-model-config-rope-list", (*base, "--device", "cpu", "--model", "m"),
                ("config.json", "'rope_scaling'"), (("m", _model_with(LLAMA_405B | {"rope_scaling": [1]})),)),
            Cli(f"{cmd}-model-no-config", (*base, "--device", "cpu", "--model", "m"), ("m", "config.json"),
                (("m/x.txt", "x"),)),
            Cli(f"{cmd}-model-unknown", (*base, "--model", "no-such-model"), ("--model 'no-such-model'",)),
            Cli(f"{cmd}-draft-huge", (*base, "--device", "cpu", "--speculative-config",
                                      '{"method": "draft_model", "model": "m", "num_speculative_tokens": 2}'),
                ("--speculative-config", "weights need"), (("m", _model_with(HUGE_CONFIG)),)),
            Cli(f"{cmd}-model-label-markup", (*base, "--model", "[/]"), ("--model '[/]'",)),
        ]
    cases += [  # the real model load: a damaged checkpoint is named before the warm-up
        Cli("run-damaged-safetensors", (*run, "--device", "cpu", "--model", "m"), ("model.safetensors", "damaged"),
            (("m", _model_with(None, weights=b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage" + b"\x00" * 64)),)),
        Cli("run-truncated-safetensors", (*run, "--device", "cpu", "--model", "m"), ("model.safetensors",),
            (("m", _model_with(None, weights=b"\xff" * 7)),)),
        Cli("run-index-escapes-folder", (*run, "--device", "cpu", "--model", "m"), ("weight_map", "plain file name"),
            (("m", _model_with(None, index={"weight_map": {"model.norm.weight": "../../../etc/passwd"}})),)),
        Cli("run-index-list", (*run, "--device", "cpu", "--model", "m"), ("index", "weight_map"),
            (("m", _model_with(None, index={"weight_map": [1]})),)),
        Cli("run-metrics-port-99999", (*run, "--metrics-port", "99999"), ("--metrics-port 99999", "65535")),
        Cli("run-metrics-port-0", (*run, "--metrics-port", "0"), ("--metrics-port 0",)),
        Cli("run-metrics-port-negative", (*run, "--metrics-port", "-5"), ("--metrics-port -5",)),
        Cli("run-metrics-host-words", (*run, "--metrics-port", "9464", "--metrics-host", "not a host"),
            ("--metrics-host 'not a host'",)),
        Cli("run-metrics-host-url", (*run, "--metrics-port", "9464", "--metrics-host", "http://x/"),
            ("--metrics-host 'http://x/'",)),
        Cli("run-metrics-host-without-port", (*run, "--metrics-host", "0.0.0.0"), ("--metrics-host", "--metrics-port")),
        Cli("run-metrics-host-foreign-ip", (*run, "--metrics-port", "9464", "--metrics-host", "203.0.113.9"),
            ("--metrics-port 9464 on 203.0.113.9", "cannot listen")),
        Cli("run-disagg-bad", (*run, "--disagg", "x:y"), ("--disagg",)),
        Cli("bench-huge-prompts", ("engine", "bench", "--num-prompts", "100000", "--input-len", "100000"),
            ("--num-prompts 100000",)),
    ]
    return cases


def _flag_cases() -> list[Cli]:
    sim = ("simulate", "-w", "lab-poisson", "-n", "3")
    rows = [  # (id, extra arguments, words): sizes, times and values out of range, by flag
        ("coarsening-1e9", ("--sim-block-coarsening", "1000000000"), ("--sim-block-coarsening", "64")),
        ("coarsening-65", ("--sim-block-coarsening", "65"), ("--sim-block-coarsening '65'",)),
        ("coarsening-negative", ("--sim-block-coarsening", "-1"), ("--sim-block-coarsening",)),
        ("coarsening-word", ("--sim-block-coarsening", "fast"), ("--sim-block-coarsening 'fast'",)),
        ("num-gpus-5000", ("--num-gpus", "5000"), ("--num-gpus 5000",)),
        ("num-gpus-20-digits", ("--num-gpus", "99999999999999999999"), ("--num-gpus",)),
        ("blocks-1e9", ("--num-gpu-blocks-override", "1000000000"), ("--num-gpu-blocks-override 1000000000",)),
        ("seqs-20-digits", ("--max-num-seqs", "99999999999999999999"), ("--max-num-seqs",)),
        ("budget-1T", ("--max-num-batched-tokens", "1T"), ("--max-num-batched-tokens",)),
        ("model-len-20-digits", ("--max-model-len", "99999999999999999999"), ("--max-model-len",)),
        ("util-0.005", ("--gpu-memory-utilization", "0.005"), ("--gpu-memory-utilization 0.005",)),
        ("util-nan", ("--gpu-memory-utilization", "nan"), ("--gpu-memory-utilization",)),
        ("util-inf", ("--gpu-memory-utilization", "inf"), ("--gpu-memory-utilization",)),
        ("block-size-1e9", ("--block-size", "1000000000"), ("--block-size 1000000000", "from 1 to 4096")),
        ("tp-1e6", ("-tp", "1000000"), ("-tp 1000000",)),
        ("disagg-huge", ("--disagg", "100000:100000"), ("--disagg",)),
        ("disagg-zero", ("--disagg", "0:1"), ("--disagg",)),
        ("link-nan", ("--disagg", "1:1", "--kv-link-gb-per-s", "nan"), ("--kv-link-gb-per-s",)),
        ("link-latency-inf", ("--disagg", "1:1", "--link-latency-ms", "inf"), ("--link-latency-ms",)),
        ("goodput-nan", ("--goodput", "ttft:nan"), ("--goodput",)),
        ("goodput-markup", ("--goodput", "[/]:5"), ("--goodput '[/]:5'",)),
        ("speedup-tiny", ("--speedup", "1e-300"), ("--speedup 1e-300", "1e+09 s")),
        ("rate-tiny", ("--rate", "1e-300"), ("--rate 1e-300",)),
        ("start-far-negative", ("--start-s", "-1e300"), ("--start-s",)),
        ("end-before-start", ("--start-s", "10", "--end-s", "5"), ("window",)),
        ("first-zero", ("--first", "0"), ("--first",)),
        ("requests-1e11", ("-n", "100000000000"), ("-n 100000000000",)),
        ("hash-block-huge", ("--hash-block-size", "100000000000"), ("--hash-block-size",)),
        ("max-prompt-len-zero", ("--max-prompt-len", "0"), ("--max-prompt-len",)),
        ("spec-config-deep", ("-sc", '{"a":' * 2000 + "1" + "}" * 2000), ("-sc",)),
        ("spec-config-list", ("--speculative-config", "[1, 2]"), ("--speculative-config",)),
        ("router-markup", ("--router", "[red]x"), ("--router '[red]x'",)),
        ("model-path", ("--model", "/etc/passwd"), ("--model '/etc/passwd'",)),
        ("gpu-unknown", ("--gpu", "nope"), ("--gpu 'nope'",)),
        ("profile-dir", ("--profile", "/"), ("cost profile '/'",)),
    ]
    cases = [Cli(f"simulate-{tid}", (*sim, *extra), words) for tid, extra, words in rows]
    advise = ("advise", "-w", "lab-poisson")
    cases += [Cli(f"advise-{tid}", (*advise, *extra), words) for tid, extra, words in (
        ("gpu-nope", ("--gpu", "nope"), ("--gpu 'nope'",)),
        ("model-nope", ("--model", "nope"), ("--model 'nope'",)),
        ("model-path", ("--model", "/etc"), ("--model '/etc'",)),
        ("num-gpus-0", ("--num-gpus", "0"), ("--num-gpus",)),
        ("num-gpus-65", ("--num-gpus", "65"), ("--num-gpus",)),
        ("slo-nan", ("--slo", "ttft_p99:nan"), ("--slo",)),
        ("slo-markup", ("--slo", "[/]"), ("--slo '[/]'",)),
        ("workers-0", ("--workers", "-1"), ("--workers",)),
        ("objective", ("--objective", "fastest"), ("--objective",)),
        ("budget", ("--budget", "forever"), ("--budget",)),
        ("profile-missing", ("--profile", "/nonexistent.json"), ("not found",)),
        ("workload-missing", ("-w", "/nonexistent/t.jsonl"), ("/nonexistent/t.jsonl",)),
        ("speedup-tiny", ("--speedup", "1e-300"), ("--speedup",)),
        ("requests-huge", ("--num-requests", "100000000000"), ("--num-requests",)),
    )]
    cases += [
        Cli("fit-rate-scale-inf", ("workload", "fit", "lab-poisson", "--rate-scale", "inf"), ("--rate-scale",)),
        Cli("fit-rate-scale-1e308", ("workload", "fit", "lab-poisson", "--rate-scale", "1e308"), ("--rate-scale",)),
        Cli("fit-rate-scale-1e6", ("workload", "fit", "lab-poisson", "--rate-scale", "1e6"), ("--rate-scale",)),
        Cli("fit-lengths-word", ("workload", "fit", "lab-poisson", "--lengths", "[/]"), ("--lengths",)),
        Cli("app-address-words", ("app", "--address", "not a host", "--headless"), ("--address 'not a host'",)),
        Cli("app-address-url", ("app", "--address", "http://0.0.0.0", "--headless"), ("--address",)),
        Cli("app-port-99999", ("app", "--port", "99999", "--headless"), ("--port",)),
        Cli("advise-one-request", ("advise", "-w", "t.jsonl"), ("t.jsonl", "three requests"),
            (("t.jsonl", TRACE.splitlines()[0] + "\n"),)),
        Cli("advise-all-at-once", ("advise", "-w", "t.jsonl", "--no-arrivals"), ("--no-arrivals",)),
    ]
    cases += [Cli(f"markup-{i}", args, words) for i, (args, words) in enumerate((
        (("workload", "describe", "[/]"), ("[/]",)),
        (("workload", "describe", "[bold]x.json"), ("[bold]x.json",)),
        (("simulate", "-w", "[/]"), ("[/]",)),
        (("workload", "fit", "[red]"), ("[red]",)),
        (("workload", "export", "[/]", "-o", "x.jsonl"), ("[/]",)),
    ))]
    ok = [  # accepted, printed as typed
        Cli("label-markup", (*sim, "--label", "[/]"), ("[/]",), code=0),
        Cli("label-markup-tags", (*sim, "--label", "[bold red]x[/]"), ("[bold red]x[/]",), code=0),
        Cli("spec-named-markup", ("workload", "describe", "s.json"), ("[/]",),
            (("s.json", _json(json.loads(SPEC) | {"name": "[/]"})),), code=0),
        Cli("file-named-markup", ("simulate", "-w", "[b]t.jsonl"), ("[b]t",), (("[b]t.jsonl", TRACE),), code=0),
        Cli("coarsening-64-warns", (*sim, "--sim-block-coarsening", "64"), ("warning", "coarser"), code=0),
    ]
    return cases + ok


ENGINE_CASES = _engine_cases()
FLAG_CASES = _flag_cases()


@pytest.mark.parametrize("case", ENGINE_CASES, ids=lambda c: c.id)
def test_hostile_engine_flags_and_model_folders(case, assets):
    pytest.importorskip("torch")
    run_cli(case, assets)


@pytest.mark.parametrize("case", FLAG_CASES, ids=lambda c: c.id)
def test_hostile_flags_and_options(case, assets):
    run_cli(case, assets)


# --------------------------------------------------------------------------- the Python API
def _req(i: int, t: Any, prompt: int = 32, block: int = 16) -> Request:
    return Request(i, t, prompt, 4, tuple(range(i * 100, i * 100 + -(-prompt // block))), block)


@pytest.fixture(scope="module")
def api_dir(tmp_path_factory, assets) -> Path:
    """Files the API cases name."""
    d = tmp_path_factory.mktemp("api")
    (d / "bomb.yaml").write_text(BILLION_LAUGHS)
    (d / "far.jsonl").write_text(FAR)
    _gzip_bomb(d / "bomb.jsonl.gz")
    (d / "list.json").write_text("[1, 2]")
    (d / "words.txt").write_text("user:x:0:0:root")
    (d / "nan.json").write_text(PROFILE_OK.replace("0.7", "NaN", 1))
    _run_with("run.json", "[1]")(d / "RUN-list")
    _run_with("summary.json", _summary(median_e2el_ms=1e9))(d / "RUN-impossible")
    _run_with("steps.jsonl", "[1]\n")(d / "RUN-steps")
    _model_with(HUGE_CONFIG)(d / "huge")
    _model_with(None, weights=b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage" + b"\x00" * 64)(d / "damaged")
    _model_with("[1]")(d / "config-list")
    return d


def _api_cases() -> list[tuple[str, Callable[[Path], Any], str]]:
    from advisor.advise import AdviseRequest
    from engine.core.config import EngineArgs
    from engine.core.input_files import load_yaml, read_json
    from engine.core.outputs import check_output_dir, check_output_file
    from engine.hf_config import spec_from_hf_config
    from engine.preflight import check_metrics_endpoint
    from sim.engine_runs import check_steps_file
    from sim.profile_files import load_profile
    from sim.run import SimConfig, run
    from sim.traces import load_trace
    from sim.validate import validate_run
    from sim.workload import Workload
    from sim.workload_source import SourceOptions, load_spec, load_workload

    nan, inf = math.nan, math.inf
    two = [_req(0, 0.0)]
    cases: list[tuple[str, Callable[[Path], Any], str]] = [
        *((f"run-arrival-{name}", (lambda d, t=t: run([*two, _req(1, t)], SimConfig())), "request 1 (item 1)")
          for name, t in (("nan", nan), ("inf", inf), ("-inf", -inf), ("negative", -1.0), ("1e300", 1e300),
                          ("string", "soon"), ("none", None), ("bool", True), ("2e9", 2e9))),
        ("run-arrival-numpy-nan", lambda d: run([*two, _req(1, __import__("numpy").float64("nan"))], SimConfig()),
         "arrival_s"),
        ("run-item-dict", lambda d: run([{"arrival_s": 0}], SimConfig()), "workload item 0"),
        ("run-int", lambda d: run(5, SimConfig()), "workload: a int"),
        ("run-bytes", lambda d: run(b"lab-poisson", SimConfig()), "workload: a bytes"),
        ("run-empty", lambda d: run([], SimConfig()), "no requests"),
        ("run-prompt-1e8", lambda d: run([_req(0, 0.0, 10**8, 10**8)], SimConfig()), "more than the 10,000,000"),
        ("run-missing-file", lambda d: run(str(d / "nope.jsonl"), SimConfig()), "nope.jsonl"),
        ("run-yaml-bomb", lambda d: run(str(d / "bomb.yaml"), SimConfig()), "aliases"),
        ("run-far-trace", lambda d: run(str(d / "far.jsonl"), SimConfig()), "1e+09 s"),
        ("run-gzip-bomb", lambda d: run(str(d / "bomb.jsonl.gz"), SimConfig()), "compression bomb"),
        ("run-profile-missing", lambda d: run(two, SimConfig(profile=str(d / "nope.json"))), "not found"),
        ("run-profile-list", lambda d: run(two, SimConfig(profile=str(d / "list.json"))), "JSON object"),
        ("run-profile-nan", lambda d: run(two, SimConfig(profile=str(d / "nan.json"))), "NaN"),
        ("run-speedup-tiny", lambda d: run("lab-poisson", SimConfig(), source=SourceOptions(speedup=1e-300)),
         "speedup"),
        ("simconfig-model", lambda d: SimConfig(model="/etc/passwd"), "unknown model"),
        ("simconfig-gpu", lambda d: SimConfig(gpu="../x"), "unknown GPU preset"),
        ("simconfig-coarsening", lambda d: SimConfig(kv_block_coarsening=10**9), "kv_block_coarsening"),
        ("simconfig-num-gpus", lambda d: SimConfig(num_gpus=10**6), "4096"),
        ("simconfig-seed", lambda d: SimConfig(seed=-1), "seed"),
        ("workload-from-requests-nan", lambda d: Workload.from_requests([_req(0, nan)]), "arrival_s"),
        ("workload-from-requests-inf", lambda d: Workload.from_requests([_req(0, inf)]), "arrival_s"),
        ("load-workload-far", lambda d: load_workload(str(d / "far.jsonl")), "1e+09 s"),
        ("load-workload-rate-tiny", lambda d: load_workload("lab-poisson", SourceOptions(rate_rps=1e-300)), "rate"),
        ("spec-from-file-bomb", lambda d: load_spec(d / "bomb.yaml"), "aliases"),
        ("load-trace-bomb", lambda d: load_trace(d / "bomb.jsonl.gz"), "compression bomb"),
        ("load-trace-dev-zero", lambda d: load_trace("/dev/zero"), "character device"),
        ("load-yaml-bomb", lambda d: load_yaml(BILLION_LAUGHS, "x.yaml"), "aliases"),
        ("read-json-list", lambda d: read_json(d / "list.json"), "JSON object"),
        ("read-json-dir", lambda d: read_json(d), "folder"),
        ("read-json-dev-zero", lambda d: read_json("/dev/zero"), "character device"),
        ("load-profile-list", lambda d: load_profile(str(d / "list.json")), "JSON object"),
        ("load-profile-not-json", lambda d: load_profile(str(d / "words.txt")), "not valid JSON"),
        ("advise-request-gpu", lambda d: AdviseRequest(gpu="x"), "unknown GPU preset"),
        ("advise-request-model", lambda d: AdviseRequest(model="x"), "unknown model"),
        ("advise-request-profile", lambda d: AdviseRequest(profile=str(d / "list.json")), "JSON object"),
        ("advise-request-gpus", lambda d: AdviseRequest(num_gpus=10**6), "64"),
        ("validate-run-json-list", lambda d: validate_run(d / "RUN-list"), "JSON object"),
        ("validate-impossible-summary", lambda d: validate_run(d / "RUN-impossible", "default"), "impossible"),
        ("check-steps-list-row", lambda d: check_steps_file(d / "RUN-steps" / "steps.jsonl"), "JSON object"),
        ("hf-config-list", lambda d: spec_from_hf_config([1]), "JSON object"),
        ("hf-config-strings", lambda d: spec_from_hf_config(LLAMA_405B | {"num_hidden_layers": "126"}),
         "num_hidden_layers"),
        ("engine-args-device", lambda d: EngineArgs(device="banana"), "device"),
        ("engine-args-block", lambda d: EngineArgs(block_size=10**9), "block_size"),
        ("metrics-port", lambda d: check_metrics_endpoint(99999, "127.0.0.1"), "65535"),
        ("metrics-host", lambda d: check_metrics_endpoint(9464, "a b"), "not an IP address"),
        ("output-is-input", lambda d: check_output_file(d / "list.json", flag="out", inputs=[d / "list.json"],
                                                        force=True), "is also the input"),
        ("output-inside-input", lambda d: check_output_dir(d / "RUN-list" / "x", flag="out",
                                                           inputs=[d / "RUN-list"], force=True), "inside the input"),
        ("output-holds-input", lambda d: check_output_dir(d, flag="out", inputs=[d / "list.json"], force=True),
         "holds the input"),
    ]
    try:
        import torch  # noqa: F401
    except ImportError:
        return cases
    from engine.llm import LLM
    from engine.loader import load_model

    cases += [
        ("llm-device", lambda d: LLM(model="tiny", device="banana"), "device"),
        ("llm-huge-model", lambda d: LLM(model=str(d / "huge"), device="cpu"), "weights need"),
        ("llm-config-list", lambda d: LLM(model=str(d / "config-list"), device="cpu"), "JSON object"),
        ("load-model-damaged", lambda d: load_model(d / "damaged"), "damaged"),
        ("load-model-huge", lambda d: load_model(d / "huge"), "weights need"),
    ]
    return cases


API_CASES = _api_cases()


@pytest.mark.parametrize("name, call, words", API_CASES, ids=[c[0] for c in API_CASES])
def test_hostile_api_calls(name, call, words, api_dir):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(Exception) as raised:
            call(api_dir)
    finally:
        wall = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    exc = raised.value
    assert is_input_error(exc), (name, type(exc).__name__, str(exc))
    assert words in str(exc), (name, str(exc))
    assert wall <= TIME_LIMIT_S and peak <= PEAK_LIMIT_BYTES, (name, wall, peak)
    _measured(wall, peak)
    SEEN.add(f"api:{name}")


# --------------------------------------------------------------------------- the dashboard's URL
SECRET = "costline-secret-3b1f"  # the content of a server file a link tries to reach


@pytest.fixture(scope="module")
def server_file(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("server")
    (d / "secret.json").write_text(json.dumps({"schema_version": 1, "name": SECRET}))
    (d / "secret.jsonl").write_text(SECRET + "\n")
    with gzip.open(d / "bomb.jsonl.gz", "wb", compresslevel=1) as f:  # what it inflates to is the point
        f.write(b"\0" * (64 << 20))
    return d


PATHS = ("{secret}", "/etc/passwd", "../../../../etc/passwd", "/proc/self/environ", "file:///etc/passwd",
         "~/.ssh/id_rsa", "sim/presets/chat-production.json", "./chat-production", "C:\\Windows\\win.ini",
         "{bomb}", "chat-production/../../README.md", "x" * 5000, "\x00", "")
NUMBERS = ("-1", "0", "512", "4097", "99999999999999999999", "nan", "inf", "1e400", "0x10", "1.5", "", "10000001")
FLAG_VALUES = ("-1", "99999999999999999999", "nan", "inf", "1e309", "abc", "0.005", "")


def _url_cases() -> list[tuple[str, dict[str, str], str]]:
    """(id, query parameters, the parameter a warning must name)."""
    from app.scenario import FLAGS, flag_param, pack_spec

    cases = []
    for field in ("workload", "profile", "model", "gpu", "router", "trace_format", "kv_link"):
        for i, value in enumerate(PATHS):
            cases.append((f"{field}-path-{i}", {field: value}, field))
    for field in ("num_gpus", "seed", "first"):
        for value in NUMBERS:
            if field != "num_gpus" and value in ("0", "512", "4097", "10000001") and not (field == "first" and
                                                                                     value in ("0", "10000001")):
                continue  # a valid seed or count, not a hostile one
            cases.append((f"{field}-{value[:12] or 'empty'}", {field: value}, field))
    for flag in FLAGS.values():
        for value in FLAG_VALUES if flag.type in (int, float) else ("maybe", "[/]", "{" * 500):
            if flag.type is float and value == "0.005" or flag.type is int and value in ("-1", "99999999999999999999",
                                                                                         "abc", "", "nan", "inf",
                                                                                         "1e309") or flag.type is float and value in ("-1", "nan", "inf", "1e309", "abc", "") or flag.type not in (int, float):
                pass
            else:
                continue
            if flag.name in ("long_prefill_token_threshold",) and value in ("99999999999999999999",):
                continue  # a threshold above every prompt only means "no cap": valid
            cases.append((f"flag-{flag.name}-{value[:8] or 'empty'}", {flag_param(flag): value}, flag_param(flag)))
    spec = json.loads(SPEC)
    cases += [
        ("budget-vs-seqs", {"max-num-batched-tokens": "8", "max-num-seqs": "16"}, "max-num-batched-tokens"),
        ("disagg-huge", {"disagg": "2048:2048"}, "disagg"),
        ("disagg-words", {"disagg": "lots"}, "disagg"),
        ("link-without-disagg", {"kv_link": "nvlink"}, "kv_link"),
        ("gpus-512", {"num_gpus": "512"}, "num_gpus"),
        ("gpus-512-70b", {"num_gpus": "512", "model": "llama-3.1-70b"}, "num_gpus"),
        ("tp-bad", {"tensor-parallel-size": "3"}, "tensor-parallel-size"),
        ("slo-negative", {"slo": "ttft:-1"}, "slo"),
        ("slo-markup", {"slo": "[x](http://e)"}, "slo"),
        ("unknown-key", {"colour": "blue"}, "colour"),
        ("unknown-markdown-key", {"[a](http://x)": "1"}, "a"),
        ("spec-garbage", {"spec": "!!!!"}, "spec"),
        ("spec-10M-requests", {"workload": "custom", "spec": pack_spec(json.dumps(spec | {"num_requests": 10**7}))},
         "spec"),
        ("spec-slow-arrivals", {"workload": "custom", "spec": pack_spec(json.dumps(
            spec | {"arrival": {"kind": "poisson", "rate_rps": 1e-12}}))}, "spec"),
        ("spec-nan", {"workload": "custom", "spec": _pack_raw('{"name": NaN}')}, "spec"),
        ("spec-long", {"spec": "A" * 200_000}, "spec"),
    ]
    return cases


def _zip_bomb() -> str:
    """A packed spec that inflates to 200 MB (~1-2 s to compress: made by its own test, not at collection)."""
    import base64
    import zlib

    return base64.urlsafe_b64encode(zlib.compress(b"{" + b" " * (200 << 20) + b"}", 9)).decode().rstrip("=")


def _pack_raw(text: str) -> str:
    import base64
    import zlib

    return base64.urlsafe_b64encode(zlib.compress(text.encode(), 9)).decode().rstrip("=")


URL_CASES = _url_cases()


@pytest.mark.parametrize("name, params, named", URL_CASES, ids=[c[0] for c in URL_CASES])
def test_hostile_dashboard_links(name, params, named, server_file):
    params = {k: v.format(secret=server_file / "secret.json", bomb=server_file / "bomb.jsonl.gz")
              if k in ("workload", "profile", "model", "gpu") else v for k, v in params.items()}
    _check_link(name, params, named)


def test_hostile_dashboard_zip_bomb_link():
    """A packed spec that inflates to 200 MB: a test of its own, so that making the bomb (seconds)
    happens when it runs, neither at every collection nor in the link cases above (which then stay
    fast enough for the development loop's `-m "not slow"`)."""
    _check_link("spec-zip-bomb", {"spec": _zip_bomb()}, "spec")


def _check_link(name: str, params: dict[str, str], named: str) -> None:
    from app.scenario import Scenario, deployment_problem, from_query_params
    from sim.builtin_traces import BUILTIN_TRACES
    from sim.profile_files import shipped_profiles
    from sim.workload_presets import preset_names

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        s, problems = from_query_params(params)
    finally:
        wall = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    text = " ".join(problems)
    assert any(named in p and "ignored" in p for p in problems), (name, problems)
    assert SECRET not in text and "root:" not in text, (name, text)  # nothing read from the server
    assert s.workload in (*preset_names(), *BUILTIN_TRACES, "custom", "upload")
    assert s.profile == "auto" or s.profile in shipped_profiles()
    assert deployment_problem(s) is None, (name, deployment_problem(s))  # what is left is simulated
    assert isinstance(s, Scenario)
    assert wall <= TIME_LIMIT_S and peak <= PEAK_LIMIT_BYTES, (name, wall, peak)
    _measured(wall, peak)
    SEEN.add(f"url:{name}")


@pytest.mark.parametrize("name, make, words", [
    ("upload-too-large", lambda: ("t.jsonl", b"0" * ((32 << 20) + 1)), "32 MB"),
    ("upload-gzip-bomb", lambda: ("t.jsonl.gz", gzip.compress(b"\0" * (80 << 20), 9)), "inflates to more than"),
    ("upload-truncated-gzip", lambda: ("t.jsonl.gz", gzip.compress(TRACE.encode())[:-12]), "gzip"),
])
def test_hostile_dashboard_uploads(name, make, words):
    from app.compute import UploadError, load_scenario_workload

    upload_name, data = make()
    tracemalloc.start()
    try:
        with pytest.raises(UploadError) as raised:
            load_scenario_workload("upload", None, None, 0, upload_name, data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert words in str(raised.value) and peak - len(data) <= PEAK_LIMIT_BYTES, (name, str(raised.value), peak)
    SEEN.add(f"upload:{name}")


def test_a_page_load_never_reads_or_exhausts_the_server(server_file):
    """The What-if page opened with links naming a server file, a traversal and an oversized
    deployment: each is warned about and ignored, the page runs the default scenario."""
    from streamlit.testing.v1 import AppTest

    main = str(Path(__file__).resolve().parents[2] / "app" / "main.py")
    at = AppTest.from_file(main, default_timeout=120)
    at.query_params.update({"workload": str(server_file / "secret.jsonl"), "profile": "../../../../etc/passwd",
                            "num_gpus": "512", "gpu-memory-utilization": "0.005", "seed": "99999999999999999999"})
    at.run()
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    for key in ("workload", "profile", "num_gpus", "gpu-memory-utilization", "seed"):
        assert key in warnings, (key, warnings)
    shown = " ".join(str(e.value) for e in (*at.error, *at.warning, *at.markdown, *at.caption))
    assert SECRET not in shown and "root:" not in shown
    assert at.metric and not at.error  # the default scenario ran
    SEEN.add("page:hostile-link")


def test_the_corpus_is_large_enough():
    """Runs last (file order): every family above contributed its cases, none reached the
    catch-all (each case checks that), and there are at least MIN_CASES of them."""
    families = {k.split(":")[0] for k in SEEN}
    assert {"cli", "api", "url", "upload", "page"} <= families, families
    assert len(SEEN) >= MIN_CASES, len(SEEN)
    counts = {f: sum(k.startswith(f + ":") for k in SEEN) for f in sorted(families)}
    print(f"\nhostile corpus: {len(SEEN)} inputs {counts} ('cli-accepted': bounded work, exit 0; every other "
          f"refused clearly); slowest {WORST['wall_s']:.2f} s, largest Python peak {WORST['peak_bytes'] / 2**20:.0f} MiB")


@pytest.mark.slow
@pytest.mark.parametrize("name, files, args", [
    ("405b-config-no-weights", (("m", _model_with(LLAMA_405B)),), ("engine", "run", "--model", "m", "--device", "cpu")),
    ("yaml-billion-laughs", (("s.yaml", BILLION_LAUGHS),), ("workload", "describe", "s.yaml")),
    ("gzip-bomb", (("b.jsonl.gz", _gzip_bomb),), ("simulate", "-w", "b.jsonl.gz")),
    ("three-years", (("y.jsonl", YEARS),), ("simulate", "-w", "y.jsonl")),
])
def test_whole_process_memory_stays_bounded(name, files, args, assets):
    """The process as a user runs it (torch, numpy and all): resident memory at most
    PEAK_LIMIT_BYTES and TIME_LIMIT_S, exit status 2 (or 0 for the bounded three-year trace)."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    argv = [*args, "--out", "out"] if args[0] == "engine" else list(args)
    # the process reports its own peak resident memory (VmHWM: getrusage's maxrss outlives exec)
    child = ("import atexit\n"
             "def peak():\n"
             "    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
             "    open('rss', 'w').write(hwm.split()[1])\n"
             "atexit.register(peak)\n"
             f"from costline.cli import main\nmain({argv!r})\n")
    with tempfile.TemporaryDirectory() as tmp:
        _place(Path(tmp), files, assets)
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", child], cwd=tmp, capture_output=True, text=True, timeout=60,
                             check=False, env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])})
        wall = time.perf_counter() - t0
        rss = int((Path(tmp) / "rss").read_text()) * 1024
    assert res.returncode == (0 if name == "three-years" else 2), res.stderr
    assert "unexpected" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert rss <= PEAK_LIMIT_BYTES, (name, rss)
    assert wall <= TIME_LIMIT_S + 5, (name, wall)  # + the interpreter's and torch's start-up


# --------------------------------------------------------------------------- generated inputs
def _url_keys() -> list[str]:
    from app.scenario import _SCALARS, FLAGS, flag_param

    return [*_SCALARS, "spec", *(flag_param(f) for f in FLAGS.values())]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.dictionaries(st.sampled_from(_url_keys()) | st.text(max_size=8),
                              st.text(max_size=30) | st.integers(-(10**30), 10**30).map(str)
                              | st.floats(allow_nan=True, allow_infinity=True).map(repr), max_size=4))
def test_any_link_gives_a_scenario_a_page_may_run(params):
    """Whatever a link holds, the page gets a scenario it may simulate, and a warning for each
    parameter it ignored; nothing raises."""
    from app.scenario import deployment_problem, from_query_params
    from sim.profile_files import shipped_profiles

    s, problems = from_query_params(params)
    assert deployment_problem(s) is None, (params, deployment_problem(s))
    assert s.profile == "auto" or s.profile in shipped_profiles()
    assert all(isinstance(p, str) and "ignored" in p for p in problems)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(times=st.lists(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**20), 10**20),
                      min_size=1, max_size=4))
def test_any_arrival_times_run_or_are_refused_at_the_boundary(times):
    """`sim.run.run` on any arrival times: a result whose summary is finite, or an input error
    naming the request, within the time limit (an infinite time used to never return)."""
    from sim.run import SimConfig, run

    reqs = [_req(i, t) for i, t in enumerate(times)]
    t0 = time.perf_counter()
    try:
        summary = run(reqs, SimConfig(model="llama-3.2-1b")).summary().to_json_dict()
    except ValueError as exc:
        assert is_input_error(exc) and "arrival_s" in str(exc), str(exc)
    else:
        assert all(0 <= t <= 1e9 for t in times)
        assert math.isfinite(summary["duration"]) and summary["completed"] == len(times)
    assert time.perf_counter() - t0 <= TIME_LIMIT_S
