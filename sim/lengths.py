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


def zipf_pmf(exponent: float, low: int, high: int) -> np.ndarray:
    """P(k) for k in [low, high], proportional to k^-exponent."""
    k = np.arange(low, high + 1, dtype=np.float64)
    w = k ** -exponent
    return w / w.sum()


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
        cdf = np.cumsum(zipf_pmf(dist.exponent, dist.min_tokens, dist.max_tokens))
        idx = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
        raw = (dist.min_tokens + np.minimum(idx, cdf.size - 1)).astype(np.float64)
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
        pmf = zipf_pmf(dist.exponent, dist.min_tokens, dist.max_tokens)
        return float((pmf * np.arange(dist.min_tokens, dist.max_tokens + 1)).sum())
    return float(np.mean(dist.values))
