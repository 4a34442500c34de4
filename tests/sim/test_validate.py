"""`sim.validate`: an engine run folder replayed in the simulator and compared per metric.

The engine run is real: the CPU engine with the tiny model replays a small workload with every
request at t = 0 (no decision depends on the wall clock) and a run folder is written as the GPU
script writes it. The scheduler is shared, so every count (requests, tokens, preemptions,
prefix-cache hits, steps, KV blocks) must match exactly; times differ (a CPU against a simulated
H200) and are only checked for their arithmetic, on a constructed pair of summaries.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.replay import replay
from sim.traces import export_mooncake, load_mooncake
from sim.validate import (
    ERROR_METRICS,
    RunComparison,
    RunFolderError,
    ValidationReport,
    compare_summaries,
    relative_error,
    validate_run,
    verdict,
    was_fitted_on,
)
from sim.workload import Workload
from tests.sim.simhelpers import shared_prefix_requests

BLOCK = 4
FLAGS = {"block_size": BLOCK, "max_num_batched_tokens": 32, "max_num_seqs": 6, "max_model_len": 160,
         "enable_prefix_caching": True, "enable_chunked_prefill": True}
EXACT = ("completed", "rejected", "unfinished", "total_output_tokens", "num_preemptions",
         "prefix_cache_queries_tokens", "prefix_cache_hits_tokens", "prefix_cache_hit_rate", "num_engine_steps",
         "num_gpu_blocks")


def workload(n: int = 24, seed: int = 5) -> list[Request]:
    """Shared system prompts then unique blocks; one request too long to admit (simhelpers)."""
    return shared_prefix_requests(n, seed, BLOCK, arrival_gap_s=0.01)


def write_engine_run(folder: Path, num_gpu_blocks: int, name: str) -> Path:
    """What the GPU script writes: the engine's files, workload.jsonl, and run.json. The engine
    replays the requests as reloaded from workload.jsonl, as the script does."""
    folder.mkdir(parents=True)
    export_mooncake(Workload.from_requests(workload()), folder / "workload.jsonl")
    requests = load_mooncake(folder / "workload.jsonl", hash_block_size=BLOCK).requests
    args = EngineArgs(model="tiny", device="cpu", seed=0, num_gpu_blocks_override=num_gpu_blocks, **FLAGS)
    core = EngineCore(args)
    replay(core, requests, honor_arrivals=False).write_files(folder)
    info = {"schema": "costline-engine-run/1", "name": name, "purpose": "validation", "model": "tiny",
            "gpu": "h200", "engine_args": args.model_dump(), "hash_block_size": BLOCK, "honor_arrivals": False,
            "num_gpu_blocks": core.num_gpu_blocks, "memory": None, "engine_commit": "test",
            "date": "2026-12-01", "versions": {}, "description": "CPU engine, tiny model"}
    (folder / "run.json").write_text(json.dumps(info))
    return folder


@pytest.fixture(scope="module", params=[2000, 40], ids=["roomy", "tight"])
def compared(request, tmp_path_factory) -> RunComparison:
    folder = write_engine_run(tmp_path_factory.mktemp("runs") / "h200" / "tiny" / "validation" / "w",
                              request.param, name=f"tiny-{request.param}")
    return validate_run(folder, profile="default")


def test_counts_match_exactly_because_the_scheduler_is_shared(compared):
    for key in EXACT:
        m = compared.metric(key)
        assert m.engine is not None and m.engine == m.sim, key
    assert compared.metric("rejected").engine == 1  # the prompt longer than max_model_len
    assert compared.metric("prefix_cache_hits_tokens").engine > 0
    assert compared.verdict.preemptions_ok and compared.verdict.prefix_hit_rate_ok
    if compared.kv_blocks.engine == 40:
        assert compared.metric("num_preemptions").engine > 0  # the tight pool preempted


def test_kv_blocks_engine_simulated_and_own(compared):
    kv = compared.kv_blocks
    # both summaries report the pool (item 5 of issue 10): the engine's summary.json, the simulator's
    assert kv.engine == kv.simulated == compared.metric("num_gpu_blocks").sim == compared.metric("num_gpu_blocks").engine
    assert kv.sim_own == kv.engine  # the engine ran with an override: the simulator applies the same


def test_step_kinds_cover_every_step(compared):
    total = compared.metric("num_engine_steps").engine
    assert sum(k.engine_steps for k in compared.step_kinds) == total
    assert sum(k.sim_steps for k in compared.step_kinds) == total
    decode = compared.step_kinds[0]
    assert decode.kind == "decode-only, batch <= 16" and decode.engine_steps > 0


def test_report_json_round_trip(compared):
    report = ValidationReport(command="costline validate X", date="2026-12-01", profiles=["default"],
                              fitted_runs={"default": []}, runs=[compared])
    again = ValidationReport.from_json(report.to_json())
    assert again == report


def test_error_arithmetic_on_constructed_summaries():
    engine = {k: 10.0 for k in ERROR_METRICS} | {"p99_ttft_ms": 200.0, "num_preemptions": 40,
                                                 "prefix_cache_hit_rate": 0.400}
    sim = {k: 10.4 for k in ERROR_METRICS} | {"mean_ttft_ms": 7.0, "p99_ttft_ms": 225.0, "num_preemptions": 42,
                                              "prefix_cache_hit_rate": 0.409}
    metrics = compare_summaries(engine, sim)
    by = {m.metric: m for m in metrics}
    assert by["mean_ttft_ms"].error == pytest.approx(-0.3)
    assert by["p99_ttft_ms"].error == pytest.approx(0.125)
    assert by["output_throughput"].error == pytest.approx(0.04)
    v = verdict(metrics)
    # 18 metrics: 16 at +4%, one at -30%, one at +12.5%: the median is 4%
    assert v.median_abs_error == pytest.approx(0.04)
    assert v.max_p99_abs_error == pytest.approx(0.125)
    assert v.preemptions_ok and v.prefix_hit_rate_ok  # +2 of 40 (5%), 0.9 points
    assert not v.passed and v.failures == ["p99_ttft_ms |error| 12.5% > 10%"]
    worse = verdict(compare_summaries(engine, sim | {"num_preemptions": 43, "prefix_cache_hit_rate": 0.411}))
    assert not worse.preemptions_ok and not worse.prefix_hit_rate_ok


@pytest.mark.parametrize(("engine", "sim", "want"), [(100.0, 90.0, -0.1), (0.0, 0.0, 0.0), (0.0, 1.0, None),
                                                     (None, 1.0, None), (4.0, math.nan, None)])
def test_relative_error(engine, sim, want):
    got = relative_error(engine, sim)
    assert got == (pytest.approx(want) if want is not None else None)


def test_a_missing_run_json_field_is_named(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"schema": "costline-engine-run/1", "name": "x", "model": "tiny",
                                                   "gpu": "h200", "engine_args": {}, "hash_block_size": 4,
                                                   "honor_arrivals": False}))
    with pytest.raises(RunFolderError, match=r"run.json: field 'num_gpu_blocks' is missing"):
        validate_run(tmp_path)


def test_fitted_runs_match_on_model_purpose_and_name(tmp_path):
    run = tmp_path / "h200" / "llama-3.1-8b" / "validation" / "conv"
    assert was_fitted_on(run, ["/data/h200/llama-3.1-8b/validation/conv"]) is not None
    assert was_fitted_on(run, ["/data/h200/llama-3.1-8b/sweep/conv"]) is None
    assert was_fitted_on(run, ["llama-3.2-1b/validation/conv"]) is None
    # calibrate's provenance lists run.json names
    assert was_fitted_on(run, ["decode-b1", "conv-sweep"], run_name="conv-sweep") == "conv-sweep"
    assert was_fitted_on(run, ["decode-b1", "conv-sweep"], run_name="conv-held-out") is None


def test_profile_names_with_dots_load_by_name():
    from sim.cost_model import CostProfile
    from sim.validate import profile_path, resolve_profile

    name = resolve_profile("auto", "llama-3.1-8b", "h200")
    assert name == "h200-llama-3.1-8b" and profile_path(name).is_file()
    assert CostProfile.load(name).model == "llama-3.1-8b"


def test_both_finished_latencies_by_hand():
    """Requests 0-3; the engine finished 0, 1, 2 and the simulator 0, 2, 3: the figures cover 0 and 2 on each
    side, from each side's own columns."""
    import numpy as np

    from sim.validate import both_finished_latencies

    eng = {"request_id": np.array([0, 1, 2, 3.0]), "status": np.array(["finished", "finished", "finished", "unfinished"],
                                                                   dtype=object),
           "ttft_s": np.array([0.1, 0.2, 0.3, np.nan]), "tpot_s": np.array([0.01, 0.02, np.nan, np.nan]),
           "e2e_s": np.array([1.0, 2.0, 3.0, np.nan])}
    sim = {"request_id": np.array([3, 2, 1, 0]), "status": np.array(["finished", "finished", "unfinished", "finished"],
                                                                    dtype=object),
           "ttft_s": np.array([0.9, 0.5, np.nan, 0.3]), "tpot_s": np.array([0.03, 0.04, np.nan, 0.02]),
           "e2e_s": np.array([9.0, 5.0, np.nan, 3.0])}
    e, s, basis = both_finished_latencies(eng, sim)
    assert e["mean_ttft_ms"] == pytest.approx(200.0) and s["mean_ttft_ms"] == pytest.approx(400.0)
    assert e["mean_tpot_ms"] == pytest.approx(10.0) and s["mean_tpot_ms"] == pytest.approx(30.0)  # NaN TPOT left out
    assert e["p99_e2el_ms"] == pytest.approx(np.percentile([1000.0, 3000.0], 99))
    assert s["median_e2el_ms"] == pytest.approx(4000.0)
    assert basis == "TTFT, TPOT and e2e over the 2 requests both finished (the engine finished 3, the simulator 3)"
