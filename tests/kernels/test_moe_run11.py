"""Runs 11-12's direct-path launches with their K loops unrolled (DirectTiles.down_wide over N, up_wide over H),
in the Triton interpreter against the float32 per-expert loop, and the rounds' candidate lists."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import fused_moe
from kernels.moe_direct import DirectTiles, down_direct, gate_up_direct
from kernels.moe_plans import (
    RUN11_DOWN,
    RUN12_UP,
    known_plans,
    plan_key,
    run6_engine_tiles,
    run11_best,
    run11_candidates,
    run12_candidates,
)
from kernels.moe_reference import fused_moe_ref, route_ref
from tests.kernels.helpers import SETTINGS, assert_close

WIDE = DirectTiles(16, 16, 4, 16, 4, down_wide=True)


def _weights(g, e, h, n):
    return torch.randn(e, 2 * n, h, generator=g) / h**0.5, torch.randn(e, h, n, generator=g) / n**0.5


@settings(max_examples=12, **SETTINGS)
@given(t=st.integers(1, 5), e=st.integers(2, 10), k=st.integers(1, 4), h=st.sampled_from([8, 20]),
       n=st.sampled_from([16, 24, 40]), block_k=st.sampled_from([8, 16, 32]), seed=st.integers(0, 10**6))
def test_wide_down_equals_the_per_expert_loop(t, e, k, h, n, block_k, seed):
    """n = 24, 40 against block_k 16, 32: a last unrolled step partly (or, n = 40 at 32, mostly) masked;
    k = 3: a masked expert slot of the [next_pow2(k), BLOCK_N, BLOCK_K] tile; h = 20: a partial column tile."""
    k = min(k, e)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13, w2 = _weights(g, e, h, n)
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=bool(seed % 2))
    plan = dataclasses.replace(WIDE, down_block_k=block_k)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), fused_moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_wide_down_equals_the_plain_down_launch_on_the_same_activations():
    """The two down launches differ only in how they walk K: on one set of activations their outputs agree
    to float32 rounding (a wrong step count or offset would miss whole K slices)."""
    g = torch.Generator().manual_seed(3)
    t, e, k, h, n = 3, 6, 3, 24, 40
    x = torch.randn(t, h, generator=g)
    w13, w2 = _weights(g, e, h, n)
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=True)
    act = gate_up_direct(x, w13, ids, WIDE)
    wide = down_direct(act, w2, weights, ids, WIDE)
    plain = down_direct(act, w2, weights, ids, dataclasses.replace(WIDE, down_wide=False))
    torch.testing.assert_close(wide, plain, rtol=1e-5, atol=1e-5)
    # and the sum by hand: token 0's output is its experts' down rows times their activations, weighted
    by_hand = sum(weights[0, j] * (w2[ids[0, j]] @ act[j]) for j in range(k))
    torch.testing.assert_close(wide[0], by_hand, rtol=1e-5, atol=1e-5)


def test_run11_candidates_are_the_then_engines_direct_plan_with_each_wide_down():
    for t in (1, 2, 4):
        base = run6_engine_tiles(t, 8, 128)
        plans = run11_candidates(t, 8, 128)
        assert len(plans) == len(RUN11_DOWN) and all(p.down_wide for p in plans)
        assert all(dataclasses.replace(p, down_wide=False, down_block_n=base.down_block_n, down_block_k=base.down_block_k,
                                       down_num_warps=base.down_num_warps) == base for p in plans)
        keys = [plan_key(p) for p in plans]
        assert len(set(keys)) == len(keys) and all(key.endswith("wide") for key in keys)
        assert set(keys) <= set(known_plans())
    assert run11_candidates(64, 8, 128) == []  # the plan there is a grouped one


@settings(max_examples=10, **SETTINGS)
@given(t=st.integers(1, 4), e=st.integers(2, 8), k=st.integers(1, 3), h=st.sampled_from([16, 20, 40]),
       n=st.sampled_from([16, 24]), block_k=st.sampled_from([8, 16, 32]), seed=st.integers(0, 10**6))
def test_wide_gate_up_equals_the_per_expert_loop(t, e, k, h, n, block_k, seed):
    """h = 20, 40 against block_k 16, 32: gate+up's last unrolled step partly masked; block_k 32 > h = 20: one
    step, mostly masked."""
    k = min(k, e)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13, w2 = _weights(g, e, h, n)
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=True)
    plan = dataclasses.replace(WIDE, block_n=8, block_k=block_k, up_wide=True)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), fused_moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_run12_candidates_are_run11s_best_alone_then_with_each_wide_gate_up():
    for t in (1, 2, 4):
        base = run11_best(t, 8, 128)
        assert base.down_wide and not base.up_wide
        plans = run12_candidates(t, 8, 128)
        assert plans[0] == base and len(plans) == 1 + len(RUN12_UP)
        assert [(p.block_n, p.block_k, p.num_warps) for p in plans[1:]] == RUN12_UP
        assert all(p.up_wide and dataclasses.replace(p, up_wide=False, block_n=base.block_n, block_k=base.block_k,
                                                     num_warps=base.num_warps) == base for p in plans[1:])
        assert {plan_key(p) for p in plans} <= set(known_plans())
    assert run11_best(1, 8, 128).down_block_n == 8 and run11_best(4, 8, 128).down_block_n == 2
    assert run12_candidates(64, 8, 128) == []
