"""The typed run summary (engine/core/summary_record.py): fields in, `vllm bench serve` keys out.

The key list below is what `costline simulate --json` printed before the summary became a record
(captured on main 2b5f903, same order); the record must write exactly it, with each key holding
the field it names, and read it back unchanged."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engine.core.run_summary import jsonable
from engine.core.summary_record import STAT_NAMES, LatencyStats, RunSummary
from sim.config import EngineConfig
from sim.metrics import SLO, load_summary
from sim.run import SimConfig, run
from sim.workload_source import SourceOptions

_LAT = [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el", "queue_time") for s in STAT_NAMES]
KEYS = (["date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
         "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
         "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
         "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests"] + _LAT
        + ["num_gpus", "num_replicas", "deployment", "goodput_slo", "request_goodput_per_gpu",
           "output_throughput_per_gpu", "rejected", "unfinished", "rejected_reasons", "unfinished_reasons",
           "num_preemptions", "prefix_cache_queries_tokens", "prefix_cache_hits_tokens", "prefix_cache_hit_rate",
           "prefill_tokens_computed", "gpu_busy_share", "cpu_share_of_step_time", "num_engine_steps",
           "async_scheduling", "speculative_config", "ready_s", "spec_decode_num_drafts",
           "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_acceptance_rate",
           "spec_decode_acceptance_length", "spec_decode_per_position_acceptance_rates", "mean_kv_transfer_ms",
           "kv_cache_usage_max", "num_gpu_blocks", "kv_block_coarsening", "profile", "profile_status",
           "profile_validation", "wall_s", "simulated_requests_per_wall_s", "vllm_args", "serve_command"])
CONFIG = SimConfig(gpu="a100-80gb", num_gpus=2, slo="ttft:300 tpot:40", seed=5,
                   engine=EngineConfig(max_num_seqs=32, enable_prefix_caching=False,
                                       speculative_config={"method": "ngram", "num_speculative_tokens": 3}))


@pytest.fixture(scope="module")
def result():
    return run("lab-poisson", CONFIG, source=SourceOptions(num_requests=60))


def test_the_json_keys_are_the_ones_written_before_the_record(result) -> None:
    assert list(result.summary().to_json_dict()) == KEYS


def test_each_key_holds_the_field_it_names(result) -> None:
    s = result.summary()
    d = s.to_json_dict()
    for metric in ("ttft", "tpot", "itl", "e2el", "queue_time"):
        stats = getattr(s, metric)
        assert isinstance(stats, LatencyStats)
        for stat in STAT_NAMES:
            assert d[f"{stat}_{metric}_ms"] == getattr(stats, f"{stat}_ms")
    assert d["duration"] == s.duration_s and d["model_id"] == d["tokenizer_id"] == s.model == "llama-3.1-8b"
    assert d["goodput_slo"] == {"ttft": 300.0, "tpot": 40.0} and s.slo == SLO(ttft_ms=300.0, tpot_ms=40.0)
    assert d["request_goodput"] == s.request_goodput and d["num_preemptions"] == s.num_preemptions
    assert s.ttft.median_ms == s.ttft.p50_ms  # vLLM writes both
    # the SLO's share, recomputed from the requests table
    done = result.requests["status"] == "finished"
    tpot_ms = np.nan_to_num(result.requests["tpot_s"]) * 1e3  # one-token outputs have no TPOT
    good = done & (result.requests["ttft_s"] * 1e3 <= 300) & (tpot_ms <= 40)
    assert s.slo_attainment == pytest.approx(good.sum() / len(done))


def test_the_record_reads_back_what_it_wrote(result, tmp_path) -> None:
    s = result.summary()
    text = json.dumps(jsonable(s.to_json_dict()))
    back = RunSummary.from_json_dict(json.loads(text))
    assert json.dumps(jsonable(back.to_json_dict())) == text
    assert back.slo == s.slo and back.ttft == s.ttft and back.duration_s == s.duration_s
    # the saved summary.json is the same one entry point (serve command included)
    saved = load_summary(result.save(tmp_path / "run")["summary"])
    assert {k: v for k, v in saved.items() if k != "date"} == {
        k: v for k, v in json.loads(text).items() if k != "date"}


def test_a_run_without_samples_has_nan_statistics() -> None:
    empty = LatencyStats()
    assert all(math.isnan(v) for v in empty.json_items("ttft").values())
    assert LatencyStats.from_json({"p99_ttft_ms": None, "mean_ttft_ms": 5.0}, "ttft").mean_ms == 5.0
