"""The MoE terms fit (sim/moe_fit.py) recovers the factors that generated synthetic kernel times."""

from __future__ import annotations

import pytest

from sim.cost_model import CostProfile, MoeTerms
from sim.hardware import get_gpu
from sim.moe import ExpertRouting
from sim.moe_fit import fit_moe_terms, layer_roofline

GPU = get_gpu("h200")
PROF = CostProfile.load("default")


def _rows(truth: MoeTerms, h=2048, n=768, e=128, k=8):
    r = ExpertRouting(e, k)
    rows = []
    for t in (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096):
        row = {"T": t, "H": h, "N": n, "E": e, "k": k, "touched_experts": r.expected_touched(t)}
        lr = layer_roofline(row, GPU, PROF)
        row["fused_us"] = 1e6 * max(lr.compute_s * truth.flops_factor, lr.memory_s * truth.bytes_multiplier(t))
        rows.append(row)
    return rows


def test_fit_recovers_the_generating_factors():
    truth = MoeTerms(bytes_factor_by_tokens=((1, 2.5), (8, 1.6), (64, 1.2), (1024, 1.1)), flops_factor=1.4)
    terms, table = fit_moe_terms(_rows(truth), GPU, PROF, source="synthetic")
    assert terms.flops_multiplier(4096) == pytest.approx(1.4, rel=1e-3)
    for t in (1, 8, 64, 256):
        assert terms.bytes_multiplier(t) == pytest.approx(truth.bytes_multiplier(t), rel=1e-3)
    assert max(abs(r["rel_error"]) for r in table) < 1e-3
    assert {r["bound"] for r in table} == {"compute", "memory"}  # qwen3 shapes: T=4096 is compute-bound


def test_layer_roofline_by_hand():
    row = {"T": 1, "H": 2048, "N": 768, "E": 128, "k": 8, "touched_experts": 8.0}
    lr = layer_roofline(row, GPU, PROF)
    assert lr.memory_s == pytest.approx(8 * 3 * 2048 * 768 * 2 / (4800e9 * 0.85))
    assert lr.compute_s == pytest.approx(2 * 8 * 3 * 2048 * 768 / (989.5e12 * 0.7))


def test_no_timed_rows_is_refused():
    with pytest.raises(ValueError, match="fused_us"):
        fit_moe_terms([{"T": 1}], GPU, PROF, source="x")


def test_layer_fixed_fit_separates_per_layer_and_per_step_costs():
    from sim.moe_fit import fit_layer_fixed

    rows = [(layers, model + 7e-6 * layers + 40e-6, model) for layers in (4, 48) for model in (1e-3, 3e-3)]
    per_layer, per_step = fit_layer_fixed(rows)
    assert per_layer == pytest.approx(7e-6) and per_step == pytest.approx(40e-6)
    assert fit_layer_fixed([(4, 1.0 + 4e-5, 1.0)]) == (pytest.approx(1e-5), 0.0)  # one layer count: all per layer
