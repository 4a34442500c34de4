"""Triton kernels that fuse the small element-wise steps of a decoder layer.

At decode the matmuls and attention stream bytes; what is left are element-wise steps on a few
hundred KB each, and every one is a kernel of a few microseconds even inside a CUDA graph. The
plain-PyTorch layer issues five kernels for rotary (two multiplies, two addcmuls, a cat), one
to store K/V in the paged cache, and two for SiLU(gate) * up. Here:

- `rope_store_kv`: rotary on q and k read straight from the fused QKV projection, q written
  out for attention, rotated k and v stored in the paged cache: one kernel instead of six (and
  no per-forward cos/sin gather: positions index the fp32 tables in the kernel).
- `silu_mul`: SiLU(gate) * up of the fused gate/up projection in one kernel.
- `add_rms_norm`: the residual add and the next RMSNorm in one kernel (a plain layer folds
  the add into cuBLAS addmm, which first copies the residual into its output).

All compute in fp32 and round once, like their references in `kernels.reference`.

Why a second KV-cache writer besides `kernels.cache_write.write_kv_cache`: the rotated k exists
only in registers here; storing it through the separate writer would mean writing it to memory,
launching a second kernel and reading it back, which is the traffic and the launch this kernel
removes. Both writers address the cache the same way (slot // block_size, slot % block_size,
slots < 0 skipped), and tests/kernels/test_fused.py checks them against each other bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.cache_write import quantize_fp8, write_kv_cache
from kernels.paged_attention import KVScaleArgs, kv_scale_args
from kernels.reference import rotate_qkv_ref


@triton.jit
def _rope_store_kv_kernel(
    qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr,
    k_scale_ptr, v_scale_ptr, stride_k_scale, stride_v_scale,
    stride_qkv_tok, stride_q_tok, stride_q_head,
    stride_c_block, stride_c_row, stride_c_head,
    stride_tab, block_size,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    QK_PAD: tl.constexpr, KV_PAD: tl.constexpr, KV_FP8: tl.constexpr,
):
    # One program per token: all its q and k heads as one [QK_PAD, HALF] tile, then v.
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, QK_PAD)
    dims = tl.arange(0, HALF)
    pos = tl.load(pos_ptr + tok)
    c = tl.load(cos_ptr + pos * stride_tab + dims)[None, :]
    s = tl.load(sin_ptr + pos * stride_tab + dims)[None, :]
    in_qk = (heads < NUM_Q_HEADS + NUM_KV_HEADS)[:, None]
    src = qkv_ptr + tok * stride_qkv_tok + heads[:, None] * (2 * HALF) + dims[None, :]
    x1 = tl.load(src, mask=in_qk, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=in_qk, other=0.0).to(tl.float32)
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    is_q = (heads < NUM_Q_HEADS)[:, None]
    dst = q_out_ptr + tok * stride_q_tok + heads[:, None] * stride_q_head + dims[None, :]
    tl.store(dst, y1.to(q_out_ptr.dtype.element_ty), mask=is_q)
    tl.store(dst + HALF, y2.to(q_out_ptr.dtype.element_ty), mask=is_q)
    slot = tl.load(slot_ptr + tok)
    if slot >= 0:  # padding tokens (slot < 0) store nothing
        base = (slot // block_size) * stride_c_block + (slot % block_size) * stride_c_row
        is_k = in_qk & (heads >= NUM_Q_HEADS)[:, None]
        koff = base + (heads - NUM_Q_HEADS)[:, None] * stride_c_head + dims[None, :]
        # k is rounded to the model dtype first, as the unfused path stores the rotated k it
        # hands over; an fp8 cache then quantises that value
        k1 = y1.to(q_out_ptr.dtype.element_ty)
        k2 = y2.to(q_out_ptr.dtype.element_ty)
        if KV_FP8:
            kv_head = heads - NUM_Q_HEADS  # rows that are no k head load a harmless 1.0
            k_scale = tl.load(k_scale_ptr + kv_head * stride_k_scale,
                              mask=(kv_head >= 0) & (kv_head < NUM_KV_HEADS), other=1.0)[:, None]
            tl.store(k_cache_ptr + koff, quantize_fp8(k1, k_scale), mask=is_k)
            tl.store(k_cache_ptr + koff + HALF, quantize_fp8(k2, k_scale), mask=is_k)
        else:
            tl.store(k_cache_ptr + koff, k1.to(k_cache_ptr.dtype.element_ty), mask=is_k)
            tl.store(k_cache_ptr + koff + HALF, k2.to(k_cache_ptr.dtype.element_ty), mask=is_k)
        kv = tl.arange(0, KV_PAD)
        full = tl.arange(0, 2 * HALF)
        in_kv = (kv < NUM_KV_HEADS)[:, None]
        vsrc = qkv_ptr + tok * stride_qkv_tok + (NUM_Q_HEADS + NUM_KV_HEADS + kv)[:, None] * (2 * HALF) \
            + full[None, :]
        v = tl.load(vsrc, mask=in_kv, other=0.0)
        voff = base + kv[:, None] * stride_c_head + full[None, :]
        if KV_FP8:
            v_scale = tl.load(v_scale_ptr + kv * stride_v_scale, mask=kv < NUM_KV_HEADS, other=1.0)
            tl.store(v_cache_ptr + voff, quantize_fp8(v, v_scale[:, None]), mask=in_kv)
        else:
            tl.store(v_cache_ptr + voff, v.to(v_cache_ptr.dtype.element_ty), mask=in_kv)


def rope_fusable(head_dim: int) -> bool:
    """The fused rotary kernel tiles a head as two halves of a power-of-two width."""
    half = head_dim // 2
    return head_dim % 2 == 0 and half > 0 and half & (half - 1) == 0


def rope_store_kv(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                  num_q_heads: int, num_kv_heads: int, head_dim: int,
                  k_scale: torch.Tensor | None = None,
                  v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Rotated q [T, Hq, D]; rotated k and v stored in the caches at `slot_mapping`.

    qkv: [T, (Hq + 2 Hkv) D] (q heads, then k heads, then v heads); cos/sin: fp32 [P, D/2];
    caches: [num_blocks, block_size, Hkv, D], contiguous in D, k and v with the same strides.
    A head_dim whose half is not a power of two rotates in PyTorch and stores with
    `write_kv_cache` (same result, two more passes over k). An fp8 cache stores k and v
    quantised with `k_scale`/`v_scale` (see `kernels.cache_write`).
    """
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width:
        raise ValueError(f"rope_store_kv: qkv must be [num_tokens, (Hq + 2 Hkv) * head_dim="
                         f"{width}]; got {tuple(qkv.shape)}")
    scales = kv_scale_args(k_cache, v_cache, k_scale, v_scale)
    if not rope_fusable(head_dim):
        return _rope_then_write_kv(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping,
                                   num_q_heads, num_kv_heads, head_dim, scales)
    return _rope_store_kv_fused(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping,
                                num_q_heads, num_kv_heads, head_dim, scales)


def _rope_then_write_kv(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping,
                        num_q_heads: int, num_kv_heads: int, head_dim: int,
                        scales: KVScaleArgs) -> torch.Tensor:
    q, k, v = rotate_qkv_ref(qkv, positions, cos, sin, num_q_heads, num_kv_heads, head_dim)
    write_kv_cache(k, v, k_cache, v_cache, slot_mapping, scales.k_scale, scales.v_scale)
    return q


def _rope_store_kv_fused(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping,
                         num_q_heads: int, num_kv_heads: int, head_dim: int,
                         scales: KVScaleArgs) -> torch.Tensor:
    t = qkv.shape[0]
    q = torch.empty((t, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q
    if qkv.stride(1) != 1 or k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("rope_store_kv: qkv and the caches must be contiguous in their last dim, "
                         "k and v caches alike")
    if cos.stride() != sin.stride() or cos.stride(1) != 1:
        raise ValueError("rope_store_kv: cos and sin tables must be row-major and alike")
    _rope_store_kv_kernel[(t,)](
        qkv, q, k_cache, v_cache, cos, sin, positions, slot_mapping,
        scales.k_scale, scales.v_scale, scales.k_stride, scales.v_stride,
        qkv.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        cos.stride(0), k_cache.shape[1],
        NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, HALF=head_dim // 2,
        QK_PAD=triton.next_power_of_2(num_q_heads + num_kv_heads),
        KV_PAD=triton.next_power_of_2(num_kv_heads), KV_FP8=scales.is_fp8, num_warps=4,
    )
    return q


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x_tok, stride_out_tok, n_cols,
                     BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(x_ptr + tok * stride_x_tok + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + tok * stride_x_tok + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + tok * stride_out_tok + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for gate_up [T, 2 I] (gate first): [T, I]."""
    t, two_i = gate_up.shape
    n = two_i // 2
    out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    if t == 0:
        return out
    if gate_up.stride(1) != 1:
        raise ValueError("silu_mul: gate_up must be contiguous in its last dim")
    block = 1024
    _silu_mul_kernel[(t, triton.cdiv(n, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), n, BLOCK=block, num_warps=4)
    return out


@triton.jit
def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, x_out_ptr, h_out_ptr, stride_x, stride_d, stride_xo,
                         stride_ho, n_cols, eps, BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + tok * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + tok * stride_d + cols, mask=ok, other=0.0).to(tl.float32)
    # The residual stream is kept in the model dtype: round the sum first, normalize that.
    s = (x + d).to(x_out_ptr.dtype.element_ty)
    tl.store(x_out_ptr + tok * stride_xo + cols, s, mask=ok)
    sf = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(h_out_ptr + tok * stride_ho + cols, (sf * inv * w).to(h_out_ptr.dtype.element_ty), mask=ok)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm(x + delta) * weight) in one pass: the residual add that the plain
    layer folds into addmm (which then copies x first) and the next norm, together."""
    t, n = x.shape
    x_out = torch.empty_like(x)
    h = torch.empty_like(x)
    if t == 0:
        return x_out, h
    if x.stride(1) != 1 or delta.stride(1) != 1:
        raise ValueError("add_rms_norm: x and delta must be contiguous in their last dim")
    _add_rms_norm_kernel[(t,)](x, delta, weight, x_out, h, x.stride(0), delta.stride(0),
                               x_out.stride(0), h.stride(0), n, eps,
                               BLOCK=triton.next_power_of_2(n), num_warps=8 if n >= 4096 else 4)
    return x_out, h
