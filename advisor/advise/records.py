"""The advisor's named records: what `advise` takes (`AdviseRequest`) and returns
(`Recommendation`, whose `model_dump_json()` is recommendation.json). The dashboard codes
against these names; change them only together with app/."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from advisor.advise.assumptions import Assumption
from advisor.advise.uncertainty import DEFAULT_MIN_GAIN_PCT, GainInterval
from engine.core.run_summary import SLO
from sim.hardware import GpuPreset, ModelName
from sim.speculative import DEFAULT_ACCEPTANCE

Objective = Literal["goodput", "min-gpus", "cost"]
Budget = Literal["quick", "full"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


def normalise_slo(text: str) -> str:
    """`ttft_p99:500 tpot_p99:50` (the percentile spelling) or `ttft:500 tpot:50` (vLLM's
    `--goodput`) as vLLM's form: goodput counts requests that meet each target, so the
    percentile suffix only names which tail the user cares about."""
    parts = []
    for part in text.replace(",", " ").split():
        key, sep, value = part.partition(":")
        parts.append(key.removesuffix("_p99").removesuffix("_p50").removesuffix("_p90") + sep + value)
    return " ".join(parts)


class AdviseRequest(_Record):
    """What the user asks: traffic aside, the deployment and targets to advise on."""

    model: ModelName = Field("llama-3.1-8b", description="a model preset or its Hugging Face id "
                             "(meta-llama/Llama-3.1-8B-Instruct); refused before any simulation, naming both")
    gpu: GpuPreset = "h200"
    num_gpus: int = Field(1, ge=1, le=64)
    slo: str = Field("ttft_p99:500 tpot_p99:50", description="goodput targets in ms, e.g. "
                     "'ttft_p99:500 tpot_p99:50' or 'ttft:500 tpot:50'")
    objective: Objective = "goodput"
    seed: int = Field(0, ge=0)
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=256,
                         description="local processes running simulations")
    ray: str | None = Field(None, description="None = local processes; 'auto' or a Ray address")
    budget: Budget = "quick"
    profile: str | None = Field(None, description="cost profile; None = what the simulator picks")
    acceptance: dict[str, dict[str, float]] | None = Field(
        None, description="measured mean acceptance per draft token: method ('*' = any) -> task -> rate in (0, 1); "
        "also 'eagle3:chat=0.71,code=0.8 ngram:chat=0.2'")
    allow: list[str] | None = Field(None, description="search only options that change these (names of "
                                    "advisor.advise.space.FEATURES or groups: spec, fp8, parallelism); None = all")
    forbid: list[str] = Field(default_factory=list, description="never recommend options that change these "
                              "(e.g. 'fp8-weights,spec')")
    gpu_hour_usd: dict[str, float] = Field(default_factory=dict, description="$ per GPU-hour by GPU preset "
                                           "(advisor/advise/prices.py has defaults); also '3.5' for `gpu`")
    min_gain_pct: float = Field(DEFAULT_MIN_GAIN_PCT, ge=0, le=1000,
                                description="a change is recommended only when the low end of its gain's 90% "
                                "interval is above this (percent); otherwise vLLM's default stays")

    @field_validator("allow", "forbid", mode="before")
    @classmethod
    def _features(cls, v: Any, info: Any) -> Any:
        from advisor.advise.space import parse_features

        if v is None:
            return None if info.field_name == "allow" else []
        return parse_features(v)

    @model_validator(mode="before")
    @classmethod
    def _prices(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gpu_hour_usd" in data and data["gpu_hour_usd"] is None:
            data = {k: v for k, v in data.items() if k != "gpu_hour_usd"}
        if isinstance(data, dict) and data.get("gpu_hour_usd") is not None:
            from advisor.advise.prices import parse_gpu_hour_usd

            try:
                data = data | {"gpu_hour_usd": parse_gpu_hour_usd(data["gpu_hour_usd"], data.get("gpu") or "h200")}
            except ValueError as exc:
                raise ValueError(f"--gpu-hour-usd {data['gpu_hour_usd']!r}: {exc}") from None
        return data

    @field_validator("acceptance", mode="before")
    @classmethod
    def _parse_acceptance(cls, v: Any) -> Any:
        return parse_acceptance(v) if isinstance(v, str) else v

    @field_validator("acceptance")
    @classmethod
    def _rates(cls, v: dict[str, dict[str, float]] | None) -> dict[str, dict[str, float]] | None:
        for method, rates in (v or {}).items():
            if method != "*" and method not in DEFAULT_ACCEPTANCE:
                raise ValueError(f"acceptance: unknown method {method!r}; use one of {', '.join(DEFAULT_ACCEPTANCE)} or *")
            for task, rate in rates.items():
                if not 0 < rate < 1:
                    raise ValueError(f"acceptance: {method}:{task}={rate} must be a rate between 0 and 1 "
                                     "(accepted draft tokens / draft tokens)")
        return v

    @model_validator(mode="after")
    def _usable_profile(self) -> AdviseRequest:
        if self.profile is not None:
            from sim.profile_files import load_profile

            load_profile(self.profile, self.preset, self.gpu)  # a damaged file named before the search
        return self

    @property
    def preset(self) -> str:
        """The model preset's alias (`model` may be its Hugging Face id)."""
        from sim.models import preset_of

        return preset_of(self.model)

    @field_validator("slo", mode="before")
    @classmethod
    def _slo(cls, v: Any) -> Any:
        if isinstance(v, SLO):
            return " ".join(f"{k}:{x:g}" for k, x in v.as_dict().items())
        if isinstance(v, str):
            SLO.parse(normalise_slo(v))  # refuses a malformed pair, naming it
        return v

    def parsed_slo(self) -> SLO | None:
        return SLO.parse(normalise_slo(self.slo))


def parse_acceptance(text: str) -> dict[str, dict[str, float]]:
    """'eagle3:chat=0.71,code=0.8 ngram:chat=0.2' (or 'chat=0.71' for any method) as
    {method: {task: rate}}; a malformed part is refused naming it."""
    out: dict[str, dict[str, float]] = {}
    for group in text.split():
        method, sep, pairs = group.partition(":")
        if not sep:  # no METHOD: prefix: any method
            method, pairs = "*", group
        rates = out.setdefault(method, {})
        for pair in pairs.split(","):
            task, sep, raw = pair.partition("=")
            try:
                rates[task.strip()] = float(raw)
            except ValueError:
                raise ValueError(f"acceptance: {pair!r} is not TASK=RATE (e.g. 'eagle3:chat=0.71,code=0.8')") from None
            if not sep or not task.strip():
                raise ValueError(f"acceptance: {pair!r} is not TASK=RATE (e.g. 'eagle3:chat=0.71,code=0.8')")
    return out


class Metrics(_Record):
    goodput_rps: float
    throughput_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    itl_p99_ms: float
    e2e_p99_ms: float
    slo_attainment: float
    preemptions: int


class ScoredConfig(_Record):
    label: str
    flags: dict[str, Any] = Field(description="vLLM flag name -> value, only the non-default ones")
    num_gpus: int
    metrics: Metrics


class LadderStep(_Record):
    optimization: str
    flags_added: dict[str, Any]
    metrics: Metrics
    delta_goodput_pct: float
    delta_ttft_p99_pct: float
    delta_tpot_p99_pct: float
    gpus_needed: int | None = Field(description="fewest GPUs meeting the SLOs at this rung "
                                    "(None: not met within the GPUs given)")
    gain: GainInterval | None = Field(None, description="this rung's gain over the previous one, 90% interval")


class KeptDefault(_Record):
    """A change the search found but the error bars do not support: vLLM's default stays."""

    optimization: str
    flags: dict[str, Any]
    gain: GainInterval
    reason: str


class Rejected(_Record):
    optimization: str
    flags: dict[str, Any]
    reason: str
    delta_goodput_pct: float


class CostPoint(_Record):
    x: float
    gain_pct: float
    goodput_delta_pct: float = 0.0
    detail: dict[str, float] = Field(default_factory=dict)


# what a cost line's gain_pct is, unless it says otherwise: (1 - mean E2E with / without) x 100, the
# figure the line's answer quotes ("cuts mean end-to-end latency by 31%")
LATENCY_CUT_LABEL = "mean E2E latency cut (%)"
CPU_LABEL = "CPU share of step time (%)"


class CostLine(_Record):
    optimization: str
    variable: str
    unit: str
    points: list[CostPoint]
    gain_label: str = Field(LATENCY_CUT_LABEL, description="what the points' gain_pct measure (the chart's y "
                            "axis): 1 - mean end-to-end latency on / off, or the CPU line's share of step time")
    break_even: float | None
    operating_point: float
    operating_gain_pct: float | None = Field(None, description="gain_pct on the user's own traffic (the chart's "
                                             "'your traffic' marker, the number the answer quotes)")
    answer: str


class GapFactor(_Record):
    factor: str
    gain: float
    share_pct: float


class Gap(_Record):
    lab_gain: float
    production_gain: float
    factors: list[GapFactor]
    gain_metric: str = "mean end-to-end latency, defaults / recommended (x)"


class RobustnessRow(_Record):
    perturbation: str
    best_goodput_rps: float
    kept_goodput_rps: float
    regret_pct: float


class Robustness(_Record):
    rows: list[RobustnessRow]
    fallback: ScoredConfig
    fallback_max_regret_pct: float


class MetricToWatch(_Record):
    metric: str  # as vLLM exposes it on /metrics (counters end in _total)
    threshold: str
    why: str
    alert: str = Field("", description="the alert's name in alerts.yaml")
    promql: str = Field("", description="the PromQL alert expression (true = the recommendation stops holding)")


class Question(_Record):
    question: str
    answer: str


class ProfileInfo(_Record):
    name: str
    status: str


class SloCheck(_Record):
    metric: str  # "TTFT p99"
    target_ms: float
    value_ms: float
    met: bool


class Verdict(_Record):
    """Whether the recommended configuration meets each SLO on the GPUs given, and what it takes."""

    meets: bool
    num_gpus: int
    gpu: str
    checks: list[SloCheck]
    slo_attainment: float = Field(description="share of requests meeting every target")
    attainment_line: float = Field(description="the share at which the SLO counts as met")
    gpus_needed: int | None = Field(description="GPUs meeting the SLO (None: not found)")
    gpus_checked: bool = Field(False, description="gpus_needed was simulated, not only estimated")
    text: str


class Cost(_Record):
    """What the recommended configuration costs, on the GPUs given and at the SLO."""

    gpu: str
    usd_per_gpu_hour: float
    price_source: str
    num_gpus: int
    usd_per_hour: float
    usd_per_m_output_tokens: float | None = Field(description="$ per million output tokens served on num_gpus")
    requests_per_usd: float = Field(description="requests served within the SLO per dollar")
    gpus_at_slo: int | None = Field(description="GPUs the verdict estimates the SLO takes")
    usd_per_hour_at_slo: float | None
    usd_per_m_output_tokens_at_slo: float | None
    text: str


class GpuOption(_Record):
    """One GPU type's recommendation for the same workload (--compare-gpus)."""

    gpu: str
    label: str
    num_gpus: int
    meets: bool
    gpus_needed: int | None
    goodput_rps: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    slo_attainment: float
    usd_per_gpu_hour: float | None
    usd_per_hour_at_slo: float | None
    usd_per_m_output_tokens_at_slo: float | None
    serve_command: str


class Recommendation(_Record):
    verdict: Verdict | None = Field(None, description="the plain verdict, first in every report")
    cost: Cost | None = Field(None, description="$/hour and $/million output tokens, here and at the SLO")
    gpu_comparison: list[GpuOption] = Field(default_factory=list, description="--compare-gpus: the same "
                                            "workload's recommendation per GPU type")
    request: AdviseRequest
    profile: ProfileInfo
    workload: dict[str, Any]
    baseline: ScoredConfig
    best: ScoredConfig
    ladder: list[LadderStep]
    kept_defaults: list[KeptDefault] = Field(default_factory=list, description="changes inside the error bars")
    assumptions: list[Assumption] = Field(
        default_factory=list, description="the inputs the recommendation's figures rest on, with their provenance")
    rejected: list[Rejected]
    cost_lines: list[CostLine]
    gap: Gap | None
    robustness: Robustness
    serve_command: str
    quality_notes: list[str] = Field(default_factory=list, description="what the recommended lossy options (FP8 "
                                     "weights, FP8 KV cache) may do to outputs")
    serve_notes: list[str] = Field(default_factory=list, description="what to replace or know before pasting "
                                   "serve_command (a draft-head placeholder)")
    metrics_to_watch: list[MetricToWatch]
    model_notes: list[str] = Field(default_factory=list, description="what the model's architecture changes in "
                                   "the advice (a mixture of experts: the batch from which every expert is read, "
                                   "the spec-decode break-even)")
    questions: list[Question]
    elapsed_s: float
    num_simulations: int
    latency_cdfs: dict[str, dict[str, list[float]]] = Field(
        default_factory=dict, description="baseline / best -> ttft_ms / e2e_ms at percentiles 1..99")
