"""Plain-PyTorch references of a mixture-of-experts layer: the router's top-k and the experts.

Layouts (the fused kernel's too): `w13 [E, 2N, H]` stacks each expert's gate (rows 0..N-1) and up
(rows N..2N-1) projections as nn.Linear weights; `w2 [E, H, N]` is each expert's down projection.
A token's output is sum_j topk_weights[t, j] * down_e(SiLU(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, j].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def route_ref(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [T, k] float32, topk_ids [T, k] int64) of router logits [T, E]: softmax over all
    experts in float32, the k largest, renormalised to sum 1 when the model says so (Mixtral,
    Qwen3 norm_topk_prob) -- the order HF's Mixtral and Qwen3-MoE blocks use."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def expert_ffn_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU on rows `x [M, H]` (float32 math, x's dtype out)."""
    n = w2.shape[-1]
    gu = x.float() @ w13.float().t()
    act = F.silu(gu[:, :n]) * gu[:, n:]
    return (act.to(x.dtype).float() @ w2.float().t()).to(x.dtype)


def fused_moe_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    """`[T, H]`: a loop over experts, each running the rows routed to it (the per-expert loop a
    fused kernel replaces); the weighted sum over a token's k experts in float32."""
    t, h = x.shape
    out = torch.zeros(t, h, dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        rows, slot = (topk_ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        y = expert_ffn_ref(x[rows], w13[e], w2[e]).float()
        out.index_add_(0, rows, y * topk_weights[rows, slot].float()[:, None])
    return out.to(x.dtype)


def moe_ref(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
            renormalize: bool) -> torch.Tensor:
    """A whole MoE block on `x [T, H]` (router weight `[E, H]`)."""
    weights, ids = route_ref(x @ router_w.t(), top_k, renormalize)
    return fused_moe_ref(x, w13, w2, weights, ids)


__all__ = ["expert_ffn_ref", "fused_moe_ref", "moe_ref", "route_ref"]
