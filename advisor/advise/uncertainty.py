"""What a predicted gain is worth: a 90% interval around it, and the rule that keeps vLLM's
default when the interval does not clear the bar.

A gain (the primary figure of a configuration over another: goodput, or goodput per GPU) is
uncertain for three reasons, each measured rather than assumed where it can be:

(a) The simulator's own error. The profile's validation (`costline validate`, stored in the
    profile) gives the median |error| of each latency the SLO uses, and of request throughput,
    over held-out engine runs. Taken as the median of a normal error, the 90% band is +-2.44x
    that. Goodput counts the requests that meet the SLO per second, so the band of a
    configuration's goodput is its goodput with every SLO target tightened and loosened by its
    band, recounted on the same simulated requests, over a duration moved by the throughput band
    (`goodput_band`): a latency error reaches goodput only through the requests near a target.
    Two configurations' bands are combined as independent (root sum of squares): conservative,
    since the same profile's bias shifts both alike. A profile without validation gets a stated
    prior band (UNVALIDATED_LATENCY_ERROR).
(b) Traffic. K more realizations of the user's traffic (its fitted spec regenerated with other
    seeds) give K paired gains; their standard deviation times 1.645 is the traffic part.
(c) The inputs no one measured (a prior acceptance, say): the gain is simulated at the low and
    high end of each such input's range, and the interval spans both ends.

The interval is the point gain (on the user's own traffic) +- sqrt((a)^2 + (b)^2), widened to the
ends of (c). A change is recommended only when its interval's low end is above `min_gain_pct`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from engine.core.run_summary import SLO, good_mask

Z90 = 1.6449  # two-sided 90% of a normal
MEDIAN_ABS_TO_SIGMA = 1 / 0.6745  # median |N(0, s)| = 0.6745 s
# Latency error (90% half-width, relative) assumed for a profile without validation: the shipped
# first-principles profile measured 40-50% median |error| on the H200 validation runs
# (benchmarks/calibration/validation.md, "default"); a fitted or scaled profile not validated on
# the GPU it prices gets a quarter (the scaled profiles' H200 parent validated at 1-4%, the
# datasheet scaling itself is untested).
UNVALIDATED_LATENCY_ERROR = {"first principles": 0.5, "unvalidated": 0.25}
# SLO key -> the validation metrics its error is read from (the tail, where SLO targets sit)
SLO_METRICS = {"ttft": ("p90_ttft_ms", "p99_ttft_ms"), "tpot": ("p90_tpot_ms", "p99_tpot_ms"),
               "e2el": ("p90_e2el_ms", "p99_e2el_ms"),
               # goodput's time base: requests per second, whatever the SLO
               "throughput": ("request_throughput",)}
DEFAULT_MIN_GAIN_PCT = 2.0


def latency_error(validation: Mapping[str, Any] | None, status: str = "") -> dict[str, float]:
    """The 90% half-width of the simulator's relative error per SLO key ("ttft", "tpot",
    "e2el"), from a profile's stored validation; the prior band without one."""
    by_metric = (validation or {}).get("median_abs_error_by_metric") or {}
    prior = UNVALIDATED_LATENCY_ERROR["first principles" if "first principles" in status else "unvalidated"]
    out = {}
    for key, metrics in SLO_METRICS.items():
        seen = [float(by_metric[m]) for m in metrics if isinstance(by_metric.get(m), int | float)
                and math.isfinite(by_metric[m])]
        out[key] = Z90 * MEDIAN_ABS_TO_SIGMA * max(seen) if seen else prior
    return out


def scaled_slo(slo: SLO, error: Mapping[str, float], sign: int) -> SLO:
    """`slo` with every target moved by its error: sign -1 tightens, +1 loosens (floored at 0)."""
    moved = {f"{k}_ms": max(v * (1 + sign * error.get(k, 0.0)), 0.0) for k, v in slo.as_dict().items()}
    return SLO(**moved)


def goodput_band(requests: dict[str, np.ndarray], slo: SLO | None, duration_s: float,
                 error: Mapping[str, float]) -> tuple[float, float]:
    """(low, high) goodput in requests/s if the engine were the simulator off by the error band:
    the requests meeting the tightened and the loosened targets (latency error), over the run's
    duration moved by the throughput error (`error["throughput"]`: the time base). Without an SLO
    goodput is throughput: only the time base moves."""
    if duration_s <= 0:
        return 0.0, 0.0
    base = error.get("throughput", 0.0)
    tight = scaled_slo(slo, error, -1) if slo is not None else None
    loose = scaled_slo(slo, error, +1) if slo is not None else None
    low = float(good_mask(requests, tight).sum()) / duration_s * (1 - base)
    high = float(good_mask(requests, loose).sum()) / duration_s * (1 + base)
    return low, high


@dataclass(frozen=True, slots=True)
class Sample:
    """One simulation's primary figure and its band from the simulator's error."""

    value: float
    low: float
    high: float

    def scaled(self, factor: float) -> Sample:
        return replace(self, value=self.value * factor, low=self.low * factor, high=self.high * factor)

    def half_width_rel(self) -> float:
        return (self.high - self.low) / 2 / self.value if self.value > 0 else 0.0


class GainInterval(BaseModel):
    """A predicted gain in percent and its 90% interval, with the parts it is built from."""

    model_config = ConfigDict(extra="forbid")

    gain_pct: float = Field(description="on the user's own traffic")
    low_pct: float
    high_pct: float
    validation_pct: float = Field(description="(a): half-width from the profile's validation error")
    traffic_pct: float = Field(description="(b): 1.645 x the sd of the gain over other traffic realizations")
    realizations: int
    inputs: dict[str, list[float]] = Field(
        default_factory=dict, description="(c): input name -> [gain at its low end, gain at its high end] in %")

    def clears(self, min_gain_pct: float) -> bool:
        return self.low_pct > min_gain_pct

    def text(self) -> str:
        """'+12.3% (90%: +8.1% to +16.5%)', or '+0.7% +- 3.1%' when symmetric."""
        if not math.isfinite(self.gain_pct):
            return "from no goodput to some" if self.gain_pct > 0 else "n/a"
        if abs((self.high_pct - self.gain_pct) - (self.gain_pct - self.low_pct)) < 0.05:
            return f"{self.gain_pct:+.1f}% \u00b1 {self.high_pct - self.gain_pct:.1f}%"
        return f"{self.gain_pct:+.1f}% (90%: {self.low_pct:+.1f}% to {self.high_pct:+.1f}%)"


def _gain(new: float, old: float) -> float:
    if old <= 0:
        return 0.0 if new <= 0 else math.inf
    return (new / old - 1) * 100


def gain_interval(base: Sample, new: Sample, base_realizations: Sequence[float] = (),
                  new_realizations: Sequence[float] = (),
                  inputs: Mapping[str, tuple[Sample, Sample]] | None = None) -> GainInterval:
    """The gain of `new` over `base` (each on the user's traffic) and its 90% interval: the
    validation bands of both (a), the paired realizations' spread (b), and for each unmeasured
    input, `new` simulated at the input's low and high end (c)."""
    point = _gain(new.value, base.value)
    a = math.hypot(base.half_width_rel(), new.half_width_rel()) * 100 * (1 + point / 100 if math.isfinite(point) else 1)
    pairs = [_gain(n, b) for n, b in zip(new_realizations, base_realizations, strict=True)]
    pairs = [g for g in pairs if math.isfinite(g)]
    b = Z90 * float(np.std(pairs, ddof=1)) if len(pairs) > 1 else 0.0
    half = math.hypot(a, b)
    low, high = point - half, point + half
    ends: dict[str, list[float]] = {}
    for name, (at_low, at_high) in (inputs or {}).items():
        g = [_gain(at_low.value, base.value), _gain(at_high.value, base.value)]
        ends[name] = [round(x, 3) for x in g]
        low, high = min(low, min(g) - half), max(high, max(g) + half)
    if not math.isfinite(point):  # from no goodput to some: clear whatever the band
        low = high = point
    return GainInterval(gain_pct=round(point, 3), low_pct=round(low, 3), high_pct=round(high, 3),
                        validation_pct=round(a, 3), traffic_pct=round(b, 3), realizations=len(pairs), inputs=ends)


__all__ = ["DEFAULT_MIN_GAIN_PCT", "SLO_METRICS", "UNVALIDATED_LATENCY_ERROR", "GainInterval", "Sample",
           "gain_interval", "goodput_band", "latency_error", "scaled_slo"]
