"""Expert parallelism (vLLM's `--enable-expert-parallel`) planned from first principles, not yet
validated against a measured run.

With EP on, vLLM shards a replica's experts instead of slicing every expert: its EP size is
TP x DP, here the replica's `tensor_parallel_size` (attention stays tensor-parallel). GPU g holds
experts g E/EP .. (g+1) E/EP - 1 whole (vLLM's linear placement; with skewed routing, expert
index = popularity rank, so GPU 0 holds the most popular ones). What a step costs then:

* expert bytes: a GPU reads its own touched experts whole; the expected number touched on GPU g
  for T tokens is sum over its experts of 1 - (1 - pi_e)^T (pi_e: sim/moe.py's inclusion
  probabilities), and the step waits for the busiest GPU, so we take the MAX over GPUs of each
  GPU's expectation (not the expectation of the max, which is larger by the spread; a prior).
  Uniform routing: every GPU expects E/EP (1 - (1 - k/E)^T), the closed form / EP;
* expert FLOPs: GPU g serves T sum_{e on g} pi_e token-expert pairs; max over GPUs (uniform: T k / EP);
* all-to-all: per MoE layer each GPU dispatches its tokens' activations to the experts' GPUs and
  gets the outputs back: T x hidden x bytes x (EP - 1) / EP each way, at the link's one-direction
  bandwidth (sim/links.py's measured NVLink where there is one, else the GPU's datasheet figure);
  the collectives' latency is left out (unmeasured). This is the data-parallel-attention case
  (distinct tokens per GPU); inside one TP group vLLM's tokens are already on every rank and the
  combine replaces the MLP all-reduce, which stays priced here: an upper bound until measured;
* memory: each GPU holds its attention/dense weights / TP and E / EP whole experts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.core.flag_error import FlagError
from engine.core.model_spec import ModelSpec, dtype_bytes
from sim.hardware import GB, GPUSpec
from sim.links import measured_link
from sim.moe import ExpertRouting

SOURCE = "first principles (sim/expert_parallel.py): linear expert placement, max over GPUs, all-to-all at link bandwidth"


def check_expert_parallel(model: ModelSpec, ep: int) -> None:
    """vLLM refuses EP on a dense model; the experts must split evenly over the GPUs."""
    if ep <= 1:
        return
    if not model.is_moe:
        raise FlagError("enable_expert_parallel", True, f"needs a mixture of experts; {model.name} is dense (no "
                        "experts to place): drop the flag")
    if model.num_experts % ep:
        raise FlagError("tensor_parallel_size", ep, f"must divide {model.name}'s {model.num_experts} experts with "
                        "{enable_expert_parallel} (each GPU holds E / TP whole experts)")


def _groups(routing: ExpertRouting, ep: int) -> np.ndarray:
    """pi_e per GPU, shape (ep, E / ep): GPU g holds the g-th contiguous block of experts."""
    return np.asarray(routing.inclusion).reshape(ep, routing.num_experts // ep)


def touched_per_gpu(routing: ExpertRouting, num_tokens: Any, ep: int) -> np.ndarray:
    """Expected distinct experts each GPU reads for `num_tokens` tokens: shape (..., ep)."""
    t = np.asarray(num_tokens, dtype=np.float64)
    log_miss = np.log1p(-np.minimum(_groups(routing, ep), 1 - 1e-15))
    return -np.expm1(np.multiply.outer(t, log_miss)).sum(axis=-1)


def max_touched_per_gpu(routing: ExpertRouting, num_tokens: Any, ep: int) -> Any:
    """The busiest GPU's expected distinct experts (scalar or array like `num_tokens`)."""
    out = touched_per_gpu(routing, num_tokens, ep).max(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def max_pairs_per_token(routing: ExpertRouting, ep: int) -> float:
    """Token-expert pairs per token on the busiest GPU (k / EP for uniform routing)."""
    return float(_groups(routing, ep).sum(axis=1).max())


def link_bytes_per_s(gpu: GPUSpec) -> float:
    """One-direction GPU-to-GPU bandwidth: measured NVLink where sim/links.py has it, else the datasheet."""
    m = measured_link(gpu.name, "nvlink")
    return (m.gb_per_s if m is not None else gpu.interconnect_gb_per_s) * GB


def all_to_all_s_per_token(model: ModelSpec, gpu: GPUSpec, ep: int) -> float:
    """Seconds per token of a forward's dispatch + combine, all MoE layers."""
    if ep <= 1:
        return 0.0
    per_way = model.hidden_size * dtype_bytes(model.dtype) * (ep - 1) / ep
    return model.num_layers * 2 * per_way / link_bytes_per_s(gpu)


def weight_bytes_per_gpu(model: ModelSpec, tp: int, ep: int, weight_dtype: str | None = None) -> float:
    """One GPU's weights: the non-expert weights / TP plus E / EP whole experts (ep 1: every expert / TP)."""
    wb = dtype_bytes(weight_dtype or model.dtype)
    experts = model.num_layers * model.num_experts * model.expert_params * wb
    rest = model.weight_bytes(weight_dtype) - experts
    return rest / tp + (experts / ep if ep > 1 else experts / tp)


__all__ = ["SOURCE", "all_to_all_s_per_token", "check_expert_parallel", "link_bytes_per_s", "max_pairs_per_token",
           "max_touched_per_gpu", "touched_per_gpu", "weight_bytes_per_gpu"]
