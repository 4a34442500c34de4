"""Run 15's warp-specialised prefill launches in the Triton interpreter (which runs the loops as written:
the warp specialisation is the sm90 compiler's, checked on the H200 by repeat_engine_plans.py's check)
against the float32 per-expert loop, and the scalar binary search that finds the used blocks."""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import MoeTiles, _used_blocks_scalar, fused_moe
from kernels.moe_plans import plan_key, run12_engine_tiles, run15_candidates, run16_candidates
from tests.kernels.helpers import SETTINGS, assert_close, moe_layer, moe_ref


@triton.jit
def _used_probe(bexp_ptr, out_ptr, num_blocks, NB_LOG: tl.constexpr):
    tl.store(out_ptr, _used_blocks_scalar(bexp_ptr, num_blocks, NB_LOG))


@settings(max_examples=25, **SETTINGS)
@given(num_blocks=st.integers(0, 70), data=st.data())
def test_the_binary_search_counts_the_used_prefix(num_blocks, data):
    """block_expert is a prefix of experts >= 0 then -1s: the search returns the prefix's length for every
    length from 0 to num_blocks (all used and none used included)."""
    used = data.draw(st.integers(0, num_blocks))
    bexp = torch.full((max(num_blocks, 1),), -1, dtype=torch.int32)
    bexp[:used] = torch.randint(0, 9, (used,), dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    _used_probe[(1,)](bexp, out, num_blocks, NB_LOG=max(num_blocks, 1).bit_length())
    assert int(out) == used


@settings(max_examples=8, **SETTINGS)
@given(t=st.integers(1, 40), e=st.integers(1, 12), k=st.integers(1, 4), n=st.sampled_from([16, 20, 48]),
       down_ws=st.booleans(), seed=st.integers(0, 10**6))
def test_warp_specialised_launches_equal_the_per_expert_loop(t, e, k, n, down_ws, seed):
    """gate+up on the gathered x (up_ws) with the down launch either warp-specialised or not, and the down
    launch alone warp-specialised: N = 20 ends in a partial K step (the TMA box pads it with zeros),
    experts without tokens leave unused blocks at the end."""
    k = min(k, e)
    x, w13, w2, weights, ids = moe_layer(seed, t, e, k, 32, n)
    base = MoeTiles(16, 16, 16, 4, 1, tma=True, joint=True, align="hist", ksum="triton", sorted_act=True,
                    persistent=1, up_persistent=1)
    ref = moe_ref(x, w13, w2, weights, ids)
    for plan in (dataclasses.replace(base, down_ws=True), dataclasses.replace(base, up_ws=True, down_ws=down_ws)):
        assert_close(fused_moe(x, w13, w2, weights, ids, plan), ref, torch.float32)


def test_run15_candidates_are_the_engine_plan_with_each_launch_specialised():
    """At prefill sizes the round holds the engine's plan with the down launch specialised (down stages 4
    and 3) and with gate+up on the gathered x as well; none at decode sizes; every key is new."""
    plans = run15_candidates(4096, 8, 128)
    base = run12_engine_tiles(4096, 8, 128)
    assert [p.down_ws for p in plans] == [True, True, True, False]
    assert [p.up_ws for p in plans] == [False, False, True, True]
    assert {p.down_num_stages for p in plans if not p.up_ws} == {3, 4}
    assert len({plan_key(p) for p in plans} | {plan_key(base)}) == len(plans) + 1
    assert run15_candidates(4, 8, 128) == []


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
