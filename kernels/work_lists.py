"""Work lists of the paged-attention kernel: which Q blocks each launch of a batch works.

For a batch with prefill chunks the host lists the Q blocks of the decode launch and of the
prefill launch (`plan_work`, numpy); `kernels.paged_attention.paged_attention(..., work=)` makes
each launch's programs stride over its list, with the counts read on the device, so a CUDA graph
sized by `work_capacity` serves any batch that fits and its padding costs no programs. Here, free
of torch and triton, so the runner stages the lists whatever the backend (the backend's
`work_block_qs` says whether it takes them and in which units).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kernels.backend import DECODE_MAX_QUERY_LEN

if TYPE_CHECKING:
    import torch

WORK_SEQ_SHIFT = 16  # an item is sequence << 16 | Q block of the sequence


@dataclass(frozen=True, slots=True)
class AttentionWork:
    """The device work lists of one mixed step (what `plan_work` filled, copied over).

    `items` (int32): the decode launch's Q blocks in [0, decode_capacity), the prefill
    launch's from decode_capacity on; `counts` (int32 [2]): how many each launch has, read on
    the device; `max_items`: (decode, prefill) bounds the grids are sized by: the exact counts
    for an eager step, the most a CUDA graph's replays can bring for a graph."""

    items: torch.Tensor
    counts: torch.Tensor
    decode_capacity: int
    max_items: tuple[int, int]
    block_qs: tuple[int, int]  # query tokens per Q block the lists were made with (work_block_qs)
    # in a CUDA graph the grid is capped (kernels.paged_attention.WORK_PROGRAMS_PER_SM), each
    # program striding over the list; an eager launch gets one program per item
    in_graph: bool = False


def work_capacity(max_seqs: int, max_tokens: int, block_qs: tuple[int, int]) -> tuple[int, int]:
    """Most items each list can hold for batches of up to `max_seqs` sequences and
    `max_tokens` tokens (a decode-like sequence has 1..DECODE_MAX_QUERY_LEN tokens, a chunk
    more)."""
    dec_q, pre_q = block_qs
    max_seqs = min(max_seqs, max_tokens)
    max_chunks = min(max_seqs, max_tokens // (DECODE_MAX_QUERY_LEN + 1))
    return (max_seqs * -(-DECODE_MAX_QUERY_LEN // dec_q),
            -(-max_tokens // pre_q) + max_chunks if max_chunks else 0)


def plan_work(q_lens: np.ndarray, seq_lens: np.ndarray, block_qs: tuple[int, int], out: np.ndarray,
              decode_capacity: int) -> tuple[int, int]:
    """Write the Q blocks of both launches of a batch into `out` (int32; decode items from 0,
    prefill items from `decode_capacity`); returns (decode items, prefill items). Each list is
    ordered by keys per block, most first, so that long blocks start first and short ones fill
    the tail (the static grid's reverse order did the same for causal chunks)."""
    counts = []
    for kind_mask, bq, base in ((q_lens <= DECODE_MAX_QUERY_LEN, block_qs[0], 0),
                                (q_lens > DECODE_MAX_QUERY_LEN, block_qs[1], decode_capacity)):
        seqs = np.flatnonzero(kind_mask & (q_lens > 0))
        nb = -(-q_lens[seqs] // bq)
        n = int(nb.sum())
        if n == len(seqs):  # one block each (every decode): no repeats needed
            rows, blk = seqs, np.zeros(n, dtype=np.int64)
        else:
            rows = np.repeat(seqs, nb)
            blk = np.arange(n) - np.repeat(np.cumsum(nb) - nb, nb)
        keys = seq_lens[rows] - q_lens[rows] + np.minimum((blk + 1) * bq, q_lens[rows])
        order = np.argsort(-keys, kind="stable")
        out[base: base + n] = (rows[order] << WORK_SEQ_SHIFT) | blk[order]
        counts.append(n)
    return counts[0], counts[1]
