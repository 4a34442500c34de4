"""Run 13: prefill's gate+up and down as one persistent launch (kernels/moe_persistent.py), in the
interpreter (one program, so a wait never spins; the counts are asserted before each down tile) against
the float32 per-expert loop. The GPU check (benchmarks/kernels/check_one_launch.py) compares it with the
two launches bit for bit under a soak."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import MoeTiles, fused_moe
from kernels.moe_persistent import SYNC_MODES
from kernels.moe_plans import plan_key
from tests.kernels.helpers import SETTINGS, assert_close, moe_layer, moe_ref

SMALL = MoeTiles(16, 16, 16, 4, 1, tma=True, joint=True, align="hist", ksum="triton", sorted_act=True, persistent=1,
                 up_persistent=1, one_launch="delayed-all", down_block_n=16, down_block_k=16)


@settings(max_examples=10, **SETTINGS)
@given(t=st.integers(1, 40), e=st.integers(1, 12), k=st.integers(1, 4), h=st.sampled_from([16, 32, 48]),
       n=st.sampled_from([16, 20, 48]), group_m=st.sampled_from([1, 2, 8]), sync=st.sampled_from(SYNC_MODES),
       seed=st.integers(0, 10**6))
def test_one_launch_equals_the_per_expert_loop(t, e, k, h, n, group_m, sync, seed):
    """Blocks past the used ones, experts with no tokens, N = 20 (a partial last K step, padded by TMA),
    H tiles of 16 over H = 48 (three down tiles a block), each way of synchronising."""
    k = min(k, e)
    x, w13, w2, weights, ids = moe_layer(seed, t, e, k, h, n)
    plan = dataclasses.replace(SMALL, group_m=group_m, one_launch=sync)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_one_launch_in_bfloat16_and_with_one_crowded_expert():
    x, w13, w2, weights, ids = moe_layer(13, 23, 8, 4, 32, 48, torch.bfloat16)
    assert_close(fused_moe(x, w13, w2, weights, ids, SMALL), moe_ref(x, w13, w2, weights, ids), torch.bfloat16)
    x, w13, w2, weights, _ids = moe_layer(12, 23, 8, 4, 32, 48)
    same = torch.tensor([3, 5, 0, 1]).expand(23, 4).contiguous()
    assert_close(fused_moe(x, w13, w2, weights, same, SMALL), moe_ref(x, w13, w2, weights, same), torch.float32)


def test_plan_key_names_the_one_launch_and_a_bad_mode_is_refused():
    assert plan_key(SMALL).endswith("upersist1 onelaunch-delayed-all hist ksum-triton")
    assert "onelaunch" not in plan_key(dataclasses.replace(SMALL, one_launch=""))
    x, w13, w2, weights, ids = moe_layer(1, 4, 4, 2, 16, 16)
    with pytest.raises(ValueError, match="one_launch: 'eager' is not one of"):
        fused_moe(x, w13, w2, weights, ids, dataclasses.replace(SMALL, one_launch="eager"))
