"""Fused mixture-of-experts in Triton: two paths, chosen per step size by `default_tiles`.

A step of T tokens routes each to k experts: T*k (token, expert) pairs.

Grouped path (`MoeTiles`): `kernels.moe_align.align_by_expert` sorts the pairs by expert and pads
every expert's run to a multiple of BLOCK_M rows (the padding rows hold the sentinel T*k), so each
BLOCK_M block of the sorted list belongs to one expert; a block past the end gets expert -1 and
its programs return at once. Then two launches, each over (blocks, output tiles) of every expert:

1. `_gate_up_kernel`: rows of x gathered by the block's pair ids, times the block's expert's
   gate and up tiles (two accumulators, one pass over x), SiLU(gate) * up stored per pair
   ([T*k, N], the model dtype);
2. `_down_kernel`: those rows times the expert's down projection, scaled by the pair's routing
   weight, either stored per pair ([T*k, H]) and summed over each token's k rows by torch
   (float32), or (`atomic_sum`) added into a zeroed float32 [T, H] with atomics and cast.

Run 5's options (measured next, not defaults): `sorted_act` stores the activations at the pairs'
sorted positions so the down launch (`_down_sorted_kernel`) reads them through TMA, and `persistent`
/ `up_persistent` run the down / joint gate+up launches as a few programs per SM looping over the
used blocks' tiles. A non-atomic k-sum inside the down launch is not possible: a token's k rows lie
in k experts' blocks, computed by different programs in no fixed order, so one of them can only add
its row to the others' with atomics (`atomic_sum`) or a later launch (the k-sum).

Direct path (`kernels.moe_direct.DirectTiles`, small steps): no grouping, one program per
(pair, N tile) for gate+up and per (token, H tile) for down with the k-sum inside: two launches.
`default_tiles` gives run 2's measured plans (a call without tiles); the engine's Triton backend
picks per step with `kernels.moe_plans.engine_tiles` (the measured rule for 32+ experts).

No host sync and shapes fixed by (T, k, E, tiles), so a step captures into a CUDA graph. The
weights are read once per touched expert per tile column: a decode step reads only the experts its
tokens route to (the simulator's `expected_experts_touched`). The plain-PyTorch per-expert loop is
`kernels.moe_reference.fused_moe_ref`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.moe_align import (
    ALIGN_ONE_PROGRAM_MAX_PAIRS,
    align_by_expert,
    padded_length,
)
from kernels.moe_direct import DirectTiles, fused_moe_direct


@dataclass(frozen=True, slots=True)
class MoeTiles:
    """Tile shape and launch settings of the grouped GEMMs; the down_* fields (0: as gate+up's) let
    the down projection (K = N, output H) take its own tile."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8  # M blocks that sweep the N tiles together (L2 reuse of their rows and weight tiles)
    down_block_n: int = 0
    down_block_k: int = 0
    down_num_warps: int = 0
    down_num_stages: int = 0
    atomic_sum: bool = False  # the k-sum as float32 atomics in the down kernel, not a torch sum
    tma: bool = False  # weight tiles through TMA descriptors (Hopper's tensor memory accelerator)
    align: str = "blocks"  # the grouping (kernels.moe_align.METHODS; "legacy": run 2's)
    ksum: str = "torch"  # the k-sum of the per-pair rows (not atomic_sum): "torch" or "triton" (`moe_sum`)
    joint: bool = False  # with tma: gate+up as one [BLOCK_M, 2 * BLOCK_N] dot a K step (_gate_up_joint_kernel)
    # run 5: gate+up stores SiLU(gate) * up at the pairs' sorted positions ([P, N], P the padded sorted
    # length), so the down launch reads its activation tiles through TMA (_down_sorted_kernel) instead
    # of gathering rows by pair id; its weights through TMA too
    sorted_act: bool = False
    # run 5, with sorted_act: the down launch as this many programs per SM, each looping over
    # (expert block, H tile) tiles of the used blocks only (0: one program per tile of all blocks)
    persistent: int = 0
    # run 5, with joint: the gate+up launch as this many programs per SM over the used blocks' tiles
    up_persistent: int = 0
    def down(self) -> MoeTiles:
        """The tiles the down launch uses."""
        return MoeTiles(self.block_m, self.down_block_n or self.block_n, self.down_block_k or self.block_k,
                        self.down_num_warps or self.num_warps, self.down_num_stages or self.num_stages, self.group_m,
                        atomic_sum=self.atomic_sum, tma=self.tma, align=self.align, ksum=self.ksum,
                        sorted_act=self.sorted_act, persistent=self.persistent, joint=self.joint,
                        up_persistent=self.up_persistent)


def default_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles:
    """The plan of a call given no tiles: run 2's measured grouped path (`run2_tiles`). The engine
    does not use it: its Triton backend picks per step with `kernels.moe_plans.engine_tiles`."""
    return run2_tiles(num_tokens, top_k, num_experts)


def run2_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles:
    """Run 2's tiles by the mean rows per expert (benchmarks/kernels/data/moe_run2, 11 configs at
    T = 1..4096 on qwen3-30b-a3b's and mixtral-8x7b's layer shapes; each pick within 4% of the best
    there, except mixtral T=1024 at 13%) with run 2's grouping: up to 1 row per expert 16 x 32, to 16
    rows 32 x 64, to 32 rows 64 x 128, beyond 128 x 128 with 8 warps."""
    rows = num_tokens * top_k / num_experts
    if rows <= 1:
        return MoeTiles(16, 32, 128, 4, 4, align="legacy")
    if rows <= 16:
        return MoeTiles(32, 64, 128, 4, 3, align="legacy")
    if rows <= 32:
        return MoeTiles(64, 128, 64, 4, 3, align="legacy")
    return MoeTiles(128, 128, 64, 8, 3, align="legacy")


def run3_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles | DirectTiles:
    """Up to DIRECT_MAX_PAIRS (token, expert) pairs and at most E / 4 of them the direct path (pairs
    rarely share an expert), else run 2's tiles with the many-program grouping. Measured in run 3
    (benchmarks/kernels/MOE.md): on qwen3 2-30% faster than run 2 except at T = 8 and 16 (6% and 1%
    slower); on mixtral 22% slower at T = 1 (the direct path with 8 experts) and 2-4% at T >= 1024:
    adopting it should take each T's best plan of run 3 instead."""
    pairs = num_tokens * top_k
    if pairs <= DIRECT_MAX_PAIRS and 4 * pairs <= num_experts:
        return DirectTiles()
    return dataclasses.replace(run2_tiles(num_tokens, top_k, num_experts), align="blocks")


DIRECT_MAX_PAIRS = 32


@triton.jit
def _tile_of(num_blocks, n_cols, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(M block, N tile) of this program: GROUP_M consecutive M blocks sweep all N tiles together, so
    their rows of A (gathered activations) and their experts' weight tiles are reused from L2."""
    return _tile_at(tl.program_id(0), num_blocks, n_cols, BLOCK_N, GROUP_M)


@triton.jit
def _tile_at(tile, num_blocks, n_cols, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(M block, N tile) of tile number `tile` in _tile_of's grouped order."""
    tiles_n = tl.cdiv(n_cols, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    size = tl.minimum(num_blocks - first_m, GROUP_M)
    return first_m + (tile % per_group) % size, (tile % per_group) // size


@triton.jit
def _block_pairs(ids_ptr, pid_m, pid_n, num_pairs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The M block's sorted pair ids, which of them are real (padding rows hold the sentinel
    num_pairs), and the N tile's output columns."""
    return _rows_pairs(ids_ptr, pid_m * BLOCK_M, pid_n, num_pairs, BLOCK_M, BLOCK_N)


@triton.jit
def _rows_pairs(ids_ptr, row0, pid_n, num_pairs, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """As _block_pairs for the ROWS sorted rows from row0."""
    pairs = tl.load(ids_ptr + row0 + tl.arange(0, ROWS))
    return pairs, pairs < num_pairs, pid_n * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit(do_not_specialize=["num_pairs", "top_k", "num_blocks"])
def _gate_up_kernel(x_ptr, w_ptr, w_desc, act_ptr, ids_ptr, bexp_ptr, num_pairs, H, N, top_k, num_blocks,
                    sx_t, sw_e, sw_n, sa_p,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    USE_TMA: tl.constexpr, SORTED: tl.constexpr = False):
    pid_m, pid_n = _tile_of(num_blocks, N, BLOCK_N, GROUP_M)
    e32 = tl.load(bexp_ptr + pid_m)
    e = e32.to(tl.int64)
    if e < 0:
        return
    pairs, ok_m, cols = _block_pairs(ids_ptr, pid_m, pid_n, num_pairs, BLOCK_M, BLOCK_N)
    rows = (pairs // top_k).to(tl.int64)
    ok_n = cols < N
    w_base = w_ptr + e * sw_e
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ok_k = ks < H
        a = tl.load(x_ptr + rows[:, None] * sx_t + ks[None, :], mask=ok_m[:, None] & ok_k[None, :], other=0.0)
        if USE_TMA:  # w13 seen as [E*2N, H]: rows past N are the up rows (or zeros), masked at the store
            row0 = e32 * 2 * N + pid_n * BLOCK_N
            acc_g = tl.dot(a, tl.trans(w_desc.load([row0, k0])), acc_g)
            acc_u = tl.dot(a, tl.trans(w_desc.load([row0 + N, k0])), acc_u)
        else:
            wmask = ok_k[:, None] & ok_n[None, :]
            wg = tl.load(w_base + cols[None, :].to(tl.int64) * sw_n + ks[:, None], mask=wmask, other=0.0)
            wu = tl.load(w_base + (cols[None, :] + N).to(tl.int64) * sw_n + ks[:, None], mask=wmask, other=0.0)
            acc_g = tl.dot(a, wg, acc_g)
            acc_u = tl.dot(a, wu, acc_u)
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    _store_act(act, act_ptr, pairs, ok_m, pid_m * BLOCK_M, cols, N, sa_p, BLOCK_M, SORTED)


@triton.jit
def _store_act(act, act_ptr, pairs, ok_m, row0, cols, N, sa_p, ROWS: tl.constexpr, SORTED: tl.constexpr):
    """The tile's activations: at their pairs' rows, or (SORTED) at the tile's rows of the sorted
    list from row0, padding rows included (their x rows are zeros, so their activations are exact
    zeros)."""
    if SORTED:
        rows = (row0 + tl.arange(0, ROWS)).to(tl.int64)
        tl.store(act_ptr + rows[:, None] * sa_p + cols[None, :], act.to(act_ptr.dtype.element_ty),
                 mask=(cols < N)[None, :])
    else:
        tl.store(act_ptr + pairs[:, None].to(tl.int64) * sa_p + cols[None, :], act.to(act_ptr.dtype.element_ty),
                 mask=ok_m[:, None] & (cols < N)[None, :])


@triton.jit(do_not_specialize=["num_pairs", "top_k", "num_blocks"])
def _gate_up_joint_kernel(x_ptr, w_desc, act_ptr, ids_ptr, bexp_ptr, num_pairs, H, N, top_k, num_blocks, sx_t, sa_p,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                          SORTED: tl.constexpr = False):
    """As _gate_up_kernel with TMA, one dot a K step: w13 seen as [E, 2, N, H], a [1, 2, BLOCK_N, BLOCK_K]
    box holds the gate and up rows of the tile (one [BLOCK_M, 2 * BLOCK_N] accumulator: wider
    tensor-core instructions, the activation tile read once a step instead of twice)."""
    pid_m, pid_n = _tile_of(num_blocks, N, BLOCK_N, GROUP_M)
    e32 = tl.load(bexp_ptr + pid_m)
    if e32 < 0:
        return
    _joint_tile(x_ptr, w_desc, act_ptr, ids_ptr, e32, pid_m * BLOCK_M, pid_n, num_pairs, H, N, top_k, sx_t, sa_p,
                BLOCK_M, BLOCK_N, BLOCK_K, SORTED)


@triton.jit
def _joint_tile(x_ptr, w_desc, act_ptr, ids_ptr, e32, row0, pid_n, num_pairs, H, N, top_k, sx_t, sa_p,
                ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SORTED: tl.constexpr):
    """One (ROWS sorted rows from row0, N tile) tile of the joint gate+up: the K loop, SiLU(gate) * up,
    the store."""
    pairs, ok_m, cols = _rows_pairs(ids_ptr, row0, pid_n, num_pairs, ROWS, BLOCK_N)
    rows = (pairs // top_k).to(tl.int64)
    acc = tl.zeros((ROWS, 2 * BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rows[:, None] * sx_t + ks[None, :], mask=ok_m[:, None] & (ks < H)[None, :], other=0.0)
        w = w_desc.load([e32, 0, pid_n * BLOCK_N, k0]).reshape(2 * BLOCK_N, BLOCK_K)  # TMA pads past N, H with 0
        acc = tl.dot(a, tl.trans(w), acc)
    g, u = tl.split(tl.permute(tl.reshape(acc, (ROWS, 2, BLOCK_N)), (0, 2, 1)))
    act = g / (1.0 + tl.exp(-g)) * u
    _store_act(act, act_ptr, pairs, ok_m, row0, cols, N, sa_p, ROWS, SORTED)


@triton.jit
def _used_blocks(bexp_ptr, num_blocks, NB_P2: tl.constexpr):
    """Blocks that hold pairs (block_expert >= 0 is a prefix of the blocks)."""
    b = tl.arange(0, NB_P2)
    return tl.sum((tl.load(bexp_ptr + b, mask=b < num_blocks, other=-1) >= 0).to(tl.int32), axis=0)


@triton.jit(do_not_specialize=["num_pairs", "top_k", "num_blocks"])
def _gate_up_joint_persistent_kernel(x_ptr, w_desc, act_ptr, ids_ptr, bexp_ptr, num_pairs, H, N, top_k, num_blocks,
                                     sx_t, sa_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                     GROUP_M: tl.constexpr, NB_P2: tl.constexpr, SORTED: tl.constexpr,
                                     FLATTEN: tl.constexpr):
    """Run 5: _gate_up_joint_kernel as a few programs per SM looping over the used blocks' tiles (one
    flattened loop with FLATTEN: the next tile's loads overlap this one's SiLU and store)."""
    used = _used_blocks(bexp_ptr, num_blocks, NB_P2)
    for tile in tl.range(tl.program_id(0), used * tl.cdiv(N, BLOCK_N), tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = _tile_at(tile, used, N, BLOCK_N, GROUP_M)
        _joint_tile(x_ptr, w_desc, act_ptr, ids_ptr, tl.load(bexp_ptr + pid_m), pid_m * BLOCK_M, pid_n, num_pairs, H,
                    N, top_k, sx_t, sa_p, BLOCK_M, BLOCK_N, BLOCK_K, SORTED)


@triton.jit(do_not_specialize=["num_pairs", "top_k", "num_blocks"])
def _down_kernel(act_ptr, w_ptr, w_desc, out_ptr, ids_ptr, bexp_ptr, tw_ptr, num_pairs, N, H, top_k, num_blocks,
                 sa_p, sw_e, sw_h, so_p,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 ATOMIC: tl.constexpr, USE_TMA: tl.constexpr):
    pid_m, pid_n = _tile_of(num_blocks, H, BLOCK_N, GROUP_M)
    e32 = tl.load(bexp_ptr + pid_m)
    e = e32.to(tl.int64)
    if e < 0:
        return
    pairs, ok_m, cols = _block_pairs(ids_ptr, pid_m, pid_n, num_pairs, BLOCK_M, BLOCK_N)  # cols: hidden
    p64 = pairs.to(tl.int64)
    ok_n = cols < H
    w_base = w_ptr + e * sw_e
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, N, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ok_k = ks < N
        a = tl.load(act_ptr + p64[:, None] * sa_p + ks[None, :], mask=ok_m[:, None] & ok_k[None, :], other=0.0)
        if USE_TMA:  # w2 seen as [E*H, N]
            acc = tl.dot(a, tl.trans(w_desc.load([e32 * H + pid_n * BLOCK_N, k0])), acc)
        else:
            w = tl.load(w_base + cols[None, :].to(tl.int64) * sw_h + ks[:, None], mask=ok_k[:, None] & ok_n[None, :],
                        other=0.0)
            acc = tl.dot(a, w, acc)
    _down_store(acc, out_ptr, tw_ptr, pairs, ok_m, cols, H, top_k, so_p, ATOMIC)


@triton.jit
def _down_store(acc, out_ptr, tw_ptr, pairs, ok_m, cols, H, top_k, so_p, ATOMIC: tl.constexpr):
    """A down tile times its pairs' routing weights: stored at the pairs' rows, or (ATOMIC: out is
    float32 [T, H]) added into their tokens' rows."""
    ok = ok_m[:, None] & (cols < H)[None, :]
    acc = acc * tl.load(tw_ptr + pairs, mask=ok_m, other=0.0)[:, None]
    if ATOMIC:
        tok = (pairs // top_k).to(tl.int64)
        tl.atomic_add(out_ptr + tok[:, None] * so_p + cols[None, :], acc, mask=ok, sem="relaxed")
    else:
        tl.store(out_ptr + pairs.to(tl.int64)[:, None] * so_p + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=ok)


@triton.jit(do_not_specialize=["num_pairs", "top_k", "num_blocks"])
def _down_sorted_kernel(a_desc, w_desc, out_ptr, ids_ptr, bexp_ptr, tw_ptr, num_pairs, N, H, top_k, num_blocks, so_p,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        NB_P2: tl.constexpr, ATOMIC: tl.constexpr, FLATTEN: tl.constexpr):
    """Run 5's down launch on activations in sorted order (gate+up with SORTED): both operands through
    TMA ([P, N] activations, w2 seen as [E*H, N]). Programs loop over the (block, H tile) tiles of the
    used blocks (block_expert >= 0 is a prefix): one tile each when the grid covers them all, several
    when the grid is a few programs per SM (FLATTEN: one flattened loop, so the next tile's loads are
    issued while this one's epilogue runs)."""
    used = _used_blocks(bexp_ptr, num_blocks, NB_P2)
    num_tiles = used * tl.cdiv(H, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = _tile_at(tile, used, H, BLOCK_N, GROUP_M)
        e32 = tl.load(bexp_ptr + pid_m)
        _down_sorted_tile(a_desc, w_desc, out_ptr, ids_ptr, tw_ptr, e32, pid_m * BLOCK_M, pid_n, num_pairs, N, H,
                          top_k, so_p, BLOCK_M, BLOCK_N, BLOCK_K, ATOMIC)


@triton.jit
def _down_sorted_tile(a_desc, w_desc, out_ptr, ids_ptr, tw_ptr, e32, row0, pid_n, num_pairs, N, H, top_k, so_p,
                      ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ATOMIC: tl.constexpr):
    """One (ROWS sorted rows from row0, H tile) tile of the down launch: the K loop and the store."""
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(N, BLOCK_K)):
        a = a_desc.load([row0, ki * BLOCK_K])  # TMA pads past N with zeros
        acc = tl.dot(a, tl.trans(w_desc.load([e32 * H + pid_n * BLOCK_N, ki * BLOCK_K])), acc)
    pairs, ok_m, cols = _rows_pairs(ids_ptr, row0, pid_n, num_pairs, ROWS, BLOCK_N)
    _down_store(acc, out_ptr, tw_ptr, pairs, ok_m, cols, H, top_k, so_p, ATOMIC)


@triton.jit(do_not_specialize=["num_tokens"])
def _ksum_kernel(y_ptr, out_ptr, num_tokens, H, top_k, sy_p, so_t, KP2: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t, cols] = sum_j y[t * k + j, cols] (float32 sum); programs (H tile, token), token fastest."""
    t = tl.program_id(0) % num_tokens
    cols = (tl.program_id(0) // num_tokens) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.arange(0, KP2)
    rows = (t * top_k + j).to(tl.int64)
    m = (j < top_k)[:, None] & (cols < H)[None, :]
    y = tl.load(y_ptr + rows[:, None] * sy_p + cols[None, :], mask=m, other=0.0, eviction_policy="evict_first")
    tl.store(out_ptr + t.to(tl.int64) * so_t + cols, tl.sum(y.to(tl.float32), axis=0).to(out_ptr.dtype.element_ty),
             mask=cols < H)


KSUM_BLOCK_H = 1024


def moe_sum(y: torch.Tensor, top_k: int) -> torch.Tensor:
    """`[T, H]`: the sum over each token's k consecutive rows of `y [T*k, H]` (float32 accumulation,
    y's dtype out), one Triton launch: torch's strided `view(t, k, h).sum(1)` took ~68 us for
    134 MB at qwen3 T=4096 on the H200 (run 3, by subtraction), against ~32 us to read it."""
    pairs, h = y.shape
    t = pairs // top_k
    out = torch.empty(t, h, dtype=y.dtype, device=y.device)
    if t:
        block = min(KSUM_BLOCK_H, triton.next_power_of_2(h))
        _ksum_kernel[(t * triton.cdiv(h, block),)](y, out, t, h, top_k, y.stride(0), out.stride(0),
                                                   KP2=triton.next_power_of_2(top_k), BLOCK_H=block, num_warps=4)
    return out


def _check(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor) -> None:
    e, n2, h = w13.shape
    if x.dim() != 2 or x.shape[1] != h or w2.shape != (e, h, n2 // 2) or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"fused_moe: shapes x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}, "
                         f"topk_ids {tuple(topk_ids.shape)} do not fit x [T, H], w13 [E, 2N, H], w2 [E, H, N], "
                         "topk_ids [T, k]")
    if x.stride(1) != 1 or w13.stride(2) != 1 or w2.stride(2) != 1:
        raise ValueError("fused_moe: x, w13 and w2 must be contiguous in their last dimension")


def _launch(tiles: MoeTiles) -> dict:
    return {"BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n, "BLOCK_K": tiles.block_k, "GROUP_M": tiles.group_m,
            "num_warps": tiles.num_warps, "num_stages": tiles.num_stages, "USE_TMA": tiles.tma}


def _weight_desc(w: torch.Tensor, tiles: MoeTiles):
    """A host-side TMA descriptor of the experts' weights `[E, R, C]` seen as `[E*R, C]`, tiles
    [block_n, block_k]; None when the tiles do not ask for TMA."""
    if not tiles.tma:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    e, r, c = w.shape
    return TensorDescriptor.from_tensor(w.view(e * r, c), [tiles.block_n, tiles.block_k])


def gate_up_grouped(x: torch.Tensor, w13: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor,
                    top_k: int, tiles: MoeTiles) -> torch.Tensor:
    """SiLU(gate) * up of every (token, expert) pair, `[T*k, N]` (with `tiles.sorted_act`: `[P, N]`
    in the sorted list's order, P = len(sorted_ids)): the first grouped GEMM launch."""
    t, h = x.shape
    n = w13.shape[1] // 2
    pairs, blocks = t * top_k, block_expert.numel()
    act = torch.empty(sorted_ids.numel() if tiles.sorted_act else pairs, n, dtype=x.dtype, device=x.device)
    if tiles.joint and tiles.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = TensorDescriptor.from_tensor(w13.view(w13.shape[0], 2, n, h), [1, 2, tiles.block_n, tiles.block_k])
        if tiles.up_persistent:
            grid = min(blocks * triton.cdiv(n, tiles.block_n), tiles.up_persistent * _num_sms(x.device))
            _gate_up_joint_persistent_kernel[(max(grid, 1),)](
                x, desc, act, sorted_ids, block_expert, pairs, h, n, top_k, blocks, x.stride(0), act.stride(0),
                BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
                NB_P2=max(2, triton.next_power_of_2(blocks)), SORTED=tiles.sorted_act, FLATTEN=True,
                num_warps=tiles.num_warps, num_stages=tiles.num_stages)
            return act
        _gate_up_joint_kernel[(blocks * triton.cdiv(n, tiles.block_n),)](
            x, desc, act, sorted_ids, block_expert, pairs, h, n, top_k, blocks, x.stride(0), act.stride(0),
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
            SORTED=tiles.sorted_act, num_warps=tiles.num_warps, num_stages=tiles.num_stages)
        return act
    _gate_up_kernel[(blocks * triton.cdiv(n, tiles.block_n),)](
        x, w13, _weight_desc(w13, tiles), act, sorted_ids, block_expert, pairs, h, n, top_k, blocks, x.stride(0),
        w13.stride(0), w13.stride(1), act.stride(0), SORTED=tiles.sorted_act, **_launch(tiles))
    return act


def down_grouped(act: torch.Tensor, w2: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor,
                 topk_weights: torch.Tensor, tiles: MoeTiles) -> torch.Tensor:
    """Each pair's down projection times its routing weight: `[T*k, H]` (the model dtype), or with
    `tiles.atomic_sum` already summed over each token's k pairs, `[T, H]` float32. `act` as
    gate_up_grouped gives it for the same tiles (pair rows, or sorted rows with `sorted_act`)."""
    t, k = topk_weights.shape
    pairs, n, h, blocks = t * k, act.shape[1], w2.shape[1], block_expert.numel()
    d = tiles.down()
    if d.atomic_sum:
        out = torch.zeros(t, h, dtype=torch.float32, device=act.device)
    else:
        out = torch.empty(pairs, h, dtype=act.dtype, device=act.device)
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    if d.sorted_act:
        _down_sorted(act, w2, out, sorted_ids, block_expert, tw, k, d)
        return out
    _down_kernel[(blocks * triton.cdiv(h, d.block_n),)](
        act, w2, _weight_desc(w2, d), out, sorted_ids, block_expert, tw, pairs, n, h, k, blocks, act.stride(0),
        w2.stride(0), w2.stride(1), out.stride(0), ATOMIC=d.atomic_sum, **_launch(d))
    return out


def _down_sorted(act: torch.Tensor, w2: torch.Tensor, out: torch.Tensor, sorted_ids: torch.Tensor,
                 block_expert: torch.Tensor, tw: torch.Tensor, top_k: int, d: MoeTiles) -> None:
    """_down_sorted_kernel: one program per tile of all blocks, or `d.persistent` programs per SM (a
    flattened loop, except with atomics: sm90 compile, n256 s3, its epilogue then stages the float32
    tile in shared memory, 272 KB, over the 227 KB an SM gives a program)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    n, (e, h, _) = act.shape[1], w2.shape
    blocks = block_expert.numel()
    tiles = blocks * triton.cdiv(h, d.block_n)
    grid = min(tiles, d.persistent * _num_sms(act.device)) if d.persistent else tiles
    a_desc = TensorDescriptor.from_tensor(act, [d.block_m, d.block_k])
    w_desc = TensorDescriptor.from_tensor(w2.view(e * h, n), [d.block_n, d.block_k])
    _down_sorted_kernel[(max(grid, 1),)](
        a_desc, w_desc, out, sorted_ids, block_expert, tw, tw.numel(), n, h, top_k, blocks, out.stride(0),
        BLOCK_M=d.block_m, BLOCK_N=d.block_n, BLOCK_K=d.block_k, GROUP_M=d.group_m,
        NB_P2=max(2, triton.next_power_of_2(blocks)), ATOMIC=d.atomic_sum,
        FLATTEN=bool(d.persistent) and not d.atomic_sum,
        num_warps=d.num_warps, num_stages=d.num_stages)


def _num_sms(device: torch.device) -> int:
    """The device's SMs (the CPU interpreter: 2, so a persistent grid still loops over several tiles)."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, tiles: MoeTiles | DirectTiles | None = None, *, align: str | None = None
              ) -> torch.Tensor:
    """The MoE experts' output `[T, H]` for `x [T, H]` routed by (`topk_weights`, `topk_ids`) `[T, k]`;
    the signature and values of `kernels.moe_reference.fused_moe_ref`. `tiles` picks the path
    (default: `default_tiles`); `align`: the grouped path's grouping (kernels.moe_align.METHODS;
    "legacy" is run 2's), default the tiles' own."""
    _check(x, w13, w2, topk_ids)
    t, h = x.shape
    e, k = w13.shape[0], topk_ids.shape[1]
    if t == 0:
        return x.new_zeros(0, h)
    tiles = tiles or default_tiles(t, k, e)
    if isinstance(tiles, DirectTiles):
        return fused_moe_direct(x, w13, w2, topk_weights, topk_ids, tiles)
    sorted_ids, block_expert = align_by_expert(topk_ids, e, tiles.block_m, method=align or tiles.align)
    act = gate_up_grouped(x, w13, sorted_ids, block_expert, k, tiles)
    out = down_grouped(act, w2, sorted_ids, block_expert, topk_weights, tiles)
    if tiles.atomic_sum:
        return out.to(x.dtype)
    if tiles.ksum == "triton":
        return moe_sum(out, k)
    return out.view(t, k, h).sum(dim=1)  # one kernel (torch accumulates half types in float32)


__all__ = ["ALIGN_ONE_PROGRAM_MAX_PAIRS", "DIRECT_MAX_PAIRS", "DirectTiles", "MoeTiles",
           "align_by_expert", "default_tiles", "down_grouped", "fused_moe", "gate_up_grouped", "moe_sum", "padded_length",
           "run2_tiles", "run3_tiles"]
