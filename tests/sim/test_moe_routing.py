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
    padded_rows_ratio,
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


@settings(max_examples=12, deadline=None)
@given(e=st.sampled_from([8, 32, 128]), k=st.sampled_from([1, 2, 8]), t=st.integers(1, 600),
       b=st.sampled_from([1, 16, 64, 128]), skew=st.sampled_from([0.0, 0.8]))
def test_padded_rows_equal_monte_carlo(e, k, t, b, skew):
    """Rows computed in blocks of b per expert over rows needed: the model's survival-function sum
    against counting ceil(n_e / b) blocks over sampled top-k draws (Gumbel top-k, as routed)."""
    if k > e:
        return
    r = ExpertRouting(e, k, skew)
    rng = np.random.default_rng(t * 7 + b)
    logp = np.log(zipf_popularity(e, skew))
    trials = 300
    blocks = 0.0
    for _ in range(trials):
        top = np.argpartition(-(logp + rng.gumbel(size=(t, e))), k - 1, axis=1)[:, :k]
        blocks += np.ceil(np.bincount(top.ravel(), minlength=e) / b).sum()
    mc = b * blocks / trials / (t * k)
    tol = 0.03 if skew == 0 else 0.06  # the skewed inclusion probabilities are Rosen's approximation
    assert padded_rows_ratio(r, t, b) == pytest.approx(mc, rel=tol)


def test_padding_by_hand():
    r = ExpertRouting(128, 8)
    assert padded_rows_ratio(r, 4096, 1) == 1.0  # no blocks, no padding
    # one token: k experts get one row each, each padded to a whole block
    assert padded_rows_ratio(r, 1, 128) == pytest.approx(128.0)
    # many tokens per expert: the padding tends to half a block per expert over the rows
    t = 1 << 17
    assert padded_rows_ratio(r, t, 128) == pytest.approx(1 + 64 * 128 / (t * 8), rel=2e-3)
