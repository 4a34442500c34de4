"""The `vllm bench serve --save-detailed` writer against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.core.bench_format import (
    DETAIL_KEYS,
    EXTRA_DETAIL_KEYS,
    RUN_KEYS,
    SUMMARY_KEYS,
    RequestResult,
    RunInfo,
    bench_result,
)


def _two_requests():
    a = RequestResult(prompt_len=10, success=True, output_len=3, ttft_s=0.1, itls_s=[0.2, 0.3], latency_s=0.6,
                      start_s=0.0, generated_text="x y z")
    b = RequestResult(prompt_len=20, success=True, output_len=2, ttft_s=0.5, itls_s=[0.25], latency_s=0.75,
                      start_s=0.5, generated_text="p q")
    c = RequestResult(prompt_len=7, error="HTTP 503: busy", start_s=2.0)
    return [a, b, c]


def test_keys_are_vllms():
    out = bench_result(_two_requests(), 2.0, RunInfo(model_id="m", num_prompts=3, request_rate=math.inf))
    metric_keys = {f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                   for s in ("mean", "median", "std", "p50", "p90", "p99")}
    assert set(out) == set(RUN_KEYS) | set(SUMMARY_KEYS) | set(DETAIL_KEYS) | set(EXTRA_DETAIL_KEYS) | metric_keys
    assert out["request_rate"] == "inf" and out["request_goodput"] is None
    assert len(out["date"]) == len("20261202-161800")


def test_values_by_hand():
    out = bench_result(_two_requests(), 2.0, RunInfo(model_id="m", num_prompts=3, request_rate=4.0))
    assert out["completed"] == 2 and out["failed"] == 1
    assert out["total_input_tokens"] == 30 and out["total_output_tokens"] == 5
    assert out["request_throughput"] == pytest.approx(1.0)
    assert out["output_throughput"] == pytest.approx(2.5)
    assert out["total_token_throughput"] == pytest.approx(17.5)
    assert out["input_lens"] == [10, 20, 7] and out["output_lens"] == [3, 2, 0]
    assert out["errors"] == ["", "", "HTTP 503: busy"]
    # TPOT: a (0.6-0.1)/2 = 0.25, b (0.75-0.5)/1 = 0.25
    assert out["mean_tpot_ms"] == pytest.approx(250.0)
    assert out["mean_itl_ms"] == pytest.approx(np.mean([200, 300, 250]))
    assert out["median_ttft_ms"] == pytest.approx(300.0)
    assert out["p99_e2el_ms"] == pytest.approx(np.percentile([600, 750], 99))
    # tokens at 0.1, 0.3, 0.6 (a) and 1.0, 1.25 (b): 3 in second 0, 2 in second 1
    assert out["max_output_tokens_per_s"] == 3
    # a runs 0-0.6, b 0.5-1.25, c is an instant at 2.0: at most 2 at once
    assert out["max_concurrent_requests"] == 2


def test_arrivals_as_vllm_draws_them():
    from engine.serve.load_client import arrival_offsets

    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    t = np.asarray(arrival_offsets(20001, 10.0, burstiness=0.5, seed=3))
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)  # Gamma(k, 1/(rate k)) has mean 1/rate
    assert gaps.var() == pytest.approx(0.5 * (1 / 5.0) ** 2, rel=0.06)  # variance k theta^2
    assert arrival_offsets(5, 2.0, seed=1) == arrival_offsets(5, 2.0, seed=1)


def _aiperf_row(start_ns, ttft_ms, gaps_ms, latency_ms, isl, osl, phase="profiling", error=None):
    row = {"metadata": {"request_start_ns": start_ns, "request_end_ns": start_ns + int(latency_ms * 1e6),
                        "benchmark_phase": phase, "was_cancelled": False},
           "metrics": {"time_to_first_token": {"value": ttft_ms, "unit": "ms"},
                       "inter_chunk_latency": {"value": [0.0, *gaps_ms], "unit": "ms"},
                       "request_latency": {"value": latency_ms, "unit": "ms"},
                       "input_sequence_length": {"value": isl, "unit": "tokens"},
                       "output_sequence_length": {"value": osl, "unit": "tokens"}}}
    if error:
        row["error"] = error
    return row


def test_aiperf_export_becomes_vllm_rows():
    from engine.core.bench_format import results_from_aiperf

    rows = [_aiperf_row(0, 1.0, [], 5.0, 3, 1, phase="warmup"),
            _aiperf_row(1_000_000_000, 100.0, [20.0, 30.0], 150.0, 32, 3),
            _aiperf_row(1_500_000_000, 50.0, [10.0], 60.0, 16, 2),
            _aiperf_row(1_600_000_000, 0.0, [], 0.0, 8, 0, error={"code": 503})]
    res, duration = results_from_aiperf(rows)
    assert [r.prompt_len for r in res] == [32, 16, 8]
    assert res[0].itls_s == pytest.approx([0.02, 0.03]) and res[0].ttft_s == pytest.approx(0.1)
    assert res[1].start_s == pytest.approx(0.5) and res[0].start_s == 0.0
    assert [r.success for r in res] == [True, True, False]
    assert duration == pytest.approx(0.6)  # 1.0 s start to 1.6 s (the failed one's end)
    out = bench_result(res, duration, RunInfo(model_id="m", num_prompts=3, request_rate=2.0))
    assert out["completed"] == 2 and out["ttfts"][:2] == pytest.approx([0.1, 0.05])
