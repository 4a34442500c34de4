"""Prefill's two grouped GEMMs in one persistent launch (`MoeTiles.one_launch`, run 13).

The engine's prefill plan (run 6) runs gate+up and down as two persistent launches of one program per
SM. Each ends in a part-filled wave: at qwen3-30b-a3b T = 4096, ~1,920 gate+up tiles of ~27 us are
14.5 waves, so in the last one about half the SMs idle for a tile's time (~12 us, 3% of the step), and
the down launch cannot start before the last gate+up tile is stored.

Here one program per SM walks one list of tiles: every gate+up tile, then every down tile, dealt
round-robin (program p takes tiles p, p + P, ...: the down tiles continue the numbering, so a program
with one gate+up tile fewer starts its down tiles a tile earlier). A down tile needs all N tiles of
its block's activations. Each gate+up tile, once stored, adds one count per thread to its block's
ready counter (a release); a down tile first waits until its block's counter is full (an acquire). A
block's down tiles come ~14 waves after its gate+up tiles, so the wait is almost never spun; only
the last gate+up wave's blocks could be, and their down tiles are at the end of the list.

Proxies: gate+up stores its activations through the generic proxy and the down tiles read them
through TMA (the async proxy), so the writer fences (fence.proxy.async) before its release and the
reader after its acquire. Every thread signals and waits for itself: a CTA barrier between a tile's
stores and one release would stop Triton flattening the loop (benchmarks/kernels/MOE.md, run 8).

Liveness: all programs must be resident at once (a waiting program waits on tiles dealt to others),
so the grid is one program per SM and no more; the CPU interpreter runs programs one after another,
so there the grid is one program (which then never waits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.fused_moe import (
    MoeTiles,
    _down_sorted_tile,
    _joint_act,
    _num_sms,
    _store_act,
    _tile_at,
    _used_blocks,
)

SYNC_MODES = ("fenced", "release", "delayed", "delayed-all", "nosync")


@triton.jit
def _signal_ready(ptr, total_ptr, count, PROXY_FENCE: tl.constexpr, TOTAL: tl.constexpr, GPU: tl.constexpr):
    """`count` (0 or 1) at `ptr` (and, with TOTAL, at `total_ptr`) from every thread, released after the
    thread's earlier stores; PROXY_FENCE: a generic-to-async proxy fence first. The interpreter: one count."""
    if GPU:
        if PROXY_FENCE:
            tl.inline_asm_elementwise("fence.proxy.async.global;\n\tmov.u32 $0, 0;", "=r,l", [ptr], dtype=tl.int32,
                                      is_pure=False, pack=1)
        if TOTAL:
            tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.s32 [$1], $3;\n\t"
                                      "red.relaxed.gpu.global.add.s32 [$2], $3;\n\tmov.u32 $0, 0;", "=r,l,l,r",
                                      [ptr, total_ptr, count], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise("red.release.gpu.global.add.s32 [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                      [ptr, count], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.atomic_add(ptr, count, sem="release")
        if TOTAL:
            tl.atomic_add(total_ptr, count, sem="release")


@triton.jit
def _load_acquire(ptr):
    return tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _proxy_fence(v):
    """A generic-to-async proxy fence (the TMA loads after it see what the acquire before it saw)."""
    return tl.inline_asm_elementwise("fence.proxy.async.global;\n\tmov.u32 $0, $1;", "=r,r", [v], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _wait_ready(ptr, target, GPU: tl.constexpr):
    """Spin until the count at `ptr` reaches `target` (acquire), then fence to the async proxy."""
    if GPU:
        seen = _load_acquire(ptr)
        while seen < target:
            seen = _load_acquire(ptr)
        _proxy_fence(seen)
    else:
        tl.device_assert(tl.load(ptr) >= target, "a down tile ran before its block's activations")


@triton.jit
def _wait_ready_or_all(ptr, target, total_ptr, total_target, all_ready, GPU: tl.constexpr):
    """As _wait_ready unless `all_ready`; first reads the count of every gate+up tile: once that is full,
    no later tile of this program waits (returns the new all_ready)."""
    if all_ready == 0:
        if GPU:
            seen_all = _load_acquire(total_ptr)
            if seen_all < total_target:
                seen = _load_acquire(ptr)
                while seen < target:
                    seen = _load_acquire(ptr)
            else:
                all_ready = 1
            _proxy_fence(seen_all)
        else:
            tl.device_assert(tl.load(ptr) >= target, "a down tile ran before its block's activations")
    return all_ready


@triton.jit(do_not_specialize=["num_pairs", "top_k", "num_blocks"])
def _gate_up_down_kernel(x_ptr, w13_desc, act_ptr, act_desc, w2_desc, out_ptr, ids_ptr, bexp_ptr, tw_ptr, ready_ptr,
                         num_pairs, H, N, top_k, num_blocks, sx_t, sa_p, so_p,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                         DOWN_N: tl.constexpr, DOWN_K: tl.constexpr, NB_P2: tl.constexpr, THREADS: tl.constexpr,
                         UP_STAGES: tl.constexpr, DOWN_STAGES: tl.constexpr, SYNC: tl.constexpr, GPU: tl.constexpr):
    used = _used_blocks(bexp_ptr, num_blocks, NB_P2)
    progs = tl.num_programs(0)
    up_tiles = used * tl.cdiv(N, BLOCK_N)
    total_ptr = ready_ptr + num_blocks  # the count of every gate+up tile ("delayed-all")
    delayed: tl.constexpr = SYNC == "delayed" or SYNC == "delayed-all"
    with_total: tl.constexpr = SYNC == "delayed-all"
    prev = 0  # "delayed": the block of this program's previous gate+up tile, signalled before this tile's store
    has_prev = 0
    for tile in tl.range(tl.program_id(0), up_tiles, progs, num_stages=UP_STAGES, flatten=True):
        pid_m, pid_n = _tile_at(tile, used, N, BLOCK_N, GROUP_M)
        row0 = pid_m * BLOCK_M
        act, pairs, ok_m, cols = _joint_act(x_ptr, w13_desc, ids_ptr, tl.load(bexp_ptr + pid_m), row0, pid_n,
                                            num_pairs, H, N, top_k, sx_t, BLOCK_M, BLOCK_N, BLOCK_K)
        if delayed:  # the previous tile's stores are long done: the release waits for nothing
            _signal_ready(ready_ptr + prev, total_ptr, has_prev, False, with_total, GPU)
            prev = pid_m
            has_prev = 1
        _store_act(act, act_ptr, pairs, ok_m, row0, cols, N, sa_p, BLOCK_M, True)
        if SYNC == "fenced" or SYNC == "release":
            _signal_ready(ready_ptr + pid_m, total_ptr, 1, SYNC == "fenced", False, GPU)
    if delayed:
        _signal_ready(ready_ptr + prev, total_ptr, has_prev, False, with_total, GPU)
    full = tl.cdiv(N, BLOCK_N) * (THREADS if GPU else 1)
    full_total = up_tiles * (THREADS if GPU else 1)
    first = (tl.program_id(0) + progs - up_tiles % progs) % progs
    all_ready = 0
    for tile in tl.range(first, used * tl.cdiv(H, DOWN_N), progs, num_stages=DOWN_STAGES, flatten=True):
        pid_m, pid_n = _tile_at(tile, used, H, DOWN_N, GROUP_M)
        if with_total:
            all_ready = _wait_ready_or_all(ready_ptr + pid_m, full, total_ptr, full_total, all_ready, GPU)
        elif SYNC != "nosync":
            _wait_ready(ready_ptr + pid_m, full, GPU)
        _down_sorted_tile(act_desc, w2_desc, out_ptr, ids_ptr, tw_ptr, tl.load(bexp_ptr + pid_m), pid_m * BLOCK_M,
                          pid_n, num_pairs, N, H, top_k, so_p, BLOCK_M, DOWN_N, DOWN_K, False)


def gate_up_down_one_launch(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, sorted_ids: torch.Tensor,
                            block_expert: torch.Tensor, topk_weights: torch.Tensor, tiles: MoeTiles
                            ) -> torch.Tensor | None:
    """Each pair's down projection times its routing weight, `[T*k, H]` (as `down_grouped` gives it), by
    one launch of `_gate_up_down_kernel` (`tiles.one_launch`: its SYNC_MODES entry); None where the two
    GEMMs' warps differ (the caller then runs the two launches)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    t, k = topk_weights.shape
    e, n2, h = w13.shape
    n, pairs, blocks, d = n2 // 2, t * k, block_expert.numel(), tiles.down()
    gpu = x.device.type == "cuda"
    programs = _num_sms(x.device) if gpu else 1  # the interpreter runs programs one by one: one never waits
    if tiles.one_launch not in SYNC_MODES:
        raise ValueError(f"MoeTiles.one_launch: {tiles.one_launch!r} is not one of {SYNC_MODES}")
    if d.num_warps != tiles.num_warps:
        return None
    act = torch.empty(sorted_ids.numel(), n, dtype=x.dtype, device=x.device)
    out = torch.empty(pairs, h, dtype=x.dtype, device=x.device)
    ready = torch.zeros(blocks + 1, dtype=torch.int32, device=x.device)  # + every tile's count
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    w13_desc = TensorDescriptor.from_tensor(w13.view(e, 2, n, h), [1, 2, tiles.block_n, tiles.block_k])
    act_desc = TensorDescriptor.from_tensor(act, [tiles.block_m, d.block_k])
    w2_desc = TensorDescriptor.from_tensor(w2.view(e * h, n), [d.block_n, d.block_k])
    _gate_up_down_kernel[(programs,)](
        x, w13_desc, act, act_desc, w2_desc, out, sorted_ids, block_expert, tw, ready, pairs, h, n, k, blocks,
        x.stride(0), act.stride(0), out.stride(0), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m, DOWN_N=d.block_n, DOWN_K=d.block_k,
        NB_P2=max(2, triton.next_power_of_2(blocks)), THREADS=32 * tiles.num_warps, UP_STAGES=tiles.num_stages,
        DOWN_STAGES=d.num_stages, SYNC=tiles.one_launch, GPU=gpu, num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return out
