"""The longest decode's weight in steps with prefill (`GpuTerms.decode_max_excess`): the cost model
prices the longest decode's context as the decodes' mean + the weight x its excess over the mean
(hand-computed below), decode-only steps keep the whole context, and `choose_longest_excess` finds
the weight a synthetic trace was made with."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.model_spec import get_model
from sim.calibrate import CalibrationInputError, choose_longest_excess, fit_profile
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile, GpuTerms, Roofline, longest_decode_context
from sim.hardware import get_gpu
from tests.sim.test_calibrate_mixed_graph import CAPTURE, TRUE_GRAPH, graph_run

M1, H200 = get_model("llama-3.2-1b"), get_gpu("h200")


def test_the_longest_context_by_hand():
    # mean 1,000 (4 decodes, 4,000 tokens), the longest 7,000: 6,000 beyond the mean
    assert longest_decode_context(7000, 4000, 4, 1.0) == 7000
    assert longest_decode_context(7000, 4000, 4, 0.5) == 4000
    assert longest_decode_context(7000, 4000, 4, 0.0) == 1000
    assert longest_decode_context(0, 0, 0, 0.5) == 0  # no decodes
    got = longest_decode_context(np.array([7000, 50, 0]), np.array([4000, 100, 0]), np.array([4, 2, 0]), 0.25)
    np.testing.assert_allclose(got, [2500, 50, 0])


@given(mx=st.integers(1, 40_000), n=st.integers(1, 256), share=st.floats(0.0, 1.0), w=st.floats(0.0, 1.0))
def test_the_longest_context_lies_between_the_mean_and_the_longest(mx, n, share, w):
    # the others' contexts sum to at most (n - 1) x mx: a sum the longest can have
    total = mx + share * (n - 1) * mx
    got = longest_decode_context(mx, total, n, w)
    assert total / n - 1e-9 <= got <= mx + 1e-9
    assert longest_decode_context(mx, total, n, 1.0) == pytest.approx(mx)
    # the fit's array path and the simulator's scalar path give the same value
    as_array = longest_decode_context(np.array([mx]), np.array([total]), np.array([n]), w)
    assert as_array[0] == pytest.approx(got, rel=1e-12)


@pytest.fixture(scope="module")
def fitted() -> CostProfile:
    return fit_profile([graph_run(graphs=True, seed=5, n=1200, name="full")], M1, H200).profile


def _profile(p: CostProfile, excess: float) -> CostProfile:
    """`p` with a large longest-decode multiplier in its mixed graphs, so the weight shows."""
    graph = p.mixed_graph.model_copy(update={"decode_max_kv": 3.0, "decode_max_excess": excess})
    return p.model_copy(update={"mixed_graph": graph})


def _step(prefill: int, decodes: int, mean: int, longest: int) -> SimpleNamespace:
    return SimpleNamespace(num_prefill_tokens=prefill, num_prefill_seqs=1, prefill_attn_pairs=prefill * (prefill + 1) // 2,
                           sum_prefill_context=prefill, num_decode_seqs=decodes, num_decode_tokens=decodes,
                           sum_decode_context=(decodes - 1) * mean + longest, max_decode_context=longest,
                           num_blocks_allocated=0, num_blocks_hashed=0)


def test_the_cost_model_prices_only_the_weighted_excess_of_a_mixed_steps_longest_decode(fitted):
    whole = CostModel(M1, H200, EngineConfig(), _profile(fitted, 1.0))
    half = CostModel(M1, H200, EngineConfig(), _profile(fitted, 0.5))
    rates = Roofline.of(M1, H200, EngineConfig())
    per_token = 3.0 * max(rates.attn_s_per_pair, rates.kv_s_per_token)  # decode_max_kv x one token's KV, q = 1
    b = _step(prefill=200, decodes=20, mean=2000, longest=12_000)  # in a mixed graph (220 tokens <= CAPTURE)
    assert 220 <= CAPTURE
    mean = b.sum_decode_context / 20
    # the whole longest context against mean + half its excess: the difference is half the excess
    expected = per_token * 0.5 * (12_000 - mean)
    assert whole.gpu_time_s(b) - half.gpu_time_s(b) == pytest.approx(expected, rel=1e-9)
    # decodes only: the decode graphs' terms, which take the whole longest context either way
    d = _step(prefill=0, decodes=20, mean=2000, longest=12_000)
    d.num_prefill_seqs = 0
    assert whole.gpu_time_s(d) == pytest.approx(half.gpu_time_s(d), rel=1e-12)


def test_a_profile_without_the_weight_keeps_the_whole_longest_context():
    assert GpuTerms().decode_max_excess == 1.0
    with pytest.raises(ValueError):
        GpuTerms(decode_max_excess=1.5)
    with pytest.raises(CalibrationInputError, match="longest_excess"):
        fit_profile([graph_run(graphs=True, seed=5, n=400)], M1, H200, longest_excess=-0.1)


def test_the_fit_finds_the_weight_the_trace_was_made_with(monkeypatch):
    """A trace whose mixed graphs price the longest decode at mean + 0.5 x excess (a large
    longest-decode multiplier, so the weight shows): of the grid (1, 0.5, 0.25) the choice is 0.5,
    the multiplier comes back, and the other weights price the held-out steps worse."""
    import tests.sim.test_calibrate_mixed_graph as mg

    truth = TRUE_GRAPH.model_copy(update={"decode_max_kv": 3.0})
    made = mg.true_graph_gpu_s

    def with_weight(cols, rates, t=truth):
        cols = dict(cols)
        cols["max_decode_context"] = longest_decode_context(cols["max_decode_context"], cols["sum_decode_context"],
                                                            cols["num_decode_seqs"], 0.5)
        return made(cols, rates, t)

    monkeypatch.setattr(mg, "true_graph_gpu_s", with_weight)
    runs = [graph_run(graphs=True, seed=21, n=2400, name="a", graph_terms=truth, n_small=1200),
            graph_run(graphs=True, seed=22, n=2400, name="b", graph_terms=truth, n_small=1200)]
    res, scores = choose_longest_excess(runs, M1, H200, grid=(1.0, 0.5, 0.25))
    assert res.profile.mixed_graph.decode_max_excess == 0.5
    assert res.profile.mixed.decode_max_excess == 0.5 and res.profile.decode.decode_max_excess == 1.0
    assert scores[0.5] < scores[1.0] and scores[0.5] < scores[0.25]
    assert res.profile.mixed_graph.decode_max_kv == pytest.approx(3.0, rel=0.05)
    assert res.profile.provenance["longest_excess_scores"] == {"1.0": scores[1.0], "0.5": scores[0.5],
                                                               "0.25": scores[0.25]}


def test_a_run_recorded_for_its_prefill_steps_gives_the_fit_none_of_its_decode_steps():
    """EngineRun.prefill_steps_only: the run's decode-only steps are left out of the fit (training and
    held-out alike), its steps with prefill are not."""
    from sim.calibrate import WARMUP_STEPS

    a = graph_run(graphs=True, seed=31, n=900, name="a")
    b = graph_run(graphs=True, seed=32, n=900, name="b")
    both = fit_profile([a, b], M1, H200)
    b.prefill_steps_only = True
    flagged = fit_profile([a, b], M1, H200)

    def decode_rows(run):
        order = np.argsort(run.steps["step_id"], kind="stable")
        is_dec = (run.steps["num_prefill_tokens"] == 0)[order]
        return int(is_dec[WARMUP_STEPS:].sum())

    def counted(res, kinds):
        return sum(res.errors[k].n_fit + res.errors[k].n_held_out for k in kinds)

    assert counted(both, ["decode"]) == decode_rows(a) + decode_rows(b)
    assert counted(flagged, ["decode"]) == decode_rows(a)
    assert counted(flagged, ["mixed", "mixed_graph"]) == counted(both, ["mixed", "mixed_graph"])
