"""The Triton KV-cache writer round-trips exactly and skips padding slots."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.cache_write import write_kv_cache
from kernels.reference import gather_context, write_kv_cache_ref


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    num_tokens=st.integers(1, 20),
    num_kv_heads=st.sampled_from([1, 2, 8]),
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([8, 16, 32, 64]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    padding_every=st.integers(2, 5),
    seed=st.integers(0, 2**16),
)
def test_writes_match_reference_and_skip_padding(
    num_tokens, num_kv_heads, head_dim, block_size, dtype, padding_every, seed
):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = num_tokens // block_size + 3
    # k and v as views into one fused qkv projection, like an engine would hand them over
    qkv = torch.randn(num_tokens, 3, num_kv_heads, head_dim, generator=gen).to(dtype)
    k, v = qkv[:, 1], qkv[:, 2]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(torch.int64)
    slots[::padding_every] = -1
    sentinel = torch.full((num_blocks, block_size, num_kv_heads, head_dim), 7.0, dtype=dtype)
    k_cache, v_cache = sentinel.clone(), sentinel.clone()
    k_ref, v_ref = sentinel.clone(), sentinel.clone()
    write_kv_cache(k, v, k_cache, v_cache, slots)
    write_kv_cache_ref(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    # round trip: every kept token reads back bit for bit; padding left the sentinel alone
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        assert torch.equal(k_cache[slot // block_size, slot % block_size], k[t])
        assert torch.equal(v_cache[slot // block_size, slot % block_size], v[t])
    written = int((slots >= 0).sum())
    untouched = (k_cache == 7.0).all(dim=(-1, -2)).sum()
    assert int(untouched) == num_blocks * block_size - written


def test_gathered_sequence_reads_back_what_was_written():
    """Write a sequence through a shuffled block table, gather it back in token order."""
    block_size, num_tokens = 8, 29
    table = torch.tensor([5, 0, 3, 6], dtype=torch.int32)
    positions = torch.arange(num_tokens)
    slots = table[positions // block_size].long() * block_size + positions % block_size
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(num_tokens, 2, 64, generator=gen).to(torch.bfloat16)
    v = torch.randn(num_tokens, 2, 64, generator=gen).to(torch.bfloat16)
    k_cache = torch.zeros(8, block_size, 2, 64, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    write_kv_cache(k, v, k_cache, v_cache, slots.to(torch.int32))
    assert torch.equal(gather_context(k_cache, table, num_tokens), k)
    assert torch.equal(gather_context(v_cache, table, num_tokens), v)


def test_bad_slot_mapping_is_named():
    k = torch.zeros(3, 1, 64)
    cache = torch.zeros(2, 8, 1, 64)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv_cache(k, k, cache, cache.clone(), torch.zeros(4, dtype=torch.int64))


def test_mismatched_caches_are_named():
    k = torch.zeros(3, 1, 64)
    with pytest.raises(ValueError, match="k_cache and v_cache must both be"):
        write_kv_cache(k, k, torch.zeros(2, 8, 1, 64), torch.zeros(2, 8, 1, 32), torch.zeros(3, dtype=torch.int64))
