"""One workload through the real engine (CPU, tiny model) and through the simulator with the same
scheduler configuration: the same tables, the same summary keys, the same metric set, and the
same scheduling decisions step by step (batch composition, preemptions, prefix-cache hits).

All requests arrive at t = 0 on both sides, so no decision can depend on the engine's wall clock;
the engine runs synchronously (its async path overlaps steps, which the simulator models as time,
not as a different decision). Prompts (20-90 tokens) exceed the 32-token budget, so prefills are
chunked; three shared system prompts make prefix hits; the `tight` variant's 40-block pool forces
preemption.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine.core.config import EngineArgs
from engine.core.model_spec import get_model
from engine.core.records import REQUEST_COLUMNS, STEP_COLUMNS
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.metrics import EngineMetrics
from engine.replay import replay
from sim.calibrate import RECONSTRUCTED_STEPS_FILE, load_run, reschedule
from sim.config import DeploymentConfig, EngineConfig
from sim.hardware import get_gpu
from sim.simulator import Simulation
from tests.sim.simhelpers import shared_prefix_requests
from tests.sim.step_rows import expand_step_rows

BLOCK = 4
FLAGS = {"block_size": BLOCK, "max_num_batched_tokens": 32, "max_num_seqs": 6, "max_model_len": 160,
             "enable_prefix_caching": True, "enable_chunked_prefill": True}
# what the scheduler decided, per step: every column but timings
DECISION_COLUMNS = ("step_id", "num_batched_tokens", "num_prefill_tokens", "num_prefill_seqs",
                    "sum_prefill_context", "prefill_attn_pairs", "num_decode_tokens", "num_decode_seqs",
                    "sum_decode_context", "max_decode_context", "num_spec_tokens", "num_blocks_allocated",
                    "num_blocks_hashed", "num_preempted", "num_output_tokens", "num_running", "num_waiting", "kv_usage")
REQUEST_DECISIONS = ("request_id", "status", "finish_reason", "prompt_len", "output_len", "num_output_tokens",
                     "num_cached_tokens", "num_preemptions")


def workload(n: int = 28, seed: int = 3) -> list[Request]:
    """Shared system prompts then unique blocks; one request too long to admit (simhelpers)."""
    return shared_prefix_requests(n, seed, BLOCK, arrival_gap_s=0.0)


def _engine(reqs, num_gpu_blocks):
    core = EngineCore(EngineArgs(model="tiny", device="cpu", seed=0, num_gpu_blocks_override=num_gpu_blocks,
                                 **FLAGS))
    live = EngineMetrics("tiny", FLAGS["max_model_len"])
    res = replay(core, reqs, honor_arrivals=False, metrics=live)
    res.live_metrics = live
    return core, res


def _sim(reqs, num_gpu_blocks, skip_ahead):
    dep = DeploymentConfig(model=get_model("tiny"), gpu=get_gpu("h200"),
                           engine=EngineConfig(num_gpu_blocks_override=num_gpu_blocks,
                                               attention_backend="costline", **FLAGS))
    sim = Simulation(dep, reqs, skip_ahead=skip_ahead)
    return sim, sim.run()


@pytest.fixture(scope="module", params=[2000, 40], ids=["roomy", "tight"])
def runs(request):
    reqs = workload()
    core, eng = _engine(reqs, request.param)
    sim, stepped = _sim(reqs, request.param, skip_ahead=False)
    _, skipped = _sim(reqs, request.param, skip_ahead=True)
    return request.param, core, sim, eng, stepped, skipped


def _metric_names(text: str) -> set[str]:
    return {fam.name for fam in text_string_to_metric_families(text)} - _created(text)


def _created(text: str) -> set[str]:
    """prometheus_client's creation-time series of a live exporter (wall clock, not a run figure)."""
    return {fam.name for fam in text_string_to_metric_families(text) if fam.name.endswith("_created")}


def _samples(text: str) -> dict[tuple, float]:
    return {(x.name, tuple(sorted(x.labels.items()))): x.value for fam in text_string_to_metric_families(text)
            for x in fam.samples if not x.name.endswith("_created")}


def test_same_scheduler_configuration(runs):
    _, core, sim, *_ = runs
    assert core.scheduler.config == sim.replicas[0].sched.config


def test_same_columns_summary_keys_and_metric_set(runs):
    *_, eng, stepped, skipped = runs
    for res in (eng, stepped, skipped):
        assert tuple(res.requests) == REQUEST_COLUMNS and tuple(res.steps) == STEP_COLUMNS
    assert set(eng.summary().to_json_dict()) == set(stepped.summary().to_json_dict()) == set(skipped.summary().to_json_dict())
    assert _metric_names(eng.prometheus_text()) == _metric_names(stepped.prometheus_text())
    # the engine's live exporter (a running server's /metrics) has the same metric set
    live, table = _samples(generate_latest(eng.live_metrics.registry).decode()), _samples(eng.prometheus_text())
    assert set(live) == set(table)
    for key, value in table.items():
        assert live[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_same_decisions_step_by_step(runs):
    blocks, _, _, eng, stepped, _ = runs
    assert eng.steps["step_id"].size == stepped.steps["step_id"].size > 20
    for c in DECISION_COLUMNS:
        np.testing.assert_array_equal(eng.steps[c], stepped.steps[c], err_msg=c)
    assert eng.steps["num_prefill_seqs"].max() >= 2  # chunks of several prompts share a step
    if blocks == 40:
        assert eng.steps["num_preempted"].sum() > 0  # the tight pool preempted


def test_same_outcome_per_request(runs):
    *_, eng, stepped, skipped = runs
    for c in REQUEST_DECISIONS:
        np.testing.assert_array_equal(eng.requests[c], stepped.requests[c], err_msg=c)
        np.testing.assert_array_equal(stepped.requests[c], skipped.requests[c], err_msg=c)
    r = eng.requests
    assert (r["num_cached_tokens"] > 0).sum() >= 10  # shared system prompts hit
    assert list(r["status"]).count("rejected") == 1
    s_eng, s_sim = eng.summary().to_json_dict(), stepped.summary().to_json_dict()
    for key in ("completed", "rejected", "total_output_tokens", "num_preemptions", "prefix_cache_queries_tokens",
                "prefix_cache_hits_tokens", "num_engine_steps", "prefill_tokens_computed"):
        assert s_eng[key] == s_sim[key], key


def test_skip_rows_expand_to_the_stepped_compositions(runs):
    *_, stepped, skipped = runs
    assert skipped.steps["n_steps"].max() > 1  # it did skip
    one = expand_step_rows(skipped.steps)
    totals, gauges = ("num_blocks_allocated", "num_blocks_hashed"), ("num_running", "num_waiting", "kv_usage")
    per_step = [c for c in DECISION_COLUMNS if c not in totals + gauges]
    for c in per_step:
        np.testing.assert_array_equal(one[c], stepped.steps[c], err_msg=c)
    for c in totals:  # whole-row totals
        assert skipped.steps[c].sum() == stepped.steps[c].sum(), c
    last = np.cumsum(skipped.steps["n_steps"]) - 1  # gauges: after each row's last step
    for c in gauges:
        np.testing.assert_array_equal(skipped.steps[c], stepped.steps[c][last], err_msg=c)


def _run_folder(folder, core, eng, reqs):
    """The engine run as `benchmarks/calibration/gpu_sweep.py` writes it (run.json, workload.jsonl)."""
    eng.write_files(folder)
    (folder / "run.json").write_text(json.dumps({
        "name": "crosscheck", "engine_args": core.config.model_dump(mode="json"), "hash_block_size": BLOCK,
        "honor_arrivals": False, "num_gpu_blocks": core.num_gpu_blocks}))
    (folder / "workload.jsonl").write_text("".join(json.dumps(
        {"timestamp": 0, "input_length": r.prompt_len, "output_length": r.output_len, "hash_ids": list(r.hash_ids)})
        + "\n" for r in reqs))


def test_reschedule_reproduces_the_engine_run(runs, tmp_path):
    """A trace without max_decode_context gets it back by re-running the scheduler on the run's requests:
    every step's composition equal to the engine's, the column equal to what the engine recorded."""
    _, core, _, eng, _, _ = runs
    _run_folder(tmp_path, core, eng, workload())
    r = reschedule(tmp_path)
    assert r.exact and len(r.steps) == eng.steps["step_id"].size
    got = [s["max_decode_context"] for s in r.steps]
    np.testing.assert_array_equal(got, eng.steps["max_decode_context"])
    assert max(got) > 0
    # the folder's trace without the column: calibrate reads it back from the reconstruction file
    rows = [{k: v for k, v in json.loads(line).items() if k != "max_decode_context"}
            for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert not load_run(tmp_path).steps["max_decode_context"].any()
    (tmp_path / RECONSTRUCTED_STEPS_FILE).write_text("".join(
        json.dumps({"step_id": s["step_id"], "max_decode_context": s["max_decode_context"]}) + "\n" for s in r.steps))
    np.testing.assert_array_equal(load_run(tmp_path).steps["max_decode_context"], eng.steps["max_decode_context"])
