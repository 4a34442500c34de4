"""Fused mixture-of-experts in Triton: tokens grouped by expert, one grouped GEMM launch per projection.

A step of T tokens routes each to k experts: T*k (token, expert) pairs. `align_by_expert` sorts
the pairs by expert and pads every expert's run to a multiple of BLOCK_M rows (the padding rows
hold the sentinel T*k), so each BLOCK_M block of the sorted list belongs to one expert; a block
past the end gets expert -1 and its programs return at once. All of it is torch ops on device
tensors of sizes fixed by (T, k, E, BLOCK_M) -- no host sync -- so the layer captures into a CUDA
graph. Then two launches, each over (blocks, output tiles) of every expert at once:

1. `_gate_up_kernel`: rows of x gathered by the block's pair ids, times the block's expert's
   gate and up tiles (two accumulators, one pass over x), SiLU(gate) * up stored per pair
   ([T*k, N], the model dtype);
2. `_down_kernel`: those rows times the expert's down projection, scaled by the pair's routing
   weight, stored per pair ([T*k, H]); a torch sum over each token's k rows (float32) finishes.

The weights are read once per touched expert per tile column: a decode step reads only the
experts its tokens route to (the simulator's `expected_experts_touched`). The plain-PyTorch
per-expert loop is `kernels.moe_reference.fused_moe_ref`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True, slots=True)
class MoeTiles:
    """Tile shape and launch settings of both grouped GEMMs."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8  # M blocks that sweep the N tiles together (L2 reuse of their rows and weight tiles)


def default_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles:
    """Tiles by the mean rows per expert, from the H200 sweep of run 2 (benchmarks/kernels/data/moe_run2,
    11 configs at T = 1..4096 on qwen3-30b-a3b's and mixtral-8x7b's layer shapes; each pick is within
    4% of the best there, except mixtral T=1024 at 13%, whose best is the same tile without the
    L2 grouping): up to 1 row per expert 16 x 32 (more programs stream the
    weights), to 16 rows 32 x 64, to 32 rows 64 x 128, beyond 128 x 128 with 8 warps (qwen T=4096:
    0.95 ms against 1.09 with 64 x 128)."""
    rows = num_tokens * top_k / num_experts
    if rows <= 1:
        return MoeTiles(16, 32, 128, 4, 4)
    if rows <= 16:
        return MoeTiles(32, 64, 128, 4, 3)
    if rows <= 32:
        return MoeTiles(64, 128, 64, 4, 3)
    return MoeTiles(128, 128, 64, 8, 3)


# Up to this many (token, expert) pairs the grouping is one Triton program (one launch: a decode
# step's grouping would otherwise be ~25 small torch kernels, several times the experts' own time
# at batch 1); above it, torch's sort (the launches are then a small share of the step).
ALIGN_ONE_PROGRAM_MAX_PAIRS = 4096
_ALIGN_CHUNK = 64


def padded_length(num_pairs: int, num_experts: int, block_m: int) -> int:
    """P = T*k + min(E, T*k) * (block_m - 1), rounded up to block_m: bounds the padded sorted list
    (each touched expert pads fewer than block_m rows), fixed by (T, k, E, block_m)."""
    cap = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-cap // block_m) * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int, *, one_program: bool | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted pair ids [P] int32, expert of each BLOCK_M block [P / block_m] int32).

    Pair id p = t * k + j (token t's j-th expert), sorted by expert, stable; padding rows hold
    T*k; a block past the end has expert -1. Shapes depend only on (T, k, E, block_m) and nothing
    syncs with the host, so the grouping captures into a CUDA graph. `one_program`: the single
    Triton program (default up to ALIGN_ONE_PROGRAM_MAX_PAIRS pairs) or torch ops; same output."""
    n = topk_ids.numel()
    if one_program is None:
        one_program = n <= ALIGN_ONE_PROGRAM_MAX_PAIRS
    if one_program:
        return _align_one_program(topk_ids, num_experts, block_m)
    return _align_torch(topk_ids, num_experts, block_m)


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, bexp_ptr, n, num_experts, cap, num_blocks,
                  BLOCK_M: tl.constexpr, EP2: tl.constexpr, CHUNK: tl.constexpr):
    bins = tl.arange(0, EP2)
    lanes = tl.arange(0, CHUNK)
    # 1. pairs per expert; padding lanes land in the spare last bin (EP2 > num_experts), dropped
    counts = tl.zeros((EP2,), dtype=tl.int32)
    for c0 in range(0, n, CHUNK):
        e = tl.load(ids_ptr + c0 + lanes, mask=c0 + lanes < n, other=EP2 - 1)
        counts += tl.histogram(e, EP2)
    counts = tl.where(bins < num_experts, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, 0)
    pad_start = pad_end - padded
    # 2. the sentinel everywhere, then each pair at its expert's start + the expert's pairs before it
    for c0 in range(0, cap, CHUNK):
        tl.store(sorted_ptr + c0 + lanes, n, mask=c0 + lanes < cap)
    tl.debug_barrier()
    seen = tl.zeros((EP2,), dtype=tl.int32)
    for c0 in range(0, n, CHUNK):
        ok = c0 + lanes < n
        e = tl.load(ids_ptr + c0 + lanes, mask=ok, other=EP2 - 1)
        onehot = e[:, None] == bins[None, :]
        base = tl.sum(tl.where(onehot, (pad_start + seen)[None, :], 0), axis=1)
        earlier = (e[:, None] == e[None, :]) & (lanes[None, :] < lanes[:, None])
        rank = tl.sum(earlier.to(tl.int32), axis=1)
        tl.store(sorted_ptr + base + rank, c0 + lanes, mask=ok)
        seen += tl.sum(onehot.to(tl.int32), axis=0)
    # 3. a block's expert: how many experts' padded runs end at or before its first row
    total = tl.sum(padded, axis=0)
    for b0 in range(0, num_blocks, CHUNK):
        blk = b0 + lanes
        start = blk * BLOCK_M
        ex = tl.sum((pad_end[None, :] <= start[:, None]).to(tl.int32), axis=1)
        tl.store(bexp_ptr + blk, tl.where(start < total, ex, -1), mask=blk < num_blocks)


def _align_one_program(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = topk_ids.reshape(-1).to(torch.int32)
    n = ids.numel()
    cap = padded_length(n, num_experts, block_m)
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(cap // block_m, dtype=torch.int32, device=ids.device)
    _align_kernel[(1,)](ids, sorted_ids, block_expert, n, num_experts, cap, cap // block_m, BLOCK_M=block_m,
                        EP2=triton.next_power_of_2(num_experts + 1), CHUNK=_ALIGN_CHUNK, num_warps=4)
    return sorted_ids, block_expert


def _align_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouping in torch ops: scatter_add counts, a stable sort, searchsorted for the blocks."""
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    cap = padded_length(n, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(
        0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    order = torch.sort(flat, stable=True).indices
    by_expert = flat[order]
    start = torch.cumsum(counts, 0) - counts  # first sorted position of each expert
    dest = (pad_end - padded)[by_expert] + torch.arange(n, device=dev) - start[by_expert]
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(0, cap, block_m, device=dev)
    block_expert = torch.searchsorted(pad_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_ids, block_expert


@triton.jit
def _tile_of(num_blocks, n_cols, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(M block, N tile) of this program: GROUP_M consecutive M blocks sweep all N tiles together, so
    their rows of A (gathered activations) and their experts' weight tiles are reused from L2."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(n_cols, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    size = tl.minimum(num_blocks - first_m, GROUP_M)
    return first_m + (pid % per_group) % size, (pid % per_group) // size


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, act_ptr, ids_ptr, bexp_ptr, num_pairs, H, N, top_k, num_blocks,
                    sx_t, sw_e, sw_n, sa_p,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_of(num_blocks, N, BLOCK_N, GROUP_M)
    e = tl.load(bexp_ptr + pid_m).to(tl.int64)
    if e < 0:
        return
    pairs = tl.load(ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    ok_m = pairs < num_pairs
    rows = (pairs // top_k).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok_n = cols < N
    w_base = w_ptr + e * sw_e
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ok_k = ks < H
        a = tl.load(x_ptr + rows[:, None] * sx_t + ks[None, :], mask=ok_m[:, None] & ok_k[None, :], other=0.0)
        wmask = ok_k[:, None] & ok_n[None, :]
        wg = tl.load(w_base + cols[None, :].to(tl.int64) * sw_n + ks[:, None], mask=wmask, other=0.0)
        wu = tl.load(w_base + (cols[None, :] + N).to(tl.int64) * sw_n + ks[:, None], mask=wmask, other=0.0)
        acc_g = tl.dot(a, wg, acc_g)
        acc_u = tl.dot(a, wu, acc_u)
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    dst = act_ptr + pairs[:, None].to(tl.int64) * sa_p + cols[None, :]
    tl.store(dst, act.to(act_ptr.dtype.element_ty), mask=ok_m[:, None] & ok_n[None, :])


@triton.jit
def _down_kernel(act_ptr, w_ptr, out_ptr, ids_ptr, bexp_ptr, tw_ptr, num_pairs, N, H, num_blocks,
                 sa_p, sw_e, sw_h, so_p,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_of(num_blocks, H, BLOCK_N, GROUP_M)
    e = tl.load(bexp_ptr + pid_m).to(tl.int64)
    if e < 0:
        return
    pairs = tl.load(ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    ok_m = pairs < num_pairs
    p64 = pairs.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output (hidden) columns
    ok_n = cols < H
    w_base = w_ptr + e * sw_e
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, N, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ok_k = ks < N
        a = tl.load(act_ptr + p64[:, None] * sa_p + ks[None, :], mask=ok_m[:, None] & ok_k[None, :], other=0.0)
        w = tl.load(w_base + cols[None, :].to(tl.int64) * sw_h + ks[:, None], mask=ok_k[:, None] & ok_n[None, :],
                    other=0.0)
        acc = tl.dot(a, w, acc)
    acc = acc * tl.load(tw_ptr + pairs, mask=ok_m, other=0.0)[:, None]
    tl.store(out_ptr + p64[:, None] * so_p + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=ok_m[:, None] & ok_n[None, :])


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
            "num_warps": tiles.num_warps, "num_stages": tiles.num_stages}


def gate_up_grouped(x: torch.Tensor, w13: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor,
                    top_k: int, tiles: MoeTiles) -> torch.Tensor:
    """SiLU(gate) * up of every (token, expert) pair, `[T*k, N]`: the first grouped GEMM launch."""
    t, h = x.shape
    n = w13.shape[1] // 2
    pairs, blocks = t * top_k, block_expert.numel()
    act = torch.empty(pairs, n, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(blocks * triton.cdiv(n, tiles.block_n),)](
        x, w13, act, sorted_ids, block_expert, pairs, h, n, top_k, blocks, x.stride(0), w13.stride(0), w13.stride(1),
        act.stride(0), **_launch(tiles))
    return act


def down_grouped(act: torch.Tensor, w2: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor,
                 topk_weights: torch.Tensor, tiles: MoeTiles) -> torch.Tensor:
    """Each pair's down projection times its routing weight, `[T*k, H]`: the second launch."""
    pairs, n = act.shape
    h, blocks = w2.shape[1], block_expert.numel()
    out = torch.empty(pairs, h, dtype=act.dtype, device=act.device)
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    _down_kernel[(blocks * triton.cdiv(h, tiles.block_n),)](
        act, w2, out, sorted_ids, block_expert, tw, pairs, n, h, blocks, act.stride(0), w2.stride(0), w2.stride(1),
        out.stride(0), **_launch(tiles))
    return out


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, tiles: MoeTiles | None = None) -> torch.Tensor:
    """The MoE experts' output `[T, H]` for `x [T, H]` routed by (`topk_weights`, `topk_ids`) `[T, k]`;
    the signature and values of `kernels.moe_reference.fused_moe_ref`."""
    _check(x, w13, w2, topk_ids)
    t, h = x.shape
    e, k = w13.shape[0], topk_ids.shape[1]
    if t == 0:
        return x.new_zeros(0, h)
    tiles = tiles or default_tiles(t, k, e)
    sorted_ids, block_expert = align_by_expert(topk_ids, e, tiles.block_m)
    act = gate_up_grouped(x, w13, sorted_ids, block_expert, k, tiles)
    out = down_grouped(act, w2, sorted_ids, block_expert, topk_weights, tiles)
    return out.view(t, k, h).sum(dim=1)  # one kernel (torch accumulates half types in float32)


__all__ = ["ALIGN_ONE_PROGRAM_MAX_PAIRS", "MoeTiles", "align_by_expert", "default_tiles", "down_grouped", "fused_moe",
           "gate_up_grouped", "padded_length"]
