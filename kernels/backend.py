"""Run-time choice between the Triton kernels and the plain-PyTorch references."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

BackendName = Literal["triton", "torch"]
BACKEND_NAMES: tuple[str, ...] = ("triton", "torch")


@dataclass(frozen=True)
class AttentionBackend:
    """The two calls an engine needs, both with the signatures of docs/interfaces.md."""

    name: str
    paged_attention: Callable[..., object]
    write_kv_cache: Callable[..., None]


def get_backend(name: str) -> AttentionBackend:
    """``"triton"``: the kernels (GPU, or CPU under TRITON_INTERPRET=1); ``"torch"``: references."""
    if name == "triton":
        from kernels.cache_write import write_kv_cache
        from kernels.paged_attention import paged_attention

        return AttentionBackend("triton", paged_attention, write_kv_cache)
    if name == "torch":
        from kernels.reference import paged_attention_ref, write_kv_cache_ref

        return AttentionBackend("torch", paged_attention_ref, write_kv_cache_ref)
    raise ValueError(f"unknown attention backend {name!r}; choose one of {BACKEND_NAMES}")
