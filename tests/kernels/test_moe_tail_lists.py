"""Run 8's tail lists in the Triton interpreter: `kernels.moe_align.block_lists` (the used blocks split
into full ones and half ones, whose second half is padding) against its torch reference, and the
`MoeTiles.tail_list` plans (gate+up, and with "both" down, as one launch over each list with one tile
shape) against the float32 per-expert loop; by hand, which activation rows each gate+up launch writes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import fused_moe as fm
from kernels.fused_moe import MoeTiles, align_by_expert, fused_moe, moe_sum
from kernels.moe_align import block_lists, block_lists_torch
from tests.kernels.helpers import SETTINGS, assert_close, moe_layer, moe_ref

_TAIL = MoeTiles(32, 16, 16, 4, 1, tma=True, joint=True, align="hist", ksum="triton", sorted_act=True,
                 persistent=1, up_persistent=1, tail_list="both")


def _routing(t: int, e: int, k: int, few: int, seed: int) -> torch.Tensor:
    """[t, k] distinct experts a token; with `few` > 0 every token on the first `few` + k experts of
    a random order only (crowded experts, the others empty)."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randperm(e, generator=g)[:min(e, few + k)] if few else torch.arange(e)
    return torch.stack([pool[torch.randperm(pool.numel(), generator=g)[:k]] for _ in range(t)])


@settings(max_examples=12, **SETTINGS)
@given(t=st.integers(1, 200), e=st.integers(1, 16), k=st.integers(1, 3), block_m=st.sampled_from([16, 32]),
       few=st.sampled_from([0, 0, 1, 2]), chunk=st.sampled_from([None, 16]), seed=st.integers(0, 10**6))
def test_block_lists_equal_the_torch_reference(t, e, k, block_m, few, chunk, seed):
    """Both counts, the full list from lists[2] up, the half list from the end down; one chunk of
    blocks or several (chunk 16); routing spread or crowded onto few experts (the rest with no rows)."""
    k = min(k, e)
    ids = _routing(t, e, k, few, seed)
    sorted_ids, block_expert = align_by_expert(ids, e, block_m, method="hist")
    got = block_lists(sorted_ids, block_expert, t * k, block_m, chunk=chunk)
    ref = block_lists_torch(sorted_ids, block_expert, t * k, block_m)
    n_full, n_half, blocks = int(ref[0]), int(ref[1]), block_expert.numel()
    assert got[:2].tolist() == [n_full, n_half]
    assert n_full + n_half == int((block_expert >= 0).sum())
    assert got[2:2 + n_full].tolist() == ref[2:2 + n_full].tolist()
    assert got[2 + blocks - n_half:].tolist() == ref[2 + blocks - n_half:].tolist()


def test_block_lists_by_hand():
    """Expert 0: 40 pairs (a full 32-row block, then one of 8 rows: half), expert 1: 20 (more than half
    full): full blocks 0 and 2, half block 1 in the last entry."""
    ids = _forty_and_twenty()
    sorted_ids, block_expert = align_by_expert(ids, 2, 32, method="hist")
    lists = block_lists(sorted_ids, block_expert, ids.numel(), 32)
    blocks = block_expert.numel()
    assert lists[:4].tolist() == [2, 1, 0, 2] and lists[blocks + 1] == 1
    assert block_lists_torch(sorted_ids, block_expert, ids.numel(), 32)[:4].tolist() == [2, 1, 0, 2]


def _forty_and_twenty() -> torch.Tensor:
    """30 tokens, k = 2: 40 pairs on expert 0 (tokens 20-29 send both there), 20 on expert 1."""
    ids = torch.cat([torch.zeros(30, 1, dtype=torch.int64), torch.ones(30, 1, dtype=torch.int64)], 1)
    ids[20:, 1] = 0
    return ids


@pytest.mark.parametrize("tail", ["up", "both"])
@settings(max_examples=10, **SETTINGS)
@given(t=st.integers(1, 48), e=st.integers(1, 8), k=st.integers(1, 3), n=st.sampled_from([16, 20]),
       persistent=st.sampled_from([1, 3]), atomic=st.booleans(), few=st.sampled_from([0, 1, 2]),
       seed=st.integers(0, 10**6))
def test_tail_list_plans_equal_the_per_expert_loop(tail, t, e, k, n, persistent, atomic, few, seed):
    """32-row blocks (16-row half tiles): experts with 1-16 rows (a half block), 17-32 (a full one), more
    (full blocks then a half or full one) and none (routing spread, or crowded onto few experts); 1 or
    3 programs per "SM" (the interpreter has 2) looping over each list; the k-sum by launch or by
    atomics; the half tile in gate+up only ("up": the down launch's full tile reads unwritten rows,
    which it must not store) or in both."""
    k = min(k, e)
    x, w13, w2, weights, _ids = moe_layer(seed, t, e, k, 32, n)
    ids = _routing(t, e, k, few, seed)
    plan = dataclasses.replace(_TAIL, persistent=persistent, up_persistent=persistent, atomic_sum=atomic,
                               tail_list=tail)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_tail_lists_in_bfloat16_with_a_crowded_expert():
    """Every token on experts 3 and 5 (two full blocks and a half one each at T = 40, k = 2), then random
    routing, bfloat16, "both" and "up"."""
    x, w13, w2, weights, _ids = moe_layer(5, 40, 8, 2, 32, 48, torch.bfloat16)
    same = torch.tensor([3, 5]).expand(40, 2).contiguous()
    assert_close(fused_moe(x, w13, w2, weights, same, _TAIL), moe_ref(x, w13, w2, weights, same), torch.bfloat16)
    _x, _w13, _w2, weights, ids = moe_layer(6, 40, 8, 2, 32, 48)
    up = dataclasses.replace(_TAIL, tail_list="up", persistent=3, up_persistent=3)
    assert_close(fused_moe(x, w13, w2, weights, ids, up), moe_ref(x, w13, w2, weights, ids), torch.bfloat16)


def _list_launch(x, w13, act, sorted_ids, block_expert, lists, k, half: bool) -> None:
    """One of _gate_up_lists' two launches, as it makes them (2 programs: each loops over tiles)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    e, n2, h = w13.shape
    desc = TensorDescriptor.from_tensor(w13.view(e, 2, n2 // 2, h), [1, 2, 16, 16])
    fm._gate_up_joint_list_kernel[(2,)](x, desc, act, sorted_ids, block_expert, lists, x.shape[0] * k, h, n2 // 2, k,
                                        block_expert.numel(), x.stride(0), act.stride(0), BLOCK_M=32, BLOCK_N=16,
                                        BLOCK_K=16, GROUP_M=8, ROWS=16 if half else 32, HALF_LIST=half, FLATTEN=True)


def test_the_list_launches_write_the_full_blocks_and_the_first_half_of_the_half_block():
    """_forty_and_twenty's blocks [0, 0, 1]: the full-list launch writes rows 0-31 and 64-95 only, the
    half-list launch rows 32-47 only (rows 48-63, the half block's padding half, stay unwritten)."""
    t, k, e = 30, 2, 2
    ids = _forty_and_twenty()
    x, w13, _w2, _weights, _ = moe_layer(7, t, e, k, 32, 16)
    sorted_ids, block_expert = align_by_expert(ids, e, 32, method="hist")
    lists = block_lists(sorted_ids, block_expert, t * k, 32)
    rows = torch.arange(sorted_ids.numel())
    for half, expect in ((False, (rows < 32) | ((rows >= 64) & (rows < 96))), (True, (rows >= 32) & (rows < 48))):
        act = torch.full((sorted_ids.numel(), 16), float("nan"))
        _list_launch(x, w13, act, sorted_ids, block_expert, lists, k, half)
        assert torch.equal(~torch.isnan(act).any(dim=1), expect), f"half list {half}"


@pytest.mark.parametrize("tail", ["up", "both"])
def test_the_down_launch_ignores_nan_in_the_unwritten_half(tail):
    """The activations start as NaN (what unwritten memory may hold): after the two gate+up list
    launches, the down launch ("up": run 5's full tiles, which read the half block's NaN second half;
    "both": the list launches) still gives the per-expert loop's output."""
    t, k, e = 30, 2, 2
    ids = _forty_and_twenty()
    x, w13, w2, weights, _ = moe_layer(8, t, e, k, 32, 16)
    sorted_ids, block_expert = align_by_expert(ids, e, 32, method="hist")
    lists = block_lists(sorted_ids, block_expert, t * k, 32)
    act = torch.full((sorted_ids.numel(), 16), float("nan"))
    for half in (False, True):
        _list_launch(x, w13, act, sorted_ids, block_expert, lists, k, half)
    plan = dataclasses.replace(_TAIL, block_n=16, tail_list=tail, persistent=1)
    out = moe_sum(fm.down_grouped(act, w2, sorted_ids, block_expert, weights, plan, lists), k)
    assert_close(out, moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_tail_list_needs_the_sorted_joint_tma_persistent_path():
    base = {"tma": True, "joint": True, "sorted_act": True, "up_persistent": 1}
    with pytest.raises(ValueError, match="tail_list needs joint=True"):
        MoeTiles(128, 128, 64, 8, 4, tma=True, sorted_act=True, up_persistent=1, tail_list="up")
    with pytest.raises(ValueError, match="tail_list needs .*block_m >= 32"):
        MoeTiles(16, 16, 16, 4, 1, **base, tail_list="up")
    with pytest.raises(ValueError, match="tail_list needs .*up_persistent"):
        MoeTiles(128, 128, 64, 8, 4, **{**base, "up_persistent": 0}, tail_list="up")
    with pytest.raises(ValueError, match="tail_list 'both' needs persistent"):
        MoeTiles(128, 128, 64, 8, 4, **base, tail_list="both")
    with pytest.raises(ValueError, match="tail_list 'up' and half_tail 'up' exclude"):
        MoeTiles(128, 128, 64, 8, 4, **base, tail_list="up", half_tail="up")
    with pytest.raises(ValueError, match="tail_list 'down' is not one of"):
        MoeTiles(128, 128, 64, 8, 4, **base, tail_list="down")
    plan = MoeTiles(128, 128, 64, 8, 4, **base, persistent=1, tail_list="both")
    assert plan.down().tail_list == "both"
    with pytest.raises(ValueError, match="tail_pdl needs tail_list"):
        MoeTiles(128, 128, 64, 8, 4, **base, tail_pdl=True)
    assert dataclasses.replace(plan, tail_pdl=True).down().tail_pdl


def test_run8_prefill_plans_are_named_one_to_one():
    """propose_rule can take each run 8 prefill plan: its own key among the known plans, the tail flags in it."""
    from kernels.moe_plans import PREFILL_RUN8, known_plans, plan_key, run8_candidates

    keys = [plan_key(p) for p in PREFILL_RUN8]
    assert len(set(keys)) == len(PREFILL_RUN8) and set(keys) <= set(known_plans())
    assert [k.split(" tails-")[1].split()[0] for k in keys] == ["up", "uppdl", "both", "bothpdl"]
    assert run8_candidates(4096, 8, 128)[-len(PREFILL_RUN8):] == PREFILL_RUN8 and not run8_candidates(512, 8, 128)
