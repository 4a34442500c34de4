"""Fit a profile's mixture-of-experts terms (`MoeTerms`) from the fused MoE kernel's measured times.

benchmarks/kernels/bench_moe_h200.py times one MoE layer (grouping + two grouped GEMMs + the
k-sum) at T tokens per step. The cost model prices that layer as
    max(C(T) * flops_factor, M(T) * bytes_factor(T)),
    C(T) = 2 T k (3 H N) / (peak x gemm_compute_efficiency),
    M(T) = touched(T) x 3 H N x bytes / (bandwidth x gemm_memory_efficiency),
with `touched` the measured distinct experts of that step (the routing the kernel ran), the datasheet
rates and the profile's GEMM efficiencies. Given the plans' row blocks, C(T) counts the rows the kernel
computes (C(T) x `MoeTerms.padding`: each expert's pairs in whole blocks). Each factor is a measured
time over the side that binds (a step is compute-bound when C(T) > M(T), both at factor 1): one knot
(log2 of T) per measured T on that side's factor table, `flops_factor_by_tokens` or
`bytes_factor_by_tokens`;
between and beyond the knots the tables interpolate and hold their end values, so the fitted
model reproduces every measured step and is a guess between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.cost_model import CostProfile, MoeTerms
from sim.hardware import GB, GPUSpec
from sim.moe import ExpertRouting


@dataclass(frozen=True, slots=True)
class LayerRoofline:
    """Seconds of one MoE layer's two sides at the profile's GEMM efficiencies (factors 1)."""

    compute_s: float
    memory_s: float


def layer_roofline(row: dict[str, Any], gpu: GPUSpec, profile: CostProfile, elem_bytes: float = 2.0) -> LayerRoofline:
    """A bench row's (T, H, N, E, k, measured distinct experts) priced as the cost model does."""
    t, h, n, k = row["T"], row["H"], row["N"], row["k"]
    expert = 3 * h * n
    flops = 2 * t * k * expert
    compute = flops / (gpu.bf16_tflops * 1e12 * profile.gemm_compute_efficiency)
    memory = row["touched_experts"] * expert * elem_bytes / (gpu.hbm_gb_per_s * GB * profile.gemm_memory_efficiency)
    return LayerRoofline(compute, memory)


def fit_moe_terms(rows: Sequence[dict[str, Any]], gpu: GPUSpec, profile: CostProfile, *, source: str,
                  routing_skew: float = 0.0, block_rows_by_tokens: tuple[tuple[int, int], ...] = ()
                  ) -> tuple[MoeTerms, list[dict[str, Any]]]:
    """(MoeTerms, per-row table) from one preset's bench rows (each with `fused_us`). The table
    holds each row's sides, the side that binds, its factor, and the fitted model's error.
    `block_rows_by_tokens` (the plans' rows per expert block by step size): the FLOPs side counts
    the rows the kernel computes (`MoeTerms.padding`), so its factors are per computed row."""
    blocks = MoeTerms(block_rows_by_tokens=block_rows_by_tokens)
    pts = []
    for r in rows:
        if r.get("fused_us"):
            lr = layer_roofline(r, gpu, profile)
            pad = blocks.padding(ExpertRouting(r["E"], r["k"], routing_skew), r["T"])
            pts.append((r, LayerRoofline(lr.compute_s * pad, lr.memory_s)))
    if not pts:
        raise ValueError("no timed fused MoE rows to fit (every row lacks fused_us)")
    measured = {id(r): r["fused_us"] * 1e-6 for r, _ in pts}
    flops_knots, bytes_knots = {}, {}
    for r, lr in pts:
        if lr.compute_s > lr.memory_s:
            flops_knots[int(r["T"])] = round(measured[id(r)] / lr.compute_s, 4)
        else:
            bytes_knots[int(r["T"])] = round(max(measured[id(r)] / lr.memory_s, 1e-3), 4)
    fk, bk = tuple(sorted(flops_knots.items())), tuple(sorted(bytes_knots.items()))
    terms = MoeTerms(routing_skew=routing_skew, bytes_factor_by_tokens=bk, bytes_factor=bk[-1][1] if bk else 1.0,
                     flops_factor_by_tokens=fk, flops_factor=fk[-1][1] if fk else 1.0,
                     block_rows_by_tokens=block_rows_by_tokens, source=source)
    table = []
    for r, lr in pts:  # (lr.compute_s holds the padding already)
        model = max(lr.compute_s * terms.flops_multiplier(r["T"]), lr.memory_s * terms.bytes_multiplier(r["T"]))
        table.append({"T": r["T"], "measured_us": r["fused_us"], "compute_us": lr.compute_s * 1e6,
                      "memory_us": lr.memory_s * 1e6, "bound": "compute" if lr.compute_s > lr.memory_s else "memory",
                      "model_us": model * 1e6, "rel_error": model / measured[id(r)] - 1})
    return terms, table




def fit_layer_fixed(rows: Sequence[tuple[int, float, float]]) -> tuple[float, float]:
    """(seconds per layer, seconds per step) that the model misses, from (layers, measured s, model s)
    of decode steps of models with different layer counts: least squares of the residual on
    (layers, 1), the per-layer part floored at 0 (one layer count alone cannot separate the two:
    everything then goes to the per-layer part)."""
    if not rows:
        raise ValueError("fit_layer_fixed needs at least one (layers, measured, model) row")
    layers = np.array([r[0] for r in rows], dtype=np.float64)
    resid = np.array([r[1] - r[2] for r in rows])
    if np.unique(layers).size < 2:
        return max(float(np.median(resid / layers)), 0.0), 0.0
    a = np.column_stack([layers, np.ones_like(layers)])
    (per_layer, per_step), *_ = np.linalg.lstsq(a, resid, rcond=None)
    if per_layer < 0:
        return 0.0, float(np.median(resid))
    return float(per_layer), float(per_step)


__all__ = ["LayerRoofline", "fit_layer_fixed", "fit_moe_terms", "layer_roofline"]
