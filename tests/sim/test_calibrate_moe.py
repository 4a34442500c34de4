"""Calibration of a mixture of experts: the fit prices the experts as the profile's MoE kernel terms do
(measured factors on the touched experts' roofline), scales them by a multiplier of their own per step
kind, keeps those MoE terms and the first-principles fields, and the simulator then reproduces a
synthetic engine trace whose experts cost a known multiple of the kernel's time."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.core.cuda_graphs import decode_graph_bucket
from engine.core.model_spec import get_model
from sim.calibrate import EngineRun, fit_profile, held_out
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile, GpuTerms, MoeTerms, Roofline, step_table_seconds
from sim.hardware import get_gpu
from tests.sim.calib_synth import (
    MAX_NUM_SEQS,
    synthetic_run,
    timing_columns,
    true_cpu_s,
    true_gpu_s,
)

QWEN, H200 = get_model("qwen3-30b-a3b"), get_gpu("h200")
# the fused kernel's factors and fixed cost as a kernel bench would give them (the shape, not the figures, matters)
BASE_MOE = MoeTerms(bytes_factor_by_tokens=((1, 2.0), (8, 1.15), (64, 1.1), (256, 1.35), (1024, 1.75)),
                    flops_factor_by_tokens=((4096, 2.1),), flops_factor=2.1, layer_fixed_s=6e-5, source="synthetic bench")
BASE = CostProfile.load("default").model_copy(update={"name": "base", "moe": BASE_MOE, "gpu_step_overhead_s": 5e-5})
TRUE_EXPERTS = {"decode": 1.15, "mixed": 1.35}  # the engine's experts against the kernel bench's time


def experts_s(rates: Roofline, tokens: np.ndarray, routed: np.ndarray | None = None) -> np.ndarray:
    """The kernel bench's time of every layer's experts, by hand: max(FLOPs x flops factor at the
    GEMM compute efficiency, touched experts' bytes x bytes factor at the memory efficiency), the
    experts touched by `routed` tokens (default: all of them) routed uniformly."""
    out = []
    for t, u in zip(tokens, tokens if routed is None else routed):
        touched = QWEN.num_experts * (1 - (1 - QWEN.experts_per_token / QWEN.num_experts) ** u)
        flops = 2 * t * QWEN.experts_per_token * QWEN.num_layers * QWEN.expert_params / (H200.bf16_tflops * 1e12 * 0.7)
        mem = touched * QWEN.num_layers * QWEN.expert_params * 2 / (H200.hbm_gb_per_s * 1e9 * 0.85)
        out.append(max(flops * BASE_MOE.flops_multiplier(t), mem * BASE_MOE.bytes_multiplier(t)))
    return np.array(out)


def moe_run(seed: int, name: str, async_scheduling: bool) -> EngineRun:
    """calib_synth's trace of the dense terms (the experts left out of `gemm`), plus the experts at
    TRUE_EXPERTS x the kernel's time and the per-layer fixed cost. A decode graph's padding rows are
    copies of one dummy token: they add one token's experts, not their own (as on the H200)."""
    run = synthetic_run(QWEN, H200, seed=seed, name=name, async_scheduling=async_scheduling, noise=0.0,
                        outlier_share=0.0)
    s = run.steps
    dense = dataclasses.replace(Roofline.of(QWEN, H200, EngineConfig()), routing=None)
    is_dec = s["num_prefill_tokens"] == 0
    pad = np.array([decode_graph_bucket(int(b), MAX_NUM_SEQS) for b in s["num_decode_seqs"]], dtype=float)
    tokens = np.where(is_dec, pad, s["num_prefill_tokens"] + s["num_decode_seqs"])
    mult = np.where(is_dec, TRUE_EXPERTS["decode"], TRUE_EXPERTS["mixed"])
    routed = np.where(is_dec, np.minimum(pad, s["num_decode_seqs"] + 1), tokens)
    gpu = true_gpu_s(s, dense) + mult * experts_s(dense, tokens, routed) + QWEN.num_layers * BASE_MOE.layer_fixed_s
    rng = np.random.default_rng(seed)
    gpu *= 1 + 0.01 * rng.standard_normal(gpu.size)
    cpu = true_cpu_s(s)
    s |= timing_columns(gpu, cpu, async_scheduling, eager=~is_dec)
    return run


@pytest.fixture(scope="module")
def moe_fit():
    runs = [moe_run(1, "async-run", True), moe_run(2, "sync-run", False)]
    return runs, fit_profile(runs, QWEN, H200, moe_base=BASE)


def test_the_profile_keeps_the_kernel_terms_and_first_principles_fields(moe_fit):
    _, res = moe_fit
    p = res.profile
    assert p.moe == BASE_MOE
    assert p.gpu_step_overhead_s == 5e-5 and p.gemm_compute_efficiency == BASE.gemm_compute_efficiency
    assert p.decode.experts is not None and p.mixed.experts is not None


def test_the_simulator_reproduces_held_out_steps(moe_fit):
    """The fitted profile prices each held-out step's GPU time (the simulator's own cost path) within
    the 1% noise; the mixed steps' experts multiplier is the true one (their FLOPs side varies with
    the step's tokens apart from the dense GEMMs' through the bytes-bound small steps)."""
    runs, res = moe_fit
    r = runs[0]  # async: gpu_s + sample_s is the device time
    cm = CostModel(QWEN, H200, EngineConfig(async_scheduling=True, max_num_seqs=MAX_NUM_SEQS), res.profile)
    s = r.steps
    held = held_out(r.name, s["step_id"]) & (np.arange(s["step_id"].size) >= 3)
    gpu, _ = step_table_seconds(cm, s)
    err = np.abs(gpu[held] / (s["gpu_s"] + s["sample_s"])[held] - 1)
    assert np.median(err) < 0.01 and np.percentile(err, 90) < 0.03
    assert res.errors["decode"].gpu_median < 0.01 and res.errors["mixed"].gpu_median < 0.01
    assert res.profile.mixed.experts == pytest.approx(TRUE_EXPERTS["mixed"], rel=0.03)
    # decode graphs: the experts read grow with the real batch inside a graph's bucket while the fixed
    # cost per batch knot does not, so the decode multiplier is determined too
    assert res.profile.decode.experts == pytest.approx(TRUE_EXPERTS["decode"], rel=0.05)


def test_without_experts_terms_a_profile_prices_as_before():
    """A fitted profile from before the `experts` multiplier (None) prices the experts inside `gemm`:
    the roofline's experts at efficiency 1 times the gemm multiplier, plus the per-layer fixed cost."""
    runs = [moe_run(3, "a", True)]
    p = fit_profile(runs, QWEN, H200, moe_base=BASE).profile
    old = p.model_copy(update={"decode": p.decode.model_copy(update={"experts": None}),
                               "mixed": p.mixed.model_copy(update={"experts": None})})
    cm = CostModel(QWEN, H200, EngineConfig(max_num_seqs=MAX_NUM_SEQS), old)
    new = CostModel(QWEN, H200, EngineConfig(max_num_seqs=MAX_NUM_SEQS), p)
    r = cm.roofline
    s = runs[0].steps
    i = int(np.flatnonzero(s["num_prefill_tokens"] > 0)[0])
    row = {k: s[k][i: i + 1] for k in s}
    t = float(row["num_prefill_tokens"][0] + row["num_decode_seqs"][0])
    g_old, _ = step_table_seconds(cm, row)
    g_new, _ = step_table_seconds(new, row)
    experts_old = p.mixed.gemm * r.experts_s(t)
    experts_new = p.mixed.experts * r.experts_s(t, 1 / 0.7, 1 / 0.85)
    assert g_old[0] - g_new[0] == pytest.approx(experts_old - experts_new, rel=1e-9)


def test_a_dense_fit_has_no_experts_terms():
    m = get_model("llama-3.2-1b")
    p = fit_profile([synthetic_run(m, H200, n=800, seed=4)], m, H200, moe_base=BASE).profile
    assert p.moe is None and p.decode.experts is None and isinstance(p.decode, GpuTerms)


def test_cli_keeps_the_shipped_kernel_terms(tmp_path):
    """`costline calibrate` on an MoE model's runs starts from the shipped profile's MoE terms."""
    import json

    from typer.testing import CliRunner

    from costline.cli import app

    run = moe_run(5, "cli", True)
    folder = tmp_path / "run"
    folder.mkdir()
    s = run.steps
    with open(folder / "steps.jsonl", "w") as f:
        f.writelines(json.dumps({k: float(v[i]) for k, v in s.items()}) + "\n" for i in range(s["step_id"].size))
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["calibrate", str(folder), "--model", "qwen3-30b-a3b", "--gpu", "h200",
                                 "--async-scheduling", "--max-num-seqs", "256", "--out", str(out)])
    assert r.exit_code == 0, r.output
    prof, shipped = CostProfile.load(out), CostProfile.for_target("qwen3-30b-a3b", "h200")
    assert prof.moe == shipped.moe and prof.moe is not None and prof.decode.experts is not None
    assert prof.gpu_step_overhead_s == shipped.gpu_step_overhead_s
