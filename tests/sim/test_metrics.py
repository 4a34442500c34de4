"""Metrics: aggregates against hand computation, vLLM names and buckets, files, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim.metrics import (
    SLO,
    STEP_COLUMNS,
    SimResult,
    load_summary,
    weighted_percentiles,
)
from sim.simulator import simulate
from tests.sim.simhelpers import deployment, poisson


def _result() -> SimResult:
    """Three requests (two finished, one rejected) and three step rows, made by hand."""
    nan = math.nan
    req = {
        "request_id": np.array([0, 1, 2]), "category": np.array(["a", "a", "b"], dtype=object),
        "replica": np.array([0, 0, 0]), "arrival_s": np.array([0.0, 1.0, 2.0]),
        "scheduled_s": np.array([0.0, 1.5, nan]), "first_token_s": np.array([0.1, 1.7, nan]),
        "finish_s": np.array([1.1, 2.7, nan]), "prompt_len": np.array([100, 200, 300]),
        "output_len": np.array([11, 6, 5]), "num_generated": np.array([11, 6, 0]),
        "num_cached_tokens": np.array([0, 64, 0]), "num_preemptions": np.array([0, 2, 0]),
        "status": np.array(["finished", "finished", "rejected"]), "reason": np.array(["length", "length", "x"]),
        "kv_transfer_s": np.full(3, nan), "ttft_s": np.array([0.1, 0.7, nan]),
        "tpot_s": np.array([0.1, 0.2, nan]), "e2e_s": np.array([1.1, 1.7, nan]),
        "queue_s": np.array([0.0, 0.5, nan]),
    }
    rows = [  # one single step with 2 decoders, one 3-step skip from 0.01 to 0.03 s with 1 decoder
        (0, 0.0, 0.02, 1, 0.02, 0.02, 0.015, 0.005, 100, 1, 2, 2, 500, 102, 7, 6, 0, 2, 0, 0.5, 0, 0),
        (0, 0.02, 0.06, 3, 0.01, 0.03, 0.05, 0.01, 0, 0, 1, 3, 300, 3, 0, 0, 0, 1, 0, 0.25, 0, 0),
        (0, 0.08, 0.1, 1, 0.1, 0.1, 0.1, 0.0, 200, 1, 0, 1, 0, 200, 13, 12, 1, 1, 0, 0.75, 0, 0),
    ]
    steps = {c: np.array([r[i] for r in rows], dtype=float) for i, c in enumerate(STEP_COLUMNS)}
    meta = {"model": "m", "num_gpus": 2, "num_replicas": 1, "num_gpu_blocks": 100}
    return SimResult(req, steps, meta, {"prefix_cache_queries_tokens": 300, "prefix_cache_hits_tokens": 64})


def test_weighted_percentiles_match_numpy_inverted_cdf():
    rng = np.random.default_rng(0)
    v = rng.exponential(size=200)
    w = rng.integers(1, 5, size=200)
    expanded = np.repeat(v, w)
    for p in (1, 50, 90, 99):
        assert weighted_percentiles(v, w.astype(float), (p,))[0] == np.percentile(expanded, p, method="inverted_cdf")


def test_summary_values_by_hand():
    s = _result().summary(SLO(ttft_ms=500, tpot_ms=150))
    assert s["completed"] == 2 and s["failed"] == 1 and s["rejected"] == 1
    assert s["duration"] == pytest.approx(2.7)  # first arrival to last finish
    assert s["request_throughput"] == pytest.approx(2 / 2.7)
    assert s["total_output_tokens"] == 17 and s["total_input_tokens"] == 300
    assert s["mean_ttft_ms"] == pytest.approx(400) and s["median_ttft_ms"] == pytest.approx(400)
    assert s["p99_ttft_ms"] == pytest.approx(np.percentile([100, 700], 99))
    # only request 0 meets ttft <= 500 ms and tpot <= 150 ms
    assert s["request_goodput"] == pytest.approx(1 / 2.7)
    assert s["request_goodput_per_gpu"] == pytest.approx(0.5 / 2.7)
    # ITL: 2 x 20 ms, then 10, 20, 30 ms (one decoder each): weighted mean = (40 + 60) / 5
    assert s["mean_itl_ms"] == pytest.approx(20.0)
    assert s["p99_itl_ms"] == pytest.approx(30.0)
    assert s["prefix_cache_hit_rate"] == pytest.approx(64 / 300)
    assert s["gpu_busy_share"] == pytest.approx(0.165 / 2.7)
    assert s["cpu_share_of_step_time"] == pytest.approx(0.015 / 0.18)
    assert s["num_engine_steps"] == 5 and s["num_preemptions"] == 2
    assert s["max_concurrent_requests"] == 2  # request 0 finishes at 1.1, request 1 arrives at 1.0
    assert s["max_output_tokens_per_s"] == 6  # all three rows end within the first second


def test_prometheus_names_and_buckets():
    text = _result().prometheus_text()
    lines = text.splitlines()
    lab = 'engine="sim",model_name="m"'
    # TTFT 0.1 s and 0.7 s: cumulative buckets in vLLM's bounds
    def bucket(name, le):
        return float(next(x for x in lines if x.startswith(f'{name}_bucket{{{lab},le="{le}"}}')).split()[-1])
    assert bucket("vllm:time_to_first_token_seconds", 0.08) == 0
    assert bucket("vllm:time_to_first_token_seconds", 0.1) == 1
    assert bucket("vllm:time_to_first_token_seconds", 0.75) == 2
    assert bucket("vllm:time_to_first_token_seconds", "+Inf") == 2
    # vllm-conventions.md lists 22 TTFT and 19 ITL bounds; +Inf adds one
    assert sum(1 for x in lines if x.startswith("vllm:time_to_first_token_seconds_bucket")) == 22 + 1
    assert sum(1 for x in lines if x.startswith("vllm:inter_token_latency_seconds_bucket")) == 19 + 1
    assert bucket("vllm:time_to_first_token_seconds", 2560.0) == 2  # the largest bound
    assert bucket("vllm:inter_token_latency_seconds", 0.01) == 1  # the 10 ms step
    assert bucket("vllm:inter_token_latency_seconds", 0.025) == 4  # + 20 ms in the skip, 2 decoders at 20 ms
    assert f"vllm:prefix_cache_hits_total{{{lab}}} 64.0" in lines
    assert f'vllm:request_success_total{{{lab},finished_reason="length"}} 2.0' in lines
    assert f"vllm:num_preemptions_total{{{lab}}} 2.0" in lines
    for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_time_per_output_token_seconds", "vllm:iteration_tokens_total",
                 "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert f"# TYPE {name} " in text
    assert "gpu_cache_usage_perc" not in text  # removed in vLLM (#29330)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_save_tables_and_summary(tmp_path, fmt):
    res = simulate(deployment(), poisson(30, 5.0, 300, 20, seed=0))
    paths = res.save(tmp_path, fmt=fmt)
    assert paths["requests"].suffix == f".{fmt}"
    s = load_summary(tmp_path)
    json.dumps(s, allow_nan=False)  # strict JSON: no NaN
    assert s["completed"] == 30 and s["backend"] == "costline-sim"
    for key in ("mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "p99_e2el_ms", "output_throughput",
                "total_token_throughput", "request_goodput", "max_concurrent_requests"):
        assert key in s
    if fmt == "parquet":
        import pyarrow.parquet as pq
        t = pq.read_table(paths["requests"])
        assert t.num_rows == 30 and set(t.column("status").to_pylist()) == {"finished"}
    else:
        head = paths["steps"].read_text().splitlines()[0].split(",")
        assert head == list(STEP_COLUMNS)
    assert (tmp_path / "metrics.prom").read_text().startswith("# HELP")


def test_slo_parse_errors():
    assert SLO.parse("ttft:500 tpot:50").as_dict() == {"ttft": 500.0, "tpot": 50.0}
    with pytest.raises(ValueError, match="KEY:MS"):
        SLO.parse("latency:5")


