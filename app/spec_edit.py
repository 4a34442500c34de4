"""Edits of a generated workload's spec, as the Workload page's controls make them: rate and
burstiness, the prompt and output length laws, prefix reuse (system prompts, dynamic prefix) and
the task mix. Each edit returns a validated `WorkloadSpec`; no Streamlit here.
"""

from __future__ import annotations

from typing import Any

from sim.workload_spec import (
    DynamicPrefix,
    FixedLength,
    GammaArrival,
    PoissonArrival,
    SystemPrompts,
    WorkloadSpec,
)

# The length laws a user edits by their parameters (zipf and empirical laws are kept as given).
LAW_PARAMS: dict[str, dict[str, float]] = {
    "fixed": {"tokens": 512},
    "uniform": {"low": 128, "high": 1024},
    "normal": {"mean": 512.0, "std": 128.0},
    "lognormal": {"median": 512.0, "sigma": 0.8},
    "pareto": {"alpha": 1.5, "scale": 256.0},
}
INT_PARAMS = {"tokens", "low", "high"}
DEFAULT_DYNAMIC_POSITION_TOKENS = 48
DEFAULT_SYSTEM_PROMPT_TOKENS = 500


class SpecEditError(ValueError):
    """An edit that does not make a valid spec; the message names the control and the fix."""


def arrival_rate_burstiness(spec: WorkloadSpec) -> tuple[float, float | None]:
    """The spec's mean rate and vLLM burstiness (1 = Poisson; None when the law has no such knob)."""
    a = spec.arrival
    if isinstance(a, PoissonArrival):
        return a.rate_rps, 1.0
    if isinstance(a, GammaArrival):
        return a.rate_rps, a.burstiness
    return float(getattr(a, "rate_rps", getattr(a, "end_rps", 1.0))), None


def with_arrival(spec: WorkloadSpec, rate_rps: float, burstiness: float | None) -> WorkloadSpec:
    """Gamma arrivals at `rate_rps` with `burstiness` (Poisson at 1), vLLM's `--request-rate` and
    `--burstiness`; the spec unchanged when both equal what it has."""
    if (rate_rps, burstiness) == arrival_rate_burstiness(spec):
        return spec
    if rate_rps <= 0 or (burstiness is not None and burstiness <= 0):
        raise SpecEditError(f"rate {rate_rps:g} req/s, burstiness {burstiness}: both must be > 0")
    b = 1.0 if burstiness is None else burstiness
    arrival = (PoissonArrival(rate_rps=rate_rps) if b == 1.0
               else GammaArrival(rate_rps=rate_rps, burstiness=b))
    return spec.model_copy(update={"arrival": arrival})


def law_params(law: Any) -> dict[str, float]:
    """The editable parameters of a length law (empty for zipf and empirical laws)."""
    return {k: getattr(law, k) for k in LAW_PARAMS.get(law.kind, {})}


def with_law(spec: WorkloadSpec, field: str, kind: str, params: dict[str, float]) -> WorkloadSpec:
    """`field` (prompt_tokens / output_tokens) drawn from `kind` with `params`, keeping its clip bounds."""
    old = getattr(spec, field)
    if kind == old.kind and params == law_params(old):
        return spec
    if kind not in LAW_PARAMS:
        raise SpecEditError(f"{field}: law {kind!r} is edited as JSON only; pick one of {', '.join(LAW_PARAMS)}")
    data = {"kind": kind, "min_tokens": old.min_tokens, "max_tokens": old.max_tokens,
            **{k: int(v) if k in INT_PARAMS else float(v) for k, v in params.items()}}
    try:
        return WorkloadSpec.model_validate(spec.model_dump() | {field: data})
    except ValueError as exc:
        raise SpecEditError(f"{field} {kind} {params}: {_first_error(exc)}") from None


def with_prefixes(spec: WorkloadSpec, system_share: float, dynamic_share: float) -> WorkloadSpec:
    """Share of requests opening with a shared system prompt, and share carrying per-request
    content early in the prompt (which ends their reusable prefix there)."""
    sp, dp = spec.system_prompts, spec.dynamic_prefix
    changes: dict[str, Any] = {}
    if system_share != (sp.share_of_requests if sp else 0.0):
        if sp is None:
            sp = SystemPrompts(count=1, tokens=FixedLength(tokens=DEFAULT_SYSTEM_PROMPT_TOKENS))
        changes["system_prompts"] = sp.model_copy(update={"share_of_requests": system_share}) if system_share else None
    if dynamic_share != (dp.share_of_requests if dp else 0.0):
        pos = dp.position_tokens if dp else DEFAULT_DYNAMIC_POSITION_TOKENS
        changes["dynamic_prefix"] = (DynamicPrefix(share_of_requests=dynamic_share, position_tokens=pos)
                                     if dynamic_share else None)
    return WorkloadSpec.model_validate(spec.model_dump() | changes) if changes else spec


def task_mix_text(mix: dict[str, float]) -> str:
    return " ".join(f"{k}:{v:g}" for k, v in mix.items())


def parse_task_mix(text: str) -> dict[str, float]:
    """`"chat:0.6 code:0.4"` as {category: weight}; weights > 0 (normalised by the generator)."""
    mix: dict[str, float] = {}
    for part in text.replace(",", " ").split():
        name, _, raw = part.partition(":")
        try:
            weight = float(raw)
        except ValueError:
            weight = float("nan")
        if not name or not weight > 0 or weight == float("inf"):
            raise SpecEditError(f"task mix {part!r}: use NAME:WEIGHT pairs with weights > 0, e.g. chat:0.6 code:0.4")
        mix[name] = weight
    if not mix:
        raise SpecEditError("task mix is empty: name at least one category, e.g. chat:1")
    return mix


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        e = errors()[0]
        return f"{'.'.join(str(x) for x in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
    return str(exc).splitlines()[0]


__all__ = ["LAW_PARAMS", "SpecEditError", "arrival_rate_burstiness", "law_params", "parse_task_mix",
           "task_mix_text", "with_arrival", "with_law", "with_prefixes"]
