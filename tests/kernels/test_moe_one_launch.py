"""Run 13: prefill's gate+up and down as one persistent launch (kernels/moe_persistent.py).

The kernel runs in the interpreter (one program, so no wait ever spins) against the float32 per-expert
loop. Whether a grid can deadlock is checked against an exhaustive replay of the protocol: every
program's events in its order, the next tile's wait before the current tile's signal (the pipelined
loop's look-ahead at its worst), run until no program can move."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.fused_moe import MoeTiles, fused_moe
from kernels.moe_persistent import one_launch_is_safe
from kernels.moe_plans import plan_key
from tests.kernels.helpers import SETTINGS, assert_close, moe_layer, moe_ref

SMALL = MoeTiles(16, 16, 16, 4, 1, tma=True, joint=True, align="hist", ksum="triton", sorted_act=True, persistent=1,
                 up_persistent=1, one_launch=True, down_block_n=16, down_block_k=16)


@settings(max_examples=10, **SETTINGS)
@given(t=st.integers(1, 40), e=st.integers(1, 12), k=st.integers(1, 4), h=st.sampled_from([16, 32, 48]),
       n=st.sampled_from([16, 20, 48]), group_m=st.sampled_from([1, 2, 8]), seed=st.integers(0, 10**6))
def test_one_launch_equals_the_per_expert_loop(t, e, k, h, n, group_m, seed):
    """Blocks past the used ones, experts with no tokens, N = 20 (a partial last K step, padded by TMA),
    H tiles of 16 over H = 48 (three down tiles a block)."""
    k = min(k, e)
    x, w13, w2, weights, ids = moe_layer(seed, t, e, k, h, n)
    plan = dataclasses.replace(SMALL, group_m=group_m)
    assert_close(fused_moe(x, w13, w2, weights, ids, plan), moe_ref(x, w13, w2, weights, ids), torch.float32)


def test_one_launch_in_bfloat16_and_with_one_crowded_expert():
    x, w13, w2, weights, ids = moe_layer(13, 23, 8, 4, 32, 48, torch.bfloat16)
    assert_close(fused_moe(x, w13, w2, weights, ids, SMALL), moe_ref(x, w13, w2, weights, ids), torch.bfloat16)
    x, w13, w2, weights, _ids = moe_layer(12, 23, 8, 4, 32, 48)
    same = torch.tensor([3, 5, 0, 1]).expand(23, 4).contiguous()
    assert_close(fused_moe(x, w13, w2, weights, same, SMALL), moe_ref(x, w13, w2, weights, same), torch.float32)


def test_plan_key_names_the_one_launch():
    assert plan_key(SMALL).endswith("upersist1 onelaunch hist ksum-triton")
    assert "onelaunch" not in plan_key(dataclasses.replace(SMALL, one_launch=False))


def _tile_at(tile: int, blocks: int, tiles_n: int, group_m: int) -> tuple[int, int]:
    """kernels.fused_moe._tile_at in Python."""
    per_group = group_m * tiles_n
    first = (tile // per_group) * group_m
    size = min(blocks - first, group_m)
    return first + (tile % per_group) % size, (tile % per_group) // size


def completes(used: int, tiles_n: int, tiles_h: int, group_m: int, programs: int) -> bool:
    """Replay the one launch's protocol: program p takes global tiles p, p + P, ... (the gate+up tiles,
    then the down tiles); its events are wait(tile 0), then for each tile i: wait(tile i+1) before
    signal(tile i). A wait on a down tile needs every gate+up tile of its block signalled. True when
    every program gets through all its events."""
    up = used * tiles_n
    total = up + used * tiles_h
    need = {}
    for g in range(up):
        need.setdefault(_tile_at(g, used, tiles_n, group_m)[0], set()).add(g)
    events = []
    for p in range(programs):
        mine = list(range(p, total, programs))
        seq = [("wait", mine[0])] if mine else []
        for i, tile in enumerate(mine):
            if i + 1 < len(mine):
                seq.append(("wait", mine[i + 1]))
            seq.append(("signal", tile))
        events.append(seq)
    done, at = set(), [0] * programs
    moved = True
    while moved:
        moved = False
        for p in range(programs):
            while at[p] < len(events[p]):
                kind, tile = events[p][at[p]]
                if kind == "wait" and tile >= up and not need[_tile_at(tile - up, used, tiles_h, group_m)[0]] <= done:
                    break
                if kind == "signal" and tile < up:
                    done.add(tile)
                at[p] += 1
                moved = True
    return all(a == len(s) for a, s in zip(at, events))


@settings(max_examples=60, **SETTINGS)
@given(pairs=st.integers(1, 3000), block_m=st.sampled_from([16, 64, 128]), tiles_n=st.integers(1, 6),
       tiles_h=st.integers(1, 8), group_m=st.sampled_from([1, 2, 8]), programs=st.integers(2, 40))
def test_a_grid_called_safe_completes_for_every_number_of_used_blocks(pairs, block_m, tiles_n, tiles_h, group_m,
                                                                      programs):
    """Every routing of the pairs uses between ceil(pairs / block_m) blocks and that plus one a touched
    expert (here up to 12 more): the replay completes for each wherever `one_launch_is_safe` holds."""
    tiles = MoeTiles(block_m, 64, 64, 8, 1, group_m=group_m, down_block_n=64, down_block_k=64)
    n, h = 64 * tiles_n, 64 * tiles_h
    if not one_launch_is_safe(pairs, tiles, n, h, programs):
        return
    least = -(-pairs // block_m)
    assert all(completes(used, tiles_n, tiles_h, group_m, programs) for used in range(least, least + 13))


def test_the_replay_finds_the_deadlock_the_rule_excludes():
    """A small step on a big grid deadlocks (the guard is needed, and the replay can fail), and the rule
    refuses it; qwen3-30b-a3b's prefill plan at T = 4096 on 132 SMs is safe, at T = 8 it is not."""
    assert not completes(1, 2, 4, 1, 4)
    assert not one_launch_is_safe(8, MoeTiles(128, 128, 64, 8, 4, group_m=8, down_block_n=256, down_block_k=64),
                                  768, 2048, 132)
    plan = MoeTiles(128, 128, 64, 8, 4, group_m=8, down_block_n=256, down_block_k=64, down_num_stages=4)
    assert one_launch_is_safe(4096 * 8, plan, 768, 2048, 132)
    assert not one_launch_is_safe(8 * 8, plan, 768, 2048, 132)
    assert completes(256, 6, 8, 8, 132)


@pytest.mark.parametrize("stages", [13, 40])
def test_more_stages_than_k_steps_is_never_called_safe(stages):
    """The look-ahead then spans more than one tile, which the rule's argument does not cover."""
    plan = MoeTiles(128, 128, 64, 8, stages, group_m=8, down_block_n=256, down_block_k=64)
    assert not one_launch_is_safe(4096 * 8, plan, 768, 2048, 132)
