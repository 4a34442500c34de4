"""What the recommendation costs: $/hour on the GPUs given, $/million output tokens, and the same
at the SLO (on the GPUs the verdict says it takes); and the side-by-side of GPU types."""

from __future__ import annotations

from advisor.advise.prices import price_of
from advisor.advise.records import Cost, GpuOption, Metrics, Recommendation, Verdict


def _per_m(usd_per_hour: float, tok_s: float) -> float | None:
    return usd_per_hour / (tok_s * 3600) * 1e6 if tok_s > 0 else None


def cost(m: Metrics, verdict: Verdict, gpu: str, prices: dict[str, float]) -> Cost | None:
    """The cost of the recommended configuration; None when the GPU has no price."""
    found = price_of(gpu, prices)
    if found is None:
        return None
    usd, source = found
    n = verdict.num_gpus
    per_hour = usd * n
    need = verdict.gpus_needed
    at_slo = usd * need if need is not None else None
    c = Cost(gpu=gpu, usd_per_gpu_hour=usd, price_source=source, num_gpus=n, usd_per_hour=per_hour,
             usd_per_m_output_tokens=_per_m(per_hour, m.throughput_tok_s),
             requests_per_usd=m.goodput_rps * 3600 / per_hour if per_hour else 0.0,
             gpus_at_slo=need, usd_per_hour_at_slo=at_slo,
             usd_per_m_output_tokens_at_slo=_per_m(at_slo, m.throughput_tok_s) if at_slo is not None else None,
             text="")
    return c.model_copy(update={"text": cost_text(c, checked=verdict.gpus_checked)})


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def cost_text(c: Cost, *, checked: bool = False) -> str:
    head = (f"at ${c.usd_per_gpu_hour:.2f}/GPU-hour ({c.price_source}): {c.num_gpus}x {c.gpu} cost "
            f"{_usd(c.usd_per_hour)}/hour, {_usd(c.usd_per_m_output_tokens)} per million output tokens, "
            f"{c.requests_per_usd:,.0f} requests within the SLO per dollar")
    if c.gpus_at_slo is None:
        return head + "; the GPUs it takes to meet the SLO cannot be estimated."
    if c.gpus_at_slo == c.num_gpus:
        return head + "; the SLO is met at this price."
    return (head + f"; meeting the SLO takes {'' if checked else 'about '}{c.gpus_at_slo} GPUs: {_usd(c.usd_per_hour_at_slo)}/hour, "
            f"{_usd(c.usd_per_m_output_tokens_at_slo)} per million output tokens.")


def gpu_option(rec: Recommendation) -> GpuOption:
    v, m, c = rec.verdict, rec.best.metrics, rec.cost
    assert v is not None
    return GpuOption(gpu=rec.request.gpu, label=rec.best.label, num_gpus=rec.best.num_gpus, meets=v.meets,
                     gpus_needed=v.gpus_needed, goodput_rps=m.goodput_rps, ttft_p99_ms=m.ttft_p99_ms,
                     tpot_p99_ms=m.tpot_p99_ms, slo_attainment=m.slo_attainment,
                     usd_per_gpu_hour=c.usd_per_gpu_hour if c else None,
                     usd_per_hour_at_slo=c.usd_per_hour_at_slo if c else None,
                     usd_per_m_output_tokens_at_slo=c.usd_per_m_output_tokens_at_slo if c else None,
                     serve_command=rec.serve_command)


def cheapest(options: list[GpuOption]) -> GpuOption | None:
    """The GPU type serving the traffic within the SLO for the fewest dollars per million tokens."""
    priced = [o for o in options if o.usd_per_m_output_tokens_at_slo is not None]
    return min(priced, key=lambda o: o.usd_per_m_output_tokens_at_slo or 0.0) if priced else None


__all__ = ["cheapest", "cost", "cost_text", "gpu_option"]
