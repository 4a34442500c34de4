"""`costline validate`: run folders in, a table per workload and validation.{md,json} out; bad
input ends as one line naming the folder, file or field (exit 2); outputs are never replaced
without --force; a run the profile was fitted on is refused. Also `simulate --max-prompt-len`,
which shares its prompt capping with `engine run`.

The "engine" run here is written from a simulator run (no torch needed): replaying it in the
simulator with the same profile must then give every metric exactly, which proves the run folder's
requests, flags and KV blocks reach the simulator unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from costline.cli import app
from engine.core.request import Request
from engine.core.run_summary import jsonable
from sim.config import EngineConfig
from sim.cost_model import PROFILES_DIR, CostProfile
from sim.run import SimConfig, run
from sim.traces import export_mooncake, load_mooncake
from sim.validate import ERROR_METRICS, ValidationReport
from sim.workload import Workload
from sim.workload_source import cap_prompt_lengths

runner = CliRunner()
BLOCK = 16
ENGINE_ARGS = {"model": "llama-3.2-1b", "block_size": BLOCK, "max_num_batched_tokens": 512, "max_num_seqs": 16,
               "max_model_len": 4096, "enable_prefix_caching": True, "enable_chunked_prefill": True,
               "async_scheduling": True, "gpu_memory_utilization": 0.9, "num_gpu_blocks_override": None,
               "usage_context": "api_server", "device": "cuda", "attention_backend": "auto"}
NUM_GPU_BLOCKS = 300  # what "the engine" allocated: tight, so requests queue and get preempted


def requests(n: int = 40) -> list[Request]:
    """Poisson arrivals, a shared 8-block system prompt, prompts of 200-1200 tokens."""
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.exponential(0.02, n))
    out, next_id = [], 10**6
    for i in range(n):
        prompt = int(rng.integers(200, 1200))
        blocks = -(-prompt // BLOCK)
        own = tuple(range(next_id, next_id + blocks - 8))
        next_id += len(own)
        out.append(Request(i, float(t[i]), prompt, int(rng.integers(20, 200)), tuple(range(8)) + own, BLOCK))
    return out


def write_run(folder: Path, name: str = "sim-as-engine", purpose: str = "validation", until_s: float | None = None,
              **engine_args) -> Path:
    """A run folder in the GPU script's format, its tables and summary from a simulator run
    (`engine_args`: flags other than ENGINE_ARGS'; `until_s`: cut short there, as a wall-time cap does)."""
    folder.mkdir(parents=True)
    export_mooncake(Workload.from_requests(requests()), folder / "workload.jsonl")
    reqs = load_mooncake(folder / "workload.jsonl", hash_block_size=BLOCK).requests
    args = ENGINE_ARGS | engine_args
    flags = {k: v for k, v in args.items() if k not in ("model", "usage_context", "device", "attention_backend")}
    cfg = EngineConfig(**flags | {"num_gpu_blocks_override": NUM_GPU_BLOCKS, "attention_backend": "costline"})
    # stepped (no skip-ahead), as an engine trace is: one row per step, each with its GPU time
    res = run(reqs, SimConfig(model="llama-3.2-1b", gpu="h200", engine=cfg, profile="default", skip_ahead=False),
              until_s=until_s)
    (folder / "summary.json").write_text(json.dumps(jsonable(res.summary().to_json_dict())))
    steps = res.steps
    rows = zip(*(steps[c].tolist() for c in steps))
    (folder / "steps.jsonl").write_text("".join(json.dumps(jsonable(dict(zip(steps, r)))) + "\n" for r in rows))
    req_rows = zip(*(res.requests[c].tolist() for c in res.requests))
    (folder / "requests.jsonl").write_text("".join(json.dumps(jsonable(dict(zip(res.requests, r)))) + "\n"
                                                   for r in req_rows))
    info = {"schema": "costline-engine-run/1", "name": name, "purpose": purpose, "model": "llama-3.2-1b",
            "gpu": "h200", "engine_args": args, "hash_block_size": BLOCK, "honor_arrivals": True,
            "num_gpu_blocks": NUM_GPU_BLOCKS, "memory": {}, "engine_commit": "x", "date": "2026-12-01",
            "versions": {}, "description": "simulator output posing as an engine run",
            **({"wall_s": until_s} if until_s else {})}
    (folder / "run.json").write_text(json.dumps(info))
    return folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("gpudata") / "h200" / "llama-3.2-1b" / "validation" / "conv")


def test_a_simulated_run_validates_exactly_and_writes_the_report(run_dir, tmp_path):
    out = tmp_path / "report"
    res = runner.invoke(app, ["validate", str(run_dir), "--profile", "default", "--out", str(out)],
                        terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "PASS" in res.output and "sim-as-engine" in res.output
    report = ValidationReport.from_json((out / "validation.json").read_text())
    (r,) = report.runs
    assert r.kv_blocks.engine == r.kv_blocks.simulated == NUM_GPU_BLOCKS
    assert r.metric("num_preemptions").engine > 0  # the tight pool preempted: the check is not vacuous
    for key in ERROR_METRICS:
        m = r.metric(key)
        assert m.engine is not None and m.sim == pytest.approx(m.engine, rel=1e-9), key
    assert r.verdict.passed and r.verdict.median_abs_error == pytest.approx(0, abs=1e-9)
    assert all(k.sim_steps == k.engine_steps for k in r.step_kinds)
    # the cost model on "the engine's" steps gives back their times: the same model timed them
    timed = [k for k in r.step_kinds if k.engine_steps]
    assert len(timed) >= 2 and all(k.model_gpu_error == pytest.approx(0, abs=1e-9) for k in timed)
    assert all(k.gpu_error == pytest.approx(0, abs=1e-9) for k in timed)  # skip-ahead rows sum to the steps
    md = (out / "validation.md").read_text()
    assert report.command in md and "| TTFT p99 |" in md
    assert report.command.startswith("costline validate ") and "--profile default" in report.command


def test_a_run_cut_short_is_simulated_to_the_same_time(tmp_path):
    """An engine run stopped by its wall-time cap (requests unfinished) is compared with a
    simulation stopped at the end of the engine's last step, not with one that served everything."""
    cut = write_run(tmp_path / "cut", "cut-short", until_s=0.5)
    res = runner.invoke(app, ["validate", str(cut), "--profile", "default", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    (r,) = ValidationReport.from_json((tmp_path / "r" / "validation.json").read_text()).runs
    assert r.metric("unfinished").engine == r.metric("unfinished").sim > 0
    assert r.metric("completed").sim == r.metric("completed").engine > 0
    for key in ERROR_METRICS:
        m = r.metric(key)
        assert m.sim == pytest.approx(m.engine, rel=1e-9), key


def _unfinish_last(folder: Path, n: int) -> None:
    """The engine run in `folder` as if its cap had caught its last `n` finished requests unfinished: those rows
    marked unfinished, the summary's counts and TTFT / TPOT / e2e over the rest (as the engine's summary is)."""
    from engine.core.run_summary import latency_stats

    rows = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    done = sorted((r for r in rows if r["status"] == "finished"), key=lambda r: r["finish_s"])
    for r in done[-n:]:
        r["status"] = "unfinished"
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((folder / "summary.json").read_text())
    summary["unfinished"] += n
    summary["completed"] -= n
    summary["total_output_tokens"] -= sum(r["num_output_tokens"] for r in done[-n:])
    summary["total_input_tokens"] -= sum(r["prompt_len"] for r in done[-n:])
    for rate, count in (("request_throughput", "completed"), ("output_throughput", "total_output_tokens")):
        summary[rate] = summary[count] / summary["duration"]
    left = [r for r in rows if r["status"] == "finished"]
    for name, col in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2el", "e2e_s")):
        summary |= latency_stats(np.array([r[col] for r in left if r[col] is not None])).json_items(name)
    (folder / "summary.json").write_text(json.dumps(jsonable(summary)))


def test_a_cut_run_whose_backlogs_differ_compares_the_requests_both_finished(tmp_path):
    """The engine's cap caught one request more than the simulator's: its figures leave that request out, so
    TTFT / TPOT / e2e are compared over the requests both finished (the same simulation: exact) and the run
    passes; three more is beyond the tolerance and fails, naming the counts."""
    for extra, passes in ((1, True), (3, False)):
        cut = write_run(tmp_path / f"cut{extra}", "cut-short", until_s=0.5)
        _unfinish_last(cut, extra)
        out = tmp_path / f"r{extra}"
        res = runner.invoke(app, ["validate", str(cut), "--profile", "default", "--out", str(out)])
        assert res.exit_code == 0, res.output
        (r,) = ValidationReport.from_json((out / "validation.json").read_text()).runs
        assert r.metric("unfinished").engine == r.metric("unfinished").sim + extra
        done = int(r.metric("completed").engine)
        assert r.latency_basis.startswith(f"TTFT, TPOT and e2e over the {done} requests both finished")
        for key in ERROR_METRICS:
            if key.split("_")[1] in ("ttft", "tpot", "e2el"):
                assert r.metric(key).error == pytest.approx(0, abs=1e-9), key
        assert r.verdict.passed is passes
        u = r.metric("unfinished")
        assert passes or any("backlogs differ" in f and f"engine {u.engine:g} vs sim {u.sim:g}" in f
                             for f in r.verdict.failures), r.verdict.failures
        assert r.latency_basis in (out / "validation.md").read_text()
    # without the engine's request table the two sides' figures cannot be put on the same requests: a failure
    (tmp_path / "cut1" / "requests.jsonl").unlink()
    res = runner.invoke(app, ["validate", str(tmp_path / "cut1"), "--profile", "default", "--out", str(tmp_path / "r0")])
    (r,) = ValidationReport.from_json((tmp_path / "r0" / "validation.json").read_text()).runs
    assert r.latency_basis is None and not r.verdict.passed
    assert any("no requests.jsonl" in f for f in r.verdict.failures), r.verdict.failures


def test_an_existing_report_needs_force(run_dir, tmp_path):
    (tmp_path / "validation.json").write_text("{}")
    res = runner.invoke(app, ["validate", str(run_dir), "--profile", "default", "--out", str(tmp_path)],
                        terminal_width=300)
    assert res.exit_code == 2 and "validation" in res.output and "--force" in res.output, res.output
    assert (tmp_path / "validation.json").read_text() == "{}"


def test_bad_folder_is_named(tmp_path):
    res = runner.invoke(app, ["validate", str(tmp_path / "nope")], terminal_width=300)
    assert res.exit_code == 2 and "nope: not a folder" in res.output and "Traceback" not in res.output
    empty = tmp_path / "empty"
    empty.mkdir()
    res = runner.invoke(app, ["validate", str(empty)], terminal_width=300)
    assert res.exit_code == 2 and "empty: no run.json" in res.output


@pytest.mark.parametrize("field", ["num_gpu_blocks", "engine_args", "hash_block_size"])
def test_a_missing_run_json_field_is_named(run_dir, tmp_path, field):
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad)
    info = json.loads((bad / "run.json").read_text())
    del info[field]
    (bad / "run.json").write_text(json.dumps(info))
    res = runner.invoke(app, ["validate", str(bad)], terminal_width=300)
    assert res.exit_code == 2 and f"run.json: field '{field}' is missing" in res.output, res.output


def test_a_run_the_profile_was_fitted_on_is_refused(run_dir, tmp_path):
    profile = json.loads((PROFILES_DIR / "default.json").read_text())
    profile["provenance"] = {"runs": ["gpudata/h200/llama-3.2-1b/validation/conv"]}
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(profile))
    res = runner.invoke(app, ["validate", str(run_dir), "--profile", str(path)], terminal_width=300)
    assert res.exit_code == 2 and "was fitted on this run" in res.output and "--allow-fitted" in res.output


def test_simulate_caps_prompts_as_engine_run_does(tmp_path):
    trace = tmp_path / "t.jsonl"
    export_mooncake(Workload.from_requests(requests(6)), trace)
    res = runner.invoke(app, ["simulate", "-w", str(trace), "--model", "llama-3.2-1b", "--max-prompt-len", "300",
                              "--no-arrivals", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    want = cap_prompt_lengths(load_mooncake(trace).requests, 300)
    assert summary["total_input_tokens"] == sum(r.prompt_len for r in want) == sum(
        min(r.prompt_len, 300) for r in requests(6))
    assert summary["request_rate"] == "inf"  # every request at t=0
    capped = want[0]
    assert len(capped.hash_ids) == 300 // BLOCK + 1 and capped.hash_ids == requests(6)[0].hash_ids[:19]


def test_a_step_trace_missing_a_column_is_named(run_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad)
    lines = (bad / "steps.jsonl").read_text().splitlines()
    row = json.loads(lines[2])
    del row["num_decode_seqs"]
    lines[2] = json.dumps(row)
    (bad / "steps.jsonl").write_text("\n".join(lines) + "\n")
    res = runner.invoke(app, ["validate", str(bad), "--profile", "default"], terminal_width=300)
    assert res.exit_code == 2 and "steps.jsonl, line 3: field 'num_decode_seqs' is missing" in res.output, res.output


def test_write_profile_validation_stores_the_summary_in_the_profile(run_dir, tmp_path):
    fitted, first_principles = tmp_path / "fitted.json", tmp_path / "fp.json"
    shutil.copy(PROFILES_DIR / "h200-llama-3.2-1b.json", fitted)
    shutil.copy(PROFILES_DIR / "default.json", first_principles)
    res = runner.invoke(app, ["validate", str(run_dir), "--profile", str(fitted), "--profile", str(first_principles),
                              "--write-profile-validation", "--out", str(tmp_path / "report")], terminal_width=300)
    assert res.exit_code == 0, res.output
    stored = json.loads(fitted.read_text())["validation"]
    report = ValidationReport.from_json((tmp_path / "report" / "validation.json").read_text())
    (mine,) = [r for r in report.runs if r.profile == str(fitted)]
    assert stored["runs"] == ["sim-as-engine"] and stored["runs_passed"] == ([mine.name] if mine.verdict.passed else [])
    assert stored["median_abs_error"] == pytest.approx(mine.verdict.median_abs_error)
    assert stored["worst_p99_abs_error"] == pytest.approx(mine.verdict.max_p99_abs_error)
    by_metric = stored["median_abs_error_by_metric"]
    assert set(by_metric) == set(ERROR_METRICS)
    assert by_metric["mean_ttft_ms"] == pytest.approx(abs(mine.metric("mean_ttft_ms").error))
    assert CostProfile.load(fitted).status == "validated"
    # a first-principles profile is not marked validated
    assert json.loads(first_principles.read_text()).get("validation") is None
    assert "not stored in" in res.output


def test_simulate_quotes_the_profile_validation():
    from advisor.commands.simulate import validation_note

    note = validation_note({"median_abs_error": 0.131, "worst_p99_abs_error": 0.363, "runs": ["a", "b", "c"],
                            "runs_passed": ["c"]})
    assert note == (": median |error| 13.1% over 3 held-out engine runs, worst p99 36.3%; 1 of 3 within "
                    "issue 10's targets (docs/validation.md)")
    assert validation_note(None) == ""
