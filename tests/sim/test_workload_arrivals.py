"""Arrival generators against their parameters, with tolerances of K standard errors.

Standard errors come from the sample size (closed forms where they exist, the delta method on
sample moments otherwise); seeds are fixed, so a failure is a real change, not bad luck.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.arrivals import arrival_times
from sim.describe import index_of_dispersion, interarrival_cv
from sim.workload_spec import (
    ConstantArrival,
    GammaArrival,
    OnOffArrival,
    PoissonArrival,
    RampArrival,
)

K = 5.0  # standard errors allowed
N = 100_000


def cv_standard_error(gaps: np.ndarray) -> float:
    """Delta-method SE of the sample CV from the sample's own central moments."""
    n = gaps.size
    m = gaps.mean()
    c = gaps - m
    v, mu3, mu4 = (c**2).mean(), (c**3).mean(), (c**4).mean()
    s = math.sqrt(v)
    d_m, d_v = -s / m**2, 1.0 / (2 * s * m)
    var = d_m**2 * v + d_v**2 * (mu4 - v**2) + 2 * d_m * d_v * mu3
    return math.sqrt(var / n)


def test_poisson_rate_and_cv():
    t = arrival_times(PoissonArrival(rate_rps=20.0), N, np.random.default_rng(1))
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    # mean gap 1/rate with SE (1/rate)/sqrt(n); exponential CV = 1 with SE 1/sqrt(n) (closed form)
    assert abs(gaps.mean() - 1 / 20) < K * (1 / 20) / math.sqrt(gaps.size)
    assert abs(interarrival_cv(t) - 1.0) < K / math.sqrt(gaps.size)
    # counts per 1-s bin are Poisson: index of dispersion 1, SE ~ sqrt(2/bins)
    bins = int(t[-1])
    assert abs(index_of_dispersion(t) - 1.0) < K * math.sqrt(2 / bins)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_matches_vllm_parameterisation(burstiness):
    rate = 10.0
    t = arrival_times(GammaArrival(rate_rps=rate, burstiness=burstiness), N, np.random.default_rng(2))
    gaps = np.diff(t)
    want_cv = 1 / math.sqrt(burstiness)  # Gamma(shape k): CV = 1/sqrt(k)
    assert abs(gaps.mean() - 1 / rate) < K * gaps.std() / math.sqrt(gaps.size)
    assert abs(interarrival_cv(t) - want_cv) < K * cv_standard_error(gaps)


def test_constant_is_evenly_spaced():
    t = arrival_times(ConstantArrival(rate_rps=4.0), 1001, np.random.default_rng(0))
    np.testing.assert_allclose(np.diff(t), 0.25)
    assert t[-1] == pytest.approx(250.0)


def test_ramp_counts_follow_the_integrated_rate():
    spec = RampArrival(start_rps=2.0, end_rps=20.0, ramp_s=100.0)
    t = arrival_times(spec, 5000, np.random.default_rng(3))
    # expected arrivals in [0, 50) s: integral of 2 + 0.18 t = 100 + 225 = 325; [50, 100): 1100 - 325 = 775
    # (the first arrival is pinned to 0, which shifts the process by one exponential draw at most)
    for lo, hi, want in [(0, 50, 325.0), (50, 100, 775.0), (100, 120, 400.0)]:
        got = np.count_nonzero((t >= lo) & (t < hi))
        assert abs(got - want) < K * math.sqrt(want), (lo, hi, got, want)


def test_onoff_long_run_rate_and_burstiness():
    spec = OnOffArrival(on_rate_rps=40.0, off_rate_rps=2.0, mean_on_s=5.0, mean_off_s=20.0)
    t = arrival_times(spec, N, np.random.default_rng(4))
    assert np.all(np.diff(t) >= 0) and t[0] == 0
    l1, l0, m1, m0 = spec.on_rate_rps, spec.off_rate_rps, spec.mean_on_s, spec.mean_off_s
    want_rate = (l1 * m1 + l0 * m0) / (m1 + m0)  # 9.6 req/s
    # ratio estimator over C on/off cycles: A = arrivals per cycle, L = cycle length (closed forms)
    ea, el = l1 * m1 + l0 * m0, m1 + m0
    var_a = l1 * m1 + l1**2 * m1**2 + l0 * m0 + l0**2 * m0**2
    var_l, cov = m1**2 + m0**2, l1 * m1**2 + l0 * m0**2
    cycles = t[-1] / el
    rel_se = math.sqrt((var_a / ea**2 + var_l / el**2 - 2 * cov / (ea * el)) / cycles)
    got_rate = t.size / t[-1]
    assert abs(got_rate / want_rate - 1) < K * rel_se
    assert index_of_dispersion(t) > 5  # far burstier than Poisson's 1
    assert interarrival_cv(t) > 1.3


def test_same_seed_same_times_and_different_seed_differs():
    spec = GammaArrival(rate_rps=5, burstiness=0.5)
    a = arrival_times(spec, 1000, np.random.default_rng(7))
    b = arrival_times(spec, 1000, np.random.default_rng(7))
    c = arrival_times(spec, 1000, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_falling_ramp_counts():
    spec = RampArrival(start_rps=20.0, end_rps=2.0, ramp_s=100.0)
    t = arrival_times(spec, 3000, np.random.default_rng(9))
    # integral of 20 - 0.18 t over [0, 50) = 1000 - 225 = 775; over [50, 100) = 1100 - 775 = 325
    for lo, hi, want in [(0, 50, 775.0), (50, 100, 325.0)]:
        got = np.count_nonzero((t >= lo) & (t < hi))
        assert abs(got - want) < K * math.sqrt(want), (lo, hi, got, want)


def test_scale_rate_keeps_the_shape():
    from sim.arrivals import scale_rate

    g = scale_rate(GammaArrival(rate_rps=2, burstiness=0.3), 2.5)
    assert (g.rate_rps, g.burstiness) == (5.0, 0.3)
    o = scale_rate(OnOffArrival(on_rate_rps=10, off_rate_rps=1, mean_on_s=3, mean_off_s=7), 2)
    assert (o.on_rate_rps, o.off_rate_rps, o.mean_on_s, o.mean_off_s) == (20, 2, 3, 7)
    assert o.rate_rps == pytest.approx(2 * (10 * 3 + 7) / 10)
    r = scale_rate(RampArrival(start_rps=1, end_rps=4, ramp_s=60), 3)
    assert (r.start_rps, r.end_rps, r.ramp_s) == (3, 12, 60)
    with pytest.raises(ValueError):
        scale_rate(PoissonArrival(rate_rps=1), 0)
