"""One paged forward of the engine's model from plain token lists, without the runner: what the
model tests compare with the dense reference (engine/dense_reference.py) and the draft/target pair's
tests compare with their training model."""

from __future__ import annotations

import itertools

import torch

from engine.attention import AttentionMetadata
from engine.core.model_spec import ModelSpec
from engine.model import LlamaModel

BS = 4  # small KV blocks so a short sequence spans several, scattered blocks


def run_paged(model: LlamaModel, kv: torch.Tensor, seqs: list[tuple[list[int], int, list[int]]],
              block_size: int = BS) -> tuple[torch.Tensor, list[int]]:
    """One flattened step. seqs: (all tokens so far, num already in cache, block ids); returns the
    logits of every new token and the query start offsets."""
    ids, pos, slots, qsl, lens = [], [], [], [0], []
    width = max(len(b) for _, _, b in seqs)
    bt = torch.zeros(len(seqs), width, dtype=torch.int32)
    for i, (toks, cached, blocks) in enumerate(seqs):
        for p in range(cached, len(toks)):
            ids.append(toks[p])
            pos.append(p)
            slots.append(blocks[p // block_size] * block_size + p % block_size)
        qsl.append(qsl[-1] + len(toks) - cached)
        lens.append(len(toks))
        bt[i, : len(blocks)] = torch.tensor(blocks)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), block_tables=bt, seq_lens=torch.tensor(lens, dtype=torch.int32),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        max_query_len=max(b - a for a, b in itertools.pairwise(qsl)), max_seq_len=max(lens))
    with torch.no_grad():
        h = model(torch.tensor(ids), torch.tensor(pos), kv, meta)
        return model.compute_logits(h), qsl


def new_kv(spec: ModelSpec, blocks: int = 32, block_size: int = BS) -> torch.Tensor:
    """A zeroed KV cache [layers, 2, blocks, block_size, kv_heads, head_dim] on the CPU."""
    return torch.zeros(spec.num_layers, 2, blocks, block_size, spec.num_kv_heads, spec.head_dim)


__all__ = ["BS", "new_kv", "run_paged"]
