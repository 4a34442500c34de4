"""FP8 weights' linear layer (`--quantization fp8`, dynamic W8A8 as vLLM runs a 16-bit checkpoint):
the activation quantization in Triton, then cuBLASLt's FP8 GEMM.

vLLM's default dynamic scheme gives the activations one scale per tensor, found at run time: the
absolute maximum of the whole batch maps to 448. That takes two passes over x (no program can
quantize before every row's maximum is known): `_amax_kernel` folds each row's maximum into one
float with an atomic max, `_quantize_kernel` divides and casts. The reference
(`kernels.reference.quantize_fp8_tensor`) takes six torch kernels for the same values; bit for bit
the same (the same fp32 division, the cast rounding to nearest even on the GPU as torch's cast
does on the CPU).

Why per tensor and not per token: on the H200, `torch._scaled_mm` with tensor-wise scales is
1.6-2.3x bf16 at every M of Llama-3.1-8B's projections, while row-wise activation scales drop to
0.7-1.3x below M = 256, the decode batches (benchmarks/kernels/NOTES.md, run 9).

`FAST_ACCUM`: Hopper's FP8 tensor cores keep their own accumulator through the K loop instead of
promoting to fp32 every few steps (as vLLM's CUTLASS FP8 kernels do on sm90): up to 10% faster at
large M, error against the float64 product 2.1-3.3e-3 where the fp32-promoted GEMM has 1.7e-3
(bf16 output rounding) (run 9).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.reference import FP8_MAX

FAST_ACCUM = True


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, stride_x, n_cols, BLOCK: tl.constexpr):
    # One program per row, the whole row in registers; the row's |max| into one float.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    tl.atomic_max(amax_ptr, tl.max(tl.abs(x), axis=0))


@triton.jit
def _quantize_kernel(x_ptr, amax_ptr, q_ptr, s_ptr, stride_x, stride_q, n_cols,
                     BLOCK: tl.constexpr, FP8_LIMIT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    scale = tl.maximum(tl.load(amax_ptr), 1e-12) / FP8_LIMIT
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    y = tl.minimum(tl.maximum(x / scale, -FP8_LIMIT), FP8_LIMIT)
    tl.store(q_ptr + row * stride_q + cols, y.to(tl.float8e4nv), mask=ok)
    if row == 0:
        tl.store(s_ptr, scale)


def quantize_fp8_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` [M, K] as float8_e4m3fn with one dynamic scale: (x_fp8, scale [] float32), the values
    of `kernels.reference.quantize_fp8_tensor` in two kernels (and a 4-byte memset)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"quantize_fp8_tensor: x must be [M, K] and contiguous in K; got shape "
                         f"{tuple(x.shape)}, strides {x.stride()}")
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    amax = torch.zeros((), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, amax + 1e-12 / FP8_MAX
    scale = torch.empty((), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(k)
    warps = 4 if block <= 4096 else 8 if block <= 8192 else 16
    _amax_kernel[(m,)](x, amax, x.stride(0), k, BLOCK=block, num_warps=warps)
    _quantize_kernel[(m,)](x, amax, q, scale, x.stride(0), q.stride(0), k, BLOCK=block,
                           FP8_LIMIT=FP8_MAX, num_warps=warps)
    return q, scale


def linear_fp8(x: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, *, fast_accum: bool | None = None) -> torch.Tensor:
    """``x @ (weight_fp8 * weight_scale).T (+ bias)``: `x` quantized per tensor in Triton, then
    `torch._scaled_mm` with tensor-wise scales; the signature of `kernels.reference.linear_fp8_ref`."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    xq, xs = quantize_fp8_tensor(x2)
    out = torch._scaled_mm(xq, weight_fp8.t(), scale_a=xs, scale_b=weight_scale, bias=bias, out_dtype=x.dtype,
                           use_fast_accum=FAST_ACCUM if fast_accum is None else fast_accum)
    return out.reshape(*lead, out.shape[-1])


__all__ = ["FAST_ACCUM", "linear_fp8", "quantize_fp8_tensor"]
