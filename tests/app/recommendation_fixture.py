"""A recommendation dict with exactly the advisor's keys (advisor.advise.Recommendation as JSON),
so the Advisor page is tested before and without the advisor."""

from __future__ import annotations

from typing import Any


def _metrics(goodput: float, tok_s: float, ttft_p99: float, tpot_p99: float, attain: float, preempt: int
             ) -> dict[str, Any]:
    return {"goodput_rps": goodput, "throughput_tok_s": tok_s, "ttft_p50_ms": ttft_p99 / 4,
            "ttft_p99_ms": ttft_p99, "tpot_p50_ms": tpot_p99 / 2, "tpot_p99_ms": tpot_p99,
            "itl_p99_ms": tpot_p99 * 1.5, "e2e_p99_ms": 9000.0, "slo_attainment": attain, "preemptions": preempt}


def _gain(gain: float, low: float, high: float) -> dict[str, Any]:
    return {"gain_pct": gain, "low_pct": low, "high_pct": high, "validation_pct": (high - low) / 2,
            "traffic_pct": 0.0, "realizations": 3, "inputs": {}}


def recommendation(profile_status: str = "validated") -> dict[str, Any]:
    base = _metrics(5.5, 1800.0, 950.0, 30.0, 0.71, 12)
    best = _metrics(7.25, 2400.0, 420.0, 21.0, 0.93, 0)
    return {
        "request": {"model": "llama-3.1-8b", "gpu": "h200", "num_gpus": 1, "slo": "ttft:500 tpot:50",
                    "objective": "goodput", "seed": 0, "workers": 1, "ray": None, "budget": "quick",
                    "profile": None, "min_gain_pct": 2.0},
        "profile": {"name": "h200-llama-3.1-8b", "status": profile_status},
        "workload": {"name": "chat-production", "num_requests": 2000, "rate_rps": 7.6},
        "baseline": {"label": "vLLM defaults", "flags": {}, "num_gpus": 1, "metrics": base},
        "best": {"label": "prefix caching + chunk 4096", "flags": {"max_num_batched_tokens": 4096},
                 "num_gpus": 1, "metrics": best},
        "ladder": [
            {"optimization": "prefix caching", "flags_added": {"enable_prefix_caching": True},
             "metrics": _metrics(6.4, 2100.0, 600.0, 25.0, 0.85, 3), "delta_goodput_pct": 16.4,
             "delta_ttft_p99_pct": -36.8, "delta_tpot_p99_pct": -16.7, "gpus_needed": 1,
             "gain": _gain(16.4, 9.0, 23.8)},
            {"optimization": "chunked prefill 4096", "flags_added": {"max_num_batched_tokens": 4096},
             "metrics": best, "delta_goodput_pct": 13.3, "delta_ttft_p99_pct": -30.0,
             "delta_tpot_p99_pct": -16.0, "gpus_needed": 1, "gain": _gain(13.3, 4.1, 22.5)},
        ],
        "kept_defaults": [{"optimization": "block size: 64", "flags": {"block_size": 64},
                           "gain": _gain(0.7, -2.4, 3.8),
                           "reason": "keep vLLM's default for block size: +0.7% \u00b1 3.1% predicted"}],
        "rejected": [{"optimization": "ngram speculation",
                      "flags": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}},
                      "reason": "acceptance too low at this load", "delta_goodput_pct": -4.0}],
        "cost_lines": [{"optimization": "prefix caching", "variable": "prefix reuse", "unit": "%",
                        "points": [{"x": 0.0, "gain_pct": -1.0}, {"x": 20.0, "gain_pct": 6.0},
                                   {"x": 40.0, "gain_pct": 15.0}],
                        "break_even": 3.0, "operating_point": 27.0,
                        "answer": "pays above 3% reuse; you are at 27%"}],
        "gap": {"lab_gain": 35.0, "production_gain": 16.4,
                "factors": [{"factor": "burstiness", "gain": -10.0, "share_pct": 60.0},
                            {"factor": "dynamic prefix", "gain": -8.6, "share_pct": 40.0}]},
        "robustness": {"rows": [{"perturbation": "rate x1.5", "best_goodput_rps": 8.0, "kept_goodput_rps": 7.6,
                                 "regret_pct": 5.0}],
                       "fallback": {"label": "prefix caching only", "flags": {"enable_prefix_caching": True},
                                    "num_gpus": 1, "metrics": base},
                       "fallback_max_regret_pct": 7.5},
        "serve_command": "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-batched-tokens 4096",
        "metrics_to_watch": [{"metric": "vllm:prefix_cache_hits_total", "threshold": "> 20%",
                              "why": "below it the cache stops paying"}],
        "questions": [{"question": "Will speculation help?", "answer": "Not at this load."}],
        "elapsed_s": 12.5,
        "num_simulations": 40,
    }
