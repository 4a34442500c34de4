"""Run 16's prefill plans (two programs a SM for the down launch, adopted from T = 1024; the two-a-SM gate+up
launches measured and not adopted): the candidate table and the engine's adopted plan against the float32
per-expert loop in the Triton interpreter at two programs a "SM"."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import MoeTiles, fused_moe
from kernels.moe_plans import (
    RUN16_BEST,
    plan_key,
    run12_engine_tiles,
    run16_candidates,
    run16b_candidates,
)
from tests.kernels.helpers import SETTINGS, assert_close, moe_layer, moe_ref


@settings(max_examples=6, **SETTINGS)
@given(t=st.integers(1, 40), e=st.integers(1, 12), k=st.integers(1, 4), n=st.sampled_from([16, 20, 48]),
       seed=st.integers(0, 10**6))
def test_two_down_programs_a_sm_at_their_own_tile_equal_the_per_expert_loop(t, e, k, n, seed):
    """Run 16's plan shape scaled down: the down launch at its own narrower tile, 4 warps and two programs a
    "SM" (the interpreter counts 2, so 4 programs loop over the tiles), beside the gate+up launch at one a SM."""
    k = min(k, e)
    x, w13, w2, weights, ids = moe_layer(seed, t, e, k, 32, n)
    plan = MoeTiles(16, 32, 16, 4, 1, tma=True, joint=True, align="hist", ksum="triton", sorted_act=True,
                    persistent=2, up_persistent=1, down_block_n=16, down_num_warps=4, down_num_stages=2)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_the_adopted_plan_changes_only_the_down_launch():
    """RUN16_BEST from T = 1024 is run 12's plan with run 16's down launch; the confirming round times run 12's
    plan and two more down tiles beside it."""
    for t in (1024, 4096):
        old, new = run12_engine_tiles(t, 8, 128), RUN16_BEST[t]
        assert dataclasses.replace(new, down_block_n=old.down_block_n, down_num_warps=old.down_num_warps,
                                   down_num_stages=old.down_num_stages, persistent=old.persistent) == old
    plans = run16b_candidates(4096, 8, 128)
    assert plans[0] == run12_engine_tiles(4096, 8, 128) and len({plan_key(p) for p in plans}) == 3


def test_run16_candidates_halve_the_tiles_and_run_two_programs_a_sm():
    """Run 16 at a prefill size: six plans, each the engine's with 128-wide down tiles and two down programs a
    SM, or 64-wide joint gate+up tiles (a 128 x 128 accumulator) and two gate+up programs a SM, or both; the
    rest of the engine's plan unchanged; none at decode sizes."""
    base = run12_engine_tiles(4096, 8, 128)
    plans = run16_candidates(4096, 8, 128)
    assert len(plans) == 6 and len({plan_key(p) for p in plans} | {plan_key(base)}) == 7
    for p in plans:
        down = p.persistent == 2
        up = p.up_persistent == 2
        assert down or up
        assert (p.down().block_n, p.block_n) == ((128 if down else 256), (64 if up else 128))
        assert (p.sorted_act, p.joint, p.tma, p.align, p.ksum) == (True, True, True, base.align, base.ksum)
    assert run16_candidates(4, 8, 128) == []



def test_run22_offers_the_prefill_plan_only_where_the_rule_runs_the_atomic_tile():
    """Run 22's round: the engine's T = 1024 plan where the nearest-in-log2 rule runs run 6's T = 256 plan
    (256 < T < 479 since run 22's adoption), nothing elsewhere and nothing for mixtral's 8 experts; the rule
    runs the prefill plan from T = 479 (the log2 midpoint of 448 and 512) and the atomic tile below."""
    from kernels.moe_plans import RUN22_BEST, engine_tiles, run22_candidates

    for t in (288, 384, 448, 478):
        assert run22_candidates(t, 8, 128) == [RUN16_BEST[1024]]
        assert engine_tiles(t, 8, 128) == RUN16_BEST[256] == RUN22_BEST[448]
    for t in (480, 512, 724):
        assert engine_tiles(t, 8, 128) == RUN16_BEST[1024] == RUN22_BEST[512]
    assert [run22_candidates(t, 8, 128) for t in (256, 480, 512, 768, 4096)] == [[], [], [], [], []]
    assert run22_candidates(384, 2, 8) == []
