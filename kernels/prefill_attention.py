"""Triton prefill attention tuned for Hopper: the paged-attention contract, prefill-shaped work.

Same inputs and outputs as ``kernels.paged_attention.paged_attention`` (docs/interfaces.md,
"Kernels": ``q [num_tokens, Hq, D]``, caches ``[num_blocks, block_size, Hkv, D]``, int32
``block_tables``/``seq_lens``/``query_start_loc``), and exact for any query length; its launch
shapes are meant for batches whose sequences all bring more than a few new tokens.

How the work is cut (each point is a launch parameter of `PrefillConfig`, so a GPU sweep picks):
- A program owns ``block_m`` rows. ``pack_gqa``: a row is (query token, query head) with the
  ``Hq // Hkv`` heads of one KV head side by side (each K/V tile read once for the group);
  otherwise one query head per program and a row is a token (K/V reuse across the group's
  programs then comes from L2, and the causal diagonal spans ``block_m`` keys, not ``block_m /
  group``).
- The keys of a sequence are two parts walked one after the other: the cached prefix (tiles
  aligned at position 0, every row sees all of it) and this step's new tokens (tiles aligned
  at the first new token, causal). Tiles that every row sees whole run without any mask; only
  the prefix's last tile and the new part's diagonal tiles are masked.
- Where K/V tiles come from: the paged cache through per-key block-table gathers; or, with
  ``kv_tma`` and ``block_size % tile_n == 0``, one tensor-descriptor (TMA on sm90) load per
  tile inside a cache block. The new tokens can instead be read from ``k_new``/``v_new``
  (``[num_tokens, Hkv, D]``, e.g. views of a fused QKV output): contiguous rows, so a tile is
  one descriptor load at any tile size.
- Softmax in base 2 with ``scale * log2(e)`` folded into the scores; an fp8 cache's k scale is
  folded there too and its v scale applied once to the output (as in paged_attention).
- Static grid (``num_tokens // block_q + num_seqs`` Q blocks, surplus programs return), Q
  blocks in reverse so the long causal ones start first; nothing is read back to the host, so
  the call can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.paged_attention import LOG2E, check_kv_cache_shapes, kv_scale_args, next_pow2


@dataclass(frozen=True)
class PrefillConfig:
    """Launch parameters of the prefill kernel."""

    block_m: int  # rows per program (tokens x packed heads)
    tile_n: int  # keys per K/V tile
    num_warps: int
    num_stages: int
    pack_gqa: bool = True  # rows = tokens x the query heads of one KV head; else one head
    kv_tma: bool = False  # tensor-descriptor (TMA) tile loads wherever the layout allows


DEFAULT_CONFIG = PrefillConfig(block_m=128, tile_n=64, num_warps=8, num_stages=3)

# Where a part's K/V tiles come from (the kernel's SRC_* constexprs).
SRC_GATHER = 0  # paged cache, one block-table lookup per key
SRC_DESC_PAGED = 1  # paged cache, one descriptor load per tile (tile inside one cache block)
SRC_ROWS = 2  # contiguous k_new/v_new rows through pointers
SRC_DESC_ROWS = 3  # contiguous k_new/v_new rows, one descriptor load per tile
SOURCE_NAMES = {SRC_GATHER: "cache gather", SRC_DESC_PAGED: "cache descriptor",
                SRC_ROWS: "new rows", SRC_DESC_ROWS: "new rows descriptor"}  # fmt: skip


@triton.jit
def _find_seq(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest b with query_start_loc[b] // BLOCK_Q + b <= q_block_global (binary search)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block_global:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _load_kv_tile(src, t, offs_n, offs_d, key_ok, part_start, row_base, block_table_row_ptr,
                  head_col, stride_block, stride_row, SRC: tl.constexpr, MASKED: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                  HEAD_DIM_PAD: tl.constexpr):
    """One [TILE_N, HEAD_DIM_PAD] tile of keys t*TILE_N.. of a part; masked keys read 0.

    ``head_col``: the KV head's offset within a row (elements); ``row_base``: SRC_ROWS* row of
    the part's first key."""
    if SRC == 1:  # tile inside one cache block: a box of the [blocks * BLOCK_SIZE, Hkv * D] view
        first = t * TILE_N
        block_id = tl.load(block_table_row_ptr + first // BLOCK_SIZE)
        tile = src.load([block_id * BLOCK_SIZE + first % BLOCK_SIZE, head_col])
    elif SRC == 3:
        tile = src.load([row_base + t * TILE_N, head_col])
    else:
        kk = t * TILE_N + offs_n
        if SRC == 0:
            pos = part_start + kk
            if MASKED:
                block_ids = tl.load(block_table_row_ptr + pos // BLOCK_SIZE, mask=key_ok, other=0)
            else:
                block_ids = tl.load(block_table_row_ptr + pos // BLOCK_SIZE)
            row_off = (block_ids.to(tl.int64) * stride_block
                       + (pos % BLOCK_SIZE).to(tl.int64) * stride_row)  # fmt: skip
        else:
            row_off = (row_base + kk).to(tl.int64) * stride_row
        ptrs = src + row_off[:, None] + head_col + offs_d[None, :]
        d_ok = offs_d[None, :] < HEAD_DIM
        if MASKED:
            tile = tl.load(ptrs, mask=key_ok[:, None] & d_ok, other=0.0)
        elif HEAD_DIM != HEAD_DIM_PAD:
            tile = tl.load(ptrs, mask=d_ok, other=0.0)
        else:  # no mask at all: the loads stay vectorised
            tile = tl.load(ptrs)
    if MASKED and (SRC == 1 or SRC == 3):  # a box reads whatever lies past the part: zero it
        tile = tl.where(key_ok[:, None], tile, 0.0)
    return tile


@triton.jit
def _attend_part(acc, m_i, l_i, q, k_src, v_src, tile_lo, tile_hi, key_limit, part_len,
                 part_start, row_base, block_table_row_ptr, head_col, stride_block,
                 stride_row, qk_scale, offs_d, SRC: tl.constexpr,
                 MASKED: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """Online softmax over tiles [tile_lo, tile_hi) of one key part; row r sees part keys
    < key_limit[r] and keys >= part_len do not exist (both only checked when MASKED)."""
    offs_n = tl.arange(0, TILE_N)
    for t in range(tile_lo, tile_hi):
        kk = t * TILE_N + offs_n
        key_ok = kk < part_len
        k = _load_kv_tile(k_src, t, offs_n, offs_d, key_ok, part_start, row_base,
                          block_table_row_ptr, head_col, stride_block, stride_row,
                          SRC, MASKED, BLOCK_SIZE, TILE_N, HEAD_DIM, HEAD_DIM_PAD)  # fmt: skip
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)
        # The first tile a program visits shows every row at least one key (key 0 of the
        # prefix, or of the new tokens when there is no prefix), so m stays finite after it
        # and no inf - inf guard is needed; unmasked tiles fold the scale into one multiply-add.
        if MASKED:
            s = tl.where(kk[None, :] < key_limit[:, None], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_kv_tile(v_src, t, offs_n, offs_d, key_ok, part_start, row_base,
                          block_table_row_ptr, head_col, stride_block, stride_row,
                          SRC, MASKED, BLOCK_SIZE, TILE_N, HEAD_DIM, HEAD_DIM_PAD)  # fmt: skip
        # rescale, then let the MMA accumulate into acc in place
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc * alpha[:, None],
                     input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attend_all(acc, m_i, l_i, q, k_src, v_src, num_full, num_tiles, key_limit, part_len,
                part_start, row_base, block_table_row_ptr, head_col, stride_block, stride_row,
                qk_scale, offs_d, SRC: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """Tiles [0, num_full) of a part without masks, then [num_full, num_tiles) masked."""
    acc, m_i, l_i = _attend_part(
        acc, m_i, l_i, q, k_src, v_src, 0, num_full, key_limit, part_len, part_start, row_base,
        block_table_row_ptr, head_col, stride_block, stride_row, qk_scale, offs_d, SRC, False,
        BLOCK_SIZE, TILE_N, HEAD_DIM, HEAD_DIM_PAD, DOT_PRECISION)  # fmt: skip
    return _attend_part(
        acc, m_i, l_i, q, k_src, v_src, num_full, num_tiles, key_limit, part_len, part_start,
        row_base, block_table_row_ptr, head_col, stride_block, stride_row, qk_scale, offs_d, SRC,
        True, BLOCK_SIZE, TILE_N, HEAD_DIM, HEAD_DIM_PAD, DOT_PRECISION)  # fmt: skip


@triton.jit(do_not_specialize=["num_seqs"])
def _prefill_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, k_ctx, v_ctx, k_new, v_new, block_tables_ptr, seq_lens_ptr,
    query_start_loc_ptr, k_scale_ptr, v_scale_ptr, stride_k_scale, stride_v_scale, num_seqs,
    qk_scale, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head, stride_c_block,
    stride_c_row, stride_c_head, stride_bt, stride_new_tok, stride_new_head,
    NUM_QUERIES_PER_KV: tl.constexpr, ROW_HEADS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, CTX_SRC: tl.constexpr,
    NEW_SRC: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
):  # fmt: skip
    q_block_global = tl.num_programs(0) - 1 - tl.program_id(0)
    head_prog = tl.program_id(1)  # a KV head (ROW_HEADS > 1) or a query head (ROW_HEADS == 1)
    kv_head = head_prog // (NUM_QUERIES_PER_KV // ROW_HEADS)
    seq = _find_seq(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block_local = q_block_global - (q_start // BLOCK_Q + seq)
    if q_block_local * BLOCK_Q >= q_len:
        return  # surplus program of the static grid
    context_len = tl.load(seq_lens_ptr + seq) - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    query_pos = q_block_local * BLOCK_Q + offs_m // ROW_HEADS  # among the new tokens
    q_head = head_prog * ROW_HEADS + offs_m % ROW_HEADS
    row_ok = (offs_m // ROW_HEADS < BLOCK_Q) & (query_pos < q_len)
    token = (q_start + query_pos).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * stride_q_tok + q_head[:, None] * stride_q_head
                + offs_d[None, :], mask=row_ok[:, None] & d_mask[None, :], other=0.0)  # fmt: skip
    if KV_FP8:  # scores of the stored k are k_scale times too small
        qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head * stride_k_scale)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    cache_col = kv_head.to(tl.int64) * stride_c_head
    # a descriptor addresses the head by its column in a [rows, Hkv * D] view
    ctx_col = kv_head * HEAD_DIM if CTX_SRC == 1 else cache_col
    ctx_limit = tl.full([BLOCK_M], 0, tl.int32) + context_len
    acc, m_i, l_i = _attend_all(
        acc, m_i, l_i, q, k_ctx, v_ctx, context_len // TILE_N, tl.cdiv(context_len, TILE_N),
        ctx_limit, context_len, 0, 0, bt_row, ctx_col, stride_c_block, stride_c_row, qk_scale,
        offs_d, CTX_SRC, BLOCK_SIZE, TILE_N, HEAD_DIM, HEAD_DIM_PAD, DOT_PRECISION)  # fmt: skip

    # the new tokens: row r sees new keys <= its own position (padding rows copy the first
    # row); the first (first_pos + 1) // TILE_N tiles every row sees whole
    first_pos = q_block_local * BLOCK_Q
    last_pos = tl.minimum(first_pos + BLOCK_Q, q_len) - 1
    new_limit = tl.where(row_ok, query_pos, first_pos) + 1
    new_col = cache_col
    if NEW_SRC == 2:
        new_col = kv_head.to(tl.int64) * stride_new_head
    elif NEW_SRC == 3:
        new_col = kv_head * HEAD_DIM
    k_src, v_src = k_cache_ptr, v_cache_ptr
    if NEW_SRC >= 2:
        k_src, v_src = k_new, v_new
    new_row_stride = stride_new_tok if NEW_SRC >= 2 else stride_c_row
    acc, m_i, l_i = _attend_all(
        acc, m_i, l_i, q, k_src, v_src, (first_pos + 1) // TILE_N, tl.cdiv(last_pos + 1, TILE_N),
        new_limit, last_pos + 1, context_len, q_start, bt_row, new_col, stride_c_block,
        new_row_stride, qk_scale, offs_d, NEW_SRC, BLOCK_SIZE, TILE_N, HEAD_DIM, HEAD_DIM_PAD,
        DOT_PRECISION)  # fmt: skip

    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    if KV_FP8:
        acc = acc * tl.load(v_scale_ptr + kv_head * stride_v_scale)
    tl.store(out_ptr + token[:, None] * stride_o_tok + q_head[:, None] * stride_o_head
             + offs_d[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_mask[None, :])  # fmt: skip


@dataclass(frozen=True)
class PrefillPlan:
    """What one call launches: the config, the K/V source of each key part, the grid."""

    config: PrefillConfig
    ctx_source: int  # SRC_* of the cached prefix
    new_source: int  # SRC_* of the new tokens
    block_q: int  # query tokens per program
    grid: tuple[int, int]


def _check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_tables: torch.Tensor, seq_lens: torch.Tensor,
                  query_start_loc: torch.Tensor) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_q_heads, head_dim]; got {tuple(q.shape)}")
    check_kv_cache_shapes(k_cache, v_cache)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same strides")
    if k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"cache head_dim {k_cache.shape[3]} != q head_dim {q.shape[2]}")
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"num_q_heads {q.shape[1]} must be a multiple of num_kv_heads "
                         f"{k_cache.shape[2]}")  # fmt: skip
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(f"query_start_loc must be [num_seqs + 1]={num_seqs + 1}; "
                         f"got {tuple(query_start_loc.shape)}")  # fmt: skip
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [num_seqs={num_seqs}, max_blocks]; "
                         f"got {tuple(block_tables.shape)}")  # fmt: skip
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or block_tables.stride(-1) != 1:
        raise ValueError("q, k_cache, v_cache and block_tables must be contiguous in their "
                         "last axis (stride(-1) == 1)")


def _check_new_kv(k_new: torch.Tensor, v_new: torch.Tensor, q: torch.Tensor,
                  k_cache: torch.Tensor) -> None:
    want = (q.shape[0], k_cache.shape[2], q.shape[2])
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if tuple(t.shape) != want or t.stride(-1) != 1 or t.dtype != k_cache.dtype:
            raise ValueError(f"{name} must be [num_tokens, num_kv_heads, head_dim]={want} of the "
                             f"cache's dtype {k_cache.dtype}, contiguous in head_dim; got "
                             f"{tuple(t.shape)} {t.dtype} strides {t.stride()}")  # fmt: skip
    if k_new.stride() != v_new.stride():
        raise ValueError("k_new and v_new must have the same strides")


def _descriptor_ok(t: torch.Tensor, row_stride: int, head_dim: int) -> bool:
    """A [rows, Hkv * D] view of ``t`` can back a tensor descriptor: heads adjacent in a row,
    16-byte aligned base and row stride, a power-of-two head_dim (the box's width)."""
    size = t.element_size()
    return (t.stride(-2) == head_dim and head_dim == next_pow2(head_dim)
            and t.data_ptr() % 16 == 0 and (row_stride * size) % 16 == 0)  # fmt: skip


def plan_prefill(q: torch.Tensor, k_cache: torch.Tensor, num_seqs: int,
                 config: PrefillConfig | None = None, k_new: torch.Tensor | None = None) -> PrefillPlan:
    """The launch of one call: sources fall back to pointer loads where a descriptor cannot
    describe the layout (``kv_tma`` asks for descriptors, it does not require them)."""
    cfg = config or DEFAULT_CONFIG
    group = q.shape[1] // k_cache.shape[2]
    row_heads = group if cfg.pack_gqa else 1
    if cfg.block_m < row_heads or cfg.block_m % row_heads:
        raise ValueError(f"config.block_m {cfg.block_m} must be a multiple of the query heads "
                         f"per KV head {group} when pack_gqa is set")  # fmt: skip
    block_size, head_dim = k_cache.shape[1], k_cache.shape[3]
    cache_rows = k_cache.stride(0) == block_size * k_cache.stride(1)
    ctx = SRC_GATHER
    if (cfg.kv_tma and block_size % cfg.tile_n == 0 and cache_rows
            and _descriptor_ok(k_cache, k_cache.stride(1), head_dim)):  # fmt: skip
        ctx = SRC_DESC_PAGED
    # from the cache the new part's tiles start at context_len, rarely a block boundary
    new = SRC_GATHER
    if k_new is not None:
        new = SRC_DESC_ROWS if cfg.kv_tma and _descriptor_ok(k_new, k_new.stride(0), head_dim) \
            else SRC_ROWS
    block_q = cfg.block_m // row_heads
    grid = (q.shape[0] // block_q + num_seqs, k_cache.shape[2] if cfg.pack_gqa else q.shape[1])
    return PrefillPlan(cfg, ctx, new, block_q, grid)


def _descriptor(t: torch.Tensor, rows: int, row_stride: int, tile_n: int) -> TensorDescriptor:
    width = t.shape[-2] * t.shape[-1]  # Hkv * D: every head of a row
    return TensorDescriptor(t, [rows, width], [row_stride, 1], [tile_n, t.shape[-1]])


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """Causal attention of ``q`` over the paged cache, as ``paged_attention`` computes it.

    ``k_new``/``v_new`` (optional, both or neither): this step's keys and values
    ``[num_tokens, Hkv, D]`` in the cache's dtype, the same values the cache holds for the new
    tokens; the new-token part then reads them instead of gathering from the cache. Not with an
    fp8 cache (the cache holds rounded values, and its scales apply to the cache only).
    ``max_query_len``/``max_seq_len`` are accepted for signature parity (no split-KV here).
    """
    del max_query_len, max_seq_len
    _check_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    scales = kv_scale_args(k_cache, v_cache, k_scale, v_scale)
    if (k_new is None) != (v_new is None):
        raise ValueError("pass both k_new and v_new, or neither")
    if k_new is not None:
        if scales.is_fp8:
            raise ValueError("k_new/v_new cannot be used with an fp8 cache: the cache holds "
                             "the rounded values; leave them out")
        _check_new_kv(k_new, v_new, q, k_cache)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"out must be shaped like q {tuple(q.shape)} and contiguous in "
                         f"head_dim; got {tuple(out.shape)} strides {out.stride()}")  # fmt: skip
    num_seqs = seq_lens.shape[0]
    if q.shape[0] == 0 or num_seqs == 0:
        return out
    plan = plan_prefill(q, k_cache, num_seqs, config, k_new)
    _launch(plan, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out,
            scales, k_new, v_new)  # fmt: skip
    return out


def _launch(plan: PrefillPlan, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
            scale, out, scales, k_new, v_new) -> None:  # type: ignore[no-untyped-def]
    cfg = plan.config
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    k_ctx, v_ctx = k_cache, v_cache
    if plan.ctx_source == SRC_DESC_PAGED:
        rows = num_blocks * block_size
        k_ctx = _descriptor(k_cache, rows, k_cache.stride(1), cfg.tile_n)
        v_ctx = _descriptor(v_cache, rows, v_cache.stride(1), cfg.tile_n)
    kn, vn, stride_new = (k_cache, v_cache, (0, 0)) if k_new is None else \
        (k_new, v_new, (k_new.stride(0), k_new.stride(1)))
    if plan.new_source == SRC_DESC_ROWS:
        kn = _descriptor(k_new, q.shape[0], k_new.stride(0), cfg.tile_n)
        vn = _descriptor(v_new, q.shape[0], v_new.stride(0), cfg.tile_n)
    cs, qs, os_ = k_cache.stride(), q.stride(), out.stride()
    _prefill_kernel[plan.grid](
        out, q, k_cache, v_cache, k_ctx, v_ctx, kn, vn, block_tables, seq_lens, query_start_loc,
        scales.k_scale, scales.v_scale, scales.k_stride, scales.v_stride, seq_lens.shape[0],
        scale * LOG2E, qs[0], qs[1], os_[0], os_[1], cs[0], cs[1], cs[2],
        block_tables.stride(0), stride_new[0], stride_new[1],
        NUM_QUERIES_PER_KV=q.shape[1] // num_kv_heads,
        ROW_HEADS=q.shape[1] // num_kv_heads if cfg.pack_gqa else 1,
        BLOCK_M=cfg.block_m, BLOCK_Q=plan.block_q, HEAD_DIM=head_dim,
        HEAD_DIM_PAD=next_pow2(head_dim), BLOCK_SIZE=block_size, TILE_N=cfg.tile_n,
        CTX_SRC=plan.ctx_source, NEW_SRC=plan.new_source,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", KV_FP8=scales.is_fp8,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
