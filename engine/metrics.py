"""Live Prometheus metrics with vLLM's names and buckets (defined in engine/core/vllm_metrics.py).

A private registry per engine, so tests and several engines in one process do not collide.
Written to a text file (`write(path)`, the node-exporter textfile format) or served on a port
(`serve(port)`) when asked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
    write_to_textfile,
)

from engine.core.records import RequestRecord, StepRecord
from engine.core.vllm_metrics import (
    E2E_BUCKETS_S,
    HELP,
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS_S,
    PREEMPTION_BUCKETS,
    TTFT_BUCKETS_S,
    build_1_2_5_buckets,
)


class EngineMetrics:
    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        r, lab = self.registry, ["model_name"]

        def hist(name, buckets):
            return Histogram(name, HELP[name], lab, buckets=buckets, registry=r).labels(model_name)

        def counter(name):
            return Counter(name, HELP[name], lab, registry=r).labels(model_name)

        def gauge(name):
            return Gauge(name, HELP[name], lab, registry=r).labels(model_name)

        self.running = gauge("vllm:num_requests_running")
        self.waiting = gauge("vllm:num_requests_waiting")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc")
        self.prefix_queries = counter("vllm:prefix_cache_queries")
        self.prefix_hits = counter("vllm:prefix_cache_hits")
        self.preemptions = counter("vllm:num_preemptions")
        self.prompt_tokens = counter("vllm:prompt_tokens")
        self.generation_tokens = counter("vllm:generation_tokens")
        self.spec_drafts = counter("vllm:spec_decode_num_drafts")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens")
        self.spec_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens")
        self.success = Counter("vllm:request_success", HELP["vllm:request_success"],
                               ["model_name", "finished_reason"], registry=r)
        self.rejections = Counter("vllm:admission_rejections", HELP["vllm:admission_rejections"],
                                  ["model_name", "reason"], registry=r)
        self.ttft = hist("vllm:time_to_first_token_seconds", TTFT_BUCKETS_S)
        self.itl = hist("vllm:inter_token_latency_seconds", ITL_BUCKETS_S)
        self.tpot = hist("vllm:request_time_per_output_token_seconds", ITL_BUCKETS_S)
        self.e2e = hist("vllm:e2e_request_latency_seconds", E2E_BUCKETS_S)
        self.queue = hist("vllm:request_queue_time_seconds", E2E_BUCKETS_S)
        self.inference = hist("vllm:request_inference_time_seconds", E2E_BUCKETS_S)
        self.prefill_time = hist("vllm:request_prefill_time_seconds", E2E_BUCKETS_S)
        self.decode_time = hist("vllm:request_decode_time_seconds", E2E_BUCKETS_S)
        len_buckets = build_1_2_5_buckets(max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", len_buckets)
        self.req_gen = hist("vllm:request_generation_tokens", len_buckets)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", ITERATION_TOKENS_BUCKETS)
        self.req_preemptions = hist("vllm:request_num_preemptions", PREEMPTION_BUCKETS)
        self._last_stats: dict[str, float] = {}

    def observe_step(self, step: StepRecord, scheduler) -> None:
        self.iteration_tokens.observe(step.num_batched_tokens)
        self.generation_tokens.inc(step.num_output_tokens)
        self.running.set(scheduler.num_running)
        self.waiting.set(scheduler.num_waiting)
        stats = scheduler.stats
        self.kv_usage.set(stats.kv_usage)
        for key, counter in (("prefix_cache_queries_tokens", self.prefix_queries),
                             ("prefix_cache_hits_tokens", self.prefix_hits),
                             ("num_preemptions", self.preemptions), ("num_spec_drafts", self.spec_drafts),
                             ("num_spec_draft_tokens", self.spec_draft_tokens),
                             ("num_spec_accepted_tokens", self.spec_accepted_tokens)):
            now = float(getattr(stats, key))
            counter.inc(max(0.0, now - self._last_stats.get(key, 0.0)))
            self._last_stats[key] = now

    def observe_request(self, rec: RequestRecord, itl_gaps_s: Sequence[float] = ()) -> None:
        """One finished or rejected request (`replay.request_record`) and its token gaps."""
        if rec.status == "rejected":
            self.rejections.labels(self.model_name, rec.finish_reason or "unknown").inc()
            return
        self.success.labels(self.model_name, rec.finish_reason or "length").inc()
        self.prompt_tokens.inc(rec.prompt_len)  # as vLLM: a request's whole prompt, cached tokens included
        for hist, value in ((self.ttft, rec.ttft_s), (self.tpot, rec.tpot_s), (self.e2e, rec.e2e_s),
                            (self.queue, rec.queue_s), (self.inference, rec.finish_s - rec.scheduled_s),
                            (self.prefill_time, rec.first_token_s - rec.scheduled_s),
                            (self.decode_time, rec.finish_s - rec.first_token_s)):
            if not math.isnan(value):
                hist.observe(value)
        for gap in itl_gaps_s:
            self.itl.observe(gap)
        self.req_prompt.observe(rec.prompt_len)
        self.req_gen.observe(rec.num_output_tokens)
        self.req_preemptions.observe(rec.num_preemptions)

    def write(self, path: str) -> None:
        write_to_textfile(path, self.registry)

    def serve(self, port: int, host: str = "127.0.0.1"):
        """Serve /metrics on `host:port` (the loopback address unless asked: prometheus-client's
        own default, 0.0.0.0, would expose the engine's metrics to the whole network); returns
        the HTTP server (`.shutdown()` stops it)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
