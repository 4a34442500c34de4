"""Expected distinct experts per step (sim/moe.py) against Monte Carlo routing and limits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.moe import (
    ExpertRouting,
    fit_routing_skew,
    inclusion_probabilities,
    sample_touched,
    zipf_popularity,
)

TRIALS = 200


def _mc(r: ExpertRouting, t: int, seed: int) -> tuple[float, float]:
    x = sample_touched(r, t, TRIALS, seed)
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(TRIALS))


@settings(max_examples=20, deadline=None, derandomize=True)
@given(e=st.integers(1, 160), k=st.integers(1, 10), t=st.integers(1, 300))
def test_uniform_closed_form_equals_monte_carlo(e, k, t):
    k = min(k, e)
    r = ExpertRouting(e, k)
    mean, se = _mc(r, t, seed=e * 1000 + k * 10 + t)
    # (+0.02: a rare miss that no trial drew leaves se = 0)
    assert abs(r.expected_touched(t) - mean) <= 4.5 * se + 0.02


@settings(max_examples=12, deadline=None, derandomize=True)
@given(e=st.sampled_from([8, 16, 64, 128]), k=st.integers(1, 8), t=st.sampled_from([1, 3, 16, 64, 512]),
       skew=st.floats(0.2, 1.6))
def test_skewed_approximation_within_three_percent_of_monte_carlo(e, k, t, skew):
    k = min(k, e)
    r = ExpertRouting(e, k, skew)
    mean, se = _mc(r, t, seed=int(skew * 100) + t)
    assert abs(r.expected_touched(t) - mean) <= 4.5 * se + 0.03 * mean


def test_one_token_touches_k_and_many_touch_all():
    for r in (ExpertRouting(128, 8), ExpertRouting(8, 2), ExpertRouting(128, 8, 1.0)):
        assert r.expected_touched(1) == pytest.approx(r.top_k)  # one token: exactly its k
        assert r.expected_touched(10**6) == pytest.approx(r.num_experts)  # saturates at all experts
        t = np.arange(1, 400)
        assert np.all(np.diff(r.expected_touched(t)) >= 0)  # never falls with more tokens


def test_uniform_inclusion_is_k_over_e_and_sums_to_k():
    assert np.allclose(inclusion_probabilities(zipf_popularity(128, 0.0), 8), 8 / 128)
    pi = inclusion_probabilities(zipf_popularity(64, 1.2), 6)
    assert pi.sum() == pytest.approx(6) and np.all(np.diff(pi) <= 0) and pi.max() <= 1


def test_tokens_to_touch_all_experts_by_hand():
    # uniform: E (1 - (1 - k/E)^T) >= 0.99 E  <=>  T >= ln 0.01 / ln(1 - k/E)
    assert ExpertRouting(128, 8).tokens_to_touch(0.99) == 72  # ln .01 / ln(15/16) = 71.4
    assert ExpertRouting(8, 2).tokens_to_touch(0.99) == 17  # ln .01 / ln(3/4) = 16.0 (16 gives 7.92)
    assert ExpertRouting(128, 8, 1.0).tokens_to_touch(0.99) > 72  # skew leaves rare experts unread longer


def test_skew_fit_recovers_the_skew_of_its_own_curve():
    truth = ExpertRouting(128, 8, 0.8)
    obs = [(t, truth.expected_touched(t)) for t in (1, 4, 16, 64, 256)]
    assert fit_routing_skew(128, 8, obs) == pytest.approx(0.8, abs=0.01)


def test_bad_routing_is_refused():
    with pytest.raises(ValueError, match="top_k"):
        ExpertRouting(4, 5)
    with pytest.raises(ValueError, match="skew"):
        zipf_popularity(8, -1.0)
