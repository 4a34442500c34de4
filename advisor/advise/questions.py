"""The questions vLLM users ask (shared/reference/field-figures-2026.md), each answered with a
number for this traffic, and the Prometheus metrics that say when the recommendation stops
holding in production."""

from __future__ import annotations

import math

from advisor.advise.cost_lines import latency_cut_pct, speed_words
from advisor.advise.records import CostLine, MetricToWatch, Question
from advisor.advise.search import Context, Scored, SearchResult
from engine.core.run_summary import SLO


def _line(lines: list[CostLine], optimization: str, variable: str | None = None) -> CostLine | None:
    return next((c for c in lines if c.optimization.startswith(optimization)
                 and (variable is None or c.variable == variable)), None)


def _screened(ctx: Context, found: SearchResult, option: str) -> Scored | None:
    for s in found.screen[1:]:
        if any(o.name == option for o in s.cand.options(ctx.dims)):
            return s
    return None


def _spec_answers(ctx: Context, found: SearchResult) -> tuple[str, str]:
    base = found.screen[0].outcome
    ng, ea = _screened(ctx, found, "ngram k=4"), _screened(ctx, found, "eagle3 k=2")
    ngram = "not measured"
    if ng:
        o = ng.outcome
        ngram = (f"n-gram (k=4) {speed_words(latency_cut_pct(base, o))} and changes goodput by "
                 f"{(o.metrics.goodput_rps / base.metrics.goodput_rps - 1) * 100 if base.metrics.goodput_rps else 0:+.0f}% "
                 f"here; acceptance {o.extras.get('acceptance_rate', math.nan):.2f} on this task mix.")
    ttft = "not measured"
    if ea:
        d = ea.outcome.metrics.ttft_p50_ms / base.metrics.ttft_p50_ms - 1 if base.metrics.ttft_p50_ms else math.nan
        ttft = (f"with prefix caching on, EAGLE-3 (k=2) moves TTFT p50 by {d:+.0%} "
                f"({base.metrics.ttft_p50_ms:.0f} -> {ea.outcome.metrics.ttft_p50_ms:.0f} ms) on this traffic.")
    return ngram, ttft


def questions(ctx: Context, found: SearchResult, lines: list[CostLine]) -> list[Question]:
    ngram, ttft = _spec_answers(ctx, found)
    conc, budget = _line(lines, "speculative decoding", "mean concurrency"), _line(lines, "chunked prefill")
    block, pd = _line(lines, "block size"), _line(lines, "disaggregated prefill")
    best = found.best.outcome
    recompute = (f"the recommended configuration recomputes {best.extras.get('recompute_share', 0):.1%} of prefill "
                 f"tokens after {best.metrics.preemptions} preemptions on this traffic.")
    handover = "needs two GPUs or more: not evaluated."
    if pd:
        op = min(pd.points, key=lambda p: abs(p.x - pd.operating_point))
        handover = (f"moving {op.detail['kv_bytes'] / 1e6:,.0f} MB of KV takes {op.detail['kv_transfer_ms']:.1f} ms in "
                    f"the model, while P/D moves TTFT p50 by {op.detail['ttft_p50_delta_ms']:+,.0f} ms: the hand-over "
                    "(queueing on the decode side) "
                    + ("costs more than the transfer." if op.detail["ttft_p50_delta_ms"] > op.detail["kv_transfer_ms"]
                       else "costs no more than the transfer."))
    return [
        Question(question="Does speculative decoding collapse under concurrency? (vllm#49548)",
                 answer=conc.answer if conc else "not measured"),
        Question(question="Is n-gram speculation slower than none? (vllm#19254, #27379)", answer=ngram),
        Question(question="Does speculative decoding with prefix caching add TTFT? (vllm#19996)", answer=ttft),
        Question(question="Does a token budget below the prefill length cause repeated preemption? (vllm#25538)",
                 answer=budget.answer if budget else "not measured"),
        Question(question="How much does preemption recompute waste? (vllm#54644)", answer=recompute),
        Question(question="Will prefix caching sit at 0% hits? (vllm#53749, #51198)",
                 answer=block.answer if block else "not measured"),
        Question(question="Does the P/D hand-over cost more than the KV transfer? (vllm#50913)", answer=handover),
    ]


def _quantile(metric: str, seconds: float) -> str:
    """PromQL: the p99 of a vLLM histogram over 5 minutes above `seconds`, per model."""
    return (f"histogram_quantile(0.99, sum by (le, model_name) (rate({metric}_bucket[5m]))) > {seconds:g}")


def _ratio(num: str, den: str, op: str, value: float) -> str:
    return (f"sum by (model_name) (rate({num}[10m])) / sum by (model_name) (rate({den}[10m])) {op} {value:.2f}")


def metrics_to_watch(slo: SLO | None, found: SearchResult, lines: list[CostLine]) -> list[MetricToWatch]:
    """The Prometheus series that say when the recommendation stops holding, named exactly as
    vLLM exposes them (counters with `_total`, histograms through `_bucket`), each with a PromQL
    alert expression (alerts.yaml)."""
    out = []
    if slo and slo.ttft_ms is not None:
        m = "vllm:time_to_first_token_seconds"
        out.append(MetricToWatch(metric=m, threshold=f"p99 > {slo.ttft_ms / 1e3:g} s", alert="VllmTtftP99AboveSlo",
                                 promql=_quantile(m, slo.ttft_ms / 1e3),
                                 why="the TTFT target; the recommendation was chosen for it"))
    if slo and slo.tpot_ms is not None:
        m = "vllm:request_time_per_output_token_seconds"
        out.append(MetricToWatch(metric=m, threshold=f"p99 > {slo.tpot_ms / 1e3:g} s", alert="VllmTpotP99AboveSlo",
                                 promql=_quantile(m, slo.tpot_ms / 1e3), why="the TPOT target"))
    if slo and slo.e2el_ms is not None:
        m = "vllm:e2e_request_latency_seconds"
        out.append(MetricToWatch(metric=m, threshold=f"p99 > {slo.e2el_ms / 1e3:g} s", alert="VllmE2eP99AboveSlo",
                                 promql=_quantile(m, slo.e2el_ms / 1e3), why="the end-to-end latency target"))
    kv = found.best.outcome.extras.get("kv_usage_max", 0.0)
    out.append(MetricToWatch(metric="vllm:kv_cache_usage_perc", threshold="> 0.9 for 5 minutes", alert="VllmKvCacheFull",
                             promql="min_over_time(vllm:kv_cache_usage_perc[5m]) > 0.9",
                             why=f"peaked at {kv:.0%} in simulation; above 90% preemptions start"))
    out.append(MetricToWatch(metric="vllm:num_preemptions_total", threshold="rate > 0.1/s", alert="VllmPreempting",
                             promql="sum by (model_name) (rate(vllm:num_preemptions_total[5m])) > 0.1",
                             why=f"{found.best.outcome.metrics.preemptions} in simulation; each one recomputes a prompt"))
    out.append(MetricToWatch(metric="vllm:num_requests_waiting", threshold="> 2 x vllm:num_requests_running",
                             alert="VllmQueueGrowing",
                             promql="sum by (model_name) (vllm:num_requests_waiting) > 2 * sum by (model_name) "
                                    "(vllm:num_requests_running)",
                             why="a queue that grows means the rate passed what this configuration serves"))
    acc = _line(lines, "speculative decoding", "acceptance rate")
    if acc and acc.break_even is not None:
        num, den = "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"
        out.append(MetricToWatch(metric=f"{num} / {den}", threshold=f"< {acc.break_even:.2f}",
                                 alert="VllmSpecDecodeAcceptanceLow", promql=_ratio(num, den, "<", acc.break_even),
                                 why="below this acceptance speculative decoding costs more than it saves"))
    pre = _line(lines, "prefix caching", "prefix-cache hit rate")
    if pre:
        low = pre.break_even if pre.break_even is not None else pre.operating_point / 2
        threshold = f"< {pre.break_even:.2f}" if pre.break_even is not None else "drops by half"
        num, den = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
        out.append(MetricToWatch(metric=f"{num} / {den}", threshold=threshold, alert="VllmPrefixCacheHitRateLow",
                                 promql=_ratio(num, den, "<", low),
                                 why=f"{pre.operating_point:.0%} in simulation; a new dynamic prefix shows here first"))
    return out
