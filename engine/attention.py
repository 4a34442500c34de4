"""Paged attention for the engine: the metadata one step needs and the backend that runs it.

The engine never calls a kernel directly; it calls `paged_attention` / `write_kv_cache`
here, which run the `kernels/` backend it was built with: "torch" (the plain-PyTorch
references, used on the CPU and in tests) or "triton" (the Triton kernels).
Keeping the choice in one place lets a CUDA graph capture whichever backend is active.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

AttentionBackendName = Literal["torch", "triton"]


@dataclass
class AttentionMetadata:
    """Everything one flattened mixed batch needs for attention; tensors live on the model's device.

    `max_query_len` / `max_seq_len` are host ints the runner already knows, so no kernel
    has to read them back from the device (no sync).
    """

    slot_mapping: torch.Tensor  # int64 [num_tokens]; slot < 0 = padding, not written
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [num_seqs], context including this step's tokens
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    max_query_len: int
    max_seq_len: int


class AttentionBackend:
    """The attention implementation one model instance uses."""

    def __init__(self, name: AttentionBackendName) -> None:
        from kernels import get_backend

        b = get_backend(name)
        self.name = b.name
        self._attn, self._write = b.paged_attention, b.write_kv_cache

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        self._write(k, v, k_cache, v_cache, meta.slot_mapping)
        return self.attend(q, k_cache, v_cache, meta, scale)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Attention only: this step's K/V are already in the cache (a fused kernel put them)."""
        return self._attn(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
            scale, meta.max_query_len, meta.max_seq_len,
        )
