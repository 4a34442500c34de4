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
BACKEND_NAMES: tuple[str, ...] = ("torch", "triton")


@dataclass(frozen=True, slots=True)
class Backend:
    """The kernels of one decoder forward; signatures are those of ``kernels.reference``.

    Frozen: a variant (a benchmark that drops attention, say) is a ``dataclasses.replace`` copy.
    """

    name: str
    paged_attention: Callable[..., torch.Tensor]  # (q, k_cache, v_cache, block_tables, seq_lens,
    #   query_start_loc, scale, max_query_len, max_seq_len, out=None) -> out
    write_kv_cache: Callable[..., None]  # (k, v, k_cache, v_cache, slot_mapping)
    rope_store_kv: Callable[..., torch.Tensor]  # (qkv, positions, cos, sin, k_cache, v_cache,
    #   slot_mapping, num_q_heads, num_kv_heads, head_dim) -> rotated q
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    #   (x, delta, weight, eps) -> (x + delta, RMSNorm(x + delta) * weight)
    silu_mul: Callable[..., torch.Tensor]  # (gate_up) -> SiLU(gate) * up


def get_backend(name: str) -> Backend:
    """``"torch"``: the plain-PyTorch references; ``"triton"``: the Triton kernels."""
    if name == "torch":
        from kernels import reference as ref

        return Backend(
            "torch", ref.paged_attention_ref, ref.write_kv_cache_ref, ref.rope_store_kv_ref,
            ref.add_rms_norm_ref, ref.silu_mul_ref,
        )  # fmt: skip
    if name == "triton":
        from kernels.cache_write import write_kv_cache
        from kernels.fused import add_rms_norm, rope_store_kv, silu_mul
        from kernels.paged_attention import paged_attention

        return Backend(
            "triton", paged_attention, write_kv_cache, rope_store_kv, add_rms_norm, silu_mul
        )
    raise ValueError(f"unknown kernel backend {name!r}; choose one of {BACKEND_NAMES}")


def compiled_kernel_count() -> int:
    """Compiled Triton kernel variants (one per specialisation) of the kernels loaded so far.

    A rise between two points means a launch in between paid compilation; the engine's warm-up
    and the GPU check use it to show that a replay compiles nothing. 0 when triton was never
    imported (the torch backend compiles nothing).
    """
    import sys

    if "triton" not in sys.modules:
        return 0
    from triton.runtime.jit import JITFunction

    total = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith("kernels.") or mod is None:
            continue
        for obj in vars(mod).values():
            if isinstance(obj, JITFunction):
                total += sum(len(c[0]) for c in obj.device_caches.values())
    return total
