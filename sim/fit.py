"""Fit a `WorkloadSpec` to a trace, so that its traffic can be regenerated and scaled.

What is matched, and how:
- rate: requests / span;
- burstiness, by the inter-arrival CV: below 0.05 constant spacing; within 0.1 of 1 Poisson;
  above 1.5, if the counts' index of dispersion grows from 1-s to 60-s windows as a two-state
  process's does, an on/off process (interrupted Poisson: bursts and silences) fitted to the
  rate and both indices of dispersion; otherwise vLLM's Gamma with burstiness = 1 / CV^2 (a
  Gamma renewal process has CV = 1/sqrt(shape)). A Gamma matches the CV but not how the
  bursts cluster: on the Azure code trace it gives an index of dispersion of ~70 where the
  trace has 13.2; the on/off fit gives ~13 and still a CV of ~13;
- lengths: empirical (the trace's 1,001 quantiles, resampled) by default, or a lognormal
  (median = geometric mean, sigma = std of log length), clipped to the trace's min and max;
- prefix reuse (the token share of `describe`): one shared system prompt whose length L makes
  the expected reused share over the trace's prompt lengths equal the trace's. This keeps the
  reuse figure, not the structure behind it (in Mooncake most reuse comes from conversations
  re-sending their history), so a cache working set is smaller than the trace's;
- task mix: the trace's category shares.

The Mooncake trace's 3-s timestamp steps read as burstiness (CV 3.0, a Gamma with burstiness
0.11); fit it with `--spread` to fit the traffic under the quantisation instead (CV 1.0, Poisson).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from sim.describe import index_of_dispersion, interarrival_cv, prefix_reuse
from sim.workload import Workload
from sim.workload_spec import (
    ConstantArrival,
    EmpiricalLength,
    FixedLength,
    GammaArrival,
    LengthDist,
    LognormalLength,
    OnOffArrival,
    PoissonArrival,
    SystemPrompts,
    WorkloadSpec,
)

N_QUANTILES = 1001


def fit_lengths(x: np.ndarray, kind: Literal["empirical", "lognormal"] = "empirical") -> LengthDist:
    lo, hi = int(x.min()), int(x.max())
    if lo == hi:
        return FixedLength(tokens=lo)
    if kind == "lognormal":
        logs = np.log(x.astype(np.float64))
        return LognormalLength(median=float(np.exp(logs.mean())), sigma=float(logs.std()),
                               min_tokens=lo, max_tokens=hi)
    q = np.percentile(x, np.linspace(0, 100, N_QUANTILES), method="inverted_cdf")
    return EmpiricalLength(values=[int(v) for v in q], min_tokens=lo, max_tokens=hi)


def fit_onoff(rate_rps: float, idc_short: float, idc_long: float, long_s: float,
              short_s: float = 1.0) -> OnOffArrival | None:
    """Interrupted Poisson process (rate `on` while on, 0 while off, exponential periods) whose mean
    rate and indices of dispersion over `short_s` and `long_s` windows are the given ones.

    For this process IDC(T) = 1 + A (rT - 1 + exp(-rT)) / (r^2 T), with r the sum of the two
    switching rates and A = 2 (1 - p_on) on_rate. The ratio (IDC(short) - 1) / (IDC(long) - 1)
    depends on r alone (bisection); then A, on_rate = rate + A / 2, p_on = rate / on_rate.
    None if no such process exists (e.g. dispersion that falls with the window)."""
    if not (idc_short > 1.0 and idc_long > idc_short):
        return None
    target = (idc_short - 1.0) / (idc_long - 1.0)

    def growth(r: float, t: float) -> float:
        return (r * t - 1.0 + math.exp(-r * t)) / (r * r * t)

    def gap(r: float) -> float:
        return growth(r, short_s) / growth(r, long_s) - target

    lo, hi = 1e-7, 1e4
    if gap(lo) * gap(hi) > 0:
        return None
    for _ in range(200):  # bisection on a log scale
        mid = math.sqrt(lo * hi)
        if gap(lo) * gap(mid) <= 0:
            hi = mid
        else:
            lo = mid
    r = math.sqrt(lo * hi)
    a = (idc_short - 1.0) / growth(r, short_s)
    on_rate = rate_rps + a / 2.0
    p_on = rate_rps / on_rate
    cycle_s = 1.0 / (p_on * (1.0 - p_on) * r)
    return OnOffArrival(on_rate_rps=on_rate, off_rate_rps=0.0, mean_on_s=p_on * cycle_s,
                        mean_off_s=(1.0 - p_on) * cycle_s)


def fit_arrival(arrival_s: np.ndarray) -> ConstantArrival | PoissonArrival | GammaArrival | OnOffArrival:
    span = float(arrival_s[-1] - arrival_s[0])
    if arrival_s.size < 3 or span <= 0:
        raise ValueError("fitting arrivals needs at least three requests spread over time")
    rate = arrival_s.size / span
    cv = interarrival_cv(arrival_s)
    if cv < 0.05:
        return ConstantArrival(rate_rps=rate)
    if abs(cv - 1.0) <= 0.1:
        return PoissonArrival(rate_rps=rate)
    long_s = min(60.0, span / 10.0)
    if cv > 1.5 and long_s >= 5.0:
        onoff = fit_onoff(rate, index_of_dispersion(arrival_s, 1.0), index_of_dispersion(arrival_s, long_s), long_s)
        if onoff is not None:
            return onoff
    return GammaArrival(rate_rps=rate, burstiness=1.0 / cv**2)


def shared_prefix_tokens(prompt_len: np.ndarray, target_fraction: float, block_size: int) -> int:
    """Smallest system-prompt length L whose reused share, sum((min(L, p) // bs) * bs) / sum(p),
    reaches `target_fraction` (monotone in L, so bisection)."""
    total = float(prompt_len.sum())

    def share(length: int) -> float:
        return float(((np.minimum(length, prompt_len) // block_size) * block_size).sum()) / total

    lo, hi = 0, int(prompt_len.max())
    if share(hi) <= target_fraction:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if share(mid) >= target_fraction:
            hi = mid
        else:
            lo = mid
    return hi


def fit_spec(wl: Workload, *, lengths: Literal["empirical", "lognormal"] = "empirical",
             hash_block_size: int = 16, seed: int = 0, num_requests: int | None = None,
             name: str | None = None) -> WorkloadSpec:
    """A spec whose generated workload has `wl`'s rate, inter-arrival CV, lengths and reuse."""
    reuse = prefix_reuse(wl)["token_fraction"]
    system_prompts = None
    if reuse >= 0.005:
        length = shared_prefix_tokens(wl.prompt_len, reuse, hash_block_size)
        system_prompts = SystemPrompts(count=1, tokens=FixedLength(tokens=length), zipf_exponent=0.0)
    mix = np.bincount(wl.category_code, minlength=len(wl.categories)) / len(wl)
    arrival = fit_arrival(wl.arrival_s)
    return WorkloadSpec(
        name=name or f"fit-{wl.name}",
        description=(f"Fitted to {wl.name} ({len(wl)} requests over {wl.duration_s:.0f} s): "
                     f"{arrival.kind} arrivals, {lengths} lengths, "
                     + (f"{reuse:.1%} prompt-token reuse as one shared prefix." if system_prompts
                        else "no prefix reuse.")),
        num_requests=num_requests or len(wl),
        seed=seed,
        hash_block_size=hash_block_size,
        arrival=arrival,
        prompt_tokens=fit_lengths(wl.prompt_len, lengths),
        output_tokens=fit_lengths(wl.output_len, lengths),
        system_prompts=system_prompts,
        task_mix={c: float(f) for c, f in zip(wl.categories, mix, strict=True) if f > 0},
    )
