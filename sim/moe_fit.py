"""Fit a profile's mixture-of-experts terms (`MoeTerms`) from the fused MoE kernel's measured times.

benchmarks/kernels/bench_moe_h200.py times one MoE layer (grouping + two grouped GEMMs + the
k-sum) at T tokens per step. The cost model prices that layer as
    max(C(T) * flops_factor, M(T) * bytes_factor(T)),
    C(T) = 2 T k (3 H N) / (peak x gemm_compute_efficiency),
    M(T) = touched(T) x 3 H N x bytes / (bandwidth x gemm_memory_efficiency),
with `touched` the measured distinct experts of that step (the routing the kernel ran), the
datasheet rates and the profile's GEMM efficiencies. Each factor is a measured time over the
side that binds (a step is compute-bound when C(T) > M(T), both at factor 1): `flops_factor`
the median over compute-bound steps, `bytes_factor(T)` one knot per memory-bound T (log2 knots).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.cost_model import CostProfile, MoeTerms
from sim.hardware import GB, GPUSpec


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
                  routing_skew: float = 0.0) -> tuple[MoeTerms, list[dict[str, Any]]]:
    """(MoeTerms, per-row table) from one preset's bench rows (each with `fused_us`). The table
    holds each row's sides, the side that binds, its factor, and the fitted model's error."""
    pts = [(r, layer_roofline(r, gpu, profile)) for r in rows if r.get("fused_us")]
    if not pts:
        raise ValueError("no timed fused MoE rows to fit (every row lacks fused_us)")
    measured = {id(r): r["fused_us"] * 1e-6 for r, _ in pts}
    compute_bound = [(r, lr) for r, lr in pts if lr.compute_s > lr.memory_s]
    flops_factor = float(np.median([measured[id(r)] / lr.compute_s for r, lr in compute_bound])) if compute_bound else 1.0
    knots = []
    for r, lr in pts:
        if lr.compute_s <= lr.memory_s:
            knots.append((int(r["T"]), round(max(measured[id(r)] / lr.memory_s, 1e-3), 4)))
    knots = sorted(dict(knots).items())
    terms = MoeTerms(routing_skew=routing_skew, bytes_factor_by_tokens=tuple(knots),
                     bytes_factor=knots[-1][1] if knots else 1.0, flops_factor=round(flops_factor, 4), source=source)
    table = []
    for r, lr in pts:
        model = max(lr.compute_s * terms.flops_factor, lr.memory_s * terms.bytes_multiplier(r["T"]))
        table.append({"T": r["T"], "measured_us": r["fused_us"], "compute_us": lr.compute_s * 1e6,
                      "memory_us": lr.memory_s * 1e6, "bound": "compute" if lr.compute_s > lr.memory_s else "memory",
                      "model_us": model * 1e6, "rel_error": model / measured[id(r)] - 1})
    return terms, table


__all__ = ["LayerRoofline", "fit_moe_terms", "layer_roofline"]
