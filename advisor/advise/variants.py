"""Workload variants as spec edits: the lab version of the user's traffic (gap), its
perturbations (robustness) and the sweeps of the cost lines.

A preset or spec file is edited directly; a trace is first fitted (`sim.fit.fit_spec`), so its
variants keep its rate, burstiness, lengths, reuse and task mix."""

from __future__ import annotations

import math
from typing import Any

from sim.fit import fit_spec
from sim.workload import Workload
from sim.workload_source import SourceOptions, resolve_spec
from sim.workload_spec import (
    DynamicPrefix,
    EmpiricalLength,
    FixedLength,
    GammaArrival,
    LognormalLength,
    ParetoLength,
    PoissonArrival,
    SystemPrompts,
    WorkloadSpec,
)

# The lab workload runs at this share of the user's mean rate: benchmarks that report 2-3x
# gains run below saturation (one client, or a fixed low concurrency).
LAB_LOAD_SHARE = 0.5


def spec_for(workload: Any, wl: Workload, source: SourceOptions | None = None) -> WorkloadSpec:
    """The spec behind the user's workload: the preset or spec file itself (with the source
    options that a spec takes), else a fit of the loaded requests."""
    reshaped = source is not None and any(getattr(source, k) is not None for k in
                                          ("start_s", "end_s", "first", "speedup", "rate_rps"))
    if isinstance(workload, str) and not reshaped:
        try:
            spec = resolve_spec(workload, source or SourceOptions())
        except (ValueError, OSError):
            spec = None
        if spec is not None:
            return spec.with_overrides(num_requests=len(wl))
    try:
        return fit_spec(wl, lengths="empirical")
    except ValueError as exc:  # the perturbed and lab variants are fitted from the traffic
        name = workload if isinstance(workload, str) else wl.name
        raise ValueError(f"{name}: {exc} ({len(wl)} request(s), {wl.duration_s:g} s); the advisor fits your "
                         "traffic to vary it: give a longer trace or window") from None


def rate_of(spec: WorkloadSpec) -> float:
    a = spec.arrival
    return float(getattr(a, "rate_rps", None) or a.end_rps)


def interarrival_cv(spec: WorkloadSpec) -> float:
    a = spec.arrival
    if a.kind == "gamma":
        return 1 / math.sqrt(a.burstiness)
    return {"poisson": 1.0, "constant": 0.0}.get(a.kind, 2.0)


def with_rate(spec: WorkloadSpec, factor: float) -> WorkloadSpec:
    a = spec.arrival
    if a.kind == "onoff":
        arr = a.model_copy(update={"on_rate_rps": a.on_rate_rps * factor, "off_rate_rps": a.off_rate_rps * factor})
    elif a.kind == "ramp":
        arr = a.model_copy(update={"start_rps": a.start_rps * factor, "end_rps": a.end_rps * factor})
    else:
        arr = a.model_copy(update={"rate_rps": a.rate_rps * factor})
    return spec.model_copy(update={"arrival": arr})


def burstier(spec: WorkloadSpec, factor: float) -> WorkloadSpec:
    """Inter-arrival variance x `factor` (CV^2 x factor) as vLLM's Gamma arrivals."""
    cv2 = max(interarrival_cv(spec), 0.1) ** 2 * factor
    return spec.model_copy(update={"arrival": GammaArrival(rate_rps=rate_of(spec), burstiness=1 / cv2)})


def heavier_tail(dist: Any, power: float = 1.5) -> Any:
    """The same median, a tail `power` x heavier on the log scale."""
    if isinstance(dist, LognormalLength):
        return dist.model_copy(update={"sigma": dist.sigma * power})
    if isinstance(dist, ParetoLength):
        return dist.model_copy(update={"alpha": dist.alpha / power})
    if isinstance(dist, EmpiricalLength):
        med = sorted(dist.values)[len(dist.values) // 2]
        vals = [max(1, min(int(med * (v / med) ** power), 10_000_000)) for v in dist.values]
        return dist.model_copy(update={"values": vals, "max_tokens": max(vals), "min_tokens": min(vals)})
    return LognormalLength(median=_mean_tokens(dist), sigma=0.5 * power, min_tokens=1,
                           max_tokens=dist.max_tokens)


def _mean_tokens(dist: Any) -> float:
    for key in ("tokens", "mean", "median"):
        if hasattr(dist, key):
            return float(getattr(dist, key))
    if isinstance(dist, EmpiricalLength):
        return sum(dist.values) / len(dist.values)
    if hasattr(dist, "low"):
        return (dist.low + dist.high) / 2
    if isinstance(dist, ParetoLength):
        return dist.scale * dist.alpha / (dist.alpha - 1) if dist.alpha > 1 else dist.scale * 4
    return 512.0


def fixed_lengths(spec: WorkloadSpec) -> WorkloadSpec:
    return spec.model_copy(update={
        "prompt_tokens": FixedLength(tokens=max(1, round(_mean_tokens(spec.prompt_tokens)))),
        "output_tokens": FixedLength(tokens=max(1, round(_mean_tokens(spec.output_tokens))))})


def scaled_prompts(spec: WorkloadSpec, factor: float) -> WorkloadSpec:
    return spec.model_copy(update={"prompt_tokens": FixedLength(
        tokens=max(16, round(_mean_tokens(spec.prompt_tokens) * factor)))})


def less_reuse(spec: WorkloadSpec, factor: float) -> WorkloadSpec:
    sp = spec.system_prompts
    if sp is None:
        return spec
    return spec.model_copy(update={"system_prompts": sp.model_copy(update={"share_of_requests": sp.share_of_requests * factor})})


def with_reuse(spec: WorkloadSpec, share: float) -> WorkloadSpec:
    """`share` of requests start with one of the spec's system prompts (one 1,000-token prompt
    if it has none)."""
    sp = spec.system_prompts or SystemPrompts(count=1, tokens=FixedLength(tokens=1000), zipf_exponent=0.0)
    return spec.model_copy(update={"system_prompts": sp.model_copy(update={"share_of_requests": share}),
                                   "dynamic_prefix": None})


def with_dynamic(spec: WorkloadSpec, share: float, position_tokens: int = 0) -> WorkloadSpec:
    dp = DynamicPrefix(share_of_requests=share, position_tokens=position_tokens) if share > 0 else None
    return spec.model_copy(update={"dynamic_prefix": dp})


def one_task(spec: WorkloadSpec) -> WorkloadSpec:
    top = max(spec.task_mix, key=lambda k: spec.task_mix[k])
    return spec.model_copy(update={"task_mix": {top: 1.0}})


def no_sessions_static_prefix(spec: WorkloadSpec) -> WorkloadSpec:
    return spec.model_copy(update={"dynamic_prefix": None})


# The gap's factors: name -> the edit that turns the user's traffic into the lab's for that factor.
LAB_FACTORS = {
    "burstiness": lambda s: s.model_copy(update={"arrival": PoissonArrival(rate_rps=rate_of(s))}),
    "length tails": fixed_lengths,
    "dynamic prefixes": no_sessions_static_prefix,
    "task-mix drift": one_task,
    "concurrency": lambda s: with_rate(s, LAB_LOAD_SHARE),
}


def lab_spec(spec: WorkloadSpec) -> WorkloadSpec:
    """Steady Poisson, fixed lengths, static prefix, one task, below saturation."""
    for edit in LAB_FACTORS.values():
        spec = edit(spec)
    return spec.model_copy(update={"sessions": None, "name": f"lab-{spec.name}"})
