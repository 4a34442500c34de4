"""The fused MoE kernels (kernels/fused_moe.py, Triton interpreter on the CPU) against the plain
per-expert loop (kernels/moe_reference.py), and the expert grouping against its definition."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import DirectTiles, MoeTiles, align_by_expert, default_tiles, fused_moe
from kernels.moe_reference import fused_moe_ref, moe_ref, route_ref
from tests.kernels.helpers import SETTINGS, assert_close

TILES = MoeTiles(16, 16, 16, 4, 1)  # small tiles: several N and K tiles even at these sizes


def _weights(g, e, h, n, dtype=torch.float32):
    w13 = (torch.randn(e, 2 * n, h, generator=g) / h**0.5).to(dtype)
    w2 = (torch.randn(e, h, n, generator=g) / n**0.5).to(dtype)
    return w13, w2


@settings(max_examples=25, **SETTINGS)
@given(t=st.integers(1, 40), e=st.integers(1, 130), k=st.integers(1, 4), block_m=st.sampled_from([1, 4, 16]),
       method=st.sampled_from(["blocks", "one_program"]), seed=st.integers(0, 10**6))
def test_grouping_puts_every_pair_once_in_a_block_of_its_expert(t, e, k, block_m, method, seed):
    k = min(k, e)
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    sorted_ids, block_expert = align_by_expert(ids, e, block_m, method=method)  # Triton
    torch_ids, torch_blocks = align_by_expert(ids, e, block_m, method="torch")
    assert torch.equal(sorted_ids, torch_ids) and torch.equal(block_expert, torch_blocks)  # all stable
    assert sorted_ids.numel() == block_expert.numel() * block_m
    flat = ids.reshape(-1)
    real = sorted_ids[sorted_ids < t * k]
    assert sorted(real.tolist()) == list(range(t * k))  # each pair exactly once
    for b, exp in enumerate(block_expert.tolist()):
        chunk = sorted_ids[b * block_m:(b + 1) * block_m]
        chunk = chunk[chunk < t * k]
        if exp < 0:
            assert chunk.numel() == 0
        else:
            assert bool((flat[chunk.long()] == exp).all())
    used = [x for x in block_expert.tolist() if x >= 0]
    assert used == sorted(used)  # blocks in expert order, one run per touched expert
    assert set(used) == set(flat.tolist())


@settings(max_examples=20, **SETTINGS)
@given(t=st.integers(1, 20), e=st.integers(1, 8), k=st.integers(1, 3), h=st.sampled_from([16, 24, 40]),
       n=st.sampled_from([16, 20, 48]), seed=st.integers(0, 10**6))
def test_fused_moe_equals_the_per_expert_loop(t, e, k, h, n, seed):
    k = min(k, e)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13, w2 = _weights(g, e, h, n)
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=bool(seed % 2))
    assert_close(fused_moe(x, w13, w2, weights, ids, TILES), fused_moe_ref(x, w13, w2, weights, ids),
                 torch.float32)


def test_all_tokens_on_one_expert_and_empty_experts():
    g = torch.Generator().manual_seed(3)
    t, e, h, n = 21, 6, 32, 32  # 21 rows on expert 4: two M blocks of one expert; experts 0-3 empty
    x = torch.randn(t, h, generator=g)
    w13, w2 = _weights(g, e, h, n)
    ids = torch.full((t, 2), 4)
    ids[:, 1] = 5
    weights = torch.rand(t, 2, generator=g)
    assert_close(fused_moe(x, w13, w2, weights, ids, TILES), fused_moe_ref(x, w13, w2, weights, ids),
                 torch.float32)


def test_one_token_bfloat16_default_tiles():
    g = torch.Generator().manual_seed(4)
    e, h, n = 8, 64, 32
    x = torch.randn(1, h, generator=g).to(torch.bfloat16)
    w13, w2 = _weights(g, e, h, n, torch.bfloat16)
    router = torch.randn(e, h, generator=g).to(torch.bfloat16)
    weights, ids = route_ref(x @ router.t(), 2, True)
    got = fused_moe(x, w13, w2, weights, ids)
    assert_close(got, moe_ref(x, router, w13, w2, 2, True), torch.bfloat16)
    assert isinstance(default_tiles(1, 2, e), DirectTiles)  # 2 pairs on 8 experts: the direct path


def test_routing_renormalises_only_when_asked():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    w, ids = route_ref(logits, 2, renormalize=False)
    p = torch.softmax(logits, -1)[0]
    assert ids.tolist() == [[0, 1]] and torch.allclose(w[0], p[:2])
    w, _ = route_ref(logits, 2, renormalize=True)
    assert torch.allclose(w[0], p[:2] / p[:2].sum())


def test_bad_shapes_are_refused_naming_the_layout():
    x = torch.zeros(2, 16)
    with pytest.raises(ValueError, match=r"w13 \[E, 2N, H\]"):
        fused_moe(x, torch.zeros(2, 32, 8), torch.zeros(2, 8, 16), torch.zeros(2, 1), torch.zeros(2, 1, dtype=torch.long))
