"""The fused MoE kernels (kernels/fused_moe.py, Triton interpreter on the CPU) against the plain
per-expert loop (kernels/moe_reference.py), and the expert grouping against its definition."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import (
    DirectTiles,
    MoeTiles,
    align_by_expert,
    default_tiles,
    fused_moe,
    run2_tiles,
    run3_tiles,
)
from kernels.moe_reference import fused_moe_ref, moe_ref, route_ref
from tests.kernels.helpers import SETTINGS, assert_close

TILES = MoeTiles(16, 16, 16, 4, 1)  # small tiles: several N and K tiles even at these sizes


def _weights(g, e, h, n, dtype=torch.float32):
    w13 = (torch.randn(e, 2 * n, h, generator=g) / h**0.5).to(dtype)
    w2 = (torch.randn(e, h, n, generator=g) / n**0.5).to(dtype)
    return w13, w2


@settings(max_examples=25, **SETTINGS)
@given(t=st.integers(1, 40), e=st.integers(1, 130), k=st.integers(1, 4), block_m=st.sampled_from([1, 4, 16]),
       method=st.sampled_from(["blocks", "blocks2", "one_program"]), seed=st.integers(0, 10**6))
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


@settings(max_examples=12, **SETTINGS)
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
    assert default_tiles(1, 2, e) == run2_tiles(1, 2, e)  # run 2's measured plan until run 3 is measured
    assert_close(fused_moe(x, w13, w2, weights, ids, run3_tiles(1, 2, e)), moe_ref(x, router, w13, w2, 2, True),
                 torch.bfloat16)


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


# ------------------------------------------------------------------------------- run 3's paths
DIRECT_FMA = DirectTiles(16, 16, 8, 16, 4)  # several N and K tiles at these sizes
DIRECT_DOT = DirectTiles(16, 16, 16, 16, 4, 2, use_dot=True)
GROUPED_VARIANTS = {
    "atomic_sum": MoeTiles(16, 16, 16, 4, 1, atomic_sum=True),
    "down_tile": MoeTiles(16, 16, 16, 4, 1, down_block_n=32, down_block_k=32),
    "tma": MoeTiles(16, 16, 16, 4, 1, tma=True),
    "tma_atomic_down_tile": MoeTiles(16, 32, 16, 4, 1, tma=True, atomic_sum=True, down_block_n=16, down_block_k=32),
}


@settings(max_examples=10, **SETTINGS)
@given(t=st.integers(1, 12), e=st.integers(1, 10), k=st.integers(1, 4), h=st.sampled_from([16, 40]),
       n=st.sampled_from([16, 20, 48]), dot=st.booleans(), seed=st.integers(0, 10**6))
def test_direct_path_equals_the_per_expert_loop(t, e, k, h, n, dot, seed):
    """k = 3 leaves a masked slot in the down kernel's [next_pow2(k) * BLOCK_N] rows; n = 20 a partial tile."""
    k = min(k, e)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13, w2 = _weights(g, e, h, n)
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=bool(seed % 2))
    assert_close(fused_moe(x, w13, w2, weights, ids, DIRECT_DOT if dot else DIRECT_FMA),
                 fused_moe_ref(x, w13, w2, weights, ids), torch.float32)


@pytest.mark.parametrize("variant", sorted(GROUPED_VARIANTS))
def test_grouped_variants_equal_the_per_expert_loop(variant):
    """The atomic k-sum, the down launch's own tile and TMA weight tiles (n = 48: the gate tile's last
    columns read into the up rows, masked at the store), random routing and every token on 2 experts."""
    g = torch.Generator().manual_seed(11)
    t, e, k, h, n = 19, 6, 2, 32, 48
    x = torch.randn(t, h, generator=g)
    w13, w2 = _weights(g, e, h, n)
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=True)
    same = torch.tensor([3, 5]).expand(t, k).contiguous()
    for routing in (ids, same):
        assert_close(fused_moe(x, w13, w2, weights, routing, GROUPED_VARIANTS[variant]),
                     fused_moe_ref(x, w13, w2, weights, routing), torch.float32)


@pytest.mark.parametrize(("t", "k"), [(1, 2), (1, 8), (7, 2), (7, 8), (64, 2), (64, 8), (300, 2)])
def test_every_path_at_the_briefs_sizes(t, k):
    """T = 1, 7, 64 with top 2 and top 8 of 16 experts, and T = 300 with top 2, random routing and every
    token on the same k experts: the default plan, the grouped path with each grouping, the direct path.
    At T = 300 the grouped path's blocks hold 64 rows (the interpreter runs a program at a time: 16-row
    blocks made this one case 18 s), so runs of several blocks with a partial last one are covered too
    (300 rows on each of the same 2 experts: four full blocks and a partial one). T = 300 with top 8
    (10 s) took no branch the others miss: its default plan (> 32 rows per expert: 128 x 128) is
    T = 300 top 2's, its multi-block runs too, and top 8's k-sum is T = 64's.
    The groupings: fused_moe reads `align` only to group the pairs (align_by_expert), so the
    "legacy" grouping (run 2's) is checked equal to the "blocks" one that the grouped path's run
    used, rather than by running the same GEMMs on it again (the interpreter's cost of this test)."""
    g = torch.Generator().manual_seed(100 * t + k)
    e, h, n = 16, 32, 32
    x = torch.randn(t, h, generator=g)
    w13, w2 = _weights(g, e, h, n)
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=True)
    same = torch.arange(k).expand(t, k).contiguous()
    tiles = TILES if t <= 64 else dataclasses.replace(TILES, block_m=64)
    for routing in (ids, same):
        ref = fused_moe_ref(x, w13, w2, weights, routing)
        assert_close(fused_moe(x, w13, w2, weights, routing), ref, torch.float32)
        assert_close(fused_moe(x, w13, w2, weights, routing, tiles, align="blocks"), ref, torch.float32)
        blocks, legacy = (align_by_expert(routing, e, tiles.block_m, method=m) for m in ("blocks", "legacy"))
        assert all(torch.equal(a, b) for a, b in zip(blocks, legacy, strict=True))
        if t * k <= 64:
            assert_close(fused_moe(x, w13, w2, weights, routing, DIRECT_FMA), ref, torch.float32)


def test_many_program_grouping_beyond_16k_pairs():
    """2,100 tokens x top 8 of 128 experts: 16,800 pairs, the scatter's 256-pair chunks (66 of them),
    against the torch grouping, at 128-row blocks; and every token on the same 8 experts (long runs, the
    others empty) at 16-row blocks. (Each case takes the interpreter ~4 s: not the whole cross product.)"""
    g = torch.Generator().manual_seed(7)
    e, k, t = 128, 8, 2100
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    for routing, block_m in ((ids, 128), (torch.arange(k).expand(t, k).contiguous(), 16)):
        got = align_by_expert(routing, e, block_m, method="blocks")
        want = align_by_expert(routing, e, block_m, method="torch")
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_run3_plan_is_direct_only_for_few_pairs_on_many_experts():
    assert isinstance(run3_tiles(1, 8, 128), DirectTiles) and isinstance(run3_tiles(4, 8, 128), DirectTiles)
    assert run3_tiles(8, 8, 128).align == "blocks"  # 64 pairs: grouped, the many-program grouping
    assert isinstance(run3_tiles(1, 2, 8), DirectTiles) and isinstance(run3_tiles(2, 2, 8), MoeTiles)
    assert run2_tiles(8, 8, 128).align == "legacy"


def test_unknown_grouping_is_refused():
    with pytest.raises(ValueError, match="method 'sorted' is not one of"):
        align_by_expert(torch.zeros(2, 1, dtype=torch.long), 4, 16, method="sorted")
