"""Arrival-time generators, vectorised with numpy.

Each returns `n` sorted arrival times in seconds with the first arrival at 0, so
a workload starts when the simulation starts and its span is `arrivals[-1]`.
"""

from __future__ import annotations

import numpy as np

from sim.workload_spec import (
    Arrival,
    ConstantArrival,
    GammaArrival,
    OnOffArrival,
    PoissonArrival,
    RampArrival,
)


def _from_gaps(gaps_s: np.ndarray) -> np.ndarray:
    out = np.cumsum(gaps_s)
    return out - out[0]


def poisson_arrivals(rate_rps: float, n: int, rng: np.random.Generator) -> np.ndarray:
    return _from_gaps(rng.exponential(1.0 / rate_rps, n))


def gamma_arrivals(rate_rps: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    # vLLM benchmarks/serve.py: shape = burstiness, scale = 1 / (rate * burstiness); mean gap = 1/rate.
    return _from_gaps(rng.gamma(burstiness, 1.0 / (rate_rps * burstiness), n))


def constant_arrivals(rate_rps: float, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64) / rate_rps


def ramp_arrivals(spec: RampArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Inhomogeneous Poisson by time rescaling: unit-rate arrival times E pass through the
    inverse of the cumulative intensity L(t) = a t + (b - a) t^2 / (2 T) (t <= T), then linear."""
    a, b, ramp_s = spec.start_rps, spec.end_rps, spec.ramp_s
    e = np.cumsum(rng.exponential(1.0, n))
    e -= e[0]
    area_ramp = 0.5 * (a + b) * ramp_s  # expected arrivals during the ramp
    slope = (b - a) / ramp_s
    t = np.empty(n)
    inside = e <= area_ramp
    ei = e[inside]
    if abs(slope) < 1e-12:
        t[inside] = ei / a
    else:  # solve slope/2 t^2 + a t - e = 0 for the positive root, in a cancellation-free form
        t[inside] = 2.0 * ei / (a + np.sqrt(a * a + 2.0 * slope * ei))
    t[~inside] = ramp_s + (e[~inside] - area_ramp) / b
    return t


def onoff_arrivals(spec: OnOffArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Two-state MMPP: alternate exponential on/off periods (starting in the stationary state);
    within a period of length d at rate r, Poisson(r d) arrivals fall uniformly."""
    mean_count_per_cycle = spec.on_rate_rps * spec.mean_on_s + spec.off_rate_rps * spec.mean_off_s
    start_on = rng.random() < spec.mean_on_s / (spec.mean_on_s + spec.mean_off_s)
    chunks: list[np.ndarray] = []
    have = 0
    t0 = 0.0
    while have < n:
        cycles = max(16, int(1.3 * (n - have) / mean_count_per_cycle) + 16)
        on = rng.exponential(spec.mean_on_s, cycles)
        off = rng.exponential(spec.mean_off_s, cycles)
        durs = np.stack([on, off], axis=1) if start_on else np.stack([off, on], axis=1)
        rates = np.array([spec.on_rate_rps, spec.off_rate_rps] if start_on else [spec.off_rate_rps, spec.on_rate_rps])
        durs = durs.ravel()
        rates = np.tile(rates, cycles)
        starts = t0 + np.concatenate([[0.0], np.cumsum(durs)[:-1]])
        counts = rng.poisson(rates * durs)
        ts = np.repeat(starts, counts) + rng.random(int(counts.sum())) * np.repeat(durs, counts)
        ts.sort()  # periods are disjoint and in order, so sorting only reorders within a period
        chunks.append(ts)
        have += ts.size
        t0 = starts[-1] + durs[-1]
    out = np.concatenate(chunks)[:n]
    return out - out[0]


def arrival_times(arrival: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` arrival times (s), sorted, first at 0."""
    if n <= 0:
        return np.empty(0)
    if isinstance(arrival, PoissonArrival):
        return poisson_arrivals(arrival.rate_rps, n, rng)
    if isinstance(arrival, GammaArrival):
        return gamma_arrivals(arrival.rate_rps, arrival.burstiness, n, rng)
    if isinstance(arrival, ConstantArrival):
        return constant_arrivals(arrival.rate_rps, n)
    if isinstance(arrival, RampArrival):
        return ramp_arrivals(arrival, n, rng)
    if isinstance(arrival, OnOffArrival):
        return onoff_arrivals(arrival, n, rng)
    raise TypeError(f"unknown arrival kind {arrival!r}")


def scale_rate(arrival: Arrival, factor: float) -> Arrival:
    """The same traffic shape at `factor` times the rate ("my traffic, doubled" = 2): every rate is
    multiplied; Gamma burstiness, on/off period lengths and the ramp duration are kept."""
    if not factor > 0:
        raise ValueError(f"rate factor must be > 0, got {factor}")
    d = arrival.model_dump()
    for key in ("rate_rps", "on_rate_rps", "off_rate_rps", "start_rps", "end_rps"):
        if key in d:
            d[key] = d[key] * factor
    return type(arrival).model_validate(d)

