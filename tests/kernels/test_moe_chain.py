"""Run 8's chained down (`DirectTiles.chain`) in the Triton interpreter: each (pair, N tile) program
stores its tile's share of the pair's down projection, a second launch sums each token's shares.
Checked against the float32 per-expert loop."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import moe_direct as md
from kernels.fused_moe import fused_moe
from kernels.moe_direct import DirectTiles
from tests.kernels.helpers import SETTINGS, assert_close, moe_layer, moe_ref

_CHAIN = DirectTiles(16, 16, 16, 8, 4, 2, pdl=True, pipeline=True, chain=True)


@settings(max_examples=12, **SETTINGS)
@given(t=st.integers(1, 6), e=st.integers(1, 12), k=st.integers(1, 4), h=st.sampled_from([32, 40]),
       n=st.sampled_from([16, 20, 48]), block_n=st.sampled_from([8, 16]), block_k=st.sampled_from([16, 32]),
       block_h=st.sampled_from([8, 16]), sum_h=st.sampled_from([16, 32]), seed=st.integers(0, 10**6))
def test_chain_equals_the_per_expert_loop(t, e, k, h, n, block_n, block_k, block_h, sum_h, seed):
    """Tiles that divide N and H or not (N 20, H 40: masked columns and rows), tokens that share an
    expert, and a token's partial rows (k * N / block_n: 1 to 24) in up to three sum steps of 8."""
    k = min(k, e)
    x, w13, w2, weights, ids = moe_layer(seed, t, e, k, h, n)
    plan = dataclasses.replace(_CHAIN, block_n=block_n, block_k=block_k, down_block_k=block_h, down_block_n=sum_h)
    with mock.patch.object(md, "CHAIN_SUM_ROWS", 8):
        out = fused_moe(x, w13, w2, weights, ids, plan)
    assert_close(out, moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_chain_in_bfloat16_with_every_token_on_one_expert(monkeypatch):
    """bfloat16 weights, every token's pairs on experts 3 and 5, and a sum step of 4 rows (a token's 2 * 48 / 16
    = 6 partial rows take two steps, the second masked)."""
    monkeypatch.setattr(md, "CHAIN_SUM_ROWS", 4)
    x, w13, w2, weights, _ = moe_layer(3, 4, 8, 2, 32, 48, torch.bfloat16)
    same = torch.tensor([3, 5]).expand(4, 2).contiguous()
    assert_close(fused_moe(x, w13, w2, weights, same, _CHAIN), moe_ref(x, w13, w2, weights, same), torch.bfloat16)


def test_chain_by_hand():
    """One token, one expert, H = N = 1 (the tiles mask the rest): gate 2 * x, up 3 * x, down 5 * act, routing
    weight 0.5: out = 0.5 * 5 * SiLU(2 x) * 3 x."""
    x = torch.tensor([[1.5]])
    w13 = torch.tensor([[[2.0]], [[3.0]]]).reshape(1, 2, 1)
    w2 = torch.tensor([[[5.0]]])
    out = fused_moe(x, w13, w2, torch.tensor([[0.5]]), torch.tensor([[0]]), _CHAIN)
    g = 2 * 1.5
    assert out.item() == pytest.approx(0.5 * 5 * g / (1 + torch.exp(torch.tensor(-g)).item()) * 3 * 1.5, rel=1e-6)


def test_run8_plans_are_named_one_to_one_and_each_equals_the_loop():
    """Every run 8 candidate has its own key among the known plans (propose_rule can take it) and, at T = 1
    and 4 on a 128-wide layer (tiles wider than N = 48 masked), equals the float32 loop."""
    from kernels.moe_plans import DIRECT_RUN8, known_plans, plan_key, run8_candidates
    from tests.kernels.helpers import interpreter_distinct

    keys = {plan_key(p) for p in DIRECT_RUN8}
    assert len(keys) == len(DIRECT_RUN8) and keys <= set(known_plans())
    assert run8_candidates(4, 8, 128) == DIRECT_RUN8 and run8_candidates(5, 8, 128) == []
    for plan in interpreter_distinct(DIRECT_RUN8):
        for t in (1, 4):
            x, w13, w2, weights, ids = moe_layer(t, t, 6, 2, 128, 48)
            assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.float32)
