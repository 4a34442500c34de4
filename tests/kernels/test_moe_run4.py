"""Run 4's fused-MoE kernels in the Triton interpreter: the "hist" grouping against the torch grouping
(same stable output), the Triton k-sum against torch's sum, the direct path's new variants and the
grouped plans with the new grouping and k-sum against the float32 per-expert loop."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import MoeTiles, align_by_expert, fused_moe, moe_sum
from kernels.moe_direct import DirectTiles
from kernels.moe_plans import (
    DIRECT_RUN4,
    DIRECT_RUN6,
    PREFILL_RUN4,
    PROPOSED_RULE,
    RUN3_BEST,
    known_plans,
    plan_key,
    propose_rule,
    rule_tiles,
    run3_best,
    run4_candidates,
)
from kernels.moe_reference import fused_moe_ref, route_ref
from tests.kernels.helpers import SETTINGS, assert_close, interpreter_distinct


def _ids(g, t, e, k):
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@settings(max_examples=12, **SETTINGS)
@given(t=st.integers(1, 40), e=st.integers(1, 130), k=st.integers(1, 4), block_m=st.sampled_from([1, 4, 16, 64]),
       method=st.sampled_from(["hist", "hist2"]), seed=st.integers(0, 10**6))
def test_hist_grouping_equals_the_torch_grouping(t, e, k, block_m, method, seed):
    """One launch (hist, each program counts) and two (hist2); E = 1 .. 130 (the spare bin at E, a
    non-power-of-two E), block_m = 1 (no padding) to 64 (blocks longer than an expert's run)."""
    k = min(k, e)
    ids = _ids(torch.Generator().manual_seed(seed), t, e, k)
    assert _same(align_by_expert(ids, e, block_m, method=method), align_by_expert(ids, e, block_m, method="torch"))


def test_hist_grouping_over_several_chunks_and_one_crowded_expert():
    """40 tokens x top 8 of 32 experts: 320 pairs in 3 chunks of 128 (kernels.moe_align._hist_chunk's
    size up to 4,096 pairs; the 100 tokens this took before were 7 such chunks), the last one partial,
    random routing, every token on the same 8 experts, and block_m 16 (runs of several blocks: 40 rows
    on each crowded expert) and 128. (The place launch has a program per chunk of the padded length,
    E x (block_m - 1) more than the pairs: 32 experts, not 128, keep that small in the interpreter.)"""
    g = torch.Generator().manual_seed(9)
    e, k, t = 32, 8, 40
    for routing in (_ids(g, t, e, k), torch.arange(k).expand(t, k).contiguous()):
        for block_m in (16, 128):
            assert _same(align_by_expert(routing, e, block_m, method="hist"),
                         align_by_expert(routing, e, block_m, method="torch"))


@settings(max_examples=15, **SETTINGS)
@given(t=st.integers(1, 9), k=st.integers(1, 9), h=st.sampled_from([1, 24, 1000, 1500]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 10**6))
def test_moe_sum_equals_torchs_sum_over_each_tokens_rows(t, k, h, dtype, seed):
    """h = 1500: two H tiles of 1024, the second partial; k = 3, 5..7: masked rows of next_pow2(k)."""
    y = torch.randn(t * k, h, generator=torch.Generator().manual_seed(seed)).to(dtype)
    want = y.float().view(t, k, h).sum(dim=1).to(dtype)
    assert_close(moe_sum(y, k), want, dtype)


def test_moe_sum_of_no_tokens_is_empty():
    assert moe_sum(torch.zeros(0, 16), 4).shape == (0, 16)


def _layer(seed, t, e, k, h, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * n, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, n, generator=g) / n**0.5
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=True)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("plan", interpreter_distinct(DIRECT_RUN4 + DIRECT_RUN6), ids=repr)
def test_direct_run4_variants_equal_the_per_expert_loop(plan):
    """evict-first loads, the early launch (the interpreter runs no gdc wait or prefetch: the values
    are the kernel's own), the down launch's warps, the n4 down tile, run 6's K steps (wider than H
    and N here: one masked step); k = 3 leaves a masked slot."""
    for t, e, k in ((1, 10, 3), (5, 16, 8)):
        x, w13, w2, weights, ids = _layer(t + e, t, e, k, 40, 20)
        assert_close(fused_moe(x, w13, w2, weights, ids, plan), fused_moe_ref(x, w13, w2, weights, ids),
                     torch.float32)


GROUPED_RUN4 = {
    "hist": MoeTiles(16, 16, 16, 4, 1, align="hist"),
    "hist_ksum": MoeTiles(16, 16, 16, 4, 1, align="hist", ksum="triton"),
    "hist2_ksum_tma_down_tile": MoeTiles(16, 32, 16, 4, 1, tma=True, align="hist2", ksum="triton", down_block_n=16,
                                         down_block_k=32),
    "hist_atomic": MoeTiles(16, 16, 16, 4, 1, align="hist", ksum="triton", atomic_sum=True),
    "joint": MoeTiles(16, 16, 16, 4, 1, tma=True, joint=True, align="hist", ksum="triton"),
    "joint_wide": MoeTiles(16, 32, 16, 4, 1, tma=True, joint=True),  # n = 48: the up half's box past N is TMA's zeros
}


@pytest.mark.parametrize("variant", sorted(GROUPED_RUN4))
def test_grouped_run4_plans_equal_the_per_expert_loop(variant):
    """The grouped path with the hist grouping and the Triton k-sum (with atomic_sum the k-sum is the
    atomics'), the joint gate+up dot, random routing and every token on 2 experts."""
    x, w13, w2, weights, ids = _layer(11, 19, 6, 2, 32, 48)
    same = torch.tensor([3, 5]).expand(19, 2).contiguous()
    for routing in (ids, same):
        assert_close(fused_moe(x, w13, w2, weights, routing, GROUPED_RUN4[variant]),
                     fused_moe_ref(x, w13, w2, weights, routing), torch.float32)


def test_prefill_plans_run_at_small_tiles():
    """Each prefill candidate's fields (TMA, its down tile, group_m, hist, Triton k-sum) with the
    tile sizes shrunk so the interpreter runs them: equal to the per-expert loop."""
    x, w13, w2, weights, ids = _layer(12, 23, 8, 4, 32, 48)
    ref = fused_moe_ref(x, w13, w2, weights, ids)
    for plan in PREFILL_RUN4:
        small = dataclasses.replace(plan, block_m=16, block_n=16, block_k=16, num_stages=1,
                                    down_block_n=min(plan.down_block_n, 32), down_block_k=min(plan.down_block_k, 16))
        assert_close(fused_moe(x, w13, w2, weights, ids, small), ref, torch.float32)


def test_run4_candidates_by_step_size():
    """Direct variants up to 64 pairs; run 3's grouped best with the hist grouping (and the Triton
    k-sum where it has no atomic sum); the prefill tiles from 64 rows per expert; no duplicates."""
    one = run4_candidates(1, 8, 128)
    assert one == DIRECT_RUN4
    eight = run4_candidates(8, 8, 128)
    assert eight[:len(DIRECT_RUN4)] == DIRECT_RUN4
    assert eight[len(DIRECT_RUN4):] == [dataclasses.replace(RUN3_BEST[8], align="hist")]  # atomic: no k-sum
    big = run4_candidates(4096, 8, 128)
    assert not any(isinstance(p, DirectTiles) for p in big)
    assert big[0] == dataclasses.replace(RUN3_BEST[4096], align="hist")
    assert all(p in big for p in PREFILL_RUN4) and len(big) == len(set(map(repr, big)))
    assert not any(p in run4_candidates(256, 8, 128) for p in PREFILL_RUN4)  # 16 rows per expert
    assert run3_best(3) == RUN3_BEST[2] and run3_best(5000) == RUN3_BEST[4096] and run3_best(0) == RUN3_BEST[1]


def test_propose_rule_takes_each_ts_fastest_known_plan_and_rule_tiles_the_nearest_t():
    direct, grouped = DIRECT_RUN4[1], PREFILL_RUN4[2]
    rows = [{"T": 1, "fused_by_tiles": {plan_key(direct): 20.0, plan_key(RUN3_BEST[1]): 27.5, "unknown plan": 1.0}},
            {"T": 4096, "fused_by_tiles": {plan_key(RUN3_BEST[4096]): 838.0, plan_key(grouped): 700.0}},
            {"T": 64, "fused_by_tiles": {}}]
    rule = propose_rule(rows)
    assert rule == {1: direct, 4096: grouped}  # the unknown key and the empty row skipped
    assert rule_tiles(1, rule) is direct and rule_tiles(0, rule) is direct and rule_tiles(64, rule) is direct
    assert rule_tiles(65, rule) is grouped  # log2 65 is nearer 12 than 0 by a hair past the midpoint 64
    assert len(known_plans()) == len(set(map(repr, known_plans().values())))  # keys name plans one to one


def test_proposed_rule_is_run4s_measured_best_where_run4_timed():
    """PROPOSED_RULE as written equals propose_rule of run 4's committed rows over run 3's table."""
    import json
    from pathlib import Path

    rows = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/kernels/data/moe_run4/moe.json").read_text())
    assert PROPOSED_RULE == {**RUN3_BEST, **propose_rule(rows["speed"])}


@pytest.mark.parametrize(("chunk", "tokens"), [(32, 25), (512, 70)])
def test_hist_grouping_at_any_chunk(chunk, tokens):
    """_align_hist's chunk (512 is the default above 16K pairs) over several chunks, the last one
    partial: 25 tokens x top 8 of 32 experts in 7 chunks of 32, 70 in 2 of 512."""
    from kernels.moe_align import _align_hist

    ids = _ids(torch.Generator().manual_seed(chunk), tokens, 32, 8)
    for block_m in (16, 128):
        assert _same(_align_hist(ids, 32, block_m, 0, chunk), align_by_expert(ids, 32, block_m, method="torch"))
