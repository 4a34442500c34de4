"""Run 5's fused-MoE prefill candidates in the Triton interpreter against the float32 per-expert loop
(kernels/moe_reference.py): the activations in sorted order with the TMA-fed down launch (one tile a
program or persistent, with the torch/Triton k-sum or the atomic one); runs 5 and 6's plan tables and
the engine's rule."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import MoeTiles, align_by_expert, fused_moe, gate_up_grouped
from kernels.moe_plans import (
    DIRECT_RUN6,
    PREFILL_RUN5,
    PREFILL_RUN6,
    PROPOSED_RULE,
    RUN5_BEST,
    known_plans,
    plan_key,
    run4_best,
    run5_best,
    run6_candidates,
)
from tests.kernels.helpers import SETTINGS, assert_close, interpreter_distinct, moe_layer, moe_ref


@settings(max_examples=12, **SETTINGS)
@given(t=st.integers(1, 40), e=st.integers(1, 12), k=st.integers(1, 4), h=st.sampled_from([16, 32]),
       n=st.sampled_from([16, 20, 48]), persistent=st.sampled_from([0, 1, 3]), atomic=st.booleans(),
       joint=st.booleans(), ksum=st.sampled_from(["torch", "triton"]), seed=st.integers(0, 10**6))
def test_sorted_activations_equal_the_per_expert_loop(t, e, k, h, n, persistent, atomic, joint, ksum, seed):
    """T from 1 (one pair per expert at most) to 40 (not a multiple of the 16-row blocks), E up to 12 with
    k <= 4 (experts with no tokens), N = 20 (a partial last K step the TMA box pads with zeros); the
    persistent grids (down, and the joint gate+up) are 1 or 3 programs per "SM" (the interpreter counts
    2), so programs loop over tiles."""
    k = min(k, e)
    x, w13, w2, weights, ids = moe_layer(seed, t, e, k, h, n)
    plan = MoeTiles(16, 16, 16, 4, 1, tma=True, joint=joint, align="hist", ksum=ksum, atomic_sum=atomic,
                    sorted_act=True, persistent=persistent, up_persistent=persistent)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_sorted_activations_sit_at_the_sorted_rows_and_padding_rows_are_zero():
    """gate+up with sorted_act: row i of [P, N] is pair sorted_ids[i]'s activation row (as the pair-order
    launch gives it), the padding rows of used blocks exact zeros."""
    x, w13, _w2, _weights, ids = moe_layer(3, 9, 5, 2, 32, 48)
    sorted_ids, block_expert = align_by_expert(ids, 5, 16, method="hist")
    plain = MoeTiles(16, 16, 16, 4, 1, tma=True, joint=True)
    by_pair = gate_up_grouped(x, w13, sorted_ids, block_expert, 2, plain)
    by_row = gate_up_grouped(x, w13, sorted_ids, block_expert, 2, dataclasses.replace(plain, sorted_act=True))
    assert by_row.shape == (sorted_ids.numel(), 48)
    used = torch.repeat_interleave(block_expert >= 0, 16)
    real = used & (sorted_ids < 18)
    assert torch.equal(by_row[real], by_pair[sorted_ids[real].long()])
    assert torch.equal(by_row[used & ~real], torch.zeros_like(by_row[used & ~real]))


def _shrunk(plan):
    """A prefill plan's code paths at tiles the interpreter runs in about a second."""
    return dataclasses.replace(plan, block_m=16, block_n=16, block_k=16, num_stages=1, down_block_n=16,
                               down_block_k=16, down_num_stages=1)


# runs 5 and 6's prefill plans, one test per distinct shrunk plan (tile sizes and stages are the same there)
SMALL_PREFILL = interpreter_distinct([_shrunk(p) for p in PREFILL_RUN5 + PREFILL_RUN6])


@pytest.mark.parametrize("small", SMALL_PREFILL, ids=plan_key)
def test_prefill_run5_plans_at_small_tiles(small):
    """Each prefill candidate's fields with the tiles shrunk for the interpreter, random routing and every
    token on the same two experts (one crowded expert, the rest empty), float32 and bfloat16."""
    x, w13, w2, weights, ids = moe_layer(12, 23, 8, 4, 32, 48)
    same = torch.tensor([3, 5, 0, 1]).expand(23, 4).contiguous()
    for routing in (ids, same):
        assert_close(fused_moe(x, w13, w2, weights, routing, small), moe_ref(x, w13, w2, weights, routing), torch.float32)
    xb, w13b, w2b, weights, ids = moe_layer(13, 23, 8, 4, 32, 48, torch.bfloat16)
    assert_close(fused_moe(xb, w13b, w2b, weights, ids, small), moe_ref(xb, w13b, w2b, weights, ids), torch.bfloat16)


def test_run5_prefill_plans_and_baseline():
    """Run 5's prefill plans vary run 4's joint TMA plan, each named one to one; their baseline is run 4's
    measured best at the nearest T."""
    assert run4_best(1) is PROPOSED_RULE[1] and run4_best(3000) is PROPOSED_RULE[4096]
    assert all(p.joint and p.tma for p in PREFILL_RUN5)
    assert len({plan_key(p) for p in PREFILL_RUN5}) == len(PREFILL_RUN5)
    assert all(plan_key(p) in known_plans() for p in PREFILL_RUN5)


def test_run6_candidates_and_baseline_by_step_size():
    """Run 6: direct variants up to 16 pairs (T = 1, 2), prefill variants from 64 rows per expert; the
    baseline is run 5's best (its sorted persistent plan at T = 1024 and 4096, run 4's elsewhere)."""
    assert run6_candidates(1, 8, 128) == DIRECT_RUN6 and run6_candidates(2, 8, 128) == DIRECT_RUN6
    assert run6_candidates(4, 8, 128) == [] and run6_candidates(4096, 8, 128) == PREFILL_RUN6
    assert run5_best(1) is PROPOSED_RULE[1] and run5_best(4096) is RUN5_BEST[4096]
    assert RUN5_BEST[4096].sorted_act and RUN5_BEST[4096].persistent == 1 and RUN5_BEST[4096].down_num_stages == 4
    assert all(p.up_persistent or p.group_m != 8 for p in PREFILL_RUN6)
    keys = {plan_key(p) for p in DIRECT_RUN6 + PREFILL_RUN6}
    assert len(keys) == len(DIRECT_RUN6) + len(PREFILL_RUN6) and keys <= set(known_plans())


def test_engine_runs_run12s_rule_with_32_experts_and_run2s_tiles_below():
    """The engine's plan (kernels.backend's Triton fused_moe): 32+ experts the measured rule of the
    nearest T in log2 (run 6's plans, run 12's at T = 1-4, run 16's down launch from T = 1024), fewer run 2's tiles (mixtral's profile was calibrated
    on them); and its output equals the float32 per-expert loop on each path the rule takes at E = 32."""
    from kernels.fused_moe import run2_tiles
    from kernels.moe_plans import (
        RUN6_BEST,
        RUN12_BEST,
        RUN16_BEST,
        engine_fused_moe,
        engine_tiles,
        run6_engine_tiles,
        run12_engine_tiles,
    )

    assert engine_tiles(1, 8, 128) is RUN12_BEST[1] and engine_tiles(3000, 8, 128) is RUN16_BEST[4096]
    assert engine_tiles(600, 8, 128) is RUN16_BEST[1024] and engine_tiles(12, 8, 32) is RUN6_BEST[16]
    assert engine_tiles(3, 8, 128) is RUN12_BEST[4] and engine_tiles(6, 8, 128) is RUN6_BEST[8]
    assert all(RUN12_BEST[t].up_wide and RUN12_BEST[t].down_wide for t in (1, 2, 4))
    assert run6_engine_tiles(1, 8, 128) is RUN6_BEST[1] and run12_engine_tiles(4096, 8, 128) is RUN6_BEST[4096]
    assert RUN16_BEST[4096].persistent == 2 and RUN16_BEST[4096].down().block_n == 128
    assert RUN16_BEST[4096].down().num_warps == 4 and RUN16_BEST[4096].block_n == RUN6_BEST[4096].block_n
    assert all(engine_tiles(t, 2, 8) == run2_tiles(t, 2, 8) for t in (1, 7, 64, 4096))
    assert RUN6_BEST[4096].up_persistent == 1 and RUN6_BEST[1].down_block_n == 16
    paths = set()
    for t in (1, 5, 16, 300):
        x, w13, w2, weights, ids = moe_layer(40 + t, t, 32, 8, 64, 32)
        paths.add(type(engine_tiles(t, 8, 32)).__name__)
        assert_close(engine_fused_moe(x, w13, w2, weights, ids), moe_ref(x, w13, w2, weights, ids), torch.float32)
    assert paths == {"DirectTiles", "MoeTiles"}
