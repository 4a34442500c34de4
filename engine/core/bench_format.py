"""Client-side serving results in the JSON format of `vllm bench serve --save-result --save-detailed`.

One writer for every client costline runs against an OpenAI-compatible server (its own load client,
benchmarks/serve/h200.py), so `costline calibrate --from-bench` reads ours and a user's vLLM results
alike. Key list and meaning: docs/bench-format.md. Times in the per-request arrays are seconds
(as vLLM writes them); the summary statistics are milliseconds (`mean_ttft_ms`, ...).

vLLM's definitions (vllm/benchmarks/serve.py, 0.33): TTFT from sending the request to the first
streamed chunk; ITLs the gaps between later chunks; TPOT per request = (latency - TTFT) /
(output tokens - 1); output tokens from the server's `usage` when it reports them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

# Top-level run description, the summary, the per-request arrays, then (per metric) mean/median/std/pN.
RUN_KEYS = ("date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
            "request_rate", "burstiness", "max_concurrency")
SUMMARY_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "max_output_tokens_per_s", "max_concurrent_requests")
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
# per-request arrays recent vLLM versions add beside DETAIL_KEYS (seconds; start times from the run's start)
EXTRA_DETAIL_KEYS = ("latencies", "start_times")
METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass
class RequestResult:
    """One request as the client saw it (vLLM's RequestFuncOutput)."""

    prompt_len: int
    success: bool = False
    output_len: int = 0  # tokens generated (the server's usage count)
    ttft_s: float = 0.0
    itls_s: list[float] = field(default_factory=list)
    latency_s: float = 0.0
    start_s: float = 0.0  # send time, seconds from the run's start
    generated_text: str = ""
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        if not self.success or self.output_len < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_len - 1)


@dataclass(frozen=True)
class RunInfo:
    """How the run was made (vLLM's top-level keys)."""

    model_id: str
    num_prompts: int
    request_rate: float  # math.inf: all at once
    burstiness: float = 1.0
    max_concurrency: int | None = None
    endpoint_type: str = "openai"  # "openai" (/v1/completions) or "openai-chat"
    backend: str = "openai"
    label: str | None = None
    tokenizer_id: str | None = None


def _fmt_pct(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def _stats(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """vLLM's mean/median/std/pN of one metric in ms (0 when there are no values, as vLLM)."""
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    if ms.size == 0:
        ms = np.zeros(1)
    out = {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
           f"std_{name}_ms": float(ms.std())}
    for p in percentiles:
        out[f"p{_fmt_pct(p)}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def _peaks(results: Sequence[RequestResult]) -> tuple[float, int]:
    """(most output tokens in one wall-clock second, most requests in flight at once)."""
    ok = [r for r in results if r.success]
    token_times = []
    for r in ok:
        t = r.start_s + r.ttft_s
        token_times.append(t)
        for gap in r.itls_s:
            t += gap
            token_times.append(t)
    per_s = np.bincount(np.floor(np.asarray(token_times)).astype(np.int64)) if token_times else np.zeros(1)
    events = sorted([(r.start_s, 1) for r in results] + [(r.start_s + r.latency_s, -1) for r in results],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return float(per_s.max()), peak


def bench_result(results: Sequence[RequestResult], duration_s: float, info: RunInfo, *,
                 percentiles: Sequence[float] = DEFAULT_PERCENTILES, metadata: dict | None = None) -> dict:
    """The `--save-result --save-detailed` JSON object of one run."""
    ok = [r for r in results if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    max_tok_s, max_conc = _peaks(results)
    out: dict = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": info.endpoint_type,
        "backend": info.backend, "label": info.label, "model_id": info.model_id,
        "tokenizer_id": info.tokenizer_id or info.model_id, "num_prompts": info.num_prompts,
        "request_rate": "inf" if math.isinf(info.request_rate) else info.request_rate,
        "burstiness": info.burstiness, "max_concurrency": info.max_concurrency,
        **(metadata or {}),
        "duration": duration_s, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s, "request_goodput": None,
        "output_throughput": total_out / duration_s, "total_token_throughput": (total_in + total_out) / duration_s,
        "max_output_tokens_per_s": max_tok_s, "max_concurrent_requests": max_conc,
        "input_lens": [r.prompt_len for r in results],
        "output_lens": [r.output_len for r in results],
        "ttfts": [r.ttft_s for r in results],
        "itls": [list(r.itls_s) for r in results],
        "generated_texts": [r.generated_text for r in results],
        "errors": [r.error for r in results],
        "latencies": [r.latency_s for r in results],
        "start_times": [r.start_s for r in results],
    }
    per_metric = {"ttft": [r.ttft_s for r in ok], "tpot": [t for r in ok if (t := r.tpot_s) is not None],
                  "itl": [g for r in ok for g in r.itls_s], "e2el": [r.latency_s for r in ok]}
    for name in METRICS:
        out |= _stats(name, per_metric[name], percentiles)
    return out


def _metric(m: dict, key: str, default: float = 0.0):
    v = m.get(key)
    return v["value"] if isinstance(v, dict) and "value" in v else default


def results_from_aiperf(records: Sequence[dict]) -> tuple[list[RequestResult], float]:
    """AIPerf's per-request export (`profile_export.jsonl`, one JSON object per line, AIPerf 0.13)
    as RequestResults, and the run's duration (first request start to last request end, s):
    the same run written in vLLM's format by `bench_result`. Warm-up records are left out."""
    rows = [r for r in records if r.get("metadata", {}).get("benchmark_phase", "profiling") == "profiling"]
    if not rows:
        raise ValueError("no profiling records in the AIPerf export (profile_export.jsonl)")
    starts = [r["metadata"]["request_start_ns"] for r in rows]
    t0 = min(starts)
    out = []
    for r, start in zip(rows, starts):
        md, m = r["metadata"], r.get("metrics", {})
        gaps = _metric(m, "inter_chunk_latency", [])
        failed = bool(r.get("error")) or md.get("was_cancelled", False)
        res = RequestResult(prompt_len=int(_metric(m, "input_sequence_length")), success=not failed,
                            output_len=int(_metric(m, "output_sequence_length")),
                            ttft_s=_metric(m, "time_to_first_token") / 1e3,
                            itls_s=[g / 1e3 for g in gaps[1:]],  # the first entry is the first chunk's 0
                            latency_s=_metric(m, "request_latency") / 1e3, start_s=(start - t0) / 1e9,
                            error=str(r.get("error") or ""))
        out.append(res)
    end = max(r["metadata"].get("request_end_ns", s) for r, s in zip(rows, starts))
    return out, (end - t0) / 1e9
