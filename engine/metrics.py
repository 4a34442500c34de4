"""Prometheus metrics with vLLM's names and buckets (see shared reference vllm-conventions.md).

A private registry per engine, so tests and several engines in one process do not collide.
Written to a text file (`write(path)`, the node-exporter textfile format) or served on a port
(`serve(port)`) when asked.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
    write_to_textfile,
)

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                  7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = tuple(float(2**i) for i in range(15) if i != 1 and i != 2)  # 1, 8 .. 16384
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets)."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return tuple(float(x) for x in out)
            out.append(v)
        exp += 1


class EngineMetrics:
    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        r, lab = self.registry, ["model_name"]

        def hist(name, doc, buckets):
            return Histogram(name, doc, lab, buckets=buckets, registry=r).labels(model_name)

        def counter(name, doc):
            return Counter(name, doc, lab, registry=r).labels(model_name)

        def gauge(name, doc):
            return Gauge(name, doc, lab, registry=r).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage, fraction 0-1.")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix-cache queries, in tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative preemptions.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens produced.")
        self.success = Counter("vllm:request_success", "Finished requests.", ["model_name", "finished_reason"],
                               registry=r)
        self.rejections = Counter("vllm:admission_rejections", "Rejected requests.", ["model_name", "reason"],
                                  registry=r)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS_S)
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS_S)
        self.tpot = hist("vllm:request_time_per_output_token_seconds", "Per-request TPOT.", ITL_BUCKETS_S)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end latency.", E2E_BUCKETS_S)
        self.queue = hist("vllm:request_queue_time_seconds", "Time waiting before first scheduled.", E2E_BUCKETS_S)
        self.inference = hist("vllm:request_inference_time_seconds", "First scheduled to finished.", E2E_BUCKETS_S)
        self.prefill_time = hist("vllm:request_prefill_time_seconds", "First scheduled to first token.",
                                 E2E_BUCKETS_S)
        self.decode_time = hist("vllm:request_decode_time_seconds", "First to last token.", E2E_BUCKETS_S)
        len_buckets = build_1_2_5_buckets(max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Prompt length per request.", len_buckets)
        self.req_gen = hist("vllm:request_generation_tokens", "Generated tokens per request.", len_buckets)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Tokens per engine step.",
                                     ITERATION_TOKENS_BUCKETS)
        self.req_preemptions = hist("vllm:request_num_preemptions", "Preemptions per request.",
                                    PREEMPTION_BUCKETS)
        self._last_stats: dict[str, float] = {}

    def observe_step(self, trace: dict, scheduler) -> None:
        self.iteration_tokens.observe(trace["num_batched_tokens"])
        self.prompt_tokens.inc(trace["num_prefill_tokens"])
        self.generation_tokens.inc(trace.get("num_output_tokens", 0))
        self.running.set(scheduler.num_running)
        self.waiting.set(scheduler.num_waiting)
        stats = scheduler.stats
        get = (lambda k: stats[k]) if isinstance(stats, dict) else (lambda k: getattr(stats, k))
        self.kv_usage.set(get("kv_usage"))
        for key, counter in (("prefix_cache_queries_tokens", self.prefix_queries),
                             ("prefix_cache_hits_tokens", self.prefix_hits),
                             ("num_preemptions", self.preemptions)):
            now = float(get(key))
            counter.inc(max(0.0, now - self._last_stats.get(key, 0.0)))
            self._last_stats[key] = now

    def observe_request(self, row: dict) -> None:
        """One finished/rejected request, as `replay.request_row` gives it."""
        if row["status"] == "rejected":
            self.rejections.labels(self.model_name, row["finish_reason"] or "unknown").inc()
            return
        self.success.labels(self.model_name, row["finish_reason"] or "length").inc()
        for hist, key in ((self.ttft, "ttft_s"), (self.tpot, "tpot_s"), (self.e2e, "e2e_s"),
                          (self.queue, "queue_s"), (self.inference, "inference_s"),
                          (self.prefill_time, "prefill_s"), (self.decode_time, "decode_s")):
            if row.get(key) is not None:
                hist.observe(row[key])
        for gap in row.get("itl_s", []):
            self.itl.observe(gap)
        self.req_prompt.observe(row["prompt_len"])
        self.req_gen.observe(row["num_output_tokens"])
        self.req_preemptions.observe(row["num_preemptions"])

    def write(self, path: str) -> None:
        write_to_textfile(path, self.registry)

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
