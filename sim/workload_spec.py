"""`WorkloadSpec`: a validated, JSON-serialisable description of synthetic traffic.

A spec says how requests arrive (`arrival`), how long prompts and outputs are
(`prompt_tokens`, `output_tokens`), which prompt content is shared
(`system_prompts`, `dynamic_prefix`, `sessions`) and what the requests are for
(`task_mix`). `sim.generate.generate(spec)` turns it into a `Workload`.

Limits: at most `MAX_REQUESTS` requests and `MAX_TOKENS` tokens per length parameter, arrivals
within `MAX_ARRIVAL_S` of the start; every number must be finite (NaN and Infinity are refused).

Conventions
- `prompt_tokens` is the length of a whole single-turn (or first-turn) prompt,
  system prompt included: the system prompt is its leading part. So the length
  distribution a user fits is the one the workload reproduces.
- With `sessions`, `arrival` gives session starts; follow-up turns arrive a
  think time after the previous turn.
- Every distribution clamps its draws to `[min_tokens, max_tokens]` (clipping,
  not re-drawing), so a clipped tail shows up as a spike at the bound.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# ----------------------------------------------------------------------------- arrivals


MAX_REQUESTS = 10_000_000  # a generated workload's size cap: ~1 GiB of columns, minutes to simulate
MAX_TURNS = 10_000  # per session: far beyond any real conversation
MAX_TOKENS = 10_000_000  # per request: the longest context any served model offers (Llama 4 Scout)
# Latest arrival a workload may hold, in seconds from its start (~31.7 years): a float clock there
# still resolves 0.1 us, so step and latency times stay exact; beyond it they would silently round.
MAX_ARRIVAL_S = 1e9


class _Strict(BaseModel):
    # NaN or Infinity (which Python's json accepts) would silently break arrivals and lengths
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PoissonArrival(_Strict):
    """Exponential inter-arrival times (vLLM `--burstiness 1`)."""

    kind: Literal["poisson"] = "poisson"
    rate_rps: float = Field(gt=0)


class GammaArrival(_Strict):
    """vLLM's bursty arrivals: gaps ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)).

    burstiness < 1 is burstier than Poisson, > 1 smoother; inter-arrival CV = 1/sqrt(burstiness).
    """

    kind: Literal["gamma"] = "gamma"
    rate_rps: float = Field(gt=0)
    burstiness: float = Field(gt=0)


class OnOffArrival(_Strict):
    """Two-state Markov-modulated Poisson process: bursts at `on_rate_rps`, lulls at `off_rate_rps`.

    Sojourn times in each state are exponential with the given means.
    """

    kind: Literal["onoff"] = "onoff"
    on_rate_rps: float = Field(gt=0)
    off_rate_rps: float = Field(0.0, ge=0)
    mean_on_s: float = Field(gt=0)
    mean_off_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _cycle(self) -> OnOffArrival:
        # the generator draws cycles in proportion to 1 / (requests per cycle): both ends would
        # ask numpy for absurd arrays
        per_cycle = self.on_rate_rps * self.mean_on_s + self.off_rate_rps * self.mean_off_s
        if not 1e-3 <= per_cycle <= MAX_REQUESTS:
            raise ValueError(f"one on/off cycle carries {per_cycle:.3g} requests on average; it must be "
                             f"between 0.001 and {MAX_REQUESTS:,} (on_rate_rps x mean_on_s + off_rate_rps x mean_off_s)")
        return self

    @property
    def rate_rps(self) -> float:
        """Long-run mean rate."""
        cycle_s = self.mean_on_s + self.mean_off_s
        return (self.on_rate_rps * self.mean_on_s + self.off_rate_rps * self.mean_off_s) / cycle_s


class ConstantArrival(_Strict):
    """Evenly spaced arrivals (a closed-loop load generator's ideal)."""

    kind: Literal["constant"] = "constant"
    rate_rps: float = Field(gt=0)


class RampArrival(_Strict):
    """Poisson arrivals whose rate moves linearly from `start_rps` to `end_rps` over `ramp_s`,
    then stays at `end_rps` (vLLM's `--ramp-up-strategy linear`)."""

    kind: Literal["ramp"] = "ramp"
    start_rps: float = Field(gt=0)
    end_rps: float = Field(gt=0)
    ramp_s: float = Field(gt=0)


Arrival = Annotated[
    PoissonArrival | GammaArrival | OnOffArrival | ConstantArrival | RampArrival,
    Field(discriminator="kind"),
]

# ----------------------------------------------------------------------------- lengths


class _Clipped(_Strict):
    min_tokens: int = Field(1, ge=1, le=MAX_TOKENS)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _bounds(self) -> _Clipped:
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= min_tokens ({self.min_tokens})")
        return self


class FixedLength(_Clipped):
    kind: Literal["fixed"] = "fixed"
    tokens: int = Field(ge=1, le=MAX_TOKENS)


class UniformLength(_Clipped):
    """Integers uniform on [low, high], both included."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, le=MAX_TOKENS)
    high: int = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _order(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class NormalLength(_Clipped):
    kind: Literal["normal"] = "normal"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    std: float = Field(ge=0)


class LognormalLength(_Clipped):
    """exp(N(log(median), sigma^2)); p90 = median * exp(1.2816 sigma)."""

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, le=MAX_TOKENS)
    sigma: float = Field(ge=0)


class ParetoLength(_Clipped):
    """Classic Pareto: P(X > x) = (scale/x)^alpha for x >= scale; heavy tail for small alpha."""

    kind: Literal["pareto"] = "pareto"
    alpha: float = Field(gt=0)
    scale: float = Field(gt=0, le=MAX_TOKENS)


class ZipfLength(_Clipped):
    """Discrete power law on [min_tokens, max_tokens]: P(k) proportional to k^-exponent."""

    kind: Literal["zipf"] = "zipf"
    exponent: float = Field(gt=0)
    max_tokens: int = Field(ge=1, le=MAX_TOKENS)


class EmpiricalLength(_Clipped):
    """Resample (uniformly, with replacement) from observed lengths, e.g. a trace's quantiles."""

    kind: Literal["empirical"] = "empirical"
    values: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(min_length=1, max_length=MAX_REQUESTS)


LengthDist = Annotated[
    FixedLength | UniformLength | NormalLength | LognormalLength | ParetoLength | ZipfLength | EmpiricalLength,
    Field(discriminator="kind"),
]

# ----------------------------------------------------------------------------- prefixes


class SystemPrompts(_Strict):
    """`count` system prompts; request i uses prompt k with probability proportional to
    (k+1)^-zipf_exponent (0 = equally popular). Each prompt's length is drawn once from `tokens`."""

    count: int = Field(1, ge=1, le=MAX_REQUESTS)
    tokens: LengthDist
    zipf_exponent: float = Field(1.0, ge=0)
    share_of_requests: float = Field(1.0, ge=0, le=1)  # requests without one start with their own content


class DynamicPrefix(_Strict):
    """A `share_of_requests` carry per-request content (timestamp, user id) at token
    `position_tokens`: from the hash block holding that position on, nothing is shared.
    Position 0 means no sharing at all for those requests."""

    share_of_requests: float = Field(ge=0, le=1)
    position_tokens: int = Field(ge=0, le=MAX_TOKENS)


class Sessions(_Strict):
    """Multi-turn conversations: turn n's prompt = turn n-1's prompt + its output + a new user
    message, arriving `think_time` after turn n-1 arrived (exponential with the given mean)."""

    turns: LengthDist  # turns per session ("tokens" here count turns)
    mean_think_time_s: float = Field(gt=0)
    user_message_tokens: LengthDist
    max_context_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)  # a session ends before a turn would exceed it

    @model_validator(mode="after")
    def _turns(self) -> Sessions:
        # every turn of every drawn session becomes a row before the first num_requests are kept
        t = self.turns
        bound = max(float(v) for k, v in t.model_dump().items()
                    if k in ("tokens", "high", "max_tokens", "mean", "median", "scale", "values") and v is not None
                    for v in (v if isinstance(v, list) else [v]))
        if bound > MAX_TURNS:
            raise ValueError(f"turns reach {bound:g} per session; at most {MAX_TURNS:,} are allowed")
        return self


# ----------------------------------------------------------------------------- the spec


class WorkloadSpec(_Strict):
    """Everything needed to generate a workload, deterministically from `seed`."""

    name: str = "custom"
    description: str = ""
    num_requests: int = Field(1000, ge=1, le=MAX_REQUESTS)
    seed: int = Field(0, ge=0, lt=2**63)
    hash_block_size: int = Field(16, ge=1, le=MAX_TOKENS)
    arrival: Arrival
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    system_prompts: SystemPrompts | None = None
    dynamic_prefix: DynamicPrefix | None = None
    sessions: Sessions | None = None
    task_mix: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=lambda: {"default": 1.0})

    @model_validator(mode="after")
    def _mix(self) -> WorkloadSpec:
        if not self.task_mix:
            raise ValueError("task_mix needs at least one category, e.g. {\"chat\": 1.0}")
        return self

    def to_json(self) -> str:
        """Indented JSON with each distribution's `kind` first and number lists on one line."""
        def kind_first(x: object) -> object:
            if isinstance(x, dict):
                keys = sorted(x, key=lambda k: k != "kind")  # stable: only moves "kind" to the front
                return {k: kind_first(x[k]) for k in keys}
            return x

        text = json.dumps(kind_first(self.model_dump(mode="json")), indent=2)
        return re.sub(r"\[([-0-9.,\s]+)\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)).strip() + "]", text)

    def with_overrides(self, **changes: object) -> WorkloadSpec:
        """A validated copy with top-level fields replaced (e.g. num_requests, seed)."""
        return type(self).model_validate({**self.model_dump(), **changes})
