"""FP8 weights: vLLM's `--quantization fp8` on a 16-bit checkpoint (dynamic W8A8).

Each decoder projection's weight (qkv, o, gate_up, down) becomes float8_e4m3fn with one
per-tensor scale (its absolute maximum maps to 448, e4m3's largest finite value), as vLLM's
`Fp8LinearMethod` quantizes a checkpoint that carries no FP8 weights. At run time activations are
quantized with one dynamic scale per tensor (vLLM's default dynamic scheme; kernels/fp8_linear.py)
and the GEMM is `torch._scaled_mm` with tensor-wise scales (cuBLASLt's FP8 GEMM on a GPU): on the
H200 it is 1.6-2.3x bf16 at every M, where row-wise activation scales fall to 0.7-1.3x below
M = 256 (benchmarks/kernels/NOTES.md, run 9). The embedding, the norms and the LM head
stay 16-bit, as vLLM keeps them. Half the projections' bytes: on a GPU the KV pool grows by that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.reference import FP8_MAX

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    """One projection in FP8: `weight` [N, K] float8_e4m3fn, `scale` [] float32 (per tensor)."""

    weight: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor) -> Fp8Weight:
        w = weight.detach()
        scale = w.abs().amax().float().clamp_min(1e-12) / FP8_MAX
        q = (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).contiguous()
        return cls(q, scale.reshape(()))

    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scale


@torch.no_grad()
def quantize_fp8(model) -> int:
    """Quantize `model`'s decoder projections in place (engine.model.LlamaModel); their 16-bit
    weights are freed. Returns the bytes freed. A projection whose dimensions are not multiples of
    16 (what FP8 GEMMs require) is refused naming it."""
    freed = 0
    if model.spec.is_moe:  # the experts' FP8 grouped GEMM is not built: say so, not an AttributeError
        raise ValueError(f"--quantization fp8: {model.spec.name} is a mixture of experts and FP8 experts are not "
                         "supported yet; leave --quantization unset for this model")
    for i, layer in enumerate(model.layers):
        for name in PROJECTIONS:
            lin = getattr(layer, name)
            n, k = lin.weight.shape
            if n % 16 or k % 16:
                raise ValueError(f"--quantization fp8: layer {i} {name} is {n} x {k}; FP8 GEMMs need both "
                                 "dimensions multiples of 16 (leave --quantization unset for this model)")
            q = Fp8Weight.of(lin.weight)
            freed += lin.weight.numel() * lin.weight.element_size() - q.weight.numel() - q.scale.numel() * 4
            layer.fp8[name] = q
            lin.weight.data = torch.empty(0, dtype=lin.weight.dtype, device=lin.weight.device)
    return freed


__all__ = ["PROJECTIONS", "Fp8Weight", "quantize_fp8"]
