"""Length samplers against their parameters (K standard errors from the sample size)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from sim.lengths import sample_lengths, zipf_pmf
from sim.workload_spec import (
    EmpiricalLength,
    FixedLength,
    LognormalLength,
    NormalLength,
    ParetoLength,
    UniformLength,
    ZipfLength,
)

K = 5.0
N = 100_000
Z90 = 1.2815515655446004  # standard normal 90th percentile


def phi(z: float) -> float:
    return math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def quantile_se_normal(p: float, sigma: float, n: int) -> float:
    """SE of the sample p-quantile of N(., sigma^2): sqrt(p(1-p)/n) / density at the quantile."""
    z = {0.5: 0.0, 0.9: Z90}[p]
    return math.sqrt(p * (1 - p) / n) * sigma / phi(z)


def draw(dist, seed=0, n=N):
    x = sample_lengths(dist, n, np.random.default_rng(seed))
    assert x.dtype == np.int64 and x.size == n
    return x


def test_fixed():
    assert np.all(draw(FixedLength(tokens=77), n=100) == 77)


def test_uniform_mean_and_bounds():
    x = draw(UniformLength(low=10, high=50))
    assert x.min() == 10 and x.max() == 50  # both ends are reachable
    var = ((50 - 10 + 1) ** 2 - 1) / 12  # discrete uniform
    assert abs(x.mean() - 30) < K * math.sqrt(var / N)


def test_normal_mean_std():
    x = draw(NormalLength(mean=500, std=50))
    assert abs(x.mean() - 500) < K * 50 / math.sqrt(N)
    # SE of the sample std of a normal: sigma / sqrt(2n); rounding to integers adds 1/12 variance
    assert abs(x.std() - math.sqrt(50**2 + 1 / 12)) < K * 50 / math.sqrt(2 * N)


def test_lognormal_percentiles():
    d = LognormalLength(median=800, sigma=1.0)
    logx = np.log(draw(d).astype(float))
    assert abs(np.median(logx) - math.log(800)) < K * quantile_se_normal(0.5, 1.0, N)
    assert abs(np.percentile(logx, 90) - (math.log(800) + Z90)) < K * quantile_se_normal(0.9, 1.0, N)


def test_pareto_tail_exponent():
    d = ParetoLength(alpha=1.5, scale=1000)
    x = draw(d).astype(float)
    assert x.min() >= 1000
    alpha_hat = x.size / np.log(x / 1000).sum()  # MLE; SE = alpha / sqrt(n)
    assert abs(alpha_hat - 1.5) < K * 1.5 / math.sqrt(N) + 0.01  # + rounding to whole tokens


def test_zipf_frequencies():
    d = ZipfLength(exponent=1.2, min_tokens=1, max_tokens=1000)
    x = draw(d)
    pmf = zipf_pmf(1.2, 1, 1000)
    for k in (1, 2, 3, 10):
        p = pmf[k - 1]
        assert abs(np.mean(x == k) - p) < K * math.sqrt(p * (1 - p) / N)
    assert x.min() >= 1 and x.max() <= 1000


def test_empirical_resamples_only_given_values_with_their_frequencies():
    values = [5, 5, 5, 100, 2000]
    x = draw(EmpiricalLength(values=values))
    assert set(np.unique(x)) == {5, 100, 2000}
    assert abs(np.mean(x == 5) - 0.6) < K * math.sqrt(0.24 / N)


def test_clipping_clamps_to_the_bounds():
    d = LognormalLength(median=1000, sigma=1.0, min_tokens=200, max_tokens=3000)
    x = draw(d)
    assert x.min() == 200 and x.max() == 3000
    # the share clamped at the top is P(X > 3000) = 1 - Phi(ln 3) (closed form)
    p_hi = 0.5 * math.erfc(math.log(3) / math.sqrt(2))
    assert abs(np.mean(x == 3000) - p_hi) < K * math.sqrt(p_hi * (1 - p_hi) / N)


def test_invalid_length_specs_name_the_field():
    with pytest.raises(ValidationError, match="max_tokens"):
        LognormalLength(median=10, sigma=1, min_tokens=50, max_tokens=10)
    with pytest.raises(ValidationError, match="high"):
        UniformLength(low=10, high=5)
    with pytest.raises(ValidationError, match="tokens"):
        FixedLength(tokens=0)


def test_lognormal_fit_recovers_its_parameters():
    from sim.fit import fit_lengths

    x = draw(LognormalLength(median=300, sigma=0.8), seed=3)
    d = fit_lengths(x, "lognormal")
    assert isinstance(d, LognormalLength) and (d.min_tokens, d.max_tokens) == (x.min(), x.max())
    # log-mean SE sigma/sqrt(n); log-std SE sigma/sqrt(2n); rounding to whole tokens shifts little at 300
    assert abs(math.log(d.median) - math.log(300)) < K * 0.8 / math.sqrt(N)
    assert abs(d.sigma - 0.8) < K * 0.8 / math.sqrt(2 * N) + 1e-3


def test_empirical_fit_keeps_the_quantiles():
    from sim.fit import fit_lengths

    x = draw(ParetoLength(alpha=1.2, scale=50), seed=4)
    d = fit_lengths(x)
    assert isinstance(d, EmpiricalLength) and len(d.values) == 1001
    assert d.values[500] == np.percentile(x, 50, method="inverted_cdf") and d.values[-1] == x.max()


@pytest.mark.parametrize("exponent", [0.5, 1.0, 1.3])
def test_a_wide_zipf_law_is_drawn_without_tabulating_its_support(exponent):
    """Past ZIPF_EXACT_SUPPORT values the tail is drawn from the continuous law: the mean and the
    quantiles match the exact law's, and memory no longer grows with max_tokens (10M values were
    several 80 MB arrays)."""
    import tracemalloc

    from sim.lengths import ZIPF_EXACT_SUPPORT, mean_length

    high = 4 * ZIPF_EXACT_SUPPORT
    dist = ZipfLength(exponent=exponent, min_tokens=1, max_tokens=high)
    pmf = zipf_pmf(exponent, 1, high)
    exact_mean = float((pmf * np.arange(1, high + 1)).sum())
    assert mean_length(dist) == pytest.approx(exact_mean, rel=1e-4)
    x = sample_lengths(dist, 100_000, np.random.default_rng(3))
    want = np.searchsorted(np.cumsum(pmf), [0.5, 0.9, 0.99]) + 1
    assert np.percentile(x, [50, 90, 99]) == pytest.approx(want, rel=0.05, abs=2)
    tracemalloc.start()
    sample_lengths(ZipfLength(exponent=exponent, min_tokens=1, max_tokens=10_000_000), 1000,
                   np.random.default_rng(0))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak
