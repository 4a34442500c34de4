"""Triton paged attention: one kernel for prefill chunks, decode tokens and speculative tokens.

Layout (docs/interfaces.md, "Kernels"): ``q [num_tokens, Hq, D]``, caches
``[num_blocks, block_size, Hkv, D]``, ``block_tables int32 [B, max_blocks]``, ``seq_lens int32 [B]``
(context including this step's new tokens), ``query_start_loc int32 [B+1]``.

How the work is cut:
- One program owns one KV head and one "Q block" of ``BLOCK_M`` rows; a row is (query token,
  query head) with all ``Hq // Hkv`` query heads of the KV head packed side by side, so each KV
  tile is read once for the whole group and ``tl.dot`` runs with M >= 16 even for one decode token.
- The KV loop walks tiles of ``TILE_N`` context tokens, gathering the physical block of every
  token from the block table, so the tile size does not depend on the cache's block size.
- The grid is static: ``num_tokens // BLOCK_Q + num_seqs`` Q blocks (an upper bound; surplus
  programs return at once), so nothing is read back to the host and the call can be captured in
  a CUDA graph. The sequence of a program is found by binary search over ``query_start_loc``.
- Causal tiles past a Q block's last visible key are never visited; tiles that every row of the
  block sees completely run without the mask.
- Split-KV (flash-decoding): when there are too few (Q block, KV head) programs to fill the GPU,
  a third grid axis cuts each sequence's tiles into ``num_splits`` segments; each writes a
  normalised partial output and its log-sum-exp, and a second kernel merges them.
- FP8 KV cache (``torch.float8_e4m3fn``, see ``kernels.reference`` for the scale convention):
  tiles are loaded as fp8 (half the bytes) and widened to q's dtype in registers, which is
  exact; the program's KV-head scale is folded into the softmax scale for K and applied once to
  the output for V, so dequantisation costs no multiply per element.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernels.backend import DECODE_MAX_QUERY_LEN
from kernels.reference import is_fp8

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class AttentionConfig:
    """Tile shape and launch parameters of the attention kernel."""

    block_m: int  # rows per program = query tokens x query heads of one KV head
    tile_n: int  # context tokens per KV tile (independent of the cache's block size)
    num_warps: int
    num_stages: int


# The default tile shapes live in a table (attention_configs.json, with where each entry came
# from) that the H200 benchmark's sweep writes in the same form, so a measurement updates the
# defaults without a code change. Decode is memory bound: M=16 is the smallest tensor-core tile
# and the key tile sets the bytes in flight per SM. Prefill is compute bound.
CONFIG_TABLE_PATH = Path(__file__).with_name("attention_configs.json")
CONFIG_PATHS = ("decode", "prefill")
KV_KINDS = ("16bit", "fp8")  # KV-cache element size: bf16/fp16/fp32 tiles, or fp8 tiles


def load_config_table(path: Path = CONFIG_TABLE_PATH) -> dict[tuple[str, str], AttentionConfig]:
    """{(path, kv kind): config} of a table file; every (path, kv kind) pair must be there."""
    raw = json.loads(path.read_text())
    table = {}
    for p in CONFIG_PATHS:
        for kind in KV_KINDS:
            try:
                entry = raw[p][kind]
                table[p, kind] = AttentionConfig(
                    int(entry["block_m"]), int(entry["tile_n"]), int(entry["num_warps"]),
                    int(entry["num_stages"]))  # fmt: skip
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}: entry {p}.{kind} needs integer block_m, tile_n, "
                                 f"num_warps and num_stages ({exc!r})") from None
    return table


CONFIG_TABLE = load_config_table()
DECODE_CONFIG = CONFIG_TABLE["decode", "16bit"]
PREFILL_CONFIG = CONFIG_TABLE["prefill", "16bit"]
# Beyond DECODE_MAX_QUERY_LEN query tokens (kernels.backend) a sequence takes the prefill shape.
# Split-KV: aim for this many programs per SM, and never give a segment fewer context tokens.
SPLIT_TARGET_PROGRAMS_PER_SM = 2
SPLIT_MIN_TOKENS = 256
SPLIT_MAX = 64


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (plain Python: triton.next_power_of_2 costs ~5 us a call
    through Triton 3.6's constexpr-function wrapper, which adds up on the decode path)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(slots=True)
class KVScaleArgs:
    """The kernels' view of an fp8 cache's scales (placeholders for other caches)."""

    k_scale: torch.Tensor
    v_scale: torch.Tensor
    k_stride: int  # 0: one scale for every head (per tensor); 1: one per KV head
    v_stride: int
    is_fp8: bool


@lru_cache(maxsize=8)
def _unit_scale(device: torch.device) -> torch.Tensor:
    # one persistent tensor per device: a CUDA graph may capture its address
    return torch.ones(1, dtype=torch.float32, device=device)


def kv_scale_args(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor | None,
                  v_scale: torch.Tensor | None) -> KVScaleArgs:
    """Checked scales of a cache pair: float32, one element or one per KV head, on its device;
    None = 1.0 (vLLM's default without checkpoint scales). A 16-bit cache ignores them: its
    kernels get the cache itself as a never-read placeholder, with no checks, because eager
    mixed steps call this twice per layer and the host time of a step adds up."""
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache ({k_cache.dtype}) and v_cache ({v_cache.dtype}) must share a dtype")
    if not is_fp8(k_cache):
        return KVScaleArgs(k_cache, k_cache, 0, 0, False)
    num_kv_heads, device_index = k_cache.shape[2], k_cache.get_device()
    ks = _unit_scale(k_cache.device) if k_scale is None else k_scale
    vs = _unit_scale(k_cache.device) if v_scale is None else v_scale
    k_n, v_n = ks.numel(), vs.numel()
    for name, t, n in (("k_scale", ks, k_n), ("v_scale", vs, v_n)):
        if t.dtype != torch.float32 or (n != 1 and (n != num_kv_heads or t.stride(-1) != 1)) \
                or t.get_device() != device_index:
            raise ValueError(
                f"{name} must be a contiguous float32 tensor of 1 or num_kv_heads={num_kv_heads} "
                f"elements on {k_cache.device}; got {t.dtype} of {n} on {t.device}"
            )
    return KVScaleArgs(ks, vs, int(k_n > 1), int(v_n > 1), True)


@lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms_of(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 132 (an H100/H200) for the CPU interpreter."""
    if device.type != "cuda":
        return 132
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def choose_config(max_query_len: int, num_queries_per_kv: int, kv_fp8: bool = False) -> AttentionConfig:
    """Decode shape for (near-)single-token queries, prefill shape for chunks (from the table)."""
    path = "decode" if max_query_len <= DECODE_MAX_QUERY_LEN else "prefill"
    base = CONFIG_TABLE[path, "fp8" if kv_fp8 else "16bit"]
    block_m = max(base.block_m, next_pow2(num_queries_per_kv))
    return AttentionConfig(block_m, base.tile_n, base.num_warps, base.num_stages)


def choose_num_splits(
    num_q_blocks: int,
    num_kv_heads: int,
    max_query_len: int,
    max_seq_len: int,
    block_q: int,
    num_sms: int,
) -> int:
    """KV segments per sequence: >1 only when each sequence fits one Q block (decode-like) and
    the (Q block, KV head) programs cannot fill ``SPLIT_TARGET_PROGRAMS_PER_SM`` per SM."""
    if max_query_len > block_q:
        return 1
    programs = num_q_blocks * num_kv_heads
    if programs >= num_sms:
        return 1
    wanted = math.ceil(SPLIT_TARGET_PROGRAMS_PER_SM * num_sms / max(programs, 1))
    by_length = max(1, max_seq_len // SPLIT_MIN_TOKENS)
    return max(1, min(wanted, by_length, SPLIT_MAX))


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest b with query_start_loc[b] // BLOCK_Q + b <= q_block_global (binary search)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if start <= q_block_global:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _other_kind(q_len, SEQ_KIND: tl.constexpr, DECODE_MAX_Q: tl.constexpr):
    """Whether a sequence of q_len new tokens is left to the other launch of a mixed batch
    (SEQ_KIND 1: decode-like sequences only, 2: the others, 0: every sequence)."""
    if SEQ_KIND == 1:
        other = q_len > DECODE_MAX_Q
    elif SEQ_KIND == 2:
        other = q_len <= DECODE_MAX_Q
    else:
        other = q_len < 0
    return other


@triton.jit
def _find_token_seq(query_start_loc_ptr, token, num_seqs):
    """Largest b < num_seqs with query_start_loc[b] <= token (binary search): the sequence
    holding the token, skipping zero-length sequences that start at the same offset."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) <= token:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_tiles(
    acc,
    m_i,
    l_i,
    q,
    k_cache_ptr,
    v_cache_ptr,
    block_table_row_ptr,
    kv_head_offset,
    stride_c_block,
    stride_c_row,
    tile_lo,
    tile_hi,
    key_limit,  # [BLOCK_M] row r sees keys < key_limit[r] (used only when MASKED)
    num_keys,  # keys < num_keys exist in the block table (used only when MASKED)
    qk_scale,
    offs_d,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    offs_n = tl.arange(0, TILE_N)
    for j in range(tile_lo, tile_hi):
        key_pos = j * TILE_N + offs_n
        if MASKED:  # the tile may run past the last visible key: guard every load
            key_ok = key_pos < num_keys
            block_ids = tl.load(block_table_row_ptr + key_pos // BLOCK_SIZE, mask=key_ok, other=0)
        else:
            block_ids = tl.load(block_table_row_ptr + key_pos // BLOCK_SIZE)
        # physical row of every key in the tile; int64 so huge caches cannot overflow
        row_off = (
            block_ids.to(tl.int64) * stride_c_block
            + (key_pos % BLOCK_SIZE).to(tl.int64) * stride_c_row
            + kv_head_offset
        )
        kv_ptrs = row_off[:, None] + offs_d[None, :]
        if MASKED:
            kv_mask = key_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(k_cache_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        elif HEAD_DIM != HEAD_DIM_PAD:
            k = tl.load(k_cache_ptr + kv_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            k = tl.load(k_cache_ptr + kv_ptrs)
        if KV_FP8:  # exact: every e4m3 value is a bf16/fp16/fp32 value; the scale is in qk_scale
            k = k.to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            s = tl.where(key_pos[None, :] < key_limit[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row that has seen no key yet keeps m = -inf; shift by 0 there to avoid inf - inf
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_cache_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        elif HEAD_DIM != HEAD_DIM_PAD:
            v = tl.load(v_cache_ptr + kv_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            v = tl.load(v_cache_ptr + kv_ptrs)
        if KV_FP8:  # the scale is applied once to the output
            v = v.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(
            p.to(v.dtype), v, input_precision=DOT_PRECISION
        )
        m_i = m_new
    return acc, m_i, l_i


# Integer arguments that change from step to step are not specialised on (Triton would compile
# a variant per "equals 1" / "divisible by 16" pattern of each, and an eager step meeting a new
# pattern mid-replay paid ~1 s of compilation); nothing in the kernels gains from knowing them.
@triton.jit(do_not_specialize=["num_seqs", "num_splits", "min_tiles_per_split"])
def _paged_attention_kernel(
    out_ptr,
    segm_out_ptr,  # [num_tokens, Hq, num_splits, HEAD_DIM_PAD] fp32 (split-KV only)
    segm_lse_ptr,  # [num_tokens, Hq, num_splits] fp32, log2 domain (split-KV only)
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    k_scale_ptr,  # fp8 cache only: [1] or [Hkv] float32 (see stride_k_scale)
    v_scale_ptr,
    stride_k_scale,  # 0: per-tensor scale, 1: per KV head
    stride_v_scale,
    num_seqs,
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_c_block,
    stride_c_row,
    stride_c_head,
    stride_bt,
    num_splits,  # KV segments per sequence (split-KV only; a run-time value: no recompiles)
    min_tiles_per_split,  # fewer segments than num_splits when a sequence is short (see below)
    NUM_QUERIES_PER_KV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    SEQ_KIND: tl.constexpr = 0,  # ALL_SEQS, DECODE_SEQS or PREFILL_SEQS: which sequences to attend
    DECODE_MAX_Q: tl.constexpr = 4,  # a sequence of at most this many query tokens is decode-like
):
    # Q blocks in reverse: with causal prefill the last blocks of a sequence have the most
    # tiles, so starting them first leaves the short ones to fill the tail of the grid
    q_block_global = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq = _find_seq_idx(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block_local = q_block_global - (q_start // BLOCK_Q + seq)
    if q_block_local * BLOCK_Q >= q_len:
        return  # surplus program of the static grid
    if _other_kind(q_len, SEQ_KIND, DECODE_MAX_Q):
        return  # the other launch of a mixed batch attends this sequence
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    query_pos = q_block_local * BLOCK_Q + offs_m // NUM_QUERIES_PER_KV  # among the new tokens
    q_head = kv_head * NUM_QUERIES_PER_KV + offs_m % NUM_QUERIES_PER_KV
    row_ok = (offs_m // NUM_QUERIES_PER_KV < BLOCK_Q) & (query_pos < q_len)
    token = (q_start + query_pos).to(tl.int64)

    q = tl.load(
        q_ptr + token[:, None] * stride_q_tok + q_head[:, None] * stride_q_head + offs_d[None, :],
        mask=row_ok[:, None] & d_mask[None, :],
        other=0.0,
    )

    # keys visible to each row; padding rows get the first row's limit so they never widen it
    first_pos = q_block_local * BLOCK_Q
    key_limit = context_len + tl.where(row_ok, query_pos, first_pos) + 1
    last_pos = tl.minimum(first_pos + BLOCK_Q, q_len) - 1
    num_keys = context_len + last_pos + 1  # causal pruning: no tile past the last row's keys
    num_tiles = tl.cdiv(num_keys, TILE_N)
    num_full_tiles = (context_len + first_pos + 1) // TILE_N  # seen whole by every row

    if KV_FP8:  # scores of the stored k are k_scale times too small: fold it into the scale
        qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head * stride_k_scale)

    tile_lo = 0
    tile_hi = num_tiles
    if IS_SPLIT:
        # The grid's split count is fixed at launch (a CUDA graph fixes it at capture, from
        # max_model_len); the sequence's real length decides how many segments do work, so a
        # short sequence is not cut into segments of a tile or two that cost more to merge
        tiles_per_split = tl.maximum(tl.cdiv(num_tiles, num_splits), min_tiles_per_split)
        tile_lo = tl.minimum(split * tiles_per_split, num_tiles)
        tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    block_table_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_head_offset = kv_head.to(tl.int64) * stride_c_head

    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head_offset,
        stride_c_block, stride_c_row,
        tile_lo, tl.minimum(tile_hi, num_full_tiles), key_limit, num_keys, qk_scale, offs_d,
        HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, False, DOT_PRECISION, KV_FP8,
    )  # fmt: skip
    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head_offset,
        stride_c_block, stride_c_row,
        tl.maximum(tile_lo, num_full_tiles), tile_hi, key_limit, num_keys, qk_scale, offs_d,
        HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, True, DOT_PRECISION, KV_FP8,
    )  # fmt: skip

    has_keys = l_i > 0.0
    acc = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if KV_FP8:  # linear in v: one multiply here instead of one per cached element
        acc = acc * tl.load(v_scale_ptr + kv_head * stride_v_scale)
    if not IS_SPLIT:
        tl.store(
            out_ptr + token[:, None] * stride_o_tok + q_head[:, None] * stride_o_head
            + offs_d[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_mask[None, :],
        )  # fmt: skip
    else:
        # an empty segment (short sequence) stores lse = -inf and weighs nothing in the merge
        lse = tl.where(has_keys, m_i + tl.math.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        # beside a prefill launch the scratch has DECODE_MAX_Q rows per sequence, not one per
        # token: a chunk of thousands of tokens would otherwise size it
        segm_tok = token
        if SEQ_KIND == 1:
            segm_tok = seq.to(tl.int64) * DECODE_MAX_Q + query_pos
        segm_row = (segm_tok * (NUM_QUERIES_PER_KV * tl.num_programs(1)) + q_head) * num_splits + split
        tl.store(segm_lse_ptr + segm_row, lse, mask=row_ok)
        tl.store(
            segm_out_ptr + segm_row[:, None] * HEAD_DIM_PAD + offs_d[None, :],
            acc,
            mask=row_ok[:, None],
        )


@triton.jit(do_not_specialize=["num_splits", "num_seqs"])
def _merge_splits_kernel(
    out_ptr,
    segm_out_ptr,
    segm_lse_ptr,
    query_start_loc_ptr,
    stride_o_tok,
    stride_o_head,
    num_q_heads,
    num_splits,
    num_seqs,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS_PAD: tl.constexpr,
    SEQ_KIND: tl.constexpr = 0,
    DECODE_MAX_Q: tl.constexpr = 4,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    segm_tok = token
    if SEQ_KIND != 0:
        # beside a prefill launch: rows of the other kind (and padding tokens past every
        # sequence) were never written by the split launch, and their output is not ours
        seq = _find_token_seq(query_start_loc_ptr, token.to(tl.int32), num_seqs)
        q_end = tl.load(query_start_loc_ptr + seq + 1)
        q_len = q_end - tl.load(query_start_loc_ptr + seq)
        if token >= q_end:
            return
        if _other_kind(q_len, SEQ_KIND, DECODE_MAX_Q):
            return
        if SEQ_KIND == 1:
            segm_tok = seq.to(tl.int64) * DECODE_MAX_Q + (token - (q_end - q_len))
    offs_s = tl.arange(0, NUM_SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row = (segm_tok * num_q_heads + head) * num_splits
    lse = tl.load(segm_lse_ptr + row + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    weight = tl.math.exp2(lse - lse_max)  # empty segments: exp2(-inf) = 0
    parts = tl.load(
        segm_out_ptr + (row + offs_s)[:, None] * HEAD_DIM_PAD + offs_d[None, :],
        mask=(offs_s < num_splits)[:, None],
        other=0.0,
    )
    merged = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(
        out_ptr + token * stride_o_tok + head * stride_o_head + offs_d,
        merged.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


def check_kv_cache_shapes(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Both caches `[num_blocks, block_size, num_kv_heads, head_dim]`, of one shape."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim]; "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )


def _check_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_q_heads, head_dim]; got {tuple(q.shape)}")
    check_kv_cache_shapes(k_cache, v_cache)
    cache_strides = k_cache.stride()
    if cache_strides != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same strides")
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"cache head_dim {k_cache.shape[3]} != q head_dim {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {num_kv_heads}"
        )
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(
            f"query_start_loc must be [num_seqs + 1]={num_seqs + 1}; "
            f"got {tuple(query_start_loc.shape)}"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks]; "
            f"got {tuple(block_tables.shape)}"
        )
    if q.stride(-1) != 1 or cache_strides[-1] != 1:
        raise ValueError("q, k_cache and v_cache must be contiguous in head_dim (stride(-1) == 1)")
    if block_tables.stride(-1) != 1:
        raise ValueError("block_tables must be contiguous along its last axis")


# Which sequences one launch attends (the kernels' SEQ_KIND): a mixed batch runs two launches
# of the same kernel, decode-like sequences (q_len <= DECODE_MAX_QUERY_LEN) with the decode
# shape and split-KV, the others with the prefill shape; one config for both would read every
# decode's KV with the prefill shape's short key tiles and mostly empty rows.
ALL_SEQS, DECODE_SEQS, PREFILL_SEQS = 0, 1, 2


@dataclass(frozen=True, slots=True)
class LaunchConfigs:
    """Tile shapes of the two launches of a mixed batch (an override for tests and benchmarks)."""

    decode: AttentionConfig
    prefill: AttentionConfig


@dataclass(slots=True)
class _LaunchPlan:  # built once per launch on the host: no frozen-init overhead
    config: AttentionConfig
    block_q: int  # query tokens per Q block
    num_q_blocks: int  # grid axis 0: a static upper bound, no device sync
    splits: int  # KV segments per sequence (1 = no split-KV)
    min_tiles_per_split: int  # 1 when the caller fixed the split count
    seq_kind: int = ALL_SEQS


def launch_kinds(num_seqs: int, max_query_len: int, num_decode_seqs: int | None) -> tuple[int, ...]:
    """The launches of one call: one over all sequences when they are all of one kind (known
    from max_query_len, a single sequence, or the caller's count of decode-like sequences),
    else a decode launch and a prefill launch."""
    if max_query_len <= DECODE_MAX_QUERY_LEN or num_seqs == 1 or num_decode_seqs == 0:
        return (ALL_SEQS,)
    return (DECODE_SEQS, PREFILL_SEQS)


def _plan_launch(q: torch.Tensor, num_kv_heads: int, num_seqs: int, max_query_len: int,
                 max_seq_len: int, num_splits: int | None,
                 config: AttentionConfig | None, kv_fp8: bool = False, *,
                 seq_kind: int = ALL_SEQS, num_decode_seqs: int | None = None) -> _LaunchPlan:
    """Tile shape, grid size and split-KV count of one launch (overrides checked, not trusted).

    A DECODE_SEQS launch sees query lengths up to DECODE_MAX_QUERY_LEN and, for the split
    heuristic, one Q block per decode-like sequence (all sequences when the count is unknown);
    a PREFILL_SEQS launch never splits."""
    queries_per_kv = q.shape[1] // num_kv_heads
    if seq_kind == DECODE_SEQS:
        max_query_len = min(max_query_len, DECODE_MAX_QUERY_LEN)
    elif seq_kind == PREFILL_SEQS:
        num_splits = 1
    cfg = config or choose_config(max_query_len, queries_per_kv, kv_fp8)
    if cfg.block_m < queries_per_kv:
        raise ValueError(f"config.block_m {cfg.block_m} < query heads per KV head {queries_per_kv}")
    block_q = cfg.block_m // queries_per_kv
    num_q_blocks = q.shape[0] // block_q + num_seqs  # static upper bound, no device sync
    splits = num_splits
    if splits is None:
        busy_blocks = num_q_blocks
        if seq_kind == DECODE_SEQS:
            busy_blocks = num_seqs if num_decode_seqs is None else num_decode_seqs
        splits = choose_num_splits(
            busy_blocks, num_kv_heads, max_query_len, max_seq_len, block_q, num_sms_of(q.device)
        )
    if splits > 1 and max_query_len > block_q:
        raise ValueError(
            f"split-KV needs every sequence in one Q block: max_query_len {max_query_len} > "
            f"block_q {block_q}"
        )
    min_tiles = 1 if num_splits is not None else triton.cdiv(SPLIT_MIN_TOKENS, cfg.tile_n)
    return _LaunchPlan(cfg, block_q, num_q_blocks, splits, min_tiles, seq_kind)


def paged_attention(
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
    num_splits: int | None = None,
    config: AttentionConfig | None = None,
    configs: LaunchConfigs | None = None,
    num_decode_seqs: int | None = None,
) -> torch.Tensor:
    """Causal attention of ``q`` over the paged cache (see the module docstring for layouts).

    ``max_query_len``/``max_seq_len`` are host ints the caller already knows; they pick the
    tile shape and the split-KV count, so nothing is read back from the device. A batch that
    mixes decode-like sequences (q_len <= DECODE_MAX_QUERY_LEN) with longer ones runs as two
    launches (``launch_kinds``); ``num_decode_seqs``, the count of decode-like sequences when
    the caller knows it (None in a CUDA graph, whose batches vary), saves the decode launch
    when it is 0 and sizes its split-KV. ``num_splits`` (1 = never split; the decode launch
    only) and ``config`` (one launch over every sequence with this shape) or ``configs`` (the
    shapes of the two launches) override the heuristics (tests and benchmarks use them).
    ``k_scale``/``v_scale``: an fp8 cache's scales (``kernels.reference``); other caches
    ignore them.
    """
    _check_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    scales = kv_scale_args(k_cache, v_cache, k_scale, v_scale)
    num_tokens = q.shape[0]
    num_seqs = seq_lens.shape[0]
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(
            f"out must be shaped like q {tuple(q.shape)} and contiguous in head_dim; "
            f"got {tuple(out.shape)} with strides {out.stride()}"
        )
    if num_tokens == 0 or num_seqs == 0:
        return out
    kinds = (ALL_SEQS,) if config is not None else launch_kinds(num_seqs, max_query_len,
                                                                  num_decode_seqs)
    for kind in kinds:
        cfg = config
        if configs is not None:
            cfg = configs.prefill if kind == PREFILL_SEQS or (
                kind == ALL_SEQS and max_query_len > DECODE_MAX_QUERY_LEN) else configs.decode
        plan = _plan_launch(q, k_cache.shape[2], num_seqs, max_query_len, max_seq_len, num_splits,
                            cfg, scales.is_fp8, seq_kind=kind, num_decode_seqs=num_decode_seqs)
        _launch(plan, out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                scales)
    return out


def _launch(plan: _LaunchPlan, out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
            v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
            query_start_loc: torch.Tensor, scale: float, scales: KVScaleArgs) -> None:
    """One launch of the attention kernel (and of the split merge when it splits)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size, num_seqs = k_cache.shape[2], k_cache.shape[1], seq_lens.shape[0]
    queries_per_kv = num_q_heads // num_kv_heads
    cfg, block_q, num_q_blocks, splits = plan.config, plan.block_q, plan.num_q_blocks, plan.splits
    head_dim_pad = next_pow2(head_dim)
    dot_precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if splits > 1:  # one allocation for both scratch buffers: fewer calls on the decode path
        segm_tokens = num_seqs * DECODE_MAX_QUERY_LEN if plan.seq_kind == DECODE_SEQS else num_tokens
        rows = segm_tokens * num_q_heads * splits
        scratch = torch.empty(rows * (head_dim_pad + 1), dtype=torch.float32, device=q.device)
        segm_out, segm_lse = scratch[: rows * head_dim_pad], scratch[rows * head_dim_pad :]
    else:
        segm_out = segm_lse = out  # unused placeholders
    grid = (num_q_blocks, num_kv_heads, splits)
    q_strides, out_strides, cache_strides = q.stride(), out.stride(), k_cache.stride()
    _paged_attention_kernel[grid](
        out, segm_out, segm_lse, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
        scales.k_scale, scales.v_scale, scales.k_stride, scales.v_stride, num_seqs, scale * LOG2E,
        q_strides[0], q_strides[1], out_strides[0], out_strides[1],
        cache_strides[0], cache_strides[1], cache_strides[2], block_tables.stride(0), splits, plan.min_tiles_per_split,
        NUM_QUERIES_PER_KV=queries_per_kv, BLOCK_M=cfg.block_m, BLOCK_Q=block_q,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_SIZE=block_size, TILE_N=cfg.tile_n,
        IS_SPLIT=splits > 1, DOT_PRECISION=dot_precision, KV_FP8=scales.is_fp8,
        SEQ_KIND=plan.seq_kind, DECODE_MAX_Q=DECODE_MAX_QUERY_LEN,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if splits > 1:
        _merge_splits_kernel[(num_tokens, num_q_heads)](
            out, segm_out, segm_lse, query_start_loc, out_strides[0], out_strides[1], num_q_heads,
            splits, num_seqs, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
            NUM_SPLITS_PAD=next_pow2(splits), SEQ_KIND=plan.seq_kind,
            DECODE_MAX_Q=DECODE_MAX_QUERY_LEN, num_warps=4,
        )  # fmt: skip
