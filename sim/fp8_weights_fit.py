"""FP8 weights' price from the engine's own FP8 steps: the GEMM speed-up and the per-forward cost.

A fitted profile prices bf16 steps. FP8 weights (`--quantization fp8`) change two things the
profile cannot know: how fast the FP8 GEMMs compute (`fp8_gemm_speedup`, over bf16's rate; their
bytes halve by construction) and what the activations' dynamic quantization adds to every forward
(`fp8_step_s`: two small kernels and a memset per projection, hundreds per step on a 32-layer
model). Both are fitted here from steps the engine ran with FP8 weights, holding every other term
of the profile fixed:

- for each speed-up on a grid, the cost model's GPU time of every step (the schedule held fixed,
  as `costline validate` prices steps) gives a base time b; the per-forward cost c that minimises
  the squared relative error sum((b + c) / g - 1)^2 against the measured GPU time g has a closed
  form (clamped at 0);
- the speed-up is the grid point with the least error on the training steps (even step ids); the
  held-out steps (odd ids) give the error the report quotes.

A grid, not a joint least squares: the GEMM term is a max(compute, weight bytes) per step, so the
speed-up enters non-linearly, and a 1-D scan of 33 points costs a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.core.model_spec import ModelSpec
from sim.config import EngineConfig
from sim.cost_model import STEP_TABLE_COLUMNS, CostModel, CostProfile, step_table_seconds
from sim.hardware import GPUSpec

SPEEDUP_GRID = tuple(np.round(np.arange(1.0, 2.601, 0.05), 3))


@dataclass(frozen=True, slots=True)
class Fp8WeightsFit:
    speedup: float  # FP8 GEMM compute rate over bf16's
    step_s: float  # GPU seconds FP8 weights add to each forward
    train_steps: int
    held_out_steps: int
    held_out_median_error: float  # |predicted / measured - 1| of the held-out steps
    held_out_p90_error: float
    bf16_terms_median_error: float  # the same steps priced as bf16 GEMMs (what an unfitted profile did)

    def as_dict(self) -> dict[str, float | int]:
        return {"speedup": self.speedup, "step_s": self.step_s, "train_steps": self.train_steps,
                "held_out_steps": self.held_out_steps, "held_out_median_error": self.held_out_median_error,
                "held_out_p90_error": self.held_out_p90_error,
                "datasheet_prior_median_error": self.bf16_terms_median_error}


def priced_steps(steps: dict[str, np.ndarray], model: ModelSpec, gpu: GPUSpec, engine: EngineConfig,
                 profile: CostProfile) -> np.ndarray:
    """The cost model's GPU seconds for every row of an engine step table (one step per row)."""
    return step_table_seconds(CostModel(model, gpu, engine, profile), steps)[0]


def _best_offset(base: np.ndarray, measured: np.ndarray) -> float:
    """c >= 0 minimising sum(((base + c) / measured - 1)^2)."""
    w = 1.0 / measured
    return max(0.0, float(np.sum((1.0 - base * w) * w) / np.sum(w * w)))


def fit_fp8_weights(tables: Sequence[dict[str, np.ndarray]], model: ModelSpec, gpu: GPUSpec,
                    engine: EngineConfig, profile: CostProfile,
                    grid: Sequence[float] = SPEEDUP_GRID) -> Fp8WeightsFit:
    """Fit (speed-up, per-forward cost) on `tables` (steps of FP8-weight engine runs: `gpu_s` the
    forward's device time, sampler included, one step per row, `step_id`), `engine` with
    `quantization="fp8"`, `profile` the bf16 fit of the same GPU and model."""
    if engine.quantization != "fp8":
        raise ValueError("fit_fp8_weights: the engine configuration must have quantization='fp8'")
    steps = {k: np.concatenate([t[k] for t in tables]) for k in (*STEP_TABLE_COLUMNS, "gpu_s", "step_id")}
    g = steps["gpu_s"].astype(np.float64)
    ok = np.isfinite(g) & (g > 0)
    steps = {k: v[ok] for k, v in steps.items()}
    g = g[ok]
    if g.size < 10:
        raise ValueError(f"fit_fp8_weights: {g.size} usable FP8 steps; at least 10 are needed")
    train = steps["step_id"] % 2 == 0
    held = ~train
    best: tuple[float, float, float] | None = None
    for s in grid:
        base = priced_steps(steps, model, gpu, engine, profile.model_copy(update={"fp8_gemm_speedup": float(s),
                                                                                 "fp8_step_s": 0.0}))
        c = _best_offset(base[train], g[train])
        err = float(np.sum(((base[train] + c) / g[train] - 1.0) ** 2))
        if best is None or err < best[0]:
            best = (err, float(s), c)
    assert best is not None
    _, s, c = best
    fitted = profile.model_copy(update={"fp8_gemm_speedup": s, "fp8_step_s": c})
    e = np.abs(priced_steps(steps, model, gpu, engine, fitted)[held] / g[held] - 1.0)
    prior = profile.model_copy(update={"fp8_gemm_speedup": None, "fp8_step_s": None})
    e0 = np.abs(priced_steps(steps, model, gpu, engine, prior)[held] / g[held] - 1.0)
    return Fp8WeightsFit(s, c, int(train.sum()), int(held.sum()), float(np.median(e)),
                         float(np.quantile(e, 0.9)), float(np.median(e0)))


__all__ = ["SPEEDUP_GRID", "Fp8WeightsFit", "fit_fp8_weights", "priced_steps"]
