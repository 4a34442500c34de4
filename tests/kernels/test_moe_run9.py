"""Run 9's one-step variants of the engine's plans: named one to one (propose_rule can take them), offered at
the step sizes they are for, and the decode ones equal to the float32 loop in the interpreter (the prefill
ones change only tile sizes, stages and the grouped order of code paths tests/kernels/test_moe_run5.py
covers)."""

from __future__ import annotations

import torch

from kernels.fused_moe import fused_moe
from kernels.moe_plans import (
    DIRECT_RUN9,
    PREFILL_RUN9,
    RUN6_BEST,
    known_plans,
    plan_key,
    run9_candidates,
)
from tests.kernels.helpers import assert_close, interpreter_distinct, moe_layer, moe_ref


def test_run9_plans_are_named_one_to_one_and_offered_where_meant():
    keys = {plan_key(p) for p in DIRECT_RUN9 + PREFILL_RUN9}
    assert len(keys) == len(DIRECT_RUN9) + len(PREFILL_RUN9) and keys <= set(known_plans())
    assert plan_key(RUN6_BEST[1]) not in keys and plan_key(RUN6_BEST[4096]) not in keys  # variants, not the plans
    assert run9_candidates(1, 8, 128) == DIRECT_RUN9 and run9_candidates(2, 8, 128) == []
    assert run9_candidates(4096, 8, 128) == PREFILL_RUN9 and run9_candidates(512, 8, 128) == []


def test_run9_decode_plans_equal_the_loop():
    x, w13, w2, weights, ids = moe_layer(11, 1, 16, 8, 256, 48)
    for plan in interpreter_distinct(DIRECT_RUN9):
        assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_run10_pipelined_down_plans_equal_the_loop_and_are_named_one_to_one():
    """The down loop pipelined (`down_stages`): its own code path in the kernel (tl.range), at T = 1 and 3 with
    H tiles and K steps that do not divide H and N; each plan a key of its own."""
    from kernels.moe_direct import down_direct, gate_up_direct
    from kernels.moe_plans import DIRECT_RUN10, run10_candidates

    plans = DIRECT_RUN10 + run10_candidates(2, 8, 128)
    keys = {plan_key(p) for p in plans}
    assert len(keys) == len(plans) and keys <= set(known_plans()) and all(" ds" in k for k in keys)
    for t in (1, 3):
        x, w13, w2, weights, ids = moe_layer(20 + t, t, 16, 8, 40, 80)
        ref = moe_ref(x, w13, w2, weights, ids)
        for plan in plans[:3] + plans[3:4]:
            assert_close(fused_moe(x, w13, w2, weights, ids, plan), ref, torch.float32)
        # the down launch alone, pipelined and not, on the same activations: the same sums
        act = gate_up_direct(x, w13, ids, plans[1])
        piped = down_direct(act, w2, weights, ids, plans[1])
        plain = down_direct(act, w2, weights, ids, RUN6_BEST[1])
        torch.testing.assert_close(piped, plain, rtol=1e-6, atol=1e-6)
