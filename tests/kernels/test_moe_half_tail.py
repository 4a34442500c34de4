"""Run 7's half tail tiles (`MoeTiles.half_tail`) in the Triton interpreter: a block whose second half
is padding is computed as a BLOCK_M / 2 tile by both grouped launches. Checked against the float32
per-expert loop, and by hand which blocks take the half tile."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import fused_moe as fm
from kernels.fused_moe import MoeTiles, align_by_expert, fused_moe
from tests.kernels.helpers import SETTINGS, assert_close, moe_layer, moe_ref

_HALF = MoeTiles(32, 16, 16, 4, 1, tma=True, joint=True, align="hist", ksum="triton", sorted_act=True, half_tail="both")


@settings(max_examples=10, **SETTINGS)
@given(t=st.integers(1, 48), e=st.integers(1, 8), k=st.integers(1, 3), n=st.sampled_from([16, 20]),
       persistent=st.sampled_from([0, 1, 3]), atomic=st.booleans(), half=st.sampled_from(["up", "both"]),
       seed=st.integers(0, 10**6))
def test_half_tail_plans_equal_the_per_expert_loop(t, e, k, n, persistent, atomic, half, seed):
    """32-row blocks (16-row half tiles): experts with 1-16 rows (a half block), 17-32 (a full one), more
    than 32 (a full block then a half or full one) and none; the gate+up and down grids one tile a program
    or 1 or 3 programs per "SM" looping over tiles; the k-sum by launch or by atomics; the half tile in
    gate+up only (the down launch's full tile then reads unwritten rows, which it must not store) or in
    both."""
    k = min(k, e)
    x, w13, w2, weights, ids = moe_layer(seed, t, e, k, 32, n)
    plan = dataclasses.replace(_HALF, persistent=persistent, up_persistent=persistent, atomic_sum=atomic,
                               half_tail=half)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_half_tail_in_bfloat16_with_a_crowded_expert():
    """Every token on experts 3 and 5 (two full blocks and a half one each at T = 40, k = 2), then random
    routing, bfloat16."""
    x, w13, w2, weights, _ids = moe_layer(5, 40, 8, 2, 32, 48, torch.bfloat16)
    same = torch.tensor([3, 5]).expand(40, 2).contiguous()
    assert_close(fused_moe(x, w13, w2, weights, same, _HALF), moe_ref(x, w13, w2, weights, same), torch.bfloat16)
    _x, _w13, _w2, weights, ids = moe_layer(6, 40, 8, 2, 32, 48)
    assert_close(fused_moe(x, w13, w2, weights, ids, _HALF), moe_ref(x, w13, w2, weights, ids), torch.bfloat16)


def test_the_half_tile_writes_only_the_first_half_of_a_part_filled_block():
    """Expert 0 gets 40 pairs (a full 32-row block, then 8 rows), expert 1 gets 20 (one block, more than
    half full): gate+up with half tails leaves rows 48-63 (the second half of expert 0's second block)
    as they were, and writes every other used row."""
    t, k, e = 30, 2, 2
    ids = torch.cat([torch.zeros(t, 1, dtype=torch.int64), torch.ones(t, 1, dtype=torch.int64)], 1)
    ids[20:, 1] = 0  # tokens 20-29 send both pairs to expert 0: 40 pairs there, 20 on expert 1
    x, w13, _w2, _weights, _ = moe_layer(7, t, e, k, 32, 16)
    sorted_ids, block_expert = align_by_expert(ids, e, 32, method="hist")
    assert block_expert.tolist()[:3] == [0, 0, 1]
    act = torch.full((sorted_ids.numel(), 16), float("nan"))
    from triton.tools.tensor_descriptor import TensorDescriptor

    desc = TensorDescriptor.from_tensor(w13.view(e, 2, 16, 32), [1, 2, 16, 16])
    blocks = block_expert.numel()
    fm._gate_up_joint_kernel[(blocks,)](x, desc, act, sorted_ids, block_expert, t * k, 32, 16, k, blocks,
                                        x.stride(0), act.stride(0), BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=8,
                                        SORTED=True, HALF=True)
    written = ~torch.isnan(act).any(dim=1)
    assert written[:48].all() and not written[48:64].any() and written[64:96].all()


def test_half_tail_needs_the_sorted_joint_tma_path():
    with pytest.raises(ValueError, match="half_tail needs joint=True"):
        MoeTiles(128, 128, 64, 8, 4, tma=True, half_tail="both")
    with pytest.raises(ValueError, match="block_m >= 32"):
        MoeTiles(16, 16, 16, 4, 1, tma=True, joint=True, sorted_act=True, half_tail="up")
    with pytest.raises(ValueError, match="is not one of"):
        MoeTiles(128, 128, 64, 8, 4, tma=True, joint=True, sorted_act=True, half_tail="down")
    plan = MoeTiles(128, 128, 64, 8, 4, tma=True, joint=True, sorted_act=True, half_tail="both")
    assert plan.down().half_tail == "both"
