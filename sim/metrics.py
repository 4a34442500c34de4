"""What a simulation measured: per-request and per-step tables, aggregates, exports.

The summary uses the keys of `vllm bench serve --save-result` (`mean_ttft_ms`,
`p99_tpot_ms`, `request_goodput`, ...) so a simulated run and a measured one compare
key by key; costline's extras (goodput per GPU, prefix hit rate, GPU busy share, CPU
share of step time, KV transfer) sit beside them. `prometheus_text` renders vLLM's
metric names and buckets (vllm-conventions.md section 2), so dashboards built for a
real server read a simulated one.

Inter-token latency is not kept per token: in a busy engine every decoding sequence
gets its next token at the end of each step, so the ITL distribution is the step
durations weighted by the number of sequences decoding in them. Skipped-ahead decode
stretches are stored as one row whose n step durations grow linearly from `first_dt_s`
to `last_dt_s` (sim/cost_model.py `DecodeRun`), and are expanded exactly here.
A request resumed after a preemption adds one sample: the gap from its last token before
the preemption to its first token after (the jitter preemption causes).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.vllm_metrics import (
    E2E_BUCKETS_S,
    HELP,
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS_S,
    PREEMPTION_BUCKETS,
    TTFT_BUCKETS_S,
)

PERCENTILES = (50, 90, 95, 99)

STEP_COLUMNS = ("replica", "t_start_s", "dt_s", "n_steps", "first_dt_s", "last_dt_s", "gpu_s", "cpu_s",
                "num_prefill_tokens", "num_prefill_seqs", "num_decode_seqs", "num_output_tokens",
                "sum_decode_context", "num_batched_tokens", "num_blocks_allocated", "num_blocks_hashed",
                "num_preempted", "num_running", "num_waiting", "kv_usage", "spec_draft_tokens",
                "spec_accepted_tokens")

REQUEST_COLUMNS = ("request_id", "category", "replica", "arrival_s", "scheduled_s", "first_token_s",
                   "finish_s", "prompt_len", "output_len", "num_generated", "num_cached_tokens",
                   "num_preemptions", "status", "reason", "kv_transfer_s", "ttft_s", "tpot_s",
                   "e2e_s", "queue_s")


@dataclass
class SLO:
    """Goodput targets in milliseconds, as `vllm bench serve --goodput ttft:X tpot:Y e2el:Z`."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> SLO | None:
        if not text:
            return None
        slo = cls()
        for part in text.replace(",", " ").split():
            key, _, val = part.partition(":")
            name = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2el_ms"}.get(key.strip())
            if name is None or not val:
                raise ValueError(f"--goodput {part!r}: use KEY:MS pairs with KEY in ttft, tpot, e2el "
                                 "(e.g. --goodput ttft:500 tpot:50)")
            setattr(slo, name, float(val))
        return slo

    def as_dict(self) -> dict[str, float]:
        return {k.removesuffix("_ms"): v for k, v in self.__dict__.items() if v is not None}


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, pcts: tuple[float, ...]) -> list[float]:
    """Smallest value whose cumulative weight reaches p% (numpy's 'inverted_cdf', weighted)."""
    if values.size == 0 or weights.sum() <= 0:
        return [math.nan] * len(pcts)
    order = np.argsort(values)
    v, cw = values[order], np.cumsum(weights[order], dtype=np.float64)
    total = cw[-1]
    return [float(v[min(np.searchsorted(cw, p / 100 * total, side="left"), v.size - 1)]) for p in pcts]


def _stats(prefix: str, values_s: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """mean/median/std/pXX in ms, `vllm bench serve` style (`mean_ttft_ms`, ...)."""
    out: dict[str, float] = {}
    if values_s.size == 0:
        for k in ("mean", "median", "std"):
            out[f"{k}_{prefix}_ms"] = math.nan
        for p in PERCENTILES:
            out[f"p{p}_{prefix}_ms"] = math.nan
        return out
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
    out[f"mean_{prefix}_ms"], out[f"median_{prefix}_ms"], out[f"std_{prefix}_ms"] = mean, med, std
    for p, v in zip(PERCENTILES, pct):
        out[f"p{p}_{prefix}_ms"] = v
    return out


@dataclass
class SimResult:
    """Everything one simulation produced; tables are column dicts of numpy arrays."""

    requests: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    meta: dict[str, Any]
    counters: dict[str, float]
    wall_s: float = 0.0
    stall_itl_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # gaps across preemptions
    _summary: dict[str, Any] | None = field(default=None, repr=False)

    # --- derived ----------------------------------------------------------------
    def itl_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """(inter-token gap, weight): each step's duration weighted by the sequences decoding
        in it (skip rows expanded exactly), plus one sample per resume after a preemption."""
        s = self.steps
        vals, wts = [self.stall_itl_s], [np.ones(self.stall_itl_s.size)]
        if s["n_steps"].size:
            dec = s["num_decode_seqs"] > 0
            n = s["n_steps"][dec].astype(np.int64)
            b = s["num_decode_seqs"][dec]
            single = n == 1
            vals.append(s["dt_s"][dec][single])
            wts.append(b[single])
            # a skip row of k steps: durations first + (last - first) * i / (k - 1), i = 0..k-1
            k = n[~single]
            if k.size:
                first, last = s["first_dt_s"][dec][~single], s["last_dt_s"][dec][~single]
                i = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
                kk = np.repeat(k, k)
                vals.append(np.repeat(first, k) + np.repeat(last - first, k) * i / np.maximum(kk - 1, 1))
                wts.append(np.repeat(b[~single], k))
        return np.concatenate(vals), np.concatenate(wts).astype(np.float64)

    def good_mask(self, slo: SLO | None) -> np.ndarray:
        r = self.requests
        ok = r["status"] == "finished"
        if slo is None:
            return ok
        if slo.ttft_ms is not None:
            ok &= r["ttft_s"] * 1e3 <= slo.ttft_ms
        if slo.tpot_ms is not None:
            ok &= np.nan_to_num(r["tpot_s"], nan=0.0) * 1e3 <= slo.tpot_ms
        if slo.e2el_ms is not None:
            ok &= r["e2e_s"] * 1e3 <= slo.e2el_ms
        return ok

    def summary(self, slo: SLO | None = None) -> dict[str, Any]:
        """`vllm bench serve` result keys plus costline extras (cached per SLO)."""
        slo = slo if slo is not None else self.meta.get("slo")
        r, s, c, m = self.requests, self.steps, self.counters, self.meta
        done = r["status"] == "finished"
        num_gpus = m["num_gpus"]
        t0 = float(r["arrival_s"].min()) if r["arrival_s"].size else 0.0
        t_end = float(np.nanmax(r["finish_s"])) if done.any() else t0
        duration = max(t_end - t0, 1e-12)
        out_tokens = int(r["num_generated"][done].sum())
        in_tokens = int(r["prompt_len"][done].sum())
        res: dict[str, Any] = {
            "date": time.strftime("%Y%m%d-%H%M%S", time.gmtime()),
            "endpoint_type": "simulated", "backend": "costline-sim", "label": m.get("label"),
            "model_id": m["model"], "tokenizer_id": m["model"],
            "num_prompts": int(r["request_id"].size),
            "request_rate": m.get("request_rate", "inf"), "burstiness": m.get("burstiness"),
            "max_concurrency": None,
            "duration": duration, "completed": int(done.sum()),
            "failed": int((~done).sum()),
            "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
            "request_throughput": done.sum() / duration,
            "request_goodput": (self.good_mask(slo).sum() / duration) if slo else None,
            "output_throughput": out_tokens / duration,
            "total_token_throughput": (in_tokens + out_tokens) / duration,
        }
        res["max_output_tokens_per_s"], res["max_concurrent_requests"] = self._peaks()
        res |= _stats("ttft", r["ttft_s"][done])
        tp = r["tpot_s"][done]
        res |= _stats("tpot", tp[~np.isnan(tp)])
        res |= _stats("itl", *self.itl_samples())
        res |= _stats("e2el", r["e2e_s"][done])
        res |= _stats("queue_time", r["queue_s"][done])
        # costline extras
        gpu_s, cpu_s, dt_s = float(s["gpu_s"].sum()), float(s["cpu_s"].sum()), float(s["dt_s"].sum())
        q, h = c.get("prefix_cache_queries_tokens", 0), c.get("prefix_cache_hits_tokens", 0)
        drafts, drafted, accepted = (c.get("spec_num_drafts", 0), c.get("spec_draft_tokens", 0),
                                     c.get("spec_accepted_tokens", 0))
        n_pre = int(r["num_preemptions"].sum())
        res |= {
            "num_gpus": num_gpus, "num_replicas": m["num_replicas"], "deployment": m.get("deployment"),
            "goodput_slo": slo.as_dict() if slo else None,
            "request_goodput_per_gpu": res["request_goodput"] / num_gpus if slo else None,
            "output_throughput_per_gpu": res["output_throughput"] / num_gpus,
            "rejected": int((r["status"] == "rejected").sum()),
            "unfinished": int((r["status"] == "unfinished").sum()),
            "num_preemptions": n_pre,
            "prefix_cache_queries_tokens": q, "prefix_cache_hits_tokens": h,
            "prefix_cache_hit_rate": h / q if q else 0.0,
            "prefill_tokens_computed": int(s["num_prefill_tokens"].sum()),
            "gpu_busy_share": gpu_s / (duration * m["num_replicas"]),
            "cpu_share_of_step_time": cpu_s / dt_s if dt_s else 0.0,
            "num_engine_steps": int(s["n_steps"].sum()),
            "spec_decode_num_drafts": drafts, "spec_decode_draft_tokens": drafted,
            "spec_decode_accepted_tokens": accepted,
            "spec_decode_acceptance_rate": accepted / drafted if drafted else None,
            "spec_decode_acceptance_length": 1 + accepted / drafts if drafts else None,
            "mean_kv_transfer_ms": float(np.nanmean(r["kv_transfer_s"]) * 1e3)
            if np.isfinite(r["kv_transfer_s"]).any() else None,
            "kv_cache_usage_max": float(s["kv_usage"].max()) if s["kv_usage"].size else 0.0,
            "num_gpu_blocks": m.get("num_gpu_blocks"), "kv_block_coarsening": m.get("kv_block_coarsening", 1),
            "wall_s": self.wall_s,
            "simulated_requests_per_wall_s": r["request_id"].size / self.wall_s if self.wall_s else None,
        }
        return res

    def _peaks(self) -> tuple[float, int]:
        r, s = self.requests, self.steps
        if s["t_start_s"].size:
            ends = s["t_start_s"] + s["dt_s"]
            t0 = float(s["t_start_s"].min())
            bins = np.floor(ends - t0).astype(np.int64)
            per_s = np.bincount(bins, weights=s["num_output_tokens"]) if bins.size else np.zeros(1)
            max_tok = float(per_s.max())
        else:
            max_tok = 0.0
        fin = np.where(np.isnan(r["finish_s"]), np.inf, r["finish_s"])
        t = np.concatenate([r["arrival_s"], fin])
        d = np.concatenate([np.ones(r["arrival_s"].size), -np.ones(fin.size)])
        order = np.lexsort((d, t))  # finishes before arrivals at equal times
        return max_tok, int(np.cumsum(d[order]).max()) if d.size else 0

    # --- exports ------------------------------------------------------------------
    def prometheus_text(self) -> str:
        """vLLM's Prometheus exposition for the whole run (label model_name; engine = "sim")."""
        r, c, m = self.requests, self.counters, self.meta
        done = r["status"] == "finished"
        lab = f'engine="sim",model_name="{m["model"]}"'
        lines: list[str] = []

        def hist(name: str, values: np.ndarray, buckets: tuple, weights=None) -> None:
            w = np.ones(values.size) if weights is None else weights
            lines.extend([f"# HELP {name} {HELP[name]}", f"# TYPE {name} histogram"])
            for b in buckets:
                lines.append(f'{name}_bucket{{{lab},le="{float(b)}"}} {float(w[values <= b].sum())}')
            lines.append(f'{name}_bucket{{{lab},le="+Inf"}} {float(w.sum())}')
            lines.append(f"{name}_count{{{lab}}} {float(w.sum())}")
            lines.append(f"{name}_sum{{{lab}}} {float((values * w).sum())}")

        def counter(name: str, value: float, extra: str = "") -> None:
            lines.extend([f"# HELP {name} {HELP[name]}", f"# TYPE {name} counter",
                          f"{name}_total{{{lab}{extra}}} {float(value)}"])

        def gauge(name: str, value: float) -> None:
            lines.extend([f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge", f"{name}{{{lab}}} {float(value)}"])

        s = self.steps
        last = {k: (float(s[k][-1]) if s[k].size else 0.0) for k in ("num_running", "num_waiting", "kv_usage")}
        gauge("vllm:num_requests_running", last["num_running"])
        gauge("vllm:num_requests_waiting", last["num_waiting"])
        gauge("vllm:kv_cache_usage_perc", last["kv_usage"])
        counter("vllm:prefix_cache_queries", c.get("prefix_cache_queries_tokens", 0))
        counter("vllm:prefix_cache_hits", c.get("prefix_cache_hits_tokens", 0))
        counter("vllm:num_preemptions", r["num_preemptions"].sum())
        counter("vllm:prompt_tokens", r["prompt_len"][done].sum())
        counter("vllm:generation_tokens", r["num_generated"].sum())
        counter("vllm:request_success", done.sum(), ',finished_reason="length"')
        if c.get("spec_num_drafts"):
            counter("vllm:spec_decode_num_drafts", c["spec_num_drafts"])
            counter("vllm:spec_decode_num_draft_tokens", c["spec_draft_tokens"])
            counter("vllm:spec_decode_num_accepted_tokens", c["spec_accepted_tokens"])
        hist("vllm:time_to_first_token_seconds", r["ttft_s"][done], TTFT_BUCKETS_S)
        v, w = self.itl_samples()
        hist("vllm:inter_token_latency_seconds", v, ITL_BUCKETS_S, w)
        tp = r["tpot_s"][done]
        hist("vllm:request_time_per_output_token_seconds", tp[~np.isnan(tp)], ITL_BUCKETS_S)
        hist("vllm:e2e_request_latency_seconds", r["e2e_s"][done], E2E_BUCKETS_S)
        hist("vllm:request_queue_time_seconds", r["queue_s"][done], E2E_BUCKETS_S)
        pre = r["num_preemptions"][done]
        hist("vllm:request_num_preemptions", pre[pre > 0].astype(float), PREEMPTION_BUCKETS)
        it = s["num_batched_tokens"].astype(float)
        hist("vllm:iteration_tokens_total", it, ITERATION_TOKENS_BUCKETS, s["n_steps"].astype(float))
        return "\n".join(lines) + "\n"

    def save(self, out_dir: str | Path, fmt: str = "auto") -> dict[str, Path]:
        """requests + steps tables (Parquet when pyarrow is there, else CSV), summary.json, metrics.prom."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths: dict[str, Path] = {}
        use_parquet = fmt == "parquet"
        if fmt == "auto":
            try:
                import pyarrow  # noqa: F401
                use_parquet = True
            except ImportError:
                use_parquet = False
        for name, table in (("requests", self.requests), ("steps", self.steps)):
            if use_parquet:
                import pyarrow as pa
                import pyarrow.parquet as pq
                p = out / f"{name}.parquet"
                pq.write_table(pa.table({k: np.asarray(v) for k, v in table.items()}), p)
            else:
                p = out / f"{name}.csv"
                _write_csv(p, table)
            paths[name] = p
        paths["summary"] = out / "summary.json"
        paths["summary"].write_text(json.dumps(_jsonable(self.summary()), indent=2) + "\n")
        paths["metrics"] = out / "metrics.prom"
        paths["metrics"].write_text(self.prometheus_text())
        return paths


def _write_csv(path: Path, table: dict[str, np.ndarray]) -> None:
    cols = list(table)
    with path.open("w") as f:
        f.write(",".join(cols) + "\n")
        for row in zip(*(table[c].tolist() for c in cols)):
            f.write(",".join("" if (isinstance(x, float) and math.isnan(x)) else str(x) for x in row) + "\n")


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        f = float(x)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(x, np.integer):
        return int(x)
    return x


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    """The summary.json of a saved run (a directory or the file itself)."""
    p = Path(run_dir)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise ValueError(f"{run_dir}: no summary.json there; pass a directory written by "
                         "`costline simulate --out DIR`")
    return json.loads(p.read_text())


__all__ = [
    "REQUEST_COLUMNS",
    "SLO",
    "STEP_COLUMNS",
    "SimResult",
    "load_summary",
    "weighted_percentiles",
]
