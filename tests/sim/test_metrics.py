"""Metrics: aggregates against hand computation, vLLM names and buckets, files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engine.core.records import (
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    StepRecord,
    to_columns,
)
from sim.metrics import SLO, SimResult, jsonable, load_summary, weighted_percentiles
from sim.simulator import simulate
from tests.sim.simhelpers import deployment, poisson
from tests.sim.step_rows import expand_step_rows


def _result() -> SimResult:
    """Three requests (two finished, one rejected) and three step rows, made by hand."""
    nan = math.nan
    req = {
        "request_id": np.array([0, 1, 2]), "category": np.array(["a", "a", "b"], dtype=object),
        "replica": np.array([0, 0, 0]), "status": np.array(["finished", "finished", "rejected"]),
        "finish_reason": np.array(["length", "stop", "too long"]), "arrival_s": np.array([0.0, 1.0, 2.0]),
        "scheduled_s": np.array([0.0, 1.5, nan]), "first_token_s": np.array([0.1, 1.7, nan]),
        "finish_s": np.array([1.1, 2.7, nan]), "prompt_len": np.array([100, 200, 300]),
        "output_len": np.array([11, 6, 5]), "num_output_tokens": np.array([11, 6, 0]),
        "num_cached_tokens": np.array([0, 64, 0]), "num_preemptions": np.array([0, 2, 0]),
        "queue_s": np.array([0.0, 0.5, nan]), "ttft_s": np.array([0.1, 0.7, nan]),
        "tpot_s": np.array([0.1, 0.2, nan]), "e2e_s": np.array([1.1, 1.7, nan]),
        "kv_transfer_s": np.full(3, nan),
        "num_spec_drafts": np.zeros(3, dtype=np.int64), "num_spec_draft_tokens": np.zeros(3, dtype=np.int64),
        "num_spec_accepted_tokens": np.zeros(3, dtype=np.int64),
    }
    assert tuple(req) == REQUEST_COLUMNS
    rows = [  # one single step with 2 decoders, one 3-step skip from 0.01 to 0.03 s with 1 decoder
        StepRecord(t_start_s=0.0, total_s=0.02, first_dt_s=0.02, last_dt_s=0.02, gpu_s=0.015, cpu_s=0.005,
                   num_prefill_tokens=100, num_prefill_seqs=1, num_decode_seqs=2, num_decode_tokens=2,
                   num_output_tokens=2, sum_decode_context=500, max_decode_context=260, num_batched_tokens=102, num_blocks_allocated=7,
                   num_blocks_hashed=6, num_running=2, kv_usage=0.5),
        StepRecord(t_start_s=0.02, total_s=0.06, n_steps=3, first_dt_s=0.01, last_dt_s=0.03, gpu_s=0.05,
                   cpu_s=0.01, num_decode_seqs=1, num_decode_tokens=1, num_output_tokens=3,
                   sum_decode_context=300, max_decode_context=300, num_batched_tokens=1, num_running=1,
                   kv_usage=0.25),
        StepRecord(t_start_s=0.08, total_s=0.1, first_dt_s=0.1, last_dt_s=0.1, gpu_s=0.1, cpu_s=0.0,
                   num_prefill_tokens=200, num_prefill_seqs=1, num_output_tokens=1, num_batched_tokens=200,
                   num_blocks_allocated=13, num_blocks_hashed=12, num_preempted=1, num_running=1, kv_usage=0.75),
    ]
    meta = {"model": "m", "num_gpus": 2, "num_replicas": 1, "num_gpu_blocks": 100, "max_model_len": 1000}
    return SimResult(req, to_columns(rows, StepRecord), meta,
                     {"prefix_cache_queries_tokens": 300, "prefix_cache_hits_tokens": 64})


def test_weighted_percentiles_match_numpy_inverted_cdf():
    rng = np.random.default_rng(0)
    v = rng.exponential(size=200)
    w = rng.integers(1, 5, size=200)
    expanded = np.repeat(v, w)
    for p in (1, 50, 90, 99):
        assert weighted_percentiles(v, w.astype(float), (p,))[0] == np.percentile(expanded, p, method="inverted_cdf")


def test_summary_values_by_hand():
    s = _result().summary(SLO(ttft_ms=500, tpot_ms=150)).to_json_dict()
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


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of a Prometheus exposition (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for fam in text_string_to_metric_families(text) for x in fam.samples}


def test_prometheus_names_and_buckets():
    text = _result().prometheus_text()
    got = samples(text)

    def bucket(name, le):
        return got[(f"{name}_bucket", (("le", le), ("model_name", "m")))]

    # TTFT 0.1 s and 0.7 s: cumulative buckets in vLLM's bounds
    assert bucket("vllm:time_to_first_token_seconds", "0.08") == 0
    assert bucket("vllm:time_to_first_token_seconds", "0.1") == 1
    assert bucket("vllm:time_to_first_token_seconds", "0.75") == 2
    assert bucket("vllm:time_to_first_token_seconds", "+Inf") == 2
    # vLLM 0.33's loggers.py has 22 TTFT and 19 ITL bounds; +Inf adds one
    assert sum(1 for k in got if k[0] == "vllm:time_to_first_token_seconds_bucket") == 22 + 1
    assert sum(1 for k in got if k[0] == "vllm:inter_token_latency_seconds_bucket") == 19 + 1
    assert bucket("vllm:time_to_first_token_seconds", "2560.0") == 2  # the largest bound
    assert bucket("vllm:inter_token_latency_seconds", "0.01") == 1  # the 10 ms step
    assert bucket("vllm:inter_token_latency_seconds", "0.025") == 4  # + 20 ms in the skip, 2 decoders at 20 ms
    assert got[("vllm:inter_token_latency_seconds_sum", (("model_name", "m"),))] == pytest.approx(0.1)
    # iteration tokens: one observation per engine step (the 3-step row counts 3 times)
    assert bucket("vllm:iteration_tokens_total", "1.0") == 3 and bucket("vllm:iteration_tokens_total", "+Inf") == 5
    m = (("model_name", "m"),)
    assert got[("vllm:prefix_cache_hits_total", m)] == 64
    assert got[("vllm:request_success_total", (("finished_reason", "length"), ("model_name", "m")))] == 1
    assert got[("vllm:request_success_total", (("finished_reason", "stop"), ("model_name", "m")))] == 1
    assert got[("vllm:admission_rejections_total", (("model_name", "m"), ("reason", "too long")))] == 1
    assert got[("vllm:num_preemptions_total", m)] == 2
    assert got[("vllm:generation_tokens_total", m)] == 17
    # inference time = finish - first scheduled: 1.1 s and 1.2 s
    assert got[("vllm:request_inference_time_seconds_sum", m)] == pytest.approx(2.3)
    for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_time_per_output_token_seconds", "vllm:iteration_tokens_total",
                 "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert f"# TYPE {name} " in text
    assert got[("vllm:kv_cache_usage_perc", m)] == 0.75  # the gauge after the last step
    assert "gpu_cache_usage_perc" not in text  # removed in vLLM (#29330)


def test_expanded_step_rows_are_single_steps():
    steps = _result().steps
    one = expand_step_rows(steps)
    assert list(one["n_steps"]) == [1] * 5 and list(one) == list(STEP_COLUMNS)
    assert one["total_s"].tolist() == pytest.approx([0.02, 0.01, 0.02, 0.03, 0.1])
    assert one["t_start_s"].tolist() == pytest.approx([0.0, 0.02, 0.03, 0.05, 0.08])
    assert one["sum_decode_context"].tolist() == [500, 300, 301, 302, 0]
    assert one["max_decode_context"].tolist() == [260, 300, 301, 302, 0]  # one token a step
    assert one["num_output_tokens"].tolist() == [2, 1, 1, 1, 1]
    assert one["total_s"].sum() == pytest.approx(steps["total_s"].sum())


def test_jsonable_is_strict_json():
    x = jsonable({"a": np.float64("nan"), "b": [np.int64(3), math.inf], "c": np.float32(0.5)})
    assert json.dumps(x, allow_nan=False) == '{"a": null, "b": [3, null], "c": 0.5}'


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




def test_live_metrics_render_the_same_text_as_the_tables():
    """One Prometheus writer (engine/core/prometheus.py): the engine's live exporter, fed the run's
    records one by one, scrapes to exactly the text `prometheus_text` writes for the tables (and,
    folding its records into running totals as a long-running server does, to the same values)."""
    from engine.core.prometheus import LiveMetrics
    from engine.metrics import EngineMetrics  # the engine's name for it

    for fold_at in (4096, 1, 2):  # every record kept; folded into totals after each one; after pairs
        live = EngineMetrics("m", 1000, fold_at=fold_at)
        assert isinstance(live, LiveMetrics)
        text, table = _feed_live(live)
        if fold_at == 4096:
            assert text == table
        else:  # sums add in another order: equal to rounding
            got, want = samples(text), samples(table)
            assert got.keys() == want.keys()
            for key, value in want.items():
                assert got[key] == pytest.approx(value, rel=1e-12), (fold_at, key)
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 2.0' in table


def _feed_live(live):
    """The hand-made run's records fed to `live` one by one: (its text, the tables' text)."""
    from types import SimpleNamespace

    from engine.core.prometheus import prometheus_text
    from engine.core.records import RequestRecord

    res = _result()
    gaps = np.array([0.05, 0.1, 0.2, 0.15])
    stats = SimpleNamespace(prefix_cache_queries_tokens=300, prefix_cache_hits_tokens=64, num_spec_drafts=4,
                            num_spec_draft_tokens=8, num_spec_accepted_tokens=5)
    sched = SimpleNamespace(stats=stats, num_spec_accepted_per_pos=[3, 2])
    steps = [StepRecord(**{c: res.steps[c][i] for c in STEP_COLUMNS}) for i in range(res.steps["n_steps"].size)]
    for step in steps:
        live.observe_step(step, sched)
    for i in range(res.requests["request_id"].size):
        live.observe_request(RequestRecord(**{c: res.requests[c][i] for c in REQUEST_COLUMNS}),
                             gaps[2 * i:2 * i + 2] if i < 2 else ())
    counters = {"prefix_cache_queries_tokens": 300, "prefix_cache_hits_tokens": 64, "spec_num_drafts": 4,
                "spec_draft_tokens": 8, "spec_accepted_tokens": 5,
                "spec_accepted_tokens_pos_0": 3, "spec_accepted_tokens_pos_1": 2}
    table = prometheus_text(res.requests, res.steps, meta={"model": "m", "max_model_len": 1000},
                            counters=counters, itl=(gaps, np.ones(gaps.size)))
    return live.text(), table
