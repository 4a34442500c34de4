"""Token-length samplers: one vectorised draw per distribution, clamped to its bounds."""

from __future__ import annotations

import numpy as np

from sim.workload_spec import (
    EmpiricalLength,
    FixedLength,
    LengthDist,
    LognormalLength,
    NormalLength,
    ParetoLength,
    UniformLength,
    ZipfLength,
)

# A Zipf law's support is tabulated up to this many values; past it, the tail (where k^-exponent
# is smooth) is drawn from the continuous law and rounded, so memory does not grow with max_tokens
# (10M values were 80 MB per array). A support this small or smaller is drawn exactly, as before.
ZIPF_EXACT_SUPPORT = 1 << 16


def zipf_pmf(exponent: float, low: int, high: int) -> np.ndarray:
    """P(k) for k in [low, high], proportional to k^-exponent."""
    k = np.arange(low, high + 1, dtype=np.float64)
    w = k ** -exponent
    return w / w.sum()


def _power_integral(exponent: float, a: float, b: float, extra: float = 0.0) -> float:
    """Integral of x^(extra - exponent) over [a, b]."""
    p = 1.0 + extra - exponent
    return float(np.log(b / a)) if abs(p) < 1e-12 else float((b**p - a**p) / p)


def _zipf_tail(exponent: float, a: float, b: float, q: np.ndarray) -> np.ndarray:
    """The x in [a, b] below which a fraction q of the continuous law's mass lies."""
    p = 1.0 - exponent
    if abs(p) < 1e-12:
        return a * (b / a) ** q
    return (a**p + q * (b**p - a**p)) ** (1.0 / p)


def _sample_zipf(dist: ZipfLength, n: int, rng: np.random.Generator) -> np.ndarray:
    low, high, e = dist.min_tokens, dist.max_tokens, dist.exponent
    if high - low + 1 <= ZIPF_EXACT_SUPPORT:
        cdf = np.cumsum(zipf_pmf(e, low, high))
        idx = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
        return (low + np.minimum(idx, cdf.size - 1)).astype(np.float64)
    k0 = low + ZIPF_EXACT_SUPPORT  # head low..k0-1 exact; tail k0..high continuous, rounded
    head = np.cumsum(np.arange(low, k0, dtype=np.float64) ** -e)
    a, b = k0 - 0.5, high + 0.5
    tail = _power_integral(e, a, b)
    u = rng.random(n) * (head[-1] + tail)
    out = np.empty(n)
    in_head = u < head[-1]
    out[in_head] = low + np.minimum(np.searchsorted(head, u[in_head], side="right"), head.size - 1)
    x = _zipf_tail(e, a, b, (u[~in_head] - head[-1]) / tail)
    out[~in_head] = np.clip(np.floor(x + 0.5), k0, high)
    return out


def _zipf_mean(dist: ZipfLength) -> float:
    low, high, e = dist.min_tokens, dist.max_tokens, dist.exponent
    if high - low + 1 <= ZIPF_EXACT_SUPPORT:
        pmf = zipf_pmf(e, low, high)
        return float((pmf * np.arange(low, high + 1)).sum())
    k = np.arange(low, low + ZIPF_EXACT_SUPPORT, dtype=np.float64)
    a, b = low + ZIPF_EXACT_SUPPORT - 0.5, high + 0.5
    mass = float((k**-e).sum()) + _power_integral(e, a, b)
    return (float((k ** (1 - e)).sum()) + _power_integral(e, a, b, extra=1.0)) / mass


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` integer lengths (int64) drawn from `dist`, clamped to [min_tokens, max_tokens]."""
    if isinstance(dist, FixedLength):
        raw = np.full(n, float(dist.tokens))
    elif isinstance(dist, UniformLength):
        raw = rng.integers(dist.low, dist.high + 1, n).astype(np.float64)
    elif isinstance(dist, NormalLength):
        raw = rng.normal(dist.mean, dist.std, n)
    elif isinstance(dist, LognormalLength):
        raw = np.exp(rng.normal(np.log(dist.median), dist.sigma, n))
    elif isinstance(dist, ParetoLength):
        # inverse CDF; 1 - U keeps the draw away from U = 0 (an infinite length)
        raw = dist.scale * (1.0 - rng.random(n)) ** (-1.0 / dist.alpha)
    elif isinstance(dist, ZipfLength):
        raw = _sample_zipf(dist, n, rng)
    elif isinstance(dist, EmpiricalLength):
        values = np.asarray(dist.values, dtype=np.float64)
        raw = values[rng.integers(0, values.size, n)]
    else:  # pragma: no cover - the union is closed
        raise TypeError(f"unknown length distribution {dist!r}")
    hi = np.inf if dist.max_tokens is None else float(dist.max_tokens)
    # round half up, then clamp: rounding first keeps the bounds exact integers
    return np.clip(np.floor(raw + 0.5), dist.min_tokens, hi).astype(np.int64)


def mean_length(dist: LengthDist) -> float:
    """Expected length before clipping (used to size things, not in tests of clipping)."""
    if isinstance(dist, FixedLength):
        return float(dist.tokens)
    if isinstance(dist, UniformLength):
        return (dist.low + dist.high) / 2
    if isinstance(dist, NormalLength):
        return dist.mean
    if isinstance(dist, LognormalLength):
        return dist.median * float(np.exp(dist.sigma**2 / 2))
    if isinstance(dist, ParetoLength):
        return dist.alpha * dist.scale / (dist.alpha - 1) if dist.alpha > 1 else float("inf")
    if isinstance(dist, ZipfLength):
        return _zipf_mean(dist)
    return float(np.mean(dist.values))
