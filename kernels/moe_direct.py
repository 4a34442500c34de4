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
   float32 over the k experts and stored once per token: the k-sum is in the kernel. `down_wide` (run 11):
   the K loop unrolled over all of N, so a program's weight loads are all issued before its first
   multiply (the plain loop holds one K step in flight); `up_wide` (run 12) unrolls gate+up's loop alike.

The program id's fastest axis is the pair (the token), so pairs that share an expert read the
same weight tile at about the same time (L2 hits rather than a second HBM read). `use_dot`: the
products as tensor-core dots of a 16-row tile holding the one row (its loads pipeline through
shared memory, `num_stages`; down: one flat loop over (expert, K step), the activation row scaled
by its routing weight before the dot) instead of float32 multiply-and-sums;
`pdl`: launched with programmatic dependent launch (the next kernel's launch overlaps this one's
tail; each kernel waits for its predecessor's writes before reading them).

Variants measured on the H200 and removed (run 5's one launch, run 8's chained down, run 10's
pipelined down loop):
benchmarks/kernels/MOE.md, "Removed after measurement".
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
    # run 4 (FMA path): gate and up rows in one K loop, pipelined through shared memory (tl.range
    # num_stages: cp.async on sm90). Run 3's FMA loops compile unpipelined on sm90: a load round trip per
    # K step, gate's loop then up's. The down launch's K loop stays plain (its register loads keep a K
    # step in flight; run 10 measured it pipelined slower: benchmarks/kernels/MOE.md).
    pipeline: bool = False
    down_num_warps: int = 0  # run 4: the down launch's warps (0: num_warps; sm90 compile: n8k128 spills at 4 warps)
    # run 11: the down launch's K loop unrolled over all of N (ceil(N / down_block_k) static steps), so every
    # weight load of a program is issued before its first multiply: a program keeps all its bytes in flight,
    # not one K step's (the plain loop's down launch streamed at 2.3 TB/s alone at T = 1, gate+up at 3.6)
    down_wide: bool = False
    # run 12: gate+up's K loop unrolled over all of H the same way (gate and up rows in one unrolled loop)
    up_wide: bool = False


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
def _gate_up_step(v_ptr, g_rows, u_rows, ks, ok_n, K, acc_g, acc_u, EVICT: tl.constexpr):
    """One K step of _gate_up_one_loop: the [BLOCK_K] slice `ks` of v times the gate and up rows, added in."""
    ok_k = ks < K
    m = ok_n[:, None] & ok_k[None, :]
    v = tl.load(v_ptr + ks, mask=ok_k, other=0.0).to(tl.float32)
    acc_g += tl.load(g_rows + ks[None, :], mask=m, other=0.0, eviction_policy=EVICT).to(tl.float32) * v[None, :]
    acc_u += tl.load(u_rows + ks[None, :], mask=m, other=0.0, eviction_policy=EVICT).to(tl.float32) * v[None, :]
    return acc_g, acc_u


@triton.jit
def _gate_up_one_loop(v_ptr, w_ptr, cols, ok_n, stride_w, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      EVICT: tl.constexpr, STAGES: tl.constexpr, WIDE_STEPS: tl.constexpr = 0):
    """([BLOCK_N], [BLOCK_N]) float32: the gate and up rows `cols` times v, one K loop for both: pipelined
    through shared memory (STAGES), or with WIDE_STEPS (run 12, WIDE_STEPS * BLOCK_K >= K) unrolled, so every
    load of the program is independent of the multiplies and the compiler can issue them all first."""
    g_rows = w_ptr + cols[:, None].to(tl.int64) * stride_w
    u_rows = g_rows + N * stride_w
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if WIDE_STEPS:
        for i in tl.static_range(WIDE_STEPS):
            acc_g, acc_u = _gate_up_step(v_ptr, g_rows, u_rows, i * BLOCK_K + tl.arange(0, BLOCK_K), ok_n, K, acc_g,
                                         acc_u, EVICT)
    else:
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            acc_g, acc_u = _gate_up_step(v_ptr, g_rows, u_rows, k0 + tl.arange(0, BLOCK_K), ok_n, K, acc_g, acc_u,
                                         EVICT)
    return tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1)


@triton.jit(do_not_specialize=["num_pairs", "top_k"])
def _gate_up_direct_kernel(x_ptr, w_ptr, act_ptr, ids_ptr, num_pairs, H, N, top_k, sx_t, sw_e, sw_n, sa_p,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
                           USE_GDC: tl.constexpr, EVICT: tl.constexpr = "", EARLY: tl.constexpr = False,
                           ONE_LOOP: tl.constexpr = False, STAGES: tl.constexpr = 1,
                           WIDE_STEPS: tl.constexpr = 0):
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
    if ONE_LOOP or WIDE_STEPS:
        g, u = _gate_up_one_loop(x_row, w_base, cols, ok_n, sw_n, N, H, BLOCK_N, BLOCK_K, EVICT, STAGES, WIDE_STEPS)
    else:
        g = _row_times_tile(x_row, w_base, cols, ok_n, sw_n, H, BLOCK_N, BLOCK_K, USE_DOT, EVICT)
        u = _row_times_tile(x_row, w_base + N * sw_n, cols, ok_n, sw_n, H, BLOCK_N, BLOCK_K, USE_DOT, EVICT)
    if USE_GDC and not EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    act = g / (1.0 + tl.exp(-g)) * u
    tl.store(act_ptr + p.to(tl.int64) * sa_p + cols, act.to(act_ptr.dtype.element_ty), mask=ok_n)


@triton.jit
def _prefetch_l2(w_ptr, ids_ptr, t, cols, N, H, top_k, sw_e, sw_h, BLOCK_N: tl.constexpr, KP2: tl.constexpr,
                 LINES: tl.constexpr):
    """prefetch.global.L2 of every 128-byte line of this program's down weight rows (the token's k
    experts' rows `cols`; columns clamped in range, so every address is inside w)."""
    r = tl.arange(0, KP2 * BLOCK_N)
    j = tl.minimum(r // BLOCK_N, top_k - 1)
    e = tl.load(ids_ptr + (t * top_k + j).to(tl.int64)).to(tl.int64)
    col = tl.minimum(tl.reshape(tl.broadcast_to(cols[None, :], (KP2, BLOCK_N)), (KP2 * BLOCK_N,)), H - 1)
    ks = tl.minimum(tl.arange(0, LINES) * (1024 // w_ptr.dtype.element_ty.primitive_bitwidth), N - 1)  # a line each
    ptrs = w_ptr + e[:, None] * sw_e + col.to(tl.int64)[:, None] * sw_h + ks[None, :]
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit(do_not_specialize=["num_tokens", "top_k"])
def _down_direct_kernel(act_ptr, w_ptr, out_ptr, ids_ptr, tw_ptr, num_tokens, N, H, top_k, sa_p, sw_e, sw_h, so_t,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, KP2: tl.constexpr, USE_DOT: tl.constexpr,
                        USE_GDC: tl.constexpr, EVICT: tl.constexpr = "", PREFETCH: tl.constexpr = False,
                        LINES: tl.constexpr = 1, WIDE_STEPS: tl.constexpr = 0):
    pid = tl.program_id(0)
    t = pid % num_tokens
    cols = (pid // num_tokens) * BLOCK_N + tl.arange(0, BLOCK_N)  # hidden columns
    ok_n = cols < H
    if PREFETCH:  # the routing is older than the previous kernel (its own gdc_wait saw it complete)
        _prefetch_l2(w_ptr, ids_ptr, t, cols, N, H, top_k, sw_e, sw_h, BLOCK_N, KP2, LINES)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()  # the activations are the previous kernel's
    if WIDE_STEPS:
        total = _down_rows_wide(act_ptr, w_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, sw_e, sw_h,
                                BLOCK_N, BLOCK_K, KP2, WIDE_STEPS, EVICT)
    elif USE_DOT:
        total = _down_rows_dot(act_ptr, w_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, sw_e, sw_h,
                               BLOCK_N, BLOCK_K, EVICT)
    else:
        total = _down_rows_fma(act_ptr, w_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, sw_e, sw_h,
                               BLOCK_N, BLOCK_K, KP2, EVICT)
    tl.store(out_ptr + t.to(tl.int64) * so_t + cols, total.to(out_ptr.dtype.element_ty), mask=ok_n)


@triton.jit
def _down_rows_fma(act_ptr, w_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, sw_e, sw_h,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, KP2: tl.constexpr, EVICT: tl.constexpr):
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
    for k0 in range(0, N, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        m = ok_r[:, None] & (ks < N)[None, :]
        a = tl.load(a_rows + ks[None, :], mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_rows + ks[None, :], mask=m, other=0.0, eviction_policy=EVICT).to(tl.float32)
        acc += a * w
    y = tl.sum(acc, axis=1) * tl.load(tw_ptr + p, mask=j < top_k, other=0.0)
    return tl.sum(tl.reshape(y, (KP2, BLOCK_N)), axis=0)


@triton.jit
def _down_rows_wide(act_ptr, w_ptr, ids_ptr, tw_ptr, t, cols, ok_n, N, top_k, sa_p, sw_e, sw_h,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, KP2: tl.constexpr, STEPS: tl.constexpr,
                    EVICT: tl.constexpr):
    """As _down_rows_fma with the K loop unrolled (STEPS * BLOCK_K >= N): the loads of all steps are
    independent of the multiplies, so the compiler issues them all first. [KP2, BLOCK_N, BLOCK_K] weight
    tiles (expert, hidden column, K); each expert's activation row is loaded once a step as [KP2,
    BLOCK_K] and broadcast over the columns (the 2-D tile of _down_rows_fma loads it once per column)."""
    jj = tl.arange(0, KP2)
    ok_j = jj < top_k
    p = (t * top_k + jj).to(tl.int64)
    e = tl.load(ids_ptr + p, mask=ok_j, other=0).to(tl.int64)
    w_rows = w_ptr + e[:, None, None] * sw_e + cols.to(tl.int64)[None, :, None] * sw_h
    a_rows = act_ptr + p[:, None] * sa_p
    ok_rows = ok_j[:, None, None] & ok_n[None, :, None]
    acc = tl.zeros((KP2, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for i in tl.static_range(STEPS):
        ks = i * BLOCK_K + tl.arange(0, BLOCK_K)
        ok_k = ks < N
        a = tl.load(a_rows + ks[None, :], mask=ok_j[:, None] & ok_k[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_rows + ks[None, None, :], mask=ok_rows & ok_k[None, None, :], other=0.0,
                    eviction_policy=EVICT).to(tl.float32)
        acc += w * a[:, None, :]
    y = tl.sum(acc, axis=2) * tl.load(tw_ptr + p, mask=ok_j, other=0.0)[:, None]
    return tl.sum(y, axis=0)


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


# the CPU interpreter runs no inline PTX and no grid-dependency control: there the prefetch and the
# gdc waits are left out (they change no value), so the tests run the pdl / early plans' arithmetic
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _launch(tiles: DirectTiles, down: bool = False) -> dict:
    extra = {"launch_pdl": True} if tiles.pdl and not _INTERPRETED else {}
    warps = tiles.down_num_warps if down and tiles.down_num_warps else tiles.num_warps
    return {"USE_DOT": tiles.use_dot, "USE_GDC": tiles.pdl and not _INTERPRETED, "num_warps": warps,
            "num_stages": tiles.num_stages, "EVICT": "evict_first" if tiles.evict else "", **extra}


def gate_up_direct(x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor, tiles: DirectTiles) -> torch.Tensor:
    """SiLU(gate) * up of every (token, expert) pair, `[T*k, N]`, one program per (pair, N tile)."""
    t, h = x.shape
    k, n = topk_ids.shape[1], w13.shape[1] // 2
    ids = topk_ids.reshape(-1)
    act = torch.empty(t * k, n, dtype=x.dtype, device=x.device)
    _gate_up_direct_kernel[(t * k * triton.cdiv(n, tiles.block_n),)](
        x, w13, act, ids, t * k, h, n, k, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, EARLY=tiles.early and tiles.pdl, ONE_LOOP=tiles.pipeline and not tiles.use_dot,
        STAGES=tiles.num_stages, WIDE_STEPS=triton.cdiv(h, tiles.block_k) if tiles.up_wide and not tiles.use_dot else 0,
        **_launch(tiles))
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
        WIDE_STEPS=triton.cdiv(n, tiles.down_block_k) if tiles.down_wide and not tiles.use_dot else 0,
        **_launch(tiles, down=True))
    return out


def fused_moe_direct(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, tiles: DirectTiles) -> torch.Tensor:
    """The experts' output `[T, H]` in two launches (shapes checked by kernels.fused_moe.fused_moe)."""
    return down_direct(gate_up_direct(x, w13, topk_ids, tiles), w2, topk_weights, topk_ids, tiles)


__all__ = ["DirectTiles", "down_direct", "fused_moe_direct", "gate_up_direct"]
