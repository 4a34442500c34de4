"""One backend object: every kernel the model calls, as plain-PyTorch references or Triton kernels.

``get_backend("torch")`` returns the references of ``kernels.reference`` (any device, no Triton);
``get_backend("triton")`` the Triton kernels (a GPU, or the CPU under ``TRITON_INTERPRET=1``).
Both sets share signatures, so a model calls ``backend.<entry>(...)`` and never knows which it has.
This module imports neither torch nor triton: the chosen set is imported when it is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

BackendName = Literal["torch", "triton"]
# A sequence with at most this many query tokens is "decode-like": the attention kernel reads it
# with the decode tile shape (and split-KV); longer ones (prefill chunks) with the prefill shape.
# Here, free of torch and triton, so the runner can count decode-like sequences for its hint.
DECODE_MAX_QUERY_LEN = 4
BACKEND_NAMES: tuple[str, ...] = ("torch", "triton")


@dataclass(frozen=True, slots=True)
class Backend:
    """The kernels of one decoder forward; signatures are those of ``kernels.reference``.

    Frozen: a variant (a benchmark that drops attention, say) is a ``dataclasses.replace`` copy.
    """

    name: str
    paged_attention: Callable[..., torch.Tensor]  # (q, k_cache, v_cache, block_tables, seq_lens,
    #   query_start_loc, scale, max_query_len, max_seq_len, out=None, *, k_scale, v_scale,
    #   num_decode_seqs=None) -> out; num_decode_seqs: the caller's count of decode-like
    #   sequences (a launch-planning hint the reference ignores)
    write_kv_cache: Callable[..., None]  # (k, v, k_cache, v_cache, slot_mapping)
    rope_store_kv: Callable[..., torch.Tensor]  # (qkv, positions, cos, sin, k_cache, v_cache,
    #   slot_mapping, num_q_heads, num_kv_heads, head_dim) -> rotated q
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    #   (x, delta, weight, eps) -> (x + delta, RMSNorm(x + delta) * weight)
    silu_mul: Callable[..., torch.Tensor]  # (gate_up) -> SiLU(gate) * up
    linear: Callable[..., torch.Tensor]  # (x, weight, bias=None, out=None) -> x @ weight.T + bias
    # (x, weight_fp8, weight_scale [1, N], bias=None) -> x @ (weight_fp8 * scale).T + bias, x
    # quantized per token to FP8 (--quantization fp8)
    linear_fp8: Callable[..., torch.Tensor]
    # (num_q_heads, num_kv_heads, kv_fp8) -> query tokens per Q block of the decode and prefill
    # launches, the units of paged_attention's work lists (kernels.paged_attention.plan_work);
    # None: the backend takes no work lists
    work_block_qs: Callable[..., tuple[int, int] | None]
    # (x [T, H], w13 [E, 2N, H], w2 [E, H, N], topk_weights [T, k], topk_ids [T, k]) -> [T, H]: the
    # experts of a mixture-of-experts layer (reference: a per-expert loop, which syncs the host
    # and so cannot be captured in a CUDA graph; Triton: kernels.fused_moe with the plan kernels.moe_plans.engine_tiles picks, graph-safe)
    fused_moe: Callable[..., torch.Tensor]


def get_backend(name: str) -> Backend:
    """``"torch"``: the plain-PyTorch references; ``"triton"``: the Triton kernels, with torch's
    BLAS for the GEMMs (``linear``: cuBLAS streams the decode GEMMs' weights near the bandwidth)."""
    if name == "torch":
        from kernels import reference as ref
        from kernels.moe_reference import fused_moe_ref

        return Backend(
            "torch", ref.paged_attention_ref, ref.write_kv_cache_ref, ref.rope_store_kv_ref,
            ref.add_rms_norm_ref, ref.silu_mul_ref, ref.linear_ref, ref.linear_fp8_ref, ref.work_block_qs_ref,
            fused_moe_ref,
        )  # fmt: skip
    if name == "triton":
        from kernels.cache_write import write_kv_cache
        from kernels.fp8_linear import linear_fp8
        from kernels.fused import add_rms_norm, rope_store_kv, silu_mul
        from kernels.moe_plans import engine_fused_moe
        from kernels.paged_attention import paged_attention, work_block_qs
        from kernels.reference import linear_ref as gemm
        return Backend(
            "triton", paged_attention, write_kv_cache, rope_store_kv, add_rms_norm, silu_mul, gemm,
            linear_fp8, work_block_qs, engine_fused_moe,
        )
    raise ValueError(f"unknown kernel backend {name!r}; choose one of {BACKEND_NAMES}")


def compiled_kernel_keys() -> set[tuple[str, str]]:
    """(kernel, specialisation key) of every compiled Triton kernel variant of the kernels
    loaded so far. New entries between two points mean a launch in between paid compilation;
    their keys say which argument pattern was new. Empty when triton was never imported."""
    import sys

    if "triton" not in sys.modules:
        return set()
    from triton.runtime.jit import JITFunction

    keys = set()
    for name, mod in list(sys.modules.items()):
        if not name.startswith("kernels.") or mod is None:
            continue
        for attr, obj in vars(mod).items():
            if isinstance(obj, JITFunction):
                keys.update((f"{name}.{attr}", str(k)) for c in obj.device_caches.values() for k in c[0])
    return keys


def compiled_kernel_count() -> int:
    """How many Triton kernel variants are compiled (see compiled_kernel_keys): the engine's
    warm-up and the GPU check use it to show that a replay compiles nothing."""
    return len(compiled_kernel_keys())
