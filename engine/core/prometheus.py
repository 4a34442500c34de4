"""The one Prometheus writer: vLLM's metric names and buckets (engine/core/vllm_metrics.py) computed
from a run's request and step tables, so dashboards built for a real server read a simulated run,
an engine replay, or an engine still running alike.

`prometheus_text` renders a finished run (the `metrics.prom` of a saved run). `LiveMetrics` is the
same exposition for a run in progress: the engine's replay hands it each step and each finished
request as they happen, and every scrape (`serve`) or `write` renders the tables so far through
the same `metric_families`, so a live /metrics and the run's final metrics.prom cannot disagree.

Torch-free: the simulator imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    generate_latest,
    start_http_server,
    write_to_textfile,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from engine.core.records import RequestRecord, StepRecord, to_columns
from engine.core.run_counters import accepted_per_position, per_position_counters
from engine.core.vllm_metrics import (
    E2E_BUCKETS_S,
    HELP,
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS_S,
    PREEMPTION_BUCKETS,
    TTFT_BUCKETS_S,
    build_1_2_5_buckets,
)


class _Families:
    """A prometheus_client collector over metric families computed once from the tables."""

    def __init__(self, families: list) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
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


def metric_families(requests: dict[str, np.ndarray], steps: dict[str, np.ndarray], *, meta: dict[str, Any],
                    counters: dict[str, float], itl: tuple[np.ndarray, np.ndarray]) -> list[Metric]:
    """vLLM's metric families (label model_name) of a run's tables: the gauges as of its last
    step, counters and histograms over its requests and steps; `itl` is (gap_s, weight)."""
    r, s, c = requests, steps, counters
    m = str(meta.get("model"))
    done = r["status"] == "finished"
    last = {k: (float(s[k][-1]) if s[k].size else 0.0) for k in ("num_running", "num_waiting", "kv_usage")}
    tp = r["tpot_s"][done]
    pre = r["num_preemptions"][done]
    lens = build_1_2_5_buckets(int(meta.get("max_model_len") or 8192))
    return [
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


def prometheus_text(requests: dict[str, np.ndarray], steps: dict[str, np.ndarray], *, meta: dict[str, Any],
                    counters: dict[str, float], itl: tuple[np.ndarray, np.ndarray]) -> str:
    """vLLM's Prometheus exposition of a whole run (label model_name), via prometheus_client."""
    registry = CollectorRegistry()
    registry.register(_Families(metric_families(requests, steps, meta=meta, counters=counters, itl=itl)))
    return generate_latest(registry).decode()


# the scheduler's stats (SchedulerStats fields) behind the run-wide counters (run_counters.COUNTER_KEYS)
_STAT_COUNTERS = {"prefix_cache_queries_tokens": "prefix_cache_queries_tokens",
                  "prefix_cache_hits_tokens": "prefix_cache_hits_tokens", "spec_num_drafts": "num_spec_drafts",
                  "spec_draft_tokens": "num_spec_draft_tokens", "spec_accepted_tokens": "num_spec_accepted_tokens"}


class LiveMetrics:
    """The exposition of an engine run in progress, in a private registry (so tests and several
    engines in one process do not collide): `observe_step` / `observe_request` as the run goes,
    `write(path)` (the node-exporter textfile format) or `serve(port)` (a /metrics endpoint).

    Each scrape renders the records so far through `metric_families`: the same text the run's
    final metrics.prom gets from its tables. The run-wide counters are the scheduler's own
    (cumulative since it started), read at each step; ITL samples are the measured token gaps.
    A long-running server keeps memory and scrape time bounded: every `fold_at` records the
    batch's families are added into running totals (histogram buckets, sums and counts, and
    counters add; gauges and the scheduler's counters take the latest) and the records dropped."""

    def __init__(self, model_name: str, max_model_len: int, *, fold_at: int = 4096) -> None:
        self.model_name = model_name
        self.meta = {"model": model_name, "max_model_len": max_model_len}
        self.fold_at = fold_at
        self._folded: list[Metric] | None = None  # the families of the records dropped so far
        self._steps: list[StepRecord] = []
        self._requests: list[RequestRecord] = []
        self._gaps_s: list[float] = []
        self._counters: dict[str, float] = {}
        self._lock = threading.Lock()  # a scrape runs on the HTTP server's thread
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def observe_step(self, step: StepRecord, scheduler: Any) -> None:
        """One step row and the scheduler's counters after it."""
        stats = scheduler.stats
        counters = {key: float(getattr(stats, name)) for key, name in _STAT_COUNTERS.items()}
        counters |= per_position_counters(list(getattr(scheduler, "num_spec_accepted_per_pos", [])))
        with self._lock:
            self._steps.append(step)
            self._counters = counters
            self._fold_if_due()

    def observe_request(self, rec: RequestRecord, itl_gaps_s: Sequence[float] = ()) -> None:
        """One finished or rejected request (`replay.request_record`) and its token gaps."""
        with self._lock:
            self._requests.append(rec)
            self._gaps_s.extend(itl_gaps_s)
            self._fold_if_due()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            return iter(_add_families(self._folded, self._batch_families(), bool(self._steps)))

    def _batch_families(self) -> list[Metric]:
        """The families of the records not folded yet (called under the lock)."""
        gaps = np.asarray(self._gaps_s, dtype=np.float64)
        return metric_families(to_columns(self._requests, RequestRecord), to_columns(self._steps, StepRecord),
                               meta=self.meta, counters=dict(self._counters), itl=(gaps, np.ones(gaps.size)))

    def _fold_if_due(self) -> None:
        if len(self._steps) + len(self._requests) >= self.fold_at:
            self._folded = _add_families(self._folded, self._batch_families(), bool(self._steps))
            self._steps, self._requests, self._gaps_s = [], [], []

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def write(self, path: str) -> None:
        write_to_textfile(path, self.registry)

    def serve(self, port: int, host: str = "127.0.0.1"):
        """Serve /metrics on `host:port` (the loopback address unless asked: prometheus-client's
        own default, 0.0.0.0, would expose the engine's metrics to the whole network); returns
        the HTTP server (`.shutdown()` stops it)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server


# families whose value is a level, not a count over records: the last step's gauges and the
# scheduler's own cumulative counters take the newer value when two batches are added
_LEVELS = frozenset({"vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:spec_decode_num_drafts",
                     "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
                     "vllm:spec_decode_num_accepted_tokens_per_pos"})


def _add_families(old: list[Metric] | None, new: list[Metric], new_has_steps: bool) -> list[Metric]:
    """`old` + `new` (the families of two batches of one run, in metric_families' order): samples
    of histograms and record counters add up (labelled series sorted as the table writer sorts
    them), levels take `new`'s value, gauges too unless `new` saw no step."""
    if old is None:
        return new
    out = []
    for o, n in zip(old, new, strict=True):
        if o.name in _LEVELS or o.type == "gauge":
            out.append(n if (o.type != "gauge" or new_has_steps) else o)
            continue
        total: dict[tuple, float] = {}
        labels: dict[tuple, dict[str, str]] = {}
        for s in (*o.samples, *n.samples):
            key = (s.name, tuple(sorted(s.labels.items())))
            total[key] = total.get(key, 0.0) + s.value
            labels.setdefault(key, s.labels)
        keys = sorted(total) if o.type == "counter" else list(total)  # histogram buckets keep their order
        fam = Metric(o.name, o.documentation, o.type)
        for key in keys:
            fam.add_sample(key[0], labels[key], total[key])
        out.append(fam)
    return out


__all__ = ["LiveMetrics", "metric_families", "prometheus_text"]


