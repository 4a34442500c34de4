"""The gain interval's arithmetic against hand-computed values, its coverage against a known
truth, and the goodput band recounted from the simulated requests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.advise.uncertainty import (
    UNVALIDATED_LATENCY_ERROR,
    GainInterval,
    Sample,
    gain_interval,
    goodput_band,
    latency_error,
    scaled_slo,
)
from engine.core.run_summary import SLO

Z90 = 1.6449


def test_latency_error_reads_the_tail_metrics_of_the_validation():
    validation = {"median_abs_error_by_metric": {"p90_ttft_ms": 0.02, "p99_ttft_ms": 0.03,
                                                  "p90_tpot_ms": 0.01, "p99_tpot_ms": 0.005}}
    err = latency_error(validation, "validated")
    # the larger of the two tails, as the median of a normal error, to its 90% half-width
    assert err["ttft"] == pytest.approx(0.03 / 0.6745 * Z90, rel=1e-4)
    assert err["tpot"] == pytest.approx(0.01 / 0.6745 * Z90, rel=1e-4)
    assert err["e2el"] == UNVALIDATED_LATENCY_ERROR["unvalidated"]  # not in the validation: the prior
    assert err["throughput"] == UNVALIDATED_LATENCY_ERROR["unvalidated"]
    assert latency_error(None, "first principles")["ttft"] == UNVALIDATED_LATENCY_ERROR["first principles"]
    assert latency_error({}, "scaled, not validated")["tpot"] == UNVALIDATED_LATENCY_ERROR["unvalidated"]


def test_goodput_band_recounts_the_requests_at_the_moved_targets():
    ttft = np.array([50, 95, 99, 101, 105, 120, 300], dtype=float) / 1e3
    reqs = {"status": np.array(["finished"] * 6 + ["rejected"]), "ttft_s": ttft,
            "tpot_s": np.full(7, 0.01), "e2e_s": np.full(7, 1.0)}
    slo = SLO(ttft_ms=100, tpot_ms=20)
    # targets 90 / 110 ms: 1 and 5 finished requests meet them (the 300 ms one was rejected)
    low, high = goodput_band(reqs, slo, 10.0, {"ttft": 0.10, "tpot": 0.10})
    assert (low, high) == (pytest.approx(0.1), pytest.approx(0.5))
    assert scaled_slo(slo, {"ttft": 0.1}, -1) == SLO(ttft_ms=pytest.approx(90), tpot_ms=20)
    assert goodput_band(reqs, None, 10.0, {"ttft": 0.5}) == (0.6, 0.6)  # no SLO: throughput, no band
    # the time base: every count over a duration moved by the throughput error
    low, high = goodput_band(reqs, slo, 10.0, {"ttft": 0.10, "tpot": 0.10, "throughput": 0.02})
    assert (low, high) == (pytest.approx(0.1 * 0.98), pytest.approx(0.5 * 1.02))
    assert goodput_band(reqs, None, 10.0, {"throughput": 0.02}) == (pytest.approx(0.588), pytest.approx(0.612))


def test_interval_by_hand():
    base, new = Sample(10.0, 9.5, 10.5), Sample(12.0, 11.4, 12.6)  # +-5% each
    got = gain_interval(base, new, base_realizations=[10.0, 10.5, 9.5], new_realizations=[12.0, 12.3, 11.9])
    a = math.hypot(0.05, 0.05) * 100 * 1.2
    pairs = [20.0, (12.3 / 10.5 - 1) * 100, (11.9 / 9.5 - 1) * 100]
    b = Z90 * float(np.std(pairs, ddof=1))
    half = math.hypot(a, b)
    assert got.gain_pct == pytest.approx(20.0)
    assert (got.validation_pct, got.traffic_pct) == (pytest.approx(a, abs=1e-3), pytest.approx(b, abs=1e-3))
    assert (got.low_pct, got.high_pct) == (pytest.approx(20 - half, abs=1e-3), pytest.approx(20 + half, abs=1e-3))
    assert got.realizations == 3 and got.clears(2.0) == (20 - half > 2.0)


def test_an_unmeasured_input_widens_the_interval_to_both_its_ends():
    base, new = Sample(10.0, 10.0, 10.0), Sample(11.0, 11.0, 11.0)  # no validation band, no traffic spread
    got = gain_interval(base, new, inputs={"acceptance": (Sample(9.0, 9.0, 9.0), Sample(13.0, 13.0, 13.0))})
    assert (got.gain_pct, got.low_pct, got.high_pct) == (pytest.approx(10), pytest.approx(-10), pytest.approx(30))
    assert got.inputs == {"acceptance": [pytest.approx(-10), pytest.approx(30)]}
    assert not got.clears(2.0)  # the gain hangs on the input: not recommended


def test_from_no_goodput_to_some_clears_any_bar():
    got = gain_interval(Sample(0.0, 0.0, 0.0), Sample(3.0, 2.0, 4.0))
    assert got.gain_pct == math.inf and got.clears(50.0) and got.text() == "from no goodput to some"
    none = gain_interval(Sample(0.0, 0.0, 0.0), Sample(0.0, 0.0, 0.0))
    assert none.gain_pct == 0 and not none.clears(0.0)


def test_text_says_plus_minus_when_symmetric():
    g = GainInterval(gain_pct=0.7, low_pct=-2.4, high_pct=3.8, validation_pct=3.1, traffic_pct=0.0, realizations=0)
    assert g.text() == "+0.7% \u00b1 3.1%"
    g2 = g.model_copy(update={"low_pct": -5.0})
    assert g2.text() == "+0.7% (90%: -5.0% to +3.8%)"


@settings(max_examples=30, deadline=None)
@given(sigma=st.floats(0.01, 0.15), true_gain=st.floats(-0.3, 0.5), seed=st.integers(0, 2**31 - 1))
def test_the_interval_covers_the_true_gain_90_percent_of_the_time(sigma, true_gain, seed):
    """A known truth: the engine's goodput of each configuration is the simulator's times an
    independent N(0, sigma) error, and the validation says the median |error| is 0.6745 sigma.
    Over 2,000 draws the interval must cover the true gain 85-95% of the time."""
    rng = np.random.default_rng(seed)
    n = 2000
    hw = Z90 * sigma  # what latency_error's band gives a goodput whose error is N(0, sigma)
    truth_base, truth_new = 100.0, 100.0 * (1 + true_gain)
    covered = 0
    for _ in range(n):
        sim_base = truth_base / (1 + rng.normal(0, sigma))
        sim_new = truth_new / (1 + rng.normal(0, sigma))
        g = gain_interval(Sample(sim_base, sim_base * (1 - hw), sim_base * (1 + hw)),
                          Sample(sim_new, sim_new * (1 - hw), sim_new * (1 + hw)))
        covered += g.low_pct <= true_gain * 100 <= g.high_pct
    assert 0.85 <= covered / n <= 0.96
