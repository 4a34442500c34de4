"""Run 14's prefill epilogues in the Triton interpreter against the float32 per-expert loop: the down tiles
stored at their sorted rows through TMA (the k-sum gathering each token's rows by the pairs' sorted
positions), the activation tiles through TMA, both; and the positions the "hist" grouping writes against
the inverse of its sorted pair ids."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import MoeTiles, fused_moe, moe_sum
from kernels.moe_align import align_by_expert, align_with_positions, sorted_positions
from kernels.moe_plans import plan_key, run14_candidates
from tests.kernels.helpers import SETTINGS, assert_close, moe_layer, moe_ref

SMALL = MoeTiles(16, 16, 16, 4, 1, tma=True, joint=True, align="hist", ksum="triton", sorted_act=True, persistent=1,
                 up_persistent=1, down_block_n=32, down_block_k=16)


@settings(max_examples=10, **SETTINGS)
@given(t=st.integers(1, 40), e=st.integers(1, 12), k=st.integers(1, 4), h=st.sampled_from([32, 64, 96]),
       n=st.sampled_from([16, 20, 48]), which=st.sampled_from(["down", "act", "both"]),
       ksum=st.sampled_from(["torch", "triton"]), seed=st.integers(0, 10**6))
def test_tma_stored_epilogues_equal_the_per_expert_loop(t, e, k, h, n, which, ksum, seed):
    """Experts with no tokens, N = 20 (a partial activation tile: TMA clips its columns), H = 96 (a partial
    last down tile of 32 columns stored in two 16-column halves); the torch and Triton k-sums."""
    k = min(k, e)
    x, w13, w2, weights, ids = moe_layer(seed, t, e, k, h, n)
    plan = dataclasses.replace(SMALL, sorted_out=which != "act", act_tma_store=which != "down", ksum=ksum)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_tma_stored_epilogues_in_bfloat16_and_with_one_crowded_expert():
    plan = dataclasses.replace(SMALL, sorted_out=True, act_tma_store=True)
    x, w13, w2, weights, ids = moe_layer(13, 23, 8, 4, 32, 48, torch.bfloat16)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.bfloat16)
    x, w13, w2, weights, _ids = moe_layer(12, 23, 8, 4, 32, 48)
    same = torch.tensor([3, 5, 0, 1]).expand(23, 4).contiguous()
    assert_close(fused_moe(x, w13, w2, weights, same, plan), moe_ref(x, w13, w2, weights, same), torch.float32)


@settings(max_examples=6, **SETTINGS)
@given(t=st.integers(1, 200), e=st.integers(1, 40), k=st.integers(1, 8), block_m=st.sampled_from([16, 64]),
       method=st.sampled_from(["hist", "hist2", "torch"]), seed=st.integers(0, 10**6))
def test_each_pair_sits_at_its_position_in_the_sorted_list(t, e, k, block_m, method, seed):
    """sorted_ids[positions[p]] == p for every pair p, and the grouping is align_by_expert's."""
    k = min(k, e)
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    sorted_ids, block_expert, positions = align_with_positions(ids, e, block_m, method=method)
    ref_sorted, ref_blocks = align_by_expert(ids, e, block_m, method="torch")
    assert torch.equal(sorted_ids, ref_sorted) and torch.equal(block_expert, ref_blocks)
    assert torch.equal(sorted_ids[positions.long()], torch.arange(t * k, dtype=torch.int32))
    assert torch.equal(positions, sorted_positions(ref_sorted, t * k))


def test_moe_sum_gathers_a_tokens_rows_by_their_positions():
    """Rows in a scrambled order with padding rows between them: the sum of each token's k rows, by hand."""
    y = torch.arange(7 * 3, dtype=torch.float32).view(7, 3)
    positions = torch.tensor([5, 0, 3, 6], dtype=torch.int32)  # pairs 0-3 of 2 tokens at k = 2
    expected = torch.stack([y[5] + y[0], y[3] + y[6]])
    assert torch.equal(moe_sum(y, 2, positions), expected)


def test_run14_candidates_vary_the_engine_prefill_plan_only():
    plans = run14_candidates(4096, 8, 128)
    assert [(p.sorted_out, p.act_tma_store) for p in plans] == [(True, False), (False, True), (True, True)]
    assert len({plan_key(p) for p in plans}) == 3 and all(" sortedout" in plan_key(p) or " acttma" in plan_key(p)
                                                          for p in plans)
    assert run14_candidates(1, 8, 128) == [] and run14_candidates(64, 8, 128) == []


@pytest.mark.parametrize("field", ["sorted_out", "act_tma_store"])
def test_the_new_fields_ride_along_to_the_down_tiles(field):
    assert getattr(dataclasses.replace(SMALL, **{field: True}).down(), field)
