"""The small-step path of the fused MoE: no grouping, one matrix-vector product per (token, expert) pair.

For a decode step of a few tokens the grouped path's fixed work (the grouping launch, the k-sum
launch) is as long as reading the touched experts (run 2 on the H200, qwen3-30b-a3b at T=1:
37.9 us against 18 us of weights). Here two launches, nothing else:

1. `_gate_up_direct_kernel`, programs (pair, N tile): the pair's token row times its expert's gate
   and up rows of the tile, SiLU(gate) * up stored per pair ([T*k, N], the model dtype, as the
   grouped path's intermediate);
2. `_down_direct_kernel`, programs (token, H tile): the token's k activation rows times their
   experts' down rows of the tile (all k experts' rows in one [k * BLOCK_N, BLOCK_K] load per K
   step, so a program has k times the bytes in flight), times the routing weights, summed in
   float32 over the k experts and stored once per token: the k-sum is in the kernel.

The program id's fastest axis is the pair (the token), so pairs that share an expert read the
same weight tile at about the same time (L2 hits rather than a second HBM read). `use_dot`: the
products as tensor-core dots of a 16-row tile holding the one row (its loads pipeline through
shared memory, `num_stages`; down: one flat loop over (expert, K step), the activation row scaled
by its routing weight before the dot) instead of float32 multiply-and-sums;
`pdl`: launched with programmatic dependent launch (the next kernel's launch overlaps this one's
tail; each kernel waits for its predecessor's writes before reading them).

Run 5, `fused`: both in one launch (`_direct_fused_kernel`) of a few programs per SM, all resident:
each program does its gate+up items, then its down items, each of which first waits on its token's
ready counter (raised with release semantics by the token's gate+up items, read with acquire). The
counters live in a cached [2, T] int32 buffer the kernel itself zeroes after use, so a CUDA graph
replays the launch with no host work.

Run 8, `chain`: the down projection chained onto gate+up (`_chain_kernel`): program (pair, N tile)
multiplies its own activations by its tile's columns of the expert's down weights and stores a float32
partial [H]; `_chain_sum_kernel` sums each token's k * N / block_n partial rows. Every weight byte is
read in the first launch; the second reads only the partials (1.5 MB at qwen3's T = 1), so no launch
waits on another's weight stream.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True, slots=True)
class DirectTiles:
    """Tiles and launch settings of the two direct kernels (gate+up, then down)."""

    block_n: int = 16
    block_k: int = 256
    down_block_n: int = 8
    down_block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3
    use_dot: bool = False
    pdl: bool = False
    # run 4: weight loads with evict_first (each weight byte is read once a step: keep L2 for the rest)
    evict: bool = False
    # run 4, with pdl: gate+up lets the down launch start as soon as all its programs run (not at their
    # tail), and each down program prefetches its weight rows into L2 before waiting for the activations
    early: bool = False
    # run 4 (FMA path): gate and up rows in one K loop, and both kernels' K loops pipelined through
    # shared memory (tl.range num_stages: cp.async on sm90). Run 3's FMA loops compile unpipelined on
    # sm90: a load round trip per K step, gate's loop then up's.
    pipeline: bool = False
    down_num_warps: int = 0  # run 4: the down launch's warps (0: num_warps; sm90 compile: n8k128 spills at 4 warps)
    # run 5: gate+up and down in ONE launch of `fused` programs per SM (all resident; capped by the
    # compiled kernel's occupancy): a down item waits on its token's ready counter, which the token's
    # gate+up items raise (release / acquire); `early` then prefetches every down item's weight rows
    # into L2 at the start (`evict`: gate+up loads evict-first, the prefetch evict-last). Uses the
    # pipelined loops and num_warps for both phases.
    fused: int = 0
    # run 5, with fused: each gate+up item first prefetches the next item's gate and up rows into L2 (more
    # bytes in flight a program than its pipelined loop's stages hold)
    ahead: bool = False
    # run 8: the down projection chained onto gate+up (`_chain_kernel`): each (pair, N tile) program
    # multiplies its own activations by the down weights' columns of its tile and stores the float32
    # partial product [H] (down_block_k: the H rows of one down step); a second, small launch
    # (`_chain_sum_kernel`, down_block_n: its H tile) sums each token's k * N / block_n partial rows.
    # All weight bytes stream in one launch; the second reads ~1.5 MB (qwen3 T = 1) from L2.
    chain: bool = False
    # run 10: the down launch's K loop pipelined through shared memory with this many stages (0 or 1: the
    # plain loop). Run 4's `pipeline` was meant to pipeline both launches' loops, but the down launch was
    # never given its stages, so every plan measured up to run 9 ran the down loop unpipelined. Measured
    # (run 10): pipelined is slower at T = 1-4 (T = 1 26.8 us at best against 22.6), so 0 stays the default.
    down_stages: int = 0


@triton.jit
def _row_times_tile(v_ptr, w_ptr, cols, ok_n, stride_w, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    USE_DOT: tl.constexpr, EVICT: tl.constexpr):
    """[BLOCK_N] float32: sum_k v[k] * w[cols, k] (w row-major with `stride_w` between rows)."""
    if USE_DOT:
        sixteen = tl.arange(0, 16)
        acc16 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            ok_k = ks < K
            a = tl.load(v_ptr + sixteen[:, None] * 0 + ks[None, :], mask=(sixteen == 0)[:, None] & ok_k[None, :],
                        other=0.0)
            w = tl.load(w_ptr + cols[None, :].to(tl.int64) * stride_w + ks[:, None], mask=ok_k[:, None] & ok_n[None, :],
                        other=0.0, eviction_policy=EVICT)
            acc16 = tl.dot(a, w, acc16)
        res = tl.sum(acc16, axis=0)  # rows 1..15 are zero
    else:
        w_rows = w_ptr + cols[:, None].to(tl.int64) * stride_w
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            ok_k = ks < K
            v = tl.load(v_ptr + ks, mask=ok_k, other=0.0).to(tl.float32)
            w = tl.load(w_rows + ks[None, :], mask=ok_n[:, None] & ok_k[None, :], other=0.0,
                        eviction_policy=EVICT).to(tl.float32)
            acc += w * v[None, :]
        res = tl.sum(acc, axis=1)
    return res


@triton.jit
def _gate_up_one_loop(v_ptr, w_ptr, cols, ok_n, stride_w, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      EVICT: tl.constexpr, STAGES: tl.constexpr):
    """([BLOCK_N], [BLOCK_N]) float32: the gate and up rows `cols` times v, one K loop for both."""
    g_rows = w_ptr + cols[:, None].to(tl.int64) * stride_w
    u_rows = g_rows + N * stride_w
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        ok_k = ks < K
        m = ok_n[:, None] & ok_k[None, :]
        v = tl.load(v_ptr + ks, mask=ok_k, other=0.0).to(tl.float32)
        wg = tl.load(g_rows + ks[None, :], mask=m, other=0.0, eviction_policy=EVICT).to(tl.float32)
        wu = tl.load(u_rows + ks[None, :], mask=m, other=0.0, eviction_policy=EVICT).to(tl.float32)
        acc_g += wg * v[None, :]
        acc_u += wu * v[None, :]
    return tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1)


@triton.jit(do_not_specialize=["num_pairs", "top_k"])
def _gate_up_direct_kernel(x_ptr, w_ptr, act_ptr, ids_ptr, num_pairs, H, N, top_k, sx_t, sw_e, sw_n, sa_p,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
                           USE_GDC: tl.constexpr, EVICT: tl.constexpr = "", EARLY: tl.constexpr = False,
                           ONE_LOOP: tl.constexpr = False, STAGES: tl.constexpr = 1):
    pid = tl.program_id(0)
    p = pid % num_pairs
    cols = (pid // num_pairs) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok_n = cols < N
    if USE_GDC:
        tl.extra.cuda.gdc_wait()  # x and the routing come from the previous kernel
        if EARLY:  # the down programs may start now (they wait for this grid's end before reading act)
            tl.extra.cuda.gdc_launch_dependents()
    e = tl.load(ids_ptr + p).to(tl.int64)
    x_row = x_ptr + (p // top_k).to(tl.int64) * sx_t
    w_base = w_ptr + e * sw_e
    if ONE_LOOP:
        g, u = _gate_up_one_loop(x_row, w_base, cols, ok_n, sw_n, N, H, BLOCK_N, BLOCK_K, EVICT, STAGES)
    else:
        g = _row_times_tile(x_row, w_base, cols, ok_n, sw_n, H, BLOCK_N, BLOCK_K, USE_DOT, EVICT)
        u = _row_times_tile(x_row, w_base + N * sw_n, cols, ok_n, sw_n, H, BLOCK_N, BLOCK_K, USE_DOT, EVICT)
    if USE_GDC and not EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    act = g / (1.0 + tl.exp(-g)) * u
    tl.store(act_ptr + p.to(tl.int64) * sa_p + cols, act.to(act_ptr.dtype.element_ty), mask=ok_n)


@triton.jit
def _prefetch_l2(w_ptr, ids_ptr, t, cols, N, H, top_k, sw_e, sw_h, BLOCK_N: tl.constexpr, KP2: tl.constexpr,
                 LINES: tl.constexpr, LAST: tl.constexpr = False):
    """prefetch.global.L2 of every 128-byte line of this program's down weight rows (the token's k
    experts' rows `cols`; columns clamped in range, so every address is inside w)."""
    r = tl.arange(0, KP2 * BLOCK_N)
    j = tl.minimum(r // BLOCK_N, top_k - 1)
    e = tl.load(ids_ptr + (t * top_k + j).to(tl.int64)).to(tl.int64)
    col = tl.minimum(tl.reshape(tl.broadcast_to(cols[None, :], (KP2, BLOCK_N)), (KP2 * BLOCK_N,)), H - 1)
    ks = tl.minimum(tl.arange(0, LINES) * (1024 // w_ptr.dtype.element_ty.primitive_bitwidth), N - 1)  # a line each
    ptrs = w_ptr + e[:, None] * sw_e + col.to(tl.int64)[:, None] * sw_h + ks[None, :]
    if LAST:  # run 5: kept in L2 ahead of evict-first lines
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit(do_not_specialize=["num_tokens", "top_k"])
def _down_direct_kernel(act_ptr, w_ptr, out_ptr, ids_ptr, tw_ptr, num_tokens, N, H, top_k, sa_p, sw_e, sw_h, so_t,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, KP2: tl.constexpr, USE_DOT: tl.constexpr,
                        USE_GDC: tl.constexpr, EVICT: tl.constexpr = "", PREFETCH: tl.constexpr = False,
                        LINES: tl.constexpr = 1, STAGES: tl.constexpr = 1):
    pid = tl.program_id(0)
    t = pid % num_tokens
    cols = (pid // num_tokens) * BLOCK_N + tl.arange(0, BLOCK_N)  # hidden columns
    ok_n = cols < H
    if PREFETCH:  # the routing is older than the previous kernel (its own gdc_wait saw it complete)
        _prefetch_l2(w_ptr, ids_ptr, t, cols, N, H, top_k, sw_e, sw_h, BLOCK_N, KP2, LINES)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()  # the activations are the previous kernel's
    if USE_DOT:
        total = _down_rows_dot(act_ptr, w_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, sw_e, sw_h,
                               BLOCK_N, BLOCK_K, EVICT)
    else:
        total = _down_rows_fma(act_ptr, w_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, sw_e, sw_h,
                               BLOCK_N, BLOCK_K, KP2, EVICT, STAGES)
    tl.store(out_ptr + t.to(tl.int64) * so_t + cols, total.to(out_ptr.dtype.element_ty), mask=ok_n)


@triton.jit
def _down_rows_fma(act_ptr, w_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, sw_e, sw_h,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, KP2: tl.constexpr, EVICT: tl.constexpr,
                   STAGES: tl.constexpr):
    """[BLOCK_N] float32: sum_j w_j * down_{e_j}(act_j)[cols], all k experts' rows in one tile per K
    step (k * BLOCK_N rows: k times the bytes in flight of one expert's rows)."""
    r = tl.arange(0, KP2 * BLOCK_N)
    j = r // BLOCK_N
    ok_r = (j < top_k) & tl.reshape(tl.broadcast_to(ok_n[None, :], (KP2, BLOCK_N)), (KP2 * BLOCK_N,))
    p = (t * top_k + j).to(tl.int64)
    e = tl.load(ids_ptr + p, mask=j < top_k, other=0).to(tl.int64)
    col = tl.reshape(tl.broadcast_to(cols[None, :], (KP2, BLOCK_N)), (KP2 * BLOCK_N,)).to(tl.int64)
    w_rows = w_ptr + e[:, None] * sw_e + col[:, None] * sw_h
    a_rows = act_ptr + p[:, None] * sa_p
    acc = tl.zeros((KP2 * BLOCK_N, BLOCK_K), dtype=tl.float32)
    if STAGES > 1:  # run 4's pipelined loop
        for k0 in tl.range(0, N, BLOCK_K, num_stages=STAGES):
            ks = k0 + tl.arange(0, BLOCK_K)
            m = ok_r[:, None] & (ks < N)[None, :]
            a = tl.load(a_rows + ks[None, :], mask=m, other=0.0).to(tl.float32)
            w = tl.load(w_rows + ks[None, :], mask=m, other=0.0, eviction_policy=EVICT).to(tl.float32)
            acc += a * w
    else:
        for k0 in range(0, N, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            m = ok_r[:, None] & (ks < N)[None, :]
            a = tl.load(a_rows + ks[None, :], mask=m, other=0.0).to(tl.float32)
            w = tl.load(w_rows + ks[None, :], mask=m, other=0.0, eviction_policy=EVICT).to(tl.float32)
            acc += a * w
    y = tl.sum(acc, axis=1) * tl.load(tw_ptr + p, mask=j < top_k, other=0.0)
    return tl.sum(tl.reshape(y, (KP2, BLOCK_N)), axis=0)


@triton.jit
def _down_rows_dot(act_ptr, w_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, sw_e, sw_h,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVICT: tl.constexpr):
    """As _down_rows_fma, one flat pipelined loop over (expert j, K step) with tensor-core dots of a
    16-row tile holding act_j scaled by w_j (rounded to the weights' dtype: one more bf16 rounding)."""
    sixteen = tl.arange(0, 16)
    n_k = tl.cdiv(N, BLOCK_K)
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for i in range(top_k * n_k):
        j = i // n_k
        ks = (i % n_k) * BLOCK_K + tl.arange(0, BLOCK_K)
        ok_k = ks < N
        p = (t * top_k + j).to(tl.int64)
        e = tl.load(ids_ptr + p).to(tl.int64)
        wt = tl.load(tw_ptr + p)
        a = tl.load(act_ptr + p * sa_p + sixteen[:, None] * 0 + ks[None, :],
                    mask=(sixteen == 0)[:, None] & ok_k[None, :], other=0.0)
        a = (a.to(tl.float32) * wt).to(w_ptr.dtype.element_ty)
        w = tl.load(w_ptr + e * sw_e + cols[None, :].to(tl.int64) * sw_h + ks[:, None],
                    mask=ok_k[:, None] & ok_n[None, :], other=0.0, eviction_policy=EVICT)
        acc = tl.dot(a, w, acc)
    return tl.sum(acc, axis=0)


# ------------------------------------------------------------------------------- run 5: one launch
@triton.jit
def _wait_at_least(ptr, target, MAX_SPINS: tl.constexpr):
    """Spin until *ptr >= target (at most MAX_SPINS reads: a grid that is not all resident then
    gives wrong values, which the checks catch, rather than a hung GPU), then acquire: the writes
    released before the counter's increments are visible to every thread of this program."""
    seen = tl.load(ptr, volatile=True)
    spins = 0
    while (seen < target) & (spins < MAX_SPINS):
        seen = tl.load(ptr, volatile=True)
        spins += 1
    tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _prefetch_gate_up(w_ptr, ids_ptr, item, num_pairs, N, H, sw_e, sw_n, BLOCK_N: tl.constexpr,
                      LINES_H: tl.constexpr):
    """prefetch.global.L2 of every 128-byte line of gate+up item `item`'s gate and up rows (addresses
    clamped inside the expert's weights)."""
    e = tl.load(ids_ptr + item % num_pairs).to(tl.int64)
    cols = tl.minimum((item // num_pairs) * BLOCK_N + tl.arange(0, BLOCK_N), N - 1)
    rows = tl.reshape(tl.join(cols, cols + N), (2 * BLOCK_N,)).to(tl.int64)  # gate and up rows
    ks = tl.minimum(tl.arange(0, LINES_H) * (1024 // w_ptr.dtype.element_ty.primitive_bitwidth), H - 1)
    ptrs = w_ptr + e * sw_e + rows[:, None] * sw_n + ks[None, :]
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit(do_not_specialize=["num_tokens", "top_k"])
def _direct_fused_kernel(x_ptr, w13_ptr, w2_ptr, act_ptr, out_ptr, ids_ptr, tw_ptr, sync_ptr, num_tokens, H, N, top_k,
                         sx_t, s13_e, s13_n, sa_p, s2_e, s2_h, so_t,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOWN_BLOCK_N: tl.constexpr,
                         DOWN_BLOCK_K: tl.constexpr, KP2: tl.constexpr, EVICT: tl.constexpr, STAGES: tl.constexpr,
                         PREFETCH: tl.constexpr, LAST: tl.constexpr, LINES: tl.constexpr, MAX_SPINS: tl.constexpr,
                         AHEAD: tl.constexpr = False, LINES_H: tl.constexpr = 1):
    """The direct path in one launch. Each program takes gate+up items (pair, N tile) pid, pid + G, ...,
    then down items (token, H tile) the same way; a token's down item waits until its k pairs' N
    tiles are all stored (sync[t] == k * tiles_n). sync [2, T] int32: ready counts, then finished
    down items; the token's last down item zeroes both, so the next launch finds them zero (no host
    work: a CUDA graph replays it)."""
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    num_pairs = num_tokens * top_k
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_h = tl.cdiv(H, DOWN_BLOCK_N)
    if PREFETCH:  # the routing is the previous kernel's: complete before this launch started
        for item in range(pid, num_tokens * tiles_h, progs):
            cols = (item // num_tokens) * DOWN_BLOCK_N + tl.arange(0, DOWN_BLOCK_N)
            _prefetch_l2(w2_ptr, ids_ptr, item % num_tokens, cols, N, H, top_k, s2_e, s2_h, DOWN_BLOCK_N, KP2, LINES,
                         LAST)
    for item in range(pid, num_pairs * tiles_n, progs):
        if AHEAD and item + progs < num_pairs * tiles_n:
            _prefetch_gate_up(w13_ptr, ids_ptr, item + progs, num_pairs, N, H, s13_e, s13_n, BLOCK_N, LINES_H)
        p = item % num_pairs
        cols = (item // num_pairs) * BLOCK_N + tl.arange(0, BLOCK_N)
        ok_n = cols < N
        e = tl.load(ids_ptr + p).to(tl.int64)
        g, u = _gate_up_one_loop(x_ptr + (p // top_k).to(tl.int64) * sx_t, w13_ptr + e * s13_e, cols, ok_n, s13_n, N,
                                 H, BLOCK_N, BLOCK_K, EVICT, STAGES)
        act = g / (1.0 + tl.exp(-g)) * u
        tl.store(act_ptr + p.to(tl.int64) * sa_p + cols, act.to(act_ptr.dtype.element_ty), mask=ok_n)
        tl.debug_barrier()  # all threads' stores, then one release increment
        tl.atomic_add(sync_ptr + p // top_k, 1, sem="release", scope="gpu")
    for item in range(pid, num_tokens * tiles_h, progs):
        t = item % num_tokens
        cols = (item // num_tokens) * DOWN_BLOCK_N + tl.arange(0, DOWN_BLOCK_N)
        ok_n = cols < H
        _wait_at_least(sync_ptr + t, top_k * tiles_n, MAX_SPINS)
        total = _down_rows_fma(act_ptr, w2_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, s2_e, s2_h,
                               DOWN_BLOCK_N, DOWN_BLOCK_K, KP2, "", STAGES)
        tl.store(out_ptr + t.to(tl.int64) * so_t + cols, total.to(out_ptr.dtype.element_ty), mask=ok_n)
        # every down item of t has passed its wait once this count reaches tiles_h: reset for the next call
        done = tl.atomic_add(sync_ptr + num_tokens + t, 1, sem="relaxed", scope="gpu")
        if done == tiles_h - 1:
            tl.atomic_xchg(sync_ptr + t, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(sync_ptr + num_tokens + t, 0, sem="relaxed", scope="gpu")


# ------------------------------------------------------------------------------- run 8: chained down
@triton.jit(do_not_specialize=["num_pairs", "top_k"])
def _chain_kernel(x_ptr, w13_ptr, w2_ptr, part_ptr, ids_ptr, tw_ptr, num_pairs, H, N, top_k, sx_t, s13_e, s13_n,
                  s2_e, s2_h, sp_r, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
                  EVICT: tl.constexpr, STAGES: tl.constexpr, USE_GDC: tl.constexpr):
    """Program (pair p, N tile j): act = SiLU(gate) * up * routing weight of the tile's columns (kept in
    float32), then part[p * tiles_n + j, :] = w2[e][:, tile] @ act: the tile's share of the pair's down
    projection. The down weights' columns of a tile are BLOCK_N contiguous elements per H row (64 bytes
    at BLOCK_N 32 in bf16), read once per step like the gate and up rows."""
    pid = tl.program_id(0)
    p = pid % num_pairs  # fastest axis: pairs sharing an expert read its tiles at about the same time
    j = pid // num_pairs
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    ok_n = cols < N
    if USE_GDC:
        tl.extra.cuda.gdc_wait()  # x and the routing come from the previous kernel
        tl.extra.cuda.gdc_launch_dependents()  # the sum launch starts now and waits for this grid's end
    e = tl.load(ids_ptr + p).to(tl.int64)
    g, u = _gate_up_one_loop(x_ptr + (p // top_k).to(tl.int64) * sx_t, w13_ptr + e * s13_e, cols, ok_n, s13_n, N, H,
                             BLOCK_N, BLOCK_K, EVICT, STAGES)
    act = tl.where(ok_n, g / (1.0 + tl.exp(-g)) * u * tl.load(tw_ptr + p), 0.0)
    row = part_ptr + (p.to(tl.int64) * tl.cdiv(N, BLOCK_N) + j) * sp_r
    w_cols = w2_ptr + e * s2_e + cols[None, :]
    for h0 in tl.range(0, H, BLOCK_H, num_stages=STAGES):
        hs = h0 + tl.arange(0, BLOCK_H)
        ok_h = hs < H
        w = tl.load(w_cols + hs[:, None].to(tl.int64) * s2_h, mask=ok_h[:, None] & ok_n[None, :], other=0.0,
                    eviction_policy=EVICT).to(tl.float32)
        tl.store(row + hs, tl.sum(w * act[None, :], axis=1), mask=ok_h)


@triton.jit(do_not_specialize=["num_tokens", "rows"])
def _chain_sum_kernel(part_ptr, out_ptr, num_tokens, H, rows, sp_r, so_t, BLOCK_R: tl.constexpr,
                      BLOCK_H: tl.constexpr, USE_GDC: tl.constexpr):
    """out[t, cols] = sum of token t's `rows` consecutive partial rows (float32); programs (H tile,
    token), token fastest."""
    t = tl.program_id(0) % num_tokens
    cols = (tl.program_id(0) // num_tokens) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok_h = cols < H
    if USE_GDC:
        tl.extra.cuda.gdc_wait()  # the partial products are the previous kernel's
    base = part_ptr + (t * rows).to(tl.int64) * sp_r
    acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
    for r0 in range(0, rows, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        acc += tl.load(base + r[:, None].to(tl.int64) * sp_r + cols[None, :], mask=(r < rows)[:, None] & ok_h[None, :],
                       other=0.0)
    tl.store(out_ptr + t.to(tl.int64) * so_t + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=ok_h)


# the CPU interpreter runs no inline PTX and no grid-dependency control: there the prefetch and the
# gdc waits are left out (they change no value), so the tests run the pdl / early plans' arithmetic
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _launch(tiles: DirectTiles, down: bool = False) -> dict:
    extra = {"launch_pdl": True} if tiles.pdl and not _INTERPRETED else {}
    warps = tiles.down_num_warps if down and tiles.down_num_warps else tiles.num_warps
    stages = tiles.down_stages if down and tiles.down_stages > 1 else tiles.num_stages
    return {"USE_DOT": tiles.use_dot, "USE_GDC": tiles.pdl and not _INTERPRETED, "num_warps": warps,
            "num_stages": stages, "EVICT": "evict_first" if tiles.evict else "", **extra}


def gate_up_direct(x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor, tiles: DirectTiles) -> torch.Tensor:
    """SiLU(gate) * up of every (token, expert) pair, `[T*k, N]`, one program per (pair, N tile)."""
    t, h = x.shape
    k, n = topk_ids.shape[1], w13.shape[1] // 2
    ids = topk_ids.reshape(-1)
    act = torch.empty(t * k, n, dtype=x.dtype, device=x.device)
    _gate_up_direct_kernel[(t * k * triton.cdiv(n, tiles.block_n),)](
        x, w13, act, ids, t * k, h, n, k, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, EARLY=tiles.early and tiles.pdl, ONE_LOOP=tiles.pipeline and not tiles.use_dot,
        STAGES=tiles.num_stages, **_launch(tiles))
    return act


def down_direct(act: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                tiles: DirectTiles) -> torch.Tensor:
    """`[T, H]`: each token's k down projections weighted by its routing weights and summed."""
    t, k = topk_ids.shape
    n, h = act.shape[1], w2.shape[1]
    ids = topk_ids.reshape(-1)
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()  # no-op (no launch) when float32 already
    out = torch.empty(t, h, dtype=act.dtype, device=act.device)
    _down_direct_kernel[(t * triton.cdiv(h, tiles.down_block_n),)](
        act, w2, out, ids, tw, t, n, h, k, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        BLOCK_N=tiles.down_block_n, BLOCK_K=tiles.down_block_k, KP2=triton.next_power_of_2(k),
        PREFETCH=tiles.early and tiles.pdl and not _INTERPRETED, LINES=triton.next_power_of_2(triton.cdiv(n * w2.element_size(), 128)),
        STAGES=max(tiles.down_stages, 1), **_launch(tiles, down=True))
    return out


# a down item's reads of its ready counter before it gives up (see _wait_at_least): at 0.2-1 us a read
# ~3-16 ms, against ~20 us of gate+up items at qwen3's T = 1..4
MAX_SPINS = 1 << 14
_SYNC: dict[tuple, torch.Tensor] = {}  # (device, T) -> the fused launch's counters, zero between launches
_RESIDENT: dict[tuple, int] = {}  # compiled fused kernel -> programs per SM that fit at once


def _sync_counters(device: torch.device, num_tokens: int) -> torch.Tensor:
    """[2, T] int32 zeros kept across calls (the kernel leaves them zero; a first call inside a graph
    capture allocates them from the graph's pool and they live as long as this cache)."""
    key = (str(device), num_tokens)
    if key not in _SYNC:
        _SYNC[key] = torch.zeros(2, num_tokens, dtype=torch.int32, device=device)
    return _SYNC[key]


def _resident_per_sm(kernel, num_warps: int) -> int:
    """How many programs of a compiled kernel one SM holds at once (sm90: 64K registers, allocated per
    warp in 256s; 228 KB shared memory, 1 KB reserved per program; 64 warps; 32 programs)."""
    kernel._init_handles()
    regs_per_warp = -(-max(kernel.n_regs, 1) * 32 // 256) * 256
    by_regs = 65536 // (regs_per_warp * num_warps)
    by_smem = 233472 // (kernel.metadata.shared + 1024)
    return max(1, min(by_regs, by_smem, 64 // num_warps, 32))


def fused_direct_one_launch(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                            topk_ids: torch.Tensor, tiles: DirectTiles) -> torch.Tensor:
    """`[T, H]` in one launch (_direct_fused_kernel): `tiles.fused` programs per SM, at most what the
    compiled kernel lets an SM hold (so every program is resident and the waits end); the CPU
    interpreter runs programs one after the other, so there one program does every item in order."""
    t, h = x.shape
    k, n = topk_ids.shape[1], w13.shape[1] // 2
    ids = topk_ids.reshape(-1)
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    act = torch.empty(t * k, n, dtype=x.dtype, device=x.device)
    out = torch.empty(t, h, dtype=x.dtype, device=x.device)
    args = (x, w13, w2, act, out, ids, tw, _sync_counters(x.device, t), t, h, n, k, x.stride(0), w13.stride(0),
            w13.stride(1), act.stride(0), w2.stride(0), w2.stride(1), out.stride(0))
    prefetch = tiles.early and not _INTERPRETED
    meta = {"BLOCK_N": tiles.block_n, "BLOCK_K": tiles.block_k, "DOWN_BLOCK_N": tiles.down_block_n,
            "DOWN_BLOCK_K": tiles.down_block_k, "KP2": triton.next_power_of_2(k),
            "EVICT": "evict_first" if tiles.evict else "", "STAGES": tiles.num_stages, "PREFETCH": prefetch,
            "LAST": tiles.evict, "LINES": triton.next_power_of_2(triton.cdiv(n * w2.element_size(), 128)),
            "MAX_SPINS": MAX_SPINS, "AHEAD": tiles.ahead and not _INTERPRETED,
            "LINES_H": triton.next_power_of_2(triton.cdiv(h * w13.element_size(), 128)),
            "num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
    items = max(t * k * triton.cdiv(n, tiles.block_n), t * triton.cdiv(h, tiles.down_block_n))
    if _INTERPRETED:
        grid = 1
    else:
        key = (str(x.device), x.dtype, tiles, k, n, h)
        if key not in _RESIDENT:
            _RESIDENT[key] = _resident_per_sm(_direct_fused_kernel.warmup(*args, grid=(1,), **meta), tiles.num_warps)
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        grid = min(items, sms * min(tiles.fused, _RESIDENT[key]))
    _direct_fused_kernel[(grid,)](*args, **meta)
    return out


CHAIN_SUM_ROWS = 256  # at most this many partial rows a sum step loads (a token's all at qwen3's T = 1: 192)


def chain_partials(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, tiles: DirectTiles) -> torch.Tensor:
    """`_chain_kernel`: float32 partial down products `[T * k * N / block_n, H]`, a token's rows consecutive."""
    t, h = x.shape
    k, n = topk_ids.shape[1], w13.shape[1] // 2
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    tiles_n = triton.cdiv(n, tiles.block_n)
    part = torch.empty(t * k * tiles_n, h, dtype=torch.float32, device=x.device)
    launch = _launch(tiles)
    _chain_kernel[(t * k * tiles_n,)](
        x, w13, w2, part, topk_ids.reshape(-1), tw, t * k, h, n, k, x.stride(0), w13.stride(0), w13.stride(1),
        w2.stride(0), w2.stride(1), part.stride(0), BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        BLOCK_H=tiles.down_block_k, EVICT=launch["EVICT"], STAGES=tiles.num_stages, USE_GDC=launch["USE_GDC"],
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **_pdl(launch))
    return part


def chain_sum(part: torch.Tensor, num_tokens: int, dtype: torch.dtype, tiles: DirectTiles) -> torch.Tensor:
    """`_chain_sum_kernel`: `[T, H]` in `dtype`, each token's partial rows summed (all in one step up to
    CHAIN_SUM_ROWS rows: the loop's loads are not pipelined)."""
    rows, h = part.shape[0] // num_tokens, part.shape[1]
    out = torch.empty(num_tokens, h, dtype=dtype, device=part.device)
    launch = _launch(tiles)
    _chain_sum_kernel[(num_tokens * triton.cdiv(h, tiles.down_block_n),)](
        part, out, num_tokens, h, rows, part.stride(0), out.stride(0),
        BLOCK_R=min(CHAIN_SUM_ROWS, triton.next_power_of_2(rows)), BLOCK_H=tiles.down_block_n,
        USE_GDC=launch["USE_GDC"], num_warps=tiles.down_num_warps or 4, **_pdl(launch))
    return out


def _pdl(launch: dict) -> dict:
    return {"launch_pdl": True} if "launch_pdl" in launch else {}


def fused_chain(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, tiles: DirectTiles) -> torch.Tensor:
    """`[T, H]` by run 8's chained down (`DirectTiles.chain`): `_chain_kernel` over (pair, N tile), then
    `_chain_sum_kernel` over (token, H tile), the second launched early with `tiles.pdl`."""
    return chain_sum(chain_partials(x, w13, w2, topk_weights, topk_ids, tiles), x.shape[0], x.dtype, tiles)


def fused_moe_direct(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, tiles: DirectTiles) -> torch.Tensor:
    """The experts' output `[T, H]` in two launches, or one with `tiles.fused` (shapes checked by
    kernels.fused_moe.fused_moe)."""
    if tiles.chain:
        return fused_chain(x, w13, w2, topk_weights, topk_ids, tiles)
    if tiles.fused:
        return fused_direct_one_launch(x, w13, w2, topk_weights, topk_ids, tiles)
    return down_direct(gate_up_direct(x, w13, topk_ids, tiles), w2, topk_weights, topk_ids, tiles)


__all__ = ["DirectTiles", "chain_partials", "chain_sum", "down_direct", "fused_chain", "fused_direct_one_launch", "fused_moe_direct", "gate_up_direct"]
