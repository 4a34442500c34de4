"""Random paged-attention batches and the error measure that the kernel tests and the GPU checks
(benchmarks/engine/profile_steps.py) share. Imports torch."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    scale: float
    max_query_len: int
    max_seq_len: int

    def args(self) -> tuple:
        return (
            self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
            self.query_start_loc, self.scale, self.max_query_len, self.max_seq_len,
        )  # fmt: skip


def make_batch(
    query_lens: list[int],
    context_lens: list[int],
    num_kv_heads: int,
    queries_per_kv: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    spare_blocks: int = 3,
) -> PagedBatch:
    """A batch whose sequences own shuffled physical blocks of one cache (plus unused spares).

    ``context_lens`` are tokens already cached; ``seq_lens = context + query``. Unused table
    entries point at block 0 on purpose: a kernel that reads past a sequence's end would then
    read real (wrong) data rather than zeros.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    physical = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(max(blocks_per_seq), 1) + 1  # one extra column, never needed
    block_tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_per_seq):
        block_tables[b, :n] = physical[used : used + n]
        used += n
    query_start_loc = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    num_tokens = int(query_start_loc[-1])
    q = torch.randn(num_tokens, num_kv_heads * queries_per_kv, head_dim, generator=gen).to(dtype)
    return PagedBatch(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=query_start_loc,
        scale=head_dim**-0.5,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )


def rel_norm_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere in ``out`` gives NaN (never passes)."""
    out64, ref64 = out.double(), ref.double()
    return float((out64 - ref64).norm() / ref64.norm())


__all__ = ["PagedBatch", "make_batch", "rel_norm_error"]
