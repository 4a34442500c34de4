"""One run summary and one Prometheus exposition, computed from the request and step tables
(engine/core/records.py), for the simulator's runs and the engine's alike.

The summary uses the keys of `vllm bench serve --save-result` (`mean_ttft_ms`, `p99_tpot_ms`,
`request_goodput`, ...) so a simulated run, an engine replay and a measured vLLM run compare key
by key; costline's extras (goodput per GPU, prefix hit rate, GPU busy share, CPU share of step
time, KV transfer) sit beside them. The Prometheus text has vLLM's metric names and buckets
(engine/core/vllm_metrics.py), so dashboards built for a real server read either run.

Torch-free: the simulator imports it.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.core.prometheus import prometheus_text
from engine.core.run_counters import (
    COUNTER_KEYS,
    POS_KEY,
    accepted_per_position,
    per_position_counters,
)
from engine.core.slo import SLO, SLO_KEYS
from engine.core.summary_record import LatencyStats, RunSummary

PERCENTILES = (50, 90, 95, 99)
# what a run's meta says about its engine configuration (None where a run does not say), in its summary
ENGINE_META_KEYS = ("async_scheduling", "speculative_config", "ready_s")  # ready_s: engines only


# --- statistics -----------------------------------------------------------------------------
def weighted_percentiles(values: np.ndarray, weights: np.ndarray, pcts: tuple[float, ...]) -> list[float]:
    """Smallest value whose cumulative weight reaches p% (numpy's 'inverted_cdf', weighted)."""
    if values.size == 0 or weights.sum() <= 0:
        return [math.nan] * len(pcts)
    order = np.argsort(values)
    v, cw = values[order], np.cumsum(weights[order], dtype=np.float64)
    total = cw[-1]
    return [float(v[min(np.searchsorted(cw, p / 100 * total, side="left"), v.size - 1)]) for p in pcts]


def latency_stats(values_s: np.ndarray, weights: np.ndarray | None = None) -> LatencyStats:
    """mean/median/std/percentiles in ms, `vllm bench serve` style (NaN without samples)."""
    if values_s.size == 0:
        return LatencyStats()
    ms = values_s * 1e3
    if weights is None:
        mean, std = float(ms.mean()), float(ms.std())
        q = np.percentile(ms, (50,) + PERCENTILES)
        med, pct = float(q[0]), [float(x) for x in q[1:]]
    else:
        w = weights.astype(np.float64)
        mean = float(np.average(ms, weights=w))
        std = float(math.sqrt(np.average((ms - mean) ** 2, weights=w)))
        med, *pct = weighted_percentiles(ms, w, (50,) + PERCENTILES)
    return LatencyStats(mean, med, std, *pct)


def step_itl_samples(steps: dict[str, np.ndarray], extra_gaps_s: np.ndarray | None = None,
                     *, weight_cuts: np.ndarray | None = None, pipelined: bool = False
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(inter-token gap, weight) from a step table: in a busy engine every decoding sequence gets
    its next token at the end of each step, so the ITL distribution is the step durations weighted
    by the sequences decoding in them (multi-step rows expanded exactly). `extra_gaps_s` adds
    weight-1 samples (the simulator's gaps across a preemption or across steps that left a
    decoder out); `weight_cuts` (per row) removes those decoders from their row's weight.

    `pipelined` (async scheduling): a step's tokens reach the host when the NEXT step's device
    work starts, so the decoders of step j - 1 wait the period of step j for their token: each
    period is weighted by the previous step's decoders, per replica in time order."""
    extra = np.zeros(0) if extra_gaps_s is None else np.asarray(extra_gaps_s, dtype=np.float64)
    b = steps["num_decode_seqs"].astype(np.float64)
    if weight_cuts is not None:
        b = b - weight_cuts
    if pipelined:
        vals, wts = _pipelined_step_samples(steps, b)
        return np.concatenate([extra, vals]), np.concatenate([np.ones(extra.size), wts])
    vals, wts = [extra], [np.ones(extra.size)]
    dec = b > 0
    n = steps["n_steps"][dec].astype(np.int64)
    b = b[dec]
    single = n == 1
    vals.append(steps["total_s"][dec][single])
    wts.append(b[single])
    k = n[~single]
    if k.size:  # a row of k steps: durations first + (last - first) * i / (k - 1), i = 0..k-1
        first, last = steps["first_dt_s"][dec][~single], steps["last_dt_s"][dec][~single]
        vals.append(_row_steps(first, last, k))
        wts.append(np.repeat(b[~single], k))
    return np.concatenate(vals), np.concatenate(wts).astype(np.float64)


def _row_steps(first: np.ndarray, last: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Each row's k step durations, first + (last - first) * i / (k - 1), rows in order."""
    i = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    return np.repeat(first, k) + np.repeat(last - first, k) * i / np.maximum(np.repeat(k, k) - 1, 1)


def _pipelined_step_samples(steps: dict[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every step's period paired with the decoders of the step before it on its replica."""
    order = np.lexsort((steps["t_start_s"], steps["replica"]))
    k = steps["n_steps"][order].astype(np.int64)
    periods = _row_steps(steps["first_dt_s"][order], steps["last_dt_s"][order], k)  # one row: its total_s
    w = np.repeat(weights[order], k)
    replica = np.repeat(steps["replica"][order], k)
    prev_w = np.concatenate([[0.0], w[:-1]])
    prev_w[np.concatenate([[True], replica[1:] != replica[:-1]])] = 0.0  # a replica's first step
    keep = prev_w > 0
    return periods[keep], prev_w[keep]


def good_mask(requests: dict[str, np.ndarray], slo: SLO | None) -> np.ndarray:
    """Finished requests meeting every target of `slo` (all finished ones without an SLO)."""
    ok = requests["status"] == "finished"
    if slo is None:
        return ok
    if slo.ttft_ms is not None:
        ok &= requests["ttft_s"] * 1e3 <= slo.ttft_ms
    if slo.tpot_ms is not None:
        ok &= np.nan_to_num(requests["tpot_s"], nan=0.0) * 1e3 <= slo.tpot_ms
    if slo.e2el_ms is not None:
        ok &= requests["e2e_s"] * 1e3 <= slo.e2el_ms
    return ok


def peaks(requests: dict[str, np.ndarray], steps: dict[str, np.ndarray]) -> tuple[float, int]:
    """(most output tokens ended in one 1-second bin, most requests in the system at once)."""
    if steps["t_start_s"].size:  # occupied bins only: memory grows with the steps, not the span
        ends = steps["t_start_s"] + steps["total_s"]
        bins = np.unique(np.floor(ends - float(steps["t_start_s"].min())), return_inverse=True)[1]
        max_tok = float(np.bincount(bins.ravel(), weights=steps["num_output_tokens"]).max())
    else:
        max_tok = 0.0
    fin = np.where(np.isnan(requests["finish_s"]), np.inf, requests["finish_s"])
    t = np.concatenate([requests["arrival_s"], fin])
    d = np.concatenate([np.ones(requests["arrival_s"].size), -np.ones(fin.size)])
    order = np.lexsort((d, t))  # finishes before arrivals at equal times
    return max_tok, int(np.cumsum(d[order]).max()) if d.size else 0


# --- the summary ---------------------------------------------------------------------------------
_LIMIT = re.compile(r"(\w+) = (\d+)\s*$")
UNFINISHED_REASON = "still in flight when the run stopped"


def rejection_kind(reason: str) -> str:
    """A rejection reason without its per-request figures, so one cause counts once: the
    scheduler ends each reason with the limit it broke ('... = 40000 tokens exceeds
    max_model_len = 32768' -> 'exceeds max_model_len = 32768')."""
    m = _LIMIT.search(reason)
    return f"exceeds {m.group(1)} = {m.group(2)}" if m else (reason or "unknown")


def reason_counts(r: dict[str, np.ndarray]) -> dict[str, dict[str, int]]:
    """{"rejected_reasons": {kind: count}, "unfinished_reasons": {reason: count}}, most frequent first."""
    status, reasons = r["status"], r["finish_reason"]
    rejected = Counter(rejection_kind(str(x)) for x in reasons[status == "rejected"])
    unfinished = Counter(str(x) or UNFINISHED_REASON for x in reasons[status == "unfinished"])
    return {"rejected_reasons": dict(rejected.most_common()), "unfinished_reasons": dict(unfinished.most_common())}


def summarize(requests: dict[str, np.ndarray], steps: dict[str, np.ndarray], *, meta: dict[str, Any],
              counters: dict[str, float], itl: tuple[np.ndarray, np.ndarray], wall_s: float,
              slo: SLO | None = None) -> RunSummary:
    """A run's `RunSummary` from its tables (written as `vllm bench serve` result keys plus
    costline extras by `RunSummary.to_json_dict`).

    `meta` names the run (model, num_gpus, num_replicas, backend, ...; missing keys give None);
    `counters` holds COUNTER_KEYS; `itl` is (gap_s, weight) samples.
    """
    r = requests
    done = r["status"] == "finished"
    t0 = float(r["arrival_s"].min()) if r["arrival_s"].size else 0.0
    t_end = float(np.nanmax(r["finish_s"])) if done.any() else t0
    duration = max(t_end - t0, 1e-12)
    res = _bench_fields(r, done, duration, meta, slo)
    res["max_output_tokens_per_s"], res["max_concurrent_requests"] = peaks(r, steps)
    tp = r["tpot_s"][done]
    res |= {"ttft": latency_stats(r["ttft_s"][done]), "tpot": latency_stats(tp[~np.isnan(tp)]),
            "itl": latency_stats(*itl), "e2el": latency_stats(r["e2e_s"][done]),
            "queue_time": latency_stats(r["queue_s"][done])}
    res |= _extras(r, steps, meta, counters, duration, res, slo)
    res["wall_s"] = wall_s
    res["simulated_requests_per_wall_s"] = r["request_id"].size / wall_s if wall_s else None
    res["vllm_args"], res["serve_command"] = meta.get("vllm_args"), meta.get("serve_command")
    return RunSummary(**res)


def _bench_fields(r: dict[str, np.ndarray], done: np.ndarray, duration: float, meta: dict[str, Any],
                  slo: SLO | None) -> dict[str, Any]:
    out_tokens = int(r["num_output_tokens"][done].sum())
    in_tokens = int(r["prompt_len"][done].sum())
    return {
        "date": time.strftime("%Y%m%d-%H%M%S", time.gmtime()),
        "endpoint_type": meta.get("endpoint_type"), "backend": meta.get("backend"), "label": meta.get("label"),
        "model": meta.get("model"),
        "num_prompts": int(r["request_id"].size),
        "request_rate": meta.get("request_rate", "inf"), "burstiness": meta.get("burstiness"),
        "max_concurrency": None, "duration_s": duration,
        "completed": int(done.sum()), "failed": int((~done).sum()),
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": float(done.sum() / duration),
        "request_goodput": float(good_mask(r, slo).sum() / duration) if slo else None,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
    }


def _extras(r: dict[str, np.ndarray], s: dict[str, np.ndarray], meta: dict[str, Any], c: dict[str, float],
            duration: float, res: dict[str, Any], slo: SLO | None) -> dict[str, Any]:
    num_gpus, num_replicas = meta.get("num_gpus") or 1, meta.get("num_replicas") or 1
    gpu_s, cpu_s, total_s = float(s["gpu_s"].sum()), float(s["cpu_s"].sum()), float(s["total_s"].sum())
    q, h = c.get("prefix_cache_queries_tokens", 0), c.get("prefix_cache_hits_tokens", 0)
    kv = r["kv_transfer_s"]
    return {
        "num_gpus": num_gpus, "num_replicas": num_replicas, "deployment": meta.get("deployment"),
        "slo": slo,
        "request_goodput_per_gpu": res["request_goodput"] / num_gpus if slo else None,
        "output_throughput_per_gpu": res["output_throughput"] / num_gpus,
        "rejected": int((r["status"] == "rejected").sum()),
        "unfinished": int((r["status"] == "unfinished").sum()),
        **reason_counts(r),
        "num_preemptions": int(r["num_preemptions"].sum()),
        "prefix_cache_queries_tokens": q, "prefix_cache_hits_tokens": h,
        "prefix_cache_hit_rate": h / q if q else 0.0,
        "prefill_tokens_computed": int((s["num_prefill_tokens"] * s["n_steps"]).sum()),
        "gpu_busy_share": gpu_s / (duration * num_replicas),
        "cpu_share_of_step_time": cpu_s / total_s if total_s else 0.0,
        "num_engine_steps": int(s["n_steps"].sum()),
        **{k: meta.get(k) for k in ENGINE_META_KEYS},
        **_spec_decode_fields(c),
        "mean_kv_transfer_ms": float(np.nanmean(kv) * 1e3) if np.isfinite(kv).any() else None,
        "kv_cache_usage_max": float(s["kv_usage"].max()) if s["kv_usage"].size else 0.0,
        "num_gpu_blocks": meta.get("num_gpu_blocks"), "kv_block_coarsening": meta.get("kv_block_coarsening", 1),
        "profile": meta.get("profile"), "profile_status": meta.get("profile_status"),
        "profile_validation": meta.get("profile_validation"),
    }


def _spec_decode_fields(c: dict[str, float]) -> dict[str, Any]:
    drafts, drafted, accepted = (c.get("spec_num_drafts", 0), c.get("spec_draft_tokens", 0),
                                 c.get("spec_accepted_tokens", 0))
    return {
        "spec_decode_num_drafts": drafts, "spec_decode_draft_tokens": drafted,
        "spec_decode_accepted_tokens": accepted,
        "spec_decode_acceptance_rate": accepted / drafted if drafted else None,
        "spec_decode_acceptance_length": 1 + accepted / drafts if drafts else None,
        # vLLM's bench: accepted at position i / drafts (a draft shorter than k counts as rejected there)
        "spec_decode_per_position_acceptance_rates":
            [a / drafts for a in accepted_per_position(c)] if drafts else None,
    }


def jsonable(x: Any) -> Any:
    """`x` with numpy scalars made plain and NaN/inf made None (strict JSON has neither)."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# --- a run's result ----------------------------------------------------------------------------------
@dataclass
class RunTables:
    """What one run (simulated or replayed) produced: column tables (dicts of numpy arrays whose
    names are engine/core/records.py's), run metadata, run-wide counters, and its ITL samples."""

    requests: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    meta: dict[str, Any]
    counters: dict[str, float]
    wall_s: float = 0.0
    itl_gaps_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # weight-1 ITL samples

    def itl_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """(gap_s, weight): step durations weighted by decoding sequences, plus `itl_gaps_s`."""
        return step_itl_samples(self.steps, self.itl_gaps_s)

    def good_mask(self, slo: SLO | None) -> np.ndarray:
        return good_mask(self.requests, slo)

    def summary(self, slo: SLO | None = None) -> RunSummary:
        """The run's summary (the one entry point: `to_json_dict()` writes it under `vllm bench
        serve` result keys plus costline extras); `slo` defaults to meta["slo"]."""
        slo = slo if slo is not None else self.meta.get("slo")
        return summarize(self.requests, self.steps, meta=self.meta, counters=self.counters,
                         itl=self.itl_samples(), wall_s=self.wall_s, slo=slo)

    def prometheus_text(self) -> str:
        return prometheus_text(self.requests, self.steps, meta=self.meta, counters=self.counters,
                               itl=self.itl_samples())


__all__ = [
    "COUNTER_KEYS",
    "PERCENTILES",
    "POS_KEY",
    "SLO",
    "SLO_KEYS",
    "LatencyStats",
    "RunSummary",
    "RunTables",
    "good_mask",
    "jsonable",
    "latency_stats",
    "peaks",
    "per_position_counters",
    "prometheus_text",
    "reason_counts",
    "rejection_kind",
    "step_itl_samples",
    "summarize",
    "weighted_percentiles",
]
