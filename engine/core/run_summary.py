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
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from engine.core.flags import FlagError
from engine.core.vllm_metrics import (
    E2E_BUCKETS_S,
    HELP,
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS_S,
    PREEMPTION_BUCKETS,
    TTFT_BUCKETS_S,
    build_1_2_5_buckets,
)

PERCENTILES = (50, 90, 95, 99)
# Run-wide counters both sides keep (scheduler stats); the summary and the exposition read them.
COUNTER_KEYS = ("prefix_cache_queries_tokens", "prefix_cache_hits_tokens", "spec_num_drafts",
                "spec_draft_tokens", "spec_accepted_tokens")
# what a run's meta says about its engine configuration (None where a run does not say), in its summary
ENGINE_META_KEYS = ("async_scheduling", "speculative_config", "ready_s")  # ready_s: engines only
# plus, with speculative decoding, accepted drafts by position: POS_KEY.format(i) for i < k
POS_KEY = "spec_accepted_tokens_pos_{}"


def per_position_counters(accepted_per_pos: list[int]) -> dict[str, float]:
    """Accepted drafts by draft position (the scheduler's num_spec_accepted_per_pos) as counters."""
    return {POS_KEY.format(i): float(n) for i, n in enumerate(accepted_per_pos)}


def accepted_per_position(c: dict[str, float]) -> list[float]:
    """The per-position counters back as a list (empty without speculative decoding)."""
    out: list[float] = []
    while POS_KEY.format(len(out)) in c:
        out.append(c[POS_KEY.format(len(out))])
    return out


SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclass
class SLO:
    """Goodput targets in milliseconds, as `vllm bench serve --goodput ttft:X tpot:Y e2el:Z`."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> SLO | None:
        """`"ttft:500 tpot:50"` as an `SLO`; a malformed pair, an unknown key, a negative or
        non-finite value is refused naming the pair, as `vllm bench serve --goodput` refuses it."""
        if text is None or not text.strip():
            return None
        values: dict[str, float] = {}
        for part in text.replace(",", " ").split():
            key, _, raw = part.partition(":")
            if key not in SLO_KEYS or not raw:
                raise FlagError("slo", repr(part), f"use KEY:MS pairs with KEY in {', '.join(SLO_KEYS)} "
                                '(e.g. {slo} "ttft:500 tpot:50")')
            try:
                ms = float(raw)
            except ValueError:
                raise FlagError("slo", repr(part),
                                f"{raw!r} is not a number of milliseconds (e.g. {key}:500)") from None
            if not math.isfinite(ms) or ms < 0:
                raise FlagError("slo", repr(part), "an SLO must be a finite number of milliseconds >= 0 "
                                f"(vLLM refuses negative ones); e.g. {key}:500")
            values[f"{key}_ms"] = ms
        return cls(**values)

    def as_dict(self) -> dict[str, float]:
        return {k.removesuffix("_ms"): v for k, v in self.__dict__.items() if v is not None}


# --- statistics -----------------------------------------------------------------------------
def weighted_percentiles(values: np.ndarray, weights: np.ndarray, pcts: tuple[float, ...]) -> list[float]:
    """Smallest value whose cumulative weight reaches p% (numpy's 'inverted_cdf', weighted)."""
    if values.size == 0 or weights.sum() <= 0:
        return [math.nan] * len(pcts)
    order = np.argsort(values)
    v, cw = values[order], np.cumsum(weights[order], dtype=np.float64)
    total = cw[-1]
    return [float(v[min(np.searchsorted(cw, p / 100 * total, side="left"), v.size - 1)]) for p in pcts]


def latency_stats(prefix: str, values_s: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """mean/median/std/pXX in ms, `vllm bench serve` style (`mean_ttft_ms`, ...)."""
    keys = [f"{k}_{prefix}_ms" for k in ("mean", "median", "std")] + [f"p{p}_{prefix}_ms" for p in PERCENTILES]
    if values_s.size == 0:
        return dict.fromkeys(keys, math.nan)
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
    return dict(zip(keys, [mean, med, std, *pct]))


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
              slo: SLO | None = None) -> dict[str, Any]:
    """`vllm bench serve` result keys plus costline extras, from a run's tables.

    `meta` names the run (model, num_gpus, num_replicas, backend, ...; missing keys give None);
    `counters` holds COUNTER_KEYS; `itl` is (gap_s, weight) samples.
    """
    r = requests
    done = r["status"] == "finished"
    t0 = float(r["arrival_s"].min()) if r["arrival_s"].size else 0.0
    t_end = float(np.nanmax(r["finish_s"])) if done.any() else t0
    duration = max(t_end - t0, 1e-12)
    res = _bench_keys(r, done, duration, meta, slo)
    res["max_output_tokens_per_s"], res["max_concurrent_requests"] = peaks(r, steps)
    tp = r["tpot_s"][done]
    res |= latency_stats("ttft", r["ttft_s"][done])
    res |= latency_stats("tpot", tp[~np.isnan(tp)])
    res |= latency_stats("itl", *itl)
    res |= latency_stats("e2el", r["e2e_s"][done])
    res |= latency_stats("queue_time", r["queue_s"][done])
    res |= _extras(r, steps, meta, counters, duration, res, slo)
    res["wall_s"] = wall_s
    res["simulated_requests_per_wall_s"] = r["request_id"].size / wall_s if wall_s else None
    return res


def _bench_keys(r: dict[str, np.ndarray], done: np.ndarray, duration: float, meta: dict[str, Any],
                slo: SLO | None) -> dict[str, Any]:
    out_tokens = int(r["num_output_tokens"][done].sum())
    in_tokens = int(r["prompt_len"][done].sum())
    return {
        "date": time.strftime("%Y%m%d-%H%M%S", time.gmtime()),
        "endpoint_type": meta.get("endpoint_type"), "backend": meta.get("backend"), "label": meta.get("label"),
        "model_id": meta.get("model"), "tokenizer_id": meta.get("model"),
        "num_prompts": int(r["request_id"].size),
        "request_rate": meta.get("request_rate", "inf"), "burstiness": meta.get("burstiness"),
        "max_concurrency": None, "duration": duration,
        "completed": int(done.sum()), "failed": int((~done).sum()),
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": done.sum() / duration,
        "request_goodput": (good_mask(r, slo).sum() / duration) if slo else None,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
    }


def _extras(r: dict[str, np.ndarray], s: dict[str, np.ndarray], meta: dict[str, Any], c: dict[str, float],
            duration: float, res: dict[str, Any], slo: SLO | None) -> dict[str, Any]:
    num_gpus, num_replicas = meta.get("num_gpus") or 1, meta.get("num_replicas") or 1
    gpu_s, cpu_s, total_s = float(s["gpu_s"].sum()), float(s["cpu_s"].sum()), float(s["total_s"].sum())
    q, h = c.get("prefix_cache_queries_tokens", 0), c.get("prefix_cache_hits_tokens", 0)
    drafts, drafted, accepted = (c.get("spec_num_drafts", 0), c.get("spec_draft_tokens", 0),
                                 c.get("spec_accepted_tokens", 0))
    kv = r["kv_transfer_s"]
    return {
        "num_gpus": num_gpus, "num_replicas": num_replicas, "deployment": meta.get("deployment"),
        "goodput_slo": slo.as_dict() if slo else None,
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
        "spec_decode_num_drafts": drafts, "spec_decode_draft_tokens": drafted,
        "spec_decode_accepted_tokens": accepted,
        "spec_decode_acceptance_rate": accepted / drafted if drafted else None,
        "spec_decode_acceptance_length": 1 + accepted / drafts if drafts else None,
        # vLLM's bench: accepted at position i / drafts (a draft shorter than k counts as rejected there)
        "spec_decode_per_position_acceptance_rates":
            [a / drafts for a in accepted_per_position(c)] if drafts else None,
        "mean_kv_transfer_ms": float(np.nanmean(kv) * 1e3) if np.isfinite(kv).any() else None,
        "kv_cache_usage_max": float(s["kv_usage"].max()) if s["kv_usage"].size else 0.0,
        "num_gpu_blocks": meta.get("num_gpu_blocks"), "kv_block_coarsening": meta.get("kv_block_coarsening", 1),
        # the simulator's cost profile: name, how far to trust it, its validation error (if any)
        "profile": meta.get("profile"), "profile_status": meta.get("profile_status"),
        "profile_validation": meta.get("profile_validation"),
    }


# --- Prometheus ------------------------------------------------------------------------------------
class _Families:
    """A prometheus_client collector over metric families computed once from the tables."""

    def __init__(self, families: list) -> None:
        self._families = families

    def collect(self):
        return iter(self._families)


def _hist(name: str, model: str, values: np.ndarray, bounds: tuple, weights: np.ndarray | None = None
          ) -> HistogramMetricFamily:
    v = np.asarray(values, dtype=np.float64)
    w = np.ones(v.size) if weights is None else np.asarray(weights, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    cw = np.concatenate([[0.0], np.cumsum(w[order])])
    counts = cw[np.searchsorted(v[order], np.asarray(bounds, dtype=np.float64), side="right")]
    buckets = [(floatToGoString(b), float(n)) for b, n in zip(bounds, counts)] + [("+Inf", float(cw[-1]))]
    fam = HistogramMetricFamily(name, HELP[name], labels=["model_name"])
    fam.add_metric([model], buckets, float((v * w).sum()))
    return fam


def _counter(name: str, model: str, value: float, by: tuple[str, dict[str, float]] | None = None
             ) -> CounterMetricFamily:
    if by is None:
        fam = CounterMetricFamily(name, HELP[name], labels=["model_name"])
        fam.add_metric([model], float(value))
        return fam
    label, values = by
    fam = CounterMetricFamily(name, HELP[name], labels=["model_name", label])
    for key, v in sorted(values.items()):
        fam.add_metric([model, key], float(v))
    return fam


def _gauge(name: str, model: str, value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, HELP[name], labels=["model_name"])
    fam.add_metric([model], float(value))
    return fam


def _count_by(labels: np.ndarray) -> dict[str, float]:
    keys, counts = np.unique(labels.astype(str), return_counts=True)
    return {str(k) or "unknown": float(n) for k, n in zip(keys, counts)}


def prometheus_text(requests: dict[str, np.ndarray], steps: dict[str, np.ndarray], *, meta: dict[str, Any],
                    counters: dict[str, float], itl: tuple[np.ndarray, np.ndarray]) -> str:
    """vLLM's Prometheus exposition of a whole run (label model_name), via prometheus_client."""
    r, s, c = requests, steps, counters
    m = str(meta.get("model"))
    done = r["status"] == "finished"
    last = {k: (float(s[k][-1]) if s[k].size else 0.0) for k in ("num_running", "num_waiting", "kv_usage")}
    tp = r["tpot_s"][done]
    pre = r["num_preemptions"][done]
    lens = build_1_2_5_buckets(int(meta.get("max_model_len") or 8192))
    fams = [
        _gauge("vllm:num_requests_running", m, last["num_running"]),
        _gauge("vllm:num_requests_waiting", m, last["num_waiting"]),
        _gauge("vllm:kv_cache_usage_perc", m, last["kv_usage"]),
        _counter("vllm:prefix_cache_queries", m, c.get("prefix_cache_queries_tokens", 0)),
        _counter("vllm:prefix_cache_hits", m, c.get("prefix_cache_hits_tokens", 0)),
        _counter("vllm:num_preemptions", m, r["num_preemptions"].sum()),
        _counter("vllm:prompt_tokens", m, r["prompt_len"][done].sum()),
        _counter("vllm:generation_tokens", m, r["num_output_tokens"].sum()),
        _counter("vllm:request_success", m, 0, ("finished_reason", _count_by(r["finish_reason"][done]))),
        _counter("vllm:admission_rejections", m, 0,
                 ("reason", _count_by(r["finish_reason"][r["status"] == "rejected"]))),
        _counter("vllm:spec_decode_num_drafts", m, c.get("spec_num_drafts", 0)),
        _counter("vllm:spec_decode_num_draft_tokens", m, c.get("spec_draft_tokens", 0)),
        _counter("vllm:spec_decode_num_accepted_tokens", m, c.get("spec_accepted_tokens", 0)),
        _counter("vllm:spec_decode_num_accepted_tokens_per_pos", m, 0,
                 ("position", {str(i): a for i, a in enumerate(accepted_per_position(c))})),
        _hist("vllm:time_to_first_token_seconds", m, r["ttft_s"][done], TTFT_BUCKETS_S),
        _hist("vllm:inter_token_latency_seconds", m, itl[0], ITL_BUCKETS_S, itl[1]),
        _hist("vllm:request_time_per_output_token_seconds", m, tp[~np.isnan(tp)], ITL_BUCKETS_S),
        _hist("vllm:e2e_request_latency_seconds", m, r["e2e_s"][done], E2E_BUCKETS_S),
        _hist("vllm:request_queue_time_seconds", m, r["queue_s"][done], E2E_BUCKETS_S),
        _hist("vllm:request_inference_time_seconds", m, (r["finish_s"] - r["scheduled_s"])[done], E2E_BUCKETS_S),
        _hist("vllm:request_prefill_time_seconds", m, (r["first_token_s"] - r["scheduled_s"])[done],
              E2E_BUCKETS_S),
        _hist("vllm:request_decode_time_seconds", m, (r["finish_s"] - r["first_token_s"])[done], E2E_BUCKETS_S),
        _hist("vllm:request_prompt_tokens", m, r["prompt_len"][done], lens),
        _hist("vllm:request_generation_tokens", m, r["num_output_tokens"][done], lens),
        _hist("vllm:request_num_preemptions", m, pre, PREEMPTION_BUCKETS),
        _hist("vllm:iteration_tokens_total", m, s["num_batched_tokens"], ITERATION_TOKENS_BUCKETS, s["n_steps"]),
    ]
    registry = CollectorRegistry()
    registry.register(_Families(fams))
    return generate_latest(registry).decode()


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

    def summary(self, slo: SLO | None = None) -> dict[str, Any]:
        """`vllm bench serve` result keys plus costline extras; `slo` defaults to meta["slo"]."""
        slo = slo if slo is not None else self.meta.get("slo")
        return summarize(self.requests, self.steps, meta=self.meta, counters=self.counters,
                         itl=self.itl_samples(), wall_s=self.wall_s, slo=slo)

    def prometheus_text(self) -> str:
        return prometheus_text(self.requests, self.steps, meta=self.meta, counters=self.counters,
                               itl=self.itl_samples())


__all__ = [
    "COUNTER_KEYS",
    "PERCENTILES",
    "SLO",
    "RunTables",
    "good_mask",
    "jsonable",
    "latency_stats",
    "peaks",
    "prometheus_text",
    "reason_counts",
    "rejection_kind",
    "step_itl_samples",
    "summarize",
    "weighted_percentiles",
]
