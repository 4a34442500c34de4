"""Request-level inputs (sim/bench_results.py): `vllm bench serve` result files and /metrics
scrapes, hand-written small, their values checked against hand computation; bad files refused in
one line naming the file, the key and row, and the fix."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sim.bench_results import (
    BenchFileError,
    Histogram,
    arrival_times,
    bench_from_tables,
    closed_loop_sends,
    parse_bench,
    read_bench,
    read_scrape,
    read_scrape_pair,
    request_itls,
)


def result(**over):
    """A detailed result as vLLM writes it (older version: no start_times, no latencies)."""
    base = {"date": "20261202-101500", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
            "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 3, "request_rate": 2.0,
            "burstiness": 1.0, "max_concurrency": None, "duration": 2.5, "completed": 2, "failed": 1,
            "total_input_tokens": 300, "total_output_tokens": 7, "request_throughput": 0.8,
            "output_throughput": 2.8, "mean_ttft_ms": 50.0, "median_ttft_ms": 50.0, "p99_ttft_ms": 59.8,
            "input_lens": [100, 200, 300], "output_lens": [3, 4, 0], "ttfts": [0.04, 0.06, 0.0],
            "itls": [[0.01, 0.02], [0.01, 0.01, 0.03], []], "generated_texts": ["a b c", "d e f g", ""],
            "errors": ["", "", "ReadTimeout"]}
    return base | over


def write(tmp_path: Path, obj, name="r.json") -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def test_older_format_e2e_is_ttft_plus_gaps_and_failed_rows_are_marked(tmp_path):
    (run,) = read_bench(write(tmp_path, result()))
    assert run.input_lens.tolist() == [100, 200, 300]
    assert run.ok.tolist() == [True, True, False]
    assert run.latency_s[:2] == pytest.approx([0.04 + 0.03, 0.06 + 0.05])
    assert run.start_s is None and run.request_rate == 2.0 and run.model_id.startswith("meta-llama")
    assert run.summary["median_ttft_ms"] == 50.0 and "input_lens" not in run.summary


def test_newer_format_start_times_are_the_arrivals(tmp_path):
    obj = result(start_times=[1000.5, 1000.0, 1001.25], latencies=[0.2, 0.3, 0.0], request_rate="inf")
    (run,) = read_bench(write(tmp_path, obj))
    sends, how = arrival_times(run)
    assert sends.tolist() == [0.5, 0.0, 1.25] and how.startswith("measured")
    assert run.latency_s.tolist() == [0.2, 0.3, 0.0] and math.isinf(run.request_rate)


def test_redrawn_arrivals_span_n_over_rate_as_vllm_scales_them(tmp_path):
    obj = result(input_lens=[10] * 50, output_lens=[2] * 50, ttfts=[0.01] * 50, itls=[[0.01]] * 50,
                 generated_texts=[""] * 50, errors=[""] * 50, request_rate=5.0, burstiness=0.5)
    (run,) = read_bench(write(tmp_path, obj))
    sends, how = arrival_times(run, seed=3)
    gaps = np.diff(sends)
    assert sends[0] == 0 and (gaps >= 0).all()
    # vLLM scales the cumulative delays so that the last one is n / rate; we start at the first send
    assert sends[-1] == pytest.approx(50 / 5.0 - sends_first_gap(run, 3))
    assert "Gamma" in how and "burstiness 0.5" in how


def sends_first_gap(run, seed):
    rng = np.random.default_rng(seed)
    g = rng.gamma(run.burstiness, 1 / (run.request_rate * run.burstiness), len(run))
    c = np.cumsum(g)
    return c[0] * (len(run) / run.request_rate) / c[-1]


def test_all_at_once_without_rate_and_closed_loop_with_a_concurrency_cap(tmp_path):
    (run,) = read_bench(write(tmp_path, result(request_rate="inf")))
    sends, _ = arrival_times(run)
    assert sends.tolist() == [0, 0, 0]
    # two slots, latencies 1, 2, 3, 4 s, all ready at 0: r0 0-1, r1 0-2, r2 at 1 (slot 0) -> 4, r3 at 2 -> 6
    assert closed_loop_sends(np.zeros(4), np.array([1.0, 2.0, 3.0, 4.0]), 2).tolist() == [0, 0, 1, 2]
    (capped,) = read_bench(write(tmp_path, result(request_rate="inf", max_concurrency=1), "c.json"))
    sends, how = arrival_times(capped)
    assert sends.tolist() == pytest.approx([0.0, 0.07, 0.18]) and "max_concurrency 1" in how


def test_append_result_file_holds_one_run_per_line(tmp_path):
    p = write(tmp_path, json.dumps(result()) + "\n" + json.dumps(result(request_rate=4.0)) + "\n")
    runs = read_bench(p)
    assert [r.request_rate for r in runs] == [2.0, 4.0] and runs[1].name == "r#1"


@pytest.mark.parametrize(("change", "words"), [
    ({"ttfts": None}, "key 'ttfts' is missing"),
    ({"ttfts": [0.1, 0.2]}, "key 'ttfts' has 2 entries but 'input_lens' has 3"),
    ({"ttfts": [0.1, "x", 0.2]}, "key 'ttfts' row 1"),
    ({"output_lens": [3, -1, 0]}, "key 'output_lens' row 1"),
    ({"itls": [[0.01], 5, []]}, "key 'itls' row 1"),
    ({"burstiness": 0}, "key 'burstiness'"),
    ({"request_rate": "fast"}, "key 'request_rate'"),
    ({"max_concurrency": 0}, "key 'max_concurrency'"),
])
def test_a_bad_result_names_file_key_row_and_fix(tmp_path, change, words):
    obj = {k: v for k, v in (result() | change).items() if v is not None}
    with pytest.raises(BenchFileError) as exc:
        read_bench(write(tmp_path, obj))
    msg = str(exc.value)
    assert words in msg and str(tmp_path / "r.json") in msg and "\n" not in msg
    assert "rerun" in msg or "--save-detailed" in msg


def test_a_summary_only_result_asks_for_save_detailed(tmp_path):
    obj = {k: v for k, v in result().items() if not isinstance(v, list)}
    with pytest.raises(BenchFileError, match="'input_lens' is missing.*--save-detailed"):
        read_bench(write(tmp_path, obj))
    with pytest.raises(BenchFileError, match="not valid JSON"):
        read_bench(write(tmp_path, "{oops"))
    with pytest.raises(BenchFileError, match="must be a JSON object"):
        parse_bench([1, 2], Path("x.json"))


SCRAPE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} 0.25
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{model_name="m"}} {pre}
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{model_name="m"}} {queries}
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{model_name="m"}} {hits}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",num_gpu_blocks="52000"}} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{le="0.1",model_name="m"}} {b1}
vllm:time_to_first_token_seconds_bucket{{le="0.5",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_count{{model_name="m"}} {b3}
vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total}
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{{le="0.01",model_name="m"}} {b1}
vllm:time_per_output_token_seconds_bucket{{le="+Inf",model_name="m"}} {b3}
vllm:time_per_output_token_seconds_count{{model_name="m"}} {b3}
vllm:time_per_output_token_seconds_sum{{model_name="m"}} {total}
"""


def scrape(tmp_path, name, **kv):
    values = {"running": 0, "pre": 0, "queries": 0, "hits": 0, "b1": 0, "b2": 0, "b3": 0, "total": 0} | kv
    return write(tmp_path, SCRAPE.format(**values), name)


def test_two_scrapes_give_the_run_s_counts_and_an_older_itl_name(tmp_path):
    before = scrape(tmp_path, "before.prom", pre=2, queries=1000, hits=100, b1=1, b2=2, b3=2, total=0.3)
    after = scrape(tmp_path, "after.prom", running=3, pre=5, queries=5000, hits=1700, b1=3, b2=8, b3=10, total=2.3)
    d = read_scrape_pair([before, after])
    assert d.counters["preemptions"] == 3 and d.prefix_hit_rate == pytest.approx(1600 / 4000)
    ttft = d.histograms["ttft"]
    assert ttft.cumulative == (2, 6, 8) and ttft.count == 8 and ttft.mean == pytest.approx(2.0 / 8)
    # vllm:time_per_output_token_seconds (older vLLM) stands for the inter-token histogram
    assert d.histograms["itl"].count == 8
    assert d.gauges_after["running"] == 3 and d.num_gpu_blocks == 52000


def test_histogram_quantile_interpolates_within_the_bucket_as_prometheus_does():
    h = Histogram(bounds=(0.1, 0.5, math.inf), cumulative=(2.0, 6.0, 8.0), sum=2.0, count=8.0)
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.4 * (4 - 2) / 4)  # rank 4 in (0.1, 0.5]
    assert h.quantile(0.125) == pytest.approx(0.05)  # rank 1 of 2 in [0, 0.1]
    assert h.quantile(0.99) == 0.5  # the +Inf bucket: its lower bound


def test_bad_scrapes_are_refused_in_one_line(tmp_path):
    before = scrape(tmp_path, "before.prom", pre=5, b3=10)
    after = scrape(tmp_path, "after.prom", pre=2, b3=12)
    with pytest.raises(BenchFileError, match="lower than in .*before.prom"):
        read_scrape_pair([before, after])
    with pytest.raises(BenchFileError, match="no vllm:\\* metric"):
        read_scrape(write(tmp_path, "# TYPE up gauge\nup 1\n", "up.prom"))
    with pytest.raises(BenchFileError, match="two scrapes"):
        read_scrape_pair([before, after, before])
    one = read_scrape_pair([after])  # a server started for the run: all it counted is the run's
    assert one.histograms["ttft"].count == 12 and one.counters["preemptions"] == 2


def test_request_itls_are_the_step_ends_between_first_and_last_token():
    ends = np.array([1.0, 1.1, 1.25, 1.3, 1.5])
    gaps, exact = request_itls(1.1, 1.5, 4, ends)  # tokens at 1.1 (first), 1.25, 1.3, 1.5
    assert exact and gaps == pytest.approx([0.15, 0.05, 0.2])
    gaps, exact = request_itls(1.0, 1.5, 3, ends)  # 4 step ends for 2 gaps: spread evenly
    assert not exact and gaps == pytest.approx([0.25, 0.25])


def test_tables_written_as_a_bench_result_read_back_with_the_same_figures():
    req = {"arrival_s": np.array([0.0, 0.5]), "status": np.array(["finished", "rejected"], dtype=object),
           "finish_reason": np.array(["length", "too long"], dtype=object), "num_output_tokens": np.array([3, 0]),
           "first_token_s": np.array([0.1, np.nan]), "finish_s": np.array([0.3, np.nan]),
           "prompt_len": np.array([40, 9000]), "ttft_s": np.array([0.1, np.nan]), "e2e_s": np.array([0.3, np.nan])}
    steps = {"t_start_s": np.array([0.0, 0.1, 0.2]), "total_s": np.array([0.1, 0.1, 0.1]),
             "n_steps": np.array([1, 1, 1]), "first_dt_s": np.array([0.1, 0.1, 0.1]),
             "last_dt_s": np.array([0.1, 0.1, 0.1])}
    obj, spread = bench_from_tables(req, steps, duration_s=1.0, model_id="m", backend="b", date="d")
    run = parse_bench(obj, Path("t.json"))
    assert spread == 0 and run.ok.tolist() == [True, False] and run.output_lens.tolist() == [3, 0]
    assert run.itls_s[0] == pytest.approx([0.1, 0.1]) and obj["errors"][1] == "rejected: too long"
    assert obj["mean_ttft_ms"] == pytest.approx(100.0) and obj["completed"] == 1 and obj["request_rate"] == 4.0


def _aiperf(start_ns, ttft_ms, gaps_ms, latency_ms, isl, osl):
    """One record of AIPerf 0.13's profile_export.jsonl (the fields its converter reads)."""
    return {"metadata": {"request_start_ns": start_ns, "request_end_ns": start_ns + int(latency_ms * 1e6),
                         "benchmark_phase": "profiling", "was_cancelled": False},
            "metrics": {"time_to_first_token": {"value": ttft_ms, "unit": "ms"},
                        "inter_chunk_latency": {"value": [0.0, *gaps_ms], "unit": "ms"},
                        "request_latency": {"value": latency_ms, "unit": "ms"},
                        "input_sequence_length": {"value": isl, "unit": "tokens"},
                        "output_sequence_length": {"value": osl, "unit": "tokens"}}}


def test_an_aiperf_export_reads_as_one_run_with_its_send_times(tmp_path):
    rows = [_aiperf(2_000_000_000, 100.0, [20.0, 30.0], 150.0, 32, 3), _aiperf(2_500_000_000, 50.0, [10.0], 60.0, 16, 2)]
    (run,) = read_bench(write(tmp_path, "\n".join(json.dumps(r) for r in rows) + "\n", "profile_export.jsonl"))
    assert run.input_lens.tolist() == [32, 16] and run.output_lens.tolist() == [3, 2]
    assert run.start_s.tolist() == pytest.approx([0.0, 0.5]) and run.ttft_s.tolist() == pytest.approx([0.1, 0.05])
    assert run.itls_s[0].tolist() == pytest.approx([0.02, 0.03]) and run.latency_s[1] == pytest.approx(0.06)
    bad = dict(rows[0], metrics={})
    bad["metadata"] = {"request_start_ns": "x"}
    with pytest.raises(BenchFileError, match="AIPerf"):
        read_bench(write(tmp_path, json.dumps(bad) + "\n" + json.dumps(bad) + "\n", "bad.jsonl"))
