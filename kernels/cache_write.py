"""Triton kernel that stores new keys and values into the paged KV cache through a slot mapping.

An fp8 cache (``torch.float8_e4m3fn``) gets ``fp8(clamp(x / scale, -448, 448))``, rounded to
nearest even: bit for bit what ``kernels.reference.quantize_kv_ref`` computes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.paged_attention import check_kv_cache_shapes, kv_scale_args, next_pow2
from kernels.reference import FP8_E4M3_MAX

FP8_MAX = tl.constexpr(FP8_E4M3_MAX)


@triton.jit
def quantize_fp8(x, scale):
    """``x / scale`` saturated to e4m3's finite range and rounded to e4m3 (nearest even).

    IEEE division (div_rn), not the approximate one ``/`` compiles to, so the GPU rounds exactly
    as the torch reference does; the clamp keeps a large value from becoming NaN (e4m3fn has no
    inf)."""
    y = tl.div_rn(x.to(tl.float32), scale)
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    return y.to(tl.float8e4nv)


@triton.jit
def _write_kv_cache_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_k_scale,  # 0: per-tensor scale, 1: per KV head (fp8 caches only)
    stride_v_scale,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kc_block,
    stride_kc_row,
    stride_kc_head,
    stride_vc_block,
    stride_vc_row,
    stride_vc_head,
    block_size,
    HEAD_DIM: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    token = tl.program_id(0)
    head_group = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    block = slot // block_size
    row = slot % block_size
    heads = head_group * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    tok64 = token.to(tl.int64)
    src_k = k_ptr + tok64 * stride_k_tok + heads[:, None] * stride_k_head + dims[None, :]
    src_v = v_ptr + tok64 * stride_v_tok + heads[:, None] * stride_v_head + dims[None, :]
    dst_k = (
        k_cache_ptr
        + block * stride_kc_block
        + row * stride_kc_row
        + heads[:, None] * stride_kc_head
        + dims[None, :]
    )
    dst_v = (
        v_cache_ptr
        + block * stride_vc_block
        + row * stride_vc_row
        + heads[:, None] * stride_vc_head
        + dims[None, :]
    )
    key = tl.load(src_k, mask=mask)
    value = tl.load(src_v, mask=mask)
    if KV_FP8:
        head_ok = heads < NUM_KV_HEADS
        k_scale = tl.load(k_scale_ptr + heads * stride_k_scale, mask=head_ok, other=1.0)
        v_scale = tl.load(v_scale_ptr + heads * stride_v_scale, mask=head_ok, other=1.0)
        key = quantize_fp8(key, k_scale[:, None])
        value = quantize_fp8(value, v_scale[:, None])
    tl.store(dst_k, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst_v, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check_write_inputs(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(
            f"k and v must both be [num_tokens, num_kv_heads, head_dim]; got k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    check_kv_cache_shapes(k_cache, v_cache)
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k's (num_kv_heads, head_dim) {tuple(k.shape[1:])} must match the cache's "
            f"{tuple(k_cache.shape[2:])}"
        )
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"slot_mapping must be [num_tokens]={k.shape[0]}; got {tuple(slot_mapping.shape)}"
        )
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride(-1) == 1)")


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store ``k[t]``, ``v[t]`` at flat slot ``slot_mapping[t]`` (block = slot // block_size).

    Slots < 0 mark padding tokens and are skipped. One program per token and group of heads;
    no host synchronization, so it can be captured in a CUDA graph. An fp8 cache stores the
    values quantised with ``k_scale``/``v_scale`` (None = 1.0); other caches ignore them.
    """
    _check_write_inputs(k, v, k_cache, v_cache, slot_mapping)
    scales = kv_scale_args(k_cache, v_cache, k_scale, v_scale)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    head_dim_pad = next_pow2(head_dim)
    # ~2 KB of each of K and V per program: enough for full-width stores, small enough to spread
    heads_per_program = max(1, min(next_pow2(num_kv_heads), 1024 // head_dim_pad))
    grid = (num_tokens, triton.cdiv(num_kv_heads, heads_per_program))
    _write_kv_cache_kernel[grid](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        scales.k_scale,
        scales.v_scale,
        scales.k_stride,
        scales.v_stride,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        k_cache.shape[1],
        HEAD_DIM=head_dim,
        HEADS_PER_PROGRAM=heads_per_program,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM_PAD=head_dim_pad,
        KV_FP8=scales.is_fp8,
    )
