"""FP8 weights' price fitted from FP8 steps recovers a known speed-up and per-forward cost from
steps priced with them (plus noise), and the profile then prices FP8 steps with both."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.model_spec import get_model
from sim.config import EngineConfig
from sim.cost_model import STEP_TABLE_COLUMNS as STEP_COLUMNS
from sim.cost_model import CostModel, CostProfile
from sim.fp8_weights_fit import fit_fp8_weights, priced_steps
from sim.hardware import get_gpu


def _steps() -> dict[str, np.ndarray]:
    """Decode batches of 1..256 at 2K context and prefill chunks of 256..8192 tokens."""
    rows = []
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for ctx in (512, 2048):
            rows.append({"num_decode_seqs": b, "num_decode_tokens": b, "sum_decode_context": b * ctx,
                         "max_decode_context": ctx})
    for p in (256, 512, 1024, 2048, 4096, 8192):
        rows.append({"num_prefill_seqs": 1, "num_prefill_tokens": p, "prefill_attn_pairs": p * (p + 1) // 2,
                     "sum_prefill_context": p})
    rows = rows * 3
    out = {k: np.array([r.get(k, 0) for r in rows], dtype=np.int64) for k in STEP_COLUMNS}
    out["step_id"] = np.arange(len(rows))
    return out


@pytest.mark.parametrize("speedup,step_s", [(1.7, 4e-4), (1.3, 0.0), (2.2, 1.2e-3)])
def test_the_fit_recovers_a_known_price(speedup, step_s):
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    engine = EngineConfig(quantization="fp8")
    profile = CostProfile.load("h200-llama-3.1-8b")
    steps = _steps()
    truth = profile.model_copy(update={"fp8_gemm_speedup": speedup, "fp8_step_s": step_s})
    g = priced_steps(steps, model, gpu, engine, truth)
    rng = np.random.default_rng(0)
    steps["gpu_s"] = g * rng.normal(1.0, 0.01, g.size)  # 1% timing noise
    fit = fit_fp8_weights([steps], model, gpu, engine, profile)
    assert fit.speedup == pytest.approx(speedup, abs=0.051)
    assert fit.step_s == pytest.approx(step_s, abs=1.5e-4)
    assert fit.held_out_median_error < 0.02
    assert fit.train_steps + fit.held_out_steps == g.size


def test_the_profile_prices_fp8_steps_with_the_fitted_terms():
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    profile = CostProfile.load("h200-llama-3.1-8b")
    bf16 = CostModel(model, gpu, EngineConfig(), profile)
    plain = CostModel(model, gpu, EngineConfig(quantization="fp8"),
                      profile.model_copy(update={"fp8_gemm_speedup": 1.8, "fp8_step_s": 0.0}))
    taxed = CostModel(model, gpu, EngineConfig(quantization="fp8"),
                      profile.model_copy(update={"fp8_gemm_speedup": 1.8, "fp8_step_s": 5e-4}))
    for n in (1, 64):  # decode graphs: the per-forward cost lands whole on every step
        assert taxed.decode_linear(n).gpu_s - plain.decode_linear(n).gpu_s == pytest.approx(5e-4)
        # half the decoder weights' bytes: a small batch (weight-bound) gets faster, not 2x (head, attention)
        assert 1.2 < bf16.decode_linear(n).gpu_s / plain.decode_linear(n).gpu_s < 2.0
    assert taxed.decode_linear(8).gpu_s > plain.decode_linear(8).gpu_s
    # bf16 weights ignore the FP8 terms
    same = CostModel(model, gpu, EngineConfig(), profile.model_copy(update={"fp8_step_s": 5e-4}))
    assert same.decode_linear(8).gpu_s == bf16.decode_linear(8).gpu_s


def test_a_bf16_configuration_is_refused():
    with pytest.raises(ValueError, match="quantization='fp8'"):
        fit_fp8_weights([_steps()], get_model("llama-3.1-8b"), get_gpu("h200"), EngineConfig(),
                        CostProfile.load("h200-llama-3.1-8b"))
