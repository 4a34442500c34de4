"""Grouping a step's (token, expert) pairs by expert for the grouped GEMMs of kernels/fused_moe.py.

A step of T tokens routes each to k experts: T*k pairs, pair id p = t * k + j. `align_by_expert`
sorts the pair ids by expert (stable) and pads every expert's run to a multiple of BLOCK_M rows
(padding rows hold the sentinel T*k), so each BLOCK_M block of the sorted list belongs to one
expert; a block past the end has expert -1. Shapes depend only on (T, k, E, BLOCK_M) and nothing
syncs with the host, so the grouping captures into a CUDA graph. Three ways, same output:

- "blocks" (the default): two launches over chunks of pairs. `_count_kernel` writes each chunk's
  pairs per expert; `_scatter_kernel` (one program per chunk) sums the chunks before its own and
  all of them, so it knows where each of its pairs goes, and it also writes the padding sentinels
  and block experts of one chunk of sorted positions. Up to BLOCKS_ONE_LAUNCH_MAX_PAIRS pairs the
  scatter programs count every chunk themselves: one launch ("blocks2": always two). Run 2 on the H200 measured the one-program
  grouping at 55-136 us for qwen3-30b-a3b's T = 128..4096 (one program walks every pair).
- "hist" (run 4): the same two launches without [chunk, experts] tensors: counts by tl.histogram,
  the rank within a chunk by a sort, gathers and a binary search (see its section); "hist2":
  always two launches. Same output as "torch".
- "one_program": `_align_kernel`, one Triton program that walks the pairs in chunks of 64
  (run 2's grouping up to 4,096 pairs; kept so the benchmark can time the old path).
- "torch": torch ops (scatter_add counts, a stable sort, searchsorted): run 2's grouping above
  4,096 pairs, and the reference the tests compare the other two with.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# run 2's rule for "legacy": the one program up to this many pairs, torch ops above
ALIGN_ONE_PROGRAM_MAX_PAIRS = 4096
_ALIGN_CHUNK = 64
METHODS = ("blocks", "blocks2", "hist", "hist2", "one_program", "torch", "legacy")
# "blocks" up to this many pairs: one launch (each program counts all pairs: 8 chunks of 128 at most);
# "blocks2" always two launches (the benchmark times both)
BLOCKS_ONE_LAUNCH_MAX_PAIRS = 1024


def padded_length(num_pairs: int, num_experts: int, block_m: int) -> int:
    """P = T*k + min(E, T*k) * (block_m - 1), rounded up to block_m: bounds the padded sorted list
    (each touched expert pads fewer than block_m rows), fixed by (T, k, E, block_m)."""
    cap = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-cap // block_m) * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int, *, method: str = "blocks"
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted pair ids [P] int32, expert of each BLOCK_M block [P / block_m] int32); `method` one of
    METHODS ("legacy": run 2's choice, the one program up to ALIGN_ONE_PROGRAM_MAX_PAIRS, torch above)."""
    if method == "legacy":
        method = "one_program" if topk_ids.numel() <= ALIGN_ONE_PROGRAM_MAX_PAIRS else "torch"
    if method == "blocks":
        return _align_blocks(topk_ids, num_experts, block_m, BLOCKS_ONE_LAUNCH_MAX_PAIRS)
    if method == "blocks2":
        return _align_blocks(topk_ids, num_experts, block_m, 0)
    if method == "hist":
        return _align_hist(topk_ids, num_experts, block_m, HIST_ONE_LAUNCH_MAX_PAIRS)
    if method == "hist2":
        return _align_hist(topk_ids, num_experts, block_m, 0)
    if method == "one_program":
        return _align_one_program(topk_ids, num_experts, block_m)
    if method == "torch":
        return _align_torch(topk_ids, num_experts, block_m)
    raise ValueError(f"align_by_expert: method {method!r} is not one of {METHODS}")


# ------------------------------------------------------------------------------- "blocks"
def _chunk(num_pairs: int) -> tuple[int, int]:
    """(pairs per program, warps): 128 keeps a [chunk, experts] one-hot in registers; 256 from
    16K pairs so the scatter programs re-read fewer chunk rows."""
    return (256, 8) if num_pairs > 16384 else (128, 4)


@triton.jit(do_not_specialize=["n"])
def _count_kernel(ids_ptr, hist_ptr, n, EP2: tl.constexpr, CHUNK: tl.constexpr):
    """hist[c, e]: pairs of chunk c routed to expert e."""
    c = tl.program_id(0)
    p = c * CHUNK + tl.arange(0, CHUNK)
    e = tl.load(ids_ptr + p, mask=p < n, other=-1)  # -1 matches no expert
    bins = tl.arange(0, EP2)
    onehot = (e[:, None] == bins[None, :]).to(tl.int32)
    tl.store(hist_ptr + c * EP2 + bins, tl.sum(onehot, axis=0))


@triton.jit(do_not_specialize=["n", "cap", "num_blocks", "num_chunks"])
def _scatter_kernel(ids_ptr, hist_ptr, sorted_ptr, bexp_ptr, n, cap, num_blocks, num_chunks,
                    BLOCK_M: tl.constexpr, EP2: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr,
                    COUNT_HERE: tl.constexpr):
    c = tl.program_id(0)
    bins = tl.arange(0, EP2)
    # pairs per expert in all chunks and in the chunks before this one (stable order across chunks)
    total = tl.zeros((EP2,), dtype=tl.int32)
    before = tl.zeros((EP2,), dtype=tl.int32)
    if COUNT_HERE:  # few pairs: every program counts them all itself (no count launch)
        for r in range(num_chunks):
            q = r * CHUNK + tl.arange(0, CHUNK)
            eq = tl.load(ids_ptr + q, mask=q < n, other=-1)
            h1 = tl.sum((eq[:, None] == bins[None, :]).to(tl.int32), axis=0)
            total += h1
            before += tl.where(r < c, h1, 0)
    else:
        for r0 in range(0, num_chunks, ROWS):
            r = r0 + tl.arange(0, ROWS)
            h = tl.load(hist_ptr + r[:, None] * EP2 + bins[None, :], mask=(r < num_chunks)[:, None], other=0)
            total += tl.sum(h, axis=0)
            before += tl.sum(tl.where((r < c)[:, None], h, 0), axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, 0)
    pad_start = pad_end - padded
    lanes = tl.arange(0, CHUNK)
    # 1. this chunk's pairs: expert's start + pairs of earlier chunks + earlier lanes of this chunk
    p = c * CHUNK + lanes
    ok = p < n
    e = tl.load(ids_ptr + p, mask=ok, other=-1)
    onehot = (e[:, None] == bins[None, :]).to(tl.int32)
    earlier = tl.cumsum(onehot, 0) - onehot
    dest = tl.sum(onehot * (earlier + (pad_start + before)[None, :]), axis=1)
    tl.store(sorted_ptr + dest, p, mask=ok)
    # 2. sorted positions of this chunk that no pair fills: the sentinel n (disjoint from 1's rows)
    pos = c * CHUNK + lanes
    ex = tl.sum((pad_end[None, :] <= pos[:, None]).to(tl.int32), axis=1)  # expert whose run holds pos
    mine = bins[None, :] == ex[:, None]
    used = tl.sum(tl.where(mine, pad_start[None, :] + total[None, :], 0), axis=1)  # end of its real rows
    tl.store(sorted_ptr + pos, n, mask=(pos < cap) & (pos >= used))
    # 3. blocks c*CHUNK.. : their expert, -1 past the last padded run
    blk = c * CHUNK + lanes
    start = blk * BLOCK_M
    bex = tl.sum((pad_end[None, :] <= start[:, None]).to(tl.int32), axis=1)
    tl.store(bexp_ptr + blk, tl.where(start < tl.sum(padded, axis=0), bex, -1), mask=blk < num_blocks)


def _align_blocks(topk_ids: torch.Tensor, num_experts: int, block_m: int, one_launch_max: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The many-program grouping; up to `one_launch_max` pairs each scatter program counts every
    pair itself (one launch instead of two: a few [CHUNK, experts] compares per chunk)."""
    ids = topk_ids.reshape(-1)  # read as they come (int64 from torch.topk): no conversion launch
    n = ids.numel()
    cap = padded_length(n, num_experts, block_m)
    chunk, warps = _chunk(n)
    ep2 = max(2, triton.next_power_of_2(num_experts))
    num_chunks = triton.cdiv(n, chunk)
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(cap // block_m, dtype=torch.int32, device=ids.device)
    one_launch = n <= one_launch_max
    hist = sorted_ids  # unused when the scatter counts itself
    if not one_launch:
        hist = torch.empty(num_chunks, ep2, dtype=torch.int32, device=ids.device)
        _count_kernel[(num_chunks,)](ids, hist, n, EP2=ep2, CHUNK=chunk, num_warps=warps)
    _scatter_kernel[(triton.cdiv(cap, chunk),)](ids, hist, sorted_ids, block_expert, n, cap, cap // block_m,
                                                num_chunks, BLOCK_M=block_m, EP2=ep2, CHUNK=chunk, ROWS=16,
                                                COUNT_HERE=one_launch, num_warps=warps)
    return sorted_ids, block_expert


# ------------------------------------------------------------------------------- "hist" (run 4)
# Run 3's "blocks" spent 75 us on 32K pairs (qwen3 T=4096): its scatter holds several [CHUNK, E]
# int32 one-hots (a cumsum down the chunk among them); compiled for sm90 (CHUNK 256, E 128, 8 warps)
# it takes 128 KB of shared memory (one program per SM), 255 registers and 168 spilled bytes a thread
# (benchmarks/kernels/moe_compile.py).
# "hist" keeps no [CHUNK, E] tensor (sm90: 64 registers, 2 KB shared, no spills): counts by tl.histogram, the rank within the chunk by sorting
# the keys expert * CHUNK + lane (unique, so the order is the stable one), an expert's first row by
# a gather from [E] vectors, a block's expert by a binary search of the padded runs' ends.
HIST_ONE_LAUNCH_MAX_PAIRS = 1024


def _hist_chunk(num_pairs: int) -> int:
    """Pairs per program. Run 4 (H200, two launches, qwen3): 32K pairs 10.1 us at 512, 16.1 at 256,
    35.1 at 128; 8K pairs 6.7 at 256, 7.8 at 512, 9.7 at 128."""
    if num_pairs > 16384:
        return 512
    return 256 if num_pairs > 4096 else 128


@triton.jit(do_not_specialize=["n"])
def _hist_kernel(ids_ptr, hist_ptr, n, EP2: tl.constexpr, CHUNK: tl.constexpr):
    """hist[c, e]: pairs of chunk c on expert e."""
    c = tl.program_id(0)
    p = c * CHUNK + tl.arange(0, CHUNK)
    e = tl.load(ids_ptr + p, mask=p < n, other=0).to(tl.int32)
    tl.store(hist_ptr + c * EP2 + tl.arange(0, EP2), tl.histogram(e, EP2, mask=p < n))


@triton.jit
def _chunk_counts(ids_ptr, hist_ptr, c, n, num_experts, num_chunks, EP2: tl.constexpr, CHUNK: tl.constexpr,
                  ROWS: tl.constexpr, COUNT_HERE: tl.constexpr):
    """Per expert ([EP2]): pairs in all chunks, in the chunks before c, in chunk c."""
    bins = tl.arange(0, EP2)
    total = tl.zeros((EP2,), dtype=tl.int32)
    before = tl.zeros((EP2,), dtype=tl.int32)
    mine = tl.zeros((EP2,), dtype=tl.int32)
    if COUNT_HERE:  # few pairs: each program counts them all (no hist launch)
        for r in range(num_chunks):
            q = r * CHUNK + tl.arange(0, CHUNK)
            h1 = tl.histogram(tl.load(ids_ptr + q, mask=q < n, other=0).to(tl.int32), EP2, mask=q < n)
            total += h1
            before += tl.where(r < c, h1, 0)
            mine += tl.where(r == c, h1, 0)
    else:
        for r0 in range(0, num_chunks, ROWS):
            r = r0 + tl.arange(0, ROWS)
            h = tl.load(hist_ptr + r[:, None] * EP2 + bins[None, :],
                        mask=(r < num_chunks)[:, None] & (bins < num_experts)[None, :], other=0)
            total += tl.sum(h, axis=0)
            before += tl.sum(tl.where((r < c)[:, None], h, 0), axis=0)
            mine += tl.sum(tl.where((r == c)[:, None], h, 0), axis=0)
    return total, before, mine


@triton.jit
def _runs_at_or_before(pad_end, x, EP2: tl.constexpr, LOG_EP2: tl.constexpr):
    """For each x: how many of the nondecreasing pad_end[0..EP2-1] are <= x (at most EP2 - 1)."""
    idx = tl.zeros(x.shape, dtype=tl.int32)
    for i in tl.static_range(LOG_EP2):
        cand = idx + (EP2 >> (i + 1))
        idx = tl.where(tl.gather(pad_end, cand - 1, 0) <= x, cand, idx)
    return idx


@triton.jit(do_not_specialize=["n", "num_experts", "cap", "num_blocks", "num_chunks"])
def _place_kernel(ids_ptr, hist_ptr, sorted_ptr, bexp_ptr, n, num_experts, cap, num_blocks, num_chunks,
                  BLOCK_M: tl.constexpr, EP2: tl.constexpr, LOG_EP2: tl.constexpr, CHUNK: tl.constexpr,
                  ROWS: tl.constexpr, COUNT_HERE: tl.constexpr):
    c = tl.program_id(0)
    progs = tl.num_programs(0)
    bins = tl.arange(0, EP2)
    lanes = tl.arange(0, CHUNK)
    total, before, mine = _chunk_counts(ids_ptr, hist_ptr, c, n, num_experts, num_chunks, EP2, CHUNK, ROWS,
                                        COUNT_HERE)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, 0)
    pad_start = pad_end - padded
    # 1. this chunk's pairs, sorted by (expert, lane): the i-th goes to its expert's first row +
    #    the expert's pairs in earlier chunks + i - the chunk's pairs on lower experts
    if c < num_chunks:
        p = c * CHUNK + lanes
        e = tl.load(ids_ptr + p, mask=p < n, other=num_experts).to(tl.int32)  # lanes past n sort last
        s = tl.sort(e * CHUNK + lanes)
        es = s // CHUNK
        offs = pad_start + before - (tl.cumsum(mine, 0) - mine)
        dest = tl.gather(offs, tl.minimum(es, EP2 - 1), 0) + lanes
        tl.store(sorted_ptr + dest, c * CHUNK + s % CHUNK, mask=es < num_experts)
    # 2. the sentinel n on the padding rows of experts c, c + progs, ... and on the rows past the runs
    used_end = pad_start + total
    rows = tl.arange(0, BLOCK_M)
    for ex in range(c, num_experts, progs):
        lo = tl.sum(tl.where(bins == ex, used_end, 0), axis=0)
        hi = tl.sum(tl.where(bins == ex, pad_end, 0), axis=0)
        tl.store(sorted_ptr + lo + rows, n, mask=lo + rows < hi)
    all_end = tl.sum(padded, axis=0)
    pos = c * CHUNK + lanes
    tl.store(sorted_ptr + pos, n, mask=(pos >= all_end) & (pos < cap))
    # 3. blocks c*CHUNK..: the expert whose padded run holds the block's first row, -1 past the runs
    blk = c * CHUNK + lanes
    start = blk * BLOCK_M
    bex = _runs_at_or_before(pad_end, start, EP2, LOG_EP2)
    tl.store(bexp_ptr + blk, tl.where(start < all_end, bex, -1), mask=blk < num_blocks)


def _align_hist(topk_ids: torch.Tensor, num_experts: int, block_m: int, one_launch_max: int = 0,
                chunk: int | None = None, warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """The "hist" grouping: a count launch (tl.histogram per chunk) and a place launch, or up to
    `one_launch_max` pairs the place launch alone (each program counts every chunk); `chunk`
    (a power of two): pairs per program, default `_hist_chunk`."""
    ids = topk_ids.reshape(-1)
    n = ids.numel()
    cap = padded_length(n, num_experts, block_m)
    chunk = chunk or _hist_chunk(n)
    ep2 = max(2, triton.next_power_of_2(num_experts))
    num_chunks = triton.cdiv(n, chunk)
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(cap // block_m, dtype=torch.int32, device=ids.device)
    one_launch = n <= one_launch_max
    hist = sorted_ids  # unused when the place launch counts itself
    if not one_launch:
        hist = torch.empty(num_chunks, ep2, dtype=torch.int32, device=ids.device)
        _hist_kernel[(num_chunks,)](ids, hist, n, EP2=ep2, CHUNK=chunk, num_warps=warps)
    _place_kernel[(triton.cdiv(cap, chunk),)](ids, hist, sorted_ids, block_expert, n, num_experts, cap,
                                              cap // block_m, num_chunks, BLOCK_M=block_m, EP2=ep2,
                                              LOG_EP2=ep2.bit_length() - 1, CHUNK=chunk, ROWS=32,
                                              COUNT_HERE=one_launch, num_warps=warps)
    return sorted_ids, block_expert


# ------------------------------------------------------------------------------- "one_program" (run 2)
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


# ------------------------------------------------------------------------------- "torch"
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


__all__ = ["ALIGN_ONE_PROGRAM_MAX_PAIRS", "BLOCKS_ONE_LAUNCH_MAX_PAIRS", "HIST_ONE_LAUNCH_MAX_PAIRS",
           "METHODS", "align_by_expert", "padded_length"]
