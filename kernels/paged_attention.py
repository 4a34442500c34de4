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
  a third grid axis cuts each Q block's key tiles into ``num_splits`` segments; each writes a
  normalised partial output and its log-sum-exp, and a second kernel merges them per token.
  Decode-shaped launches (one Q block per sequence) and prefill-shaped ones (chunks over a
  long cached context) alike; a Q block's causal rows simply find no keys in a late segment.
- FP8 KV cache (``torch.float8_e4m3fn``, see ``kernels.reference`` for the scale convention):
  tiles are loaded as fp8 (half the bytes) and widened for the tensor cores in registers, in one
  of the ways FP8_CONVERTS lists (a launch parameter: ``AttentionConfig.fp8_convert``); the
  program's KV-head scale is folded into the softmax scale for K and applied once to the output
  for V, so dequantisation costs no multiply per element.
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
from kernels.work_lists import AttentionWork, plan_work, work_capacity  # noqa: F401 (re-exported)

LOG2E = 1.4426950408889634


# How an fp8 (e4m3) KV tile becomes a tensor-core operand (a launch parameter, swept on the GPU
# because which is fastest depends on the hardware's conversion instructions):
# - "native": ``tile.to(q.dtype)``, Triton's own conversion; exact.
# - "fp16": K and V widened to fp16 (sm89+ converts two e4m3 to two fp16 in one instruction), q
#   and p cast to fp16 for both dots. q is first scaled by a power of two (folded into the
#   softmax scale) so that its largest magnitude is at most 2**15, below fp16's 65504: no q
#   overflows to inf; entries below 2**-24 of that scaled range flush to zero (error < 2**-39
#   of the largest q). With bf16 q this is exact wherever q's entries are >= 2**-14.
# - "bits": widened by integer ops: the e4m3 byte's exponent and mantissa are shifted into the
#   low bits of a bf16 (fp16 for fp16 q) bit pattern, which reads as the e4m3 value times
#   2**-120 (2**-8), subnormals included; the power of two is folded into the softmax scale
#   for K and into the PV product for V. Exact for every finite e4m3 byte (the two NaN codes,
#   which the cache writers never store, read as +-480). For bf16 patterns q is scaled by 2**64
#   (at most so far that its largest magnitude stays <= 2**120) and p by 2**64, so no product
#   of a dot with a q entry above 2**-61 (or p above 2**-61) falls into float32's subnormal
#   range, which tensor cores may flush.
# - "packed": the "bits" arithmetic on the cache read as uint32 words, four e4m3 values each:
#   QK^T and PV run as four dots over the byte planes (head-dim columns 4c + j), so no tile is
#   moved or converted one byte at a time (compiled for sm90, "native" reads its fp8 K tile
#   from shared memory byte by byte). Falls back to "bits" where the layout does not allow it
#   (see fp8_convert_of).
# - "words": the cache read as uint32 words as in "packed", but the four byte planes are put back
#   into one [TILE_N, D] e4m3 tile in registers and widened to fp16 as in "fp16" (same q guard):
#   one QK^T and one PV dot per tile, and no byte-wise shared-memory loads. Falls back to "fp16"
#   where the layout does not allow word loads (see fp8_convert_of).
FP8_CONVERTS = ("native", "fp16", "bits", "packed", "words")
FP8_CONVERT_DEFAULT = "native"


@dataclass(frozen=True)
class AttentionConfig:
    """Tile shape and launch parameters of the attention kernel."""

    block_m: int  # rows per program = query tokens x query heads of one KV head
    tile_n: int  # context tokens per KV tile (independent of the cache's block size)
    num_warps: int
    num_stages: int
    fp8_convert: str = FP8_CONVERT_DEFAULT  # how an fp8 tile is widened for the dots (FP8_CONVERTS)

    def __post_init__(self) -> None:
        if self.fp8_convert not in FP8_CONVERTS:
            raise ValueError(f"fp8_convert must be one of {', '.join(FP8_CONVERTS)}; "
                             f"got {self.fp8_convert!r}")


# The default tile shapes live in a table (attention_configs.json, with where each entry came
# from) that the H200 benchmark's sweep writes in the same form, so a measurement updates the
# defaults without a code change. Decode is memory bound: M=16 is the smallest tensor-core tile
# and the key tile sets the bytes in flight per SM. Prefill is compute bound.
CONFIG_TABLE_PATH = Path(__file__).with_name("attention_configs.json")
CONFIG_PATHS = ("decode", "prefill")
KV_KINDS = ("16bit", "fp8")  # KV-cache element size: bf16/fp16/fp32 tiles, or fp8 tiles


def load_config_table(path: Path = CONFIG_TABLE_PATH) -> dict[tuple[str, str], AttentionConfig]:
    """{(path, kv kind): config} of a table file; every (path, kv kind) pair must be there.
    ``fp8_convert`` is optional (tables written before it existed get the default)."""
    raw = json.loads(path.read_text())
    table = {}
    for p in CONFIG_PATHS:
        for kind in KV_KINDS:
            try:
                entry = raw[p][kind]
                table[p, kind] = AttentionConfig(
                    int(entry["block_m"]), int(entry["tile_n"]), int(entry["num_warps"]),
                    int(entry["num_stages"]), str(entry.get("fp8_convert", FP8_CONVERT_DEFAULT)))  # fmt: skip
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"{path}: entry {p}.{kind} needs integer block_m, tile_n, "
                                 f"num_warps and num_stages, and fp8_convert (optional) one of "
                                 f"{', '.join(FP8_CONVERTS)} ({exc!r})") from None
    return table


CONFIG_TABLE = load_config_table()
DECODE_CONFIG = CONFIG_TABLE["decode", "16bit"]
PREFILL_CONFIG = CONFIG_TABLE["prefill", "16bit"]
# Beyond DECODE_MAX_QUERY_LEN query tokens (kernels.backend) a sequence takes the prefill shape.
# Split-KV: aim for this many programs per SM, and never give a segment fewer context tokens.
SPLIT_TARGET_PROGRAMS_PER_SM = 2
SPLIT_MIN_TOKENS = 256
SPLIT_MAX = 64
# With the GPU already full of programs, only sequences longer than this are split (at most
# SPLIT_LONG_MAX segments): enough to keep a few long sequences from setting the step time,
# few enough that uniform batches keep one segment per sequence.
SPLIT_LONG_MIN_TOKENS = 2048
SPLIT_LONG_MAX = 16
SPLIT_FULL_PROGRAMS = 4096
# Split-KV for prefill-shaped launches (chunks). A chunk over a long cached context makes few
# (Q block, KV head) programs, each walking every key of its sequence alone while most SMs idle
# (H200, Llama-3.1-8B: 64 new tokens over 8K cached took 18.8 ms of GPU time against a 5.6 ms
# roofline, 16 programs per layer). A launch with fewer than PREFILL_SPLIT_BELOW_PROGRAMS_PER_SM
# programs per SM cuts each Q block's keys into segments of at least PREFILL_SPLIT_MIN_TOKENS
# until the programs reach PREFILL_SPLIT_TARGET_PROGRAMS_PER_SM per SM; the merge is the decode
# path's, per token. Measured on the H200 (profile_steps.py, whole steps as CUDA graphs, 8B):
# 64 over 8K 16.1 -> 6.7 ms, 128 over 2.5K beside 20 decodes 11.3 -> 9.2 ms; a 512-token chunk
# (128 programs, about one per SM) gained at most 7% and lost 4% over 1.5K cached (the merge's
# traffic), so launches of about a program per SM are left whole.
PREFILL_SPLIT_BELOW_PROGRAMS_PER_SM = 0.5
PREFILL_SPLIT_TARGET_PROGRAMS_PER_SM = 2
PREFILL_SPLIT_MIN_TOKENS = 512
PREFILL_SPLIT_MAX = 16
# The merge kernel's segment axis: two widths, not a constexpr per split count, which compiled a
# variant per count an eager step first met (H200: a validation replay stalled on one). 16 covers
# every count of a full GPU (SPLIT_LONG_MAX); 64 the few-sequence regime (SPLIT_MAX). Masked
# lanes load nothing; one width of 64 for all cost split launches 1-3% (H200, bench_split.py).
MERGE_SPLITS_PADS = (16, 64)


def merge_splits_pad(splits: int) -> int:
    """The merge kernel's NUM_SPLITS_PAD for a launch of `splits` KV segments."""
    for pad in MERGE_SPLITS_PADS:
        if splits <= pad:
            return pad
    return next_pow2(splits)  # a caller's override past the heuristics' range


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
    block_m = next_pow2(num_queries_per_kv)
    if block_m <= base.block_m:  # the common case: no new record on the decode path's host time
        return base
    return AttentionConfig(block_m, base.tile_n, base.num_warps, base.num_stages, base.fp8_convert)


# the variants that read the cache as uint32 words, and what runs where words do not fit
_WORD_FALLBACK = {"packed": "bits", "words": "fp16"}


def fp8_convert_of(config: AttentionConfig, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   kv_fp8: bool) -> str:
    """The kernel's FP8_CONVERT: the config's variant for an fp8 cache, the default otherwise
    (one compiled kernel for 16-bit caches). "packed" reads the cache as uint32 words, so it
    needs head_dim % 4 == 0 (and >= 33: four planes of at least 16 columns for the tensor
    cores) and 4-byte aligned rows; elsewhere it falls back to "bits", the same arithmetic
    on tiles widened one byte at a time. "words" needs the same except the width (its one
    tile spans the whole head dim) and falls back to "fp16"."""
    if not kv_fp8:
        return FP8_CONVERT_DEFAULT
    convert = config.fp8_convert
    if convert in _WORD_FALLBACK:
        head_dim = k_cache.shape[3]
        words_fit = head_dim % 4 == 0 and not any(st % 4 for st in k_cache.stride()[:3]) \
            and k_cache.data_ptr() % 4 == 0 and v_cache.data_ptr() % 4 == 0
        if not words_fit or (convert == "packed" and head_dim <= 32):
            return _WORD_FALLBACK[convert]
    return convert


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
        # Enough programs to fill the GPU, but one program per sequence leaves a batch waiting
        # on its longest sequence (H200 run 5, bench_split.py: 15 x 1K + one 32K took 556 us
        # unsplit, 84 us cut into 2K segments); long sequences are cut into segments of at
        # least SPLIT_LONG_MIN_TOKENS, short ones keep one segment and pay nothing
        # Every segment past a sequence's need is a program that only exits, and a CUDA graph
        # fixes the count at max_model_len: capped so the grid holds <= SPLIT_FULL_PROGRAMS
        # (decode, 256 x 1K tokens as a graph: 261 us unsplit, 337 us with 16 segments)
        cap = max(1, SPLIT_FULL_PROGRAMS // programs)
        return max(1, min(max_seq_len // SPLIT_LONG_MIN_TOKENS, SPLIT_LONG_MAX, cap))
    wanted = math.ceil(SPLIT_TARGET_PROGRAMS_PER_SM * num_sms / max(programs, 1))
    by_length = max(1, max_seq_len // SPLIT_MIN_TOKENS)
    return max(1, min(wanted, by_length, SPLIT_MAX))


def choose_prefill_splits(num_q_blocks: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """KV segments per Q block of a prefill-shaped launch: >1 only when its (Q block, KV head)
    programs fill less than PREFILL_SPLIT_BELOW_PROGRAMS_PER_SM per SM and the keys are long
    enough to give each segment PREFILL_SPLIT_MIN_TOKENS."""
    programs = max(num_q_blocks * num_kv_heads, 1)
    if programs >= PREFILL_SPLIT_BELOW_PROGRAMS_PER_SM * num_sms:
        return 1
    wanted = math.ceil(PREFILL_SPLIT_TARGET_PROGRAMS_PER_SM * num_sms / programs)
    by_length = max_seq_len // PREFILL_SPLIT_MIN_TOKENS
    return max(1, min(wanted, by_length, PREFILL_SPLIT_MAX))


@triton.jit
def _segments(num_tiles, num_splits, min_tiles_per_split):
    """(tiles per segment, segments used) of a sequence of num_tiles KV tiles. The grid's split
    count is fixed at launch (a CUDA graph fixes it at capture, from max_model_len); the real
    length decides how many segments work, each at least min_tiles_per_split tiles long, so a
    short sequence is not cut into segments that cost more to merge than they save."""
    tiles_per_split = tl.maximum(tl.cdiv(num_tiles, num_splits), min_tiles_per_split)
    return tiles_per_split, tl.cdiv(num_tiles, tiles_per_split)


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
def _pow2_headroom(q, SHIFT_LOG2: tl.constexpr, LIMIT_LOG2: tl.constexpr):
    """The exponent e <= SHIFT_LOG2 that keeps every |q * 2**e| <= 2**LIMIT_LOG2 (one rounding
    of log2 may cost a factor 2 of that margin, which the limits leave)."""
    amax = tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)
    room = LIMIT_LOG2 - tl.math.ceil(tl.math.log2(amax))  # amax = 0: +inf, so e = SHIFT_LOG2
    return tl.minimum(room, SHIFT_LOG2)


@triton.jit
def _fp8_query(q, qk_scale, FP8_CONVERT: tl.constexpr):
    """q as the QK^T operand of an fp8 variant, and qk_scale with its powers of two folded in."""
    if FP8_CONVERT == "fp16" or FP8_CONVERT == "words":
        e = _pow2_headroom(q, 0, 15)  # fp16's largest finite value is 65504 < 2**16
        return (q.to(tl.float32) * tl.math.exp2(e)).to(tl.float16), qk_scale * tl.math.exp2(-e)
    elif FP8_CONVERT == "bits" or FP8_CONVERT == "packed":
        if q.dtype == tl.float16:  # fp16 patterns read as the e4m3 value times 2**-8
            return q, qk_scale * 256.0
        else:  # bf16 patterns: times 2**-120; q moved up by 2**e (exact) keeps products normal
            e = _pow2_headroom(q, 64, 120)
            return (q.to(tl.float32) * tl.math.exp2(e)).to(q.dtype), qk_scale * tl.math.exp2(120.0 - e)
    else:
        return q, qk_scale


@triton.jit
def _widen_fp8(x, DOT_DTYPE: tl.constexpr, FP8_CONVERT: tl.constexpr):
    """An e4m3 tile as a DOT_DTYPE operand (see FP8_CONVERTS for each variant's scale)."""
    if FP8_CONVERT == "bits":
        b = x.to(tl.uint8, bitcast=True).to(tl.uint16)
        if DOT_DTYPE == tl.float16:  # sign to bit 15, exponent and mantissa to bits 13..7
            bits = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
            return bits.to(tl.uint16).to(tl.float16, bitcast=True)
        elif DOT_DTYPE == tl.float32:  # as bf16 but 16 bits further up: the same 2**-120
            w = b.to(tl.uint32)
            bits = ((w & 0x80) << 24) | ((w & 0x7F) << 20)
            return bits.to(tl.uint32).to(tl.float32, bitcast=True)
        else:  # bf16: exponent and mantissa to bits 10..4, under an 8-bit exponent field
            bits = ((b & 0x80) << 8) | ((b & 0x7F) << 4)
            return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DOT_DTYPE)


@triton.jit
def _softmax_step(s, m_i, l_i, P_LOG2: tl.constexpr):
    """One online-softmax update: (p * 2**P_LOG2, the old rows' rescale, new l, new m).
    The power of two rides in the row maximum (free), so p times a V tile that carries 2**-120
    stays in float32's normal range; l is kept unscaled."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row that has seen no key yet keeps m = -inf; shift by 0 there to avoid inf - inf
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    if P_LOG2 == 0:
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
    else:
        p = tl.math.exp2(s - (m_safe - P_LOG2)[:, None])
        l_i = l_i * alpha + tl.sum(p, 1) * tl.math.exp2(-1.0 * P_LOG2)
    return p, alpha, l_i, m_new


@triton.jit
def _attend_tiles_widened(
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
    FP8_CONVERT: tl.constexpr,  # one of FP8_CONVERTS (used only when KV_FP8)
):
    """The KV loop with whole tiles, widened element by element after the load."""
    offs_n = tl.arange(0, TILE_N)
    if KV_FP8:
        q, qk_scale = _fp8_query(q, qk_scale, FP8_CONVERT)
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
        if KV_FP8 and FP8_CONVERT == "words":
            k = _words_fp16(_load_words(k_cache_ptr, row_off, key_pos, num_keys, HEAD_DIM,
                                        HEAD_DIM_PAD, MASKED))  # fmt: skip
        elif MASKED:
            kv_mask = key_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(k_cache_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        elif HEAD_DIM != HEAD_DIM_PAD:
            k = tl.load(k_cache_ptr + kv_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            k = tl.load(k_cache_ptr + kv_ptrs)
        if KV_FP8:  # exact: every e4m3 value is a bf16/fp16/fp32 value; the scale is in qk_scale
            k = _widen_fp8(k, q.dtype, FP8_CONVERT)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            s = tl.where(key_pos[None, :] < key_limit[:, None], s, float("-inf"))
        if KV_FP8 and FP8_CONVERT == "bits" and q.dtype != tl.float16:
            p, alpha, l_i, m_new = _softmax_step(s, m_i, l_i, 64)
        else:
            p, alpha, l_i, m_new = _softmax_step(s, m_i, l_i, 0)
        if KV_FP8 and FP8_CONVERT == "words":
            v = _words_fp16(_load_words(v_cache_ptr, row_off, key_pos, num_keys, HEAD_DIM,
                                        HEAD_DIM_PAD, MASKED))  # fmt: skip
        elif MASKED:
            v = tl.load(v_cache_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        elif HEAD_DIM != HEAD_DIM_PAD:
            v = tl.load(v_cache_ptr + kv_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            v = tl.load(v_cache_ptr + kv_ptrs)
        if KV_FP8:  # the scale is applied once to the output
            v = _widen_fp8(v, q.dtype, FP8_CONVERT)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        if KV_FP8 and FP8_CONVERT == "bits":  # undo the patterns' (and p's) powers of two
            if q.dtype == tl.float16:
                pv = pv * 256.0
            else:
                pv = pv * (2.0**56)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _byte_plane(words, J: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Byte J of every uint32 word (an e4m3 value) as a DOT_DTYPE operand, by integer ops:
    the patterns of _widen_fp8's "bits" variant (2**-120 for bf16/fp32, 2**-8 for fp16)."""
    b = (words >> (8 * J)) & 0xFF
    if DOT_DTYPE == tl.float16:
        return (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.uint16).to(tl.float16, bitcast=True)
    elif DOT_DTYPE == tl.float32:
        return (((b & 0x80) << 24) | ((b & 0x7F) << 20)).to(tl.float32, bitcast=True)
    else:
        return (((b & 0x80) << 8) | ((b & 0x7F) << 4)).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _column_planes(x):
    """x [M, 4 W] as four [M, W]: columns 4c, 4c+1, 4c+2, 4c+3 (the bytes of word c)."""
    even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 4, 2, 2)))
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _join_planes(x0, x1, x2, x3):
    """The inverse of _column_planes."""
    x = tl.join(tl.join(x0, x2), tl.join(x1, x3))
    return tl.reshape(x, (x0.shape[0], x0.shape[1] * 4))


@triton.jit
def _load_words(cache_ptr, row_off, key_pos, num_keys, HEAD_DIM: tl.constexpr,
                HEAD_DIM_PAD: tl.constexpr, MASKED: tl.constexpr):
    """The e4m3 rows at ``row_off`` (element offsets, multiples of 4) as a [TILE_N,
    HEAD_DIM_PAD // 4] uint32 tile: word c holds columns 4c..4c+3, byte j column 4c + j
    (little endian); keys past ``num_keys`` (MASKED) and words past HEAD_DIM read as 0."""
    offs_w = tl.arange(0, HEAD_DIM_PAD // 4)
    w_ptrs = cache_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + (row_off // 4)[:, None] \
        + offs_w[None, :]
    if MASKED:
        mask = (key_pos < num_keys)[:, None] & (offs_w[None, :] < HEAD_DIM // 4)
        return tl.load(w_ptrs, mask=mask, other=0)
    elif HEAD_DIM != HEAD_DIM_PAD:
        return tl.load(w_ptrs, mask=offs_w[None, :] < HEAD_DIM // 4, other=0)
    else:
        return tl.load(w_ptrs)


@triton.jit
def _words_fp16(words):
    """A [N, W] uint32 tile of e4m3 bytes as the [N, 4 W] fp16 tile of their values (column
    4c + j = byte j of word c, as the cache stores them): each byte plane is cut out by a shift
    and a mask, the planes are interleaved back in registers, and the whole tile is widened by
    the hardware's paired e4m3 -> fp16 conversion (exact: every e4m3 value is an fp16 value)."""
    p0 = (words & 0xFF).to(tl.uint8)
    p1 = ((words >> 8) & 0xFF).to(tl.uint8)
    p2 = ((words >> 16) & 0xFF).to(tl.uint8)
    p3 = (words >> 24).to(tl.uint8)
    return _join_planes(p0, p1, p2, p3).to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _attend_tiles_packed(
    acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head_offset,
    stride_c_block, stride_c_row, tile_lo, tile_hi, key_limit, num_keys, qk_scale, offs_d,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, FP8_CONVERT: tl.constexpr,
):  # fmt: skip
    """The KV loop over an fp8 cache read as uint32 words (four e4m3 values each): byte j of
    word c is head-dim column 4c + j, so QK^T is the sum of four dots over the byte planes
    (q split the same way) and PV gives the output's four column planes. No tile is ever moved
    or converted byte by byte (the "native" variant's compiled code reads the fp8 K tile from
    shared memory one byte at a time). Needs HEAD_DIM % 4 == 0 and cache strides that are
    multiples of 4 (the wrapper checks)."""
    tl.static_assert(HEAD_DIM % 4 == 0 and HEAD_DIM_PAD >= 64, "packed fp8 needs head_dim % 4 == 0, >= 64")
    WORDS: tl.constexpr = HEAD_DIM_PAD // 4
    offs_n = tl.arange(0, TILE_N)
    offs_w = tl.arange(0, WORDS)
    q, qk_scale = _fp8_query(q, qk_scale, FP8_CONVERT)
    q0, q1, q2, q3 = _column_planes(q)
    a0, a1, a2, a3 = _column_planes(acc)
    k_words = k_cache_ptr.to(tl.pointer_type(tl.uint32), bitcast=True)
    v_words = v_cache_ptr.to(tl.pointer_type(tl.uint32), bitcast=True)
    for j in range(tile_lo, tile_hi):
        key_pos = j * TILE_N + offs_n
        if MASKED:
            key_ok = key_pos < num_keys
            block_ids = tl.load(block_table_row_ptr + key_pos // BLOCK_SIZE, mask=key_ok, other=0)
        else:
            block_ids = tl.load(block_table_row_ptr + key_pos // BLOCK_SIZE)
        row_off = (
            block_ids.to(tl.int64) * stride_c_block
            + (key_pos % BLOCK_SIZE).to(tl.int64) * stride_c_row
            + kv_head_offset
        )
        w_ptrs = (row_off // 4)[:, None] + offs_w[None, :]
        if MASKED:
            w_mask = key_ok[:, None] & (offs_w[None, :] < HEAD_DIM // 4)
            kw = tl.load(k_words + w_ptrs, mask=w_mask, other=0)
        elif HEAD_DIM != HEAD_DIM_PAD:
            kw = tl.load(k_words + w_ptrs, mask=offs_w[None, :] < HEAD_DIM // 4, other=0)
        else:
            kw = tl.load(k_words + w_ptrs)
        s = tl.dot(q0, tl.trans(_byte_plane(kw, 0, q.dtype)), input_precision=DOT_PRECISION)
        s = tl.dot(q1, tl.trans(_byte_plane(kw, 1, q.dtype)), s, input_precision=DOT_PRECISION)
        s = tl.dot(q2, tl.trans(_byte_plane(kw, 2, q.dtype)), s, input_precision=DOT_PRECISION)
        s = tl.dot(q3, tl.trans(_byte_plane(kw, 3, q.dtype)), s, input_precision=DOT_PRECISION)
        s = s * qk_scale
        if MASKED:
            s = tl.where(key_pos[None, :] < key_limit[:, None], s, float("-inf"))
        if q.dtype == tl.float16:
            p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, 0)
            v_unscale = 256.0  # the fp16 patterns' 2**-8
        else:
            p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, 64)
            v_unscale = 2.0**56  # the bf16 patterns' 2**-120 times p's 2**64
        if MASKED:
            vw = tl.load(v_words + w_ptrs, mask=w_mask, other=0)
        elif HEAD_DIM != HEAD_DIM_PAD:
            vw = tl.load(v_words + w_ptrs, mask=offs_w[None, :] < HEAD_DIM // 4, other=0)
        else:
            vw = tl.load(v_words + w_ptrs)
        p = p.to(q.dtype)
        a0 = a0 * alpha[:, None] + tl.dot(p, _byte_plane(vw, 0, q.dtype), input_precision=DOT_PRECISION) * v_unscale
        a1 = a1 * alpha[:, None] + tl.dot(p, _byte_plane(vw, 1, q.dtype), input_precision=DOT_PRECISION) * v_unscale
        a2 = a2 * alpha[:, None] + tl.dot(p, _byte_plane(vw, 2, q.dtype), input_precision=DOT_PRECISION) * v_unscale
        a3 = a3 * alpha[:, None] + tl.dot(p, _byte_plane(vw, 3, q.dtype), input_precision=DOT_PRECISION) * v_unscale
    return _join_planes(a0, a1, a2, a3), m_i, l_i


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
    FP8_CONVERT: tl.constexpr,  # one of FP8_CONVERTS (used only when KV_FP8)
):
    """Attend the rows of ``q`` to KV tiles [tile_lo, tile_hi): the online-softmax state in and out."""
    if KV_FP8 and FP8_CONVERT == "packed":
        acc, m_i, l_i = _attend_tiles_packed(
            acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head_offset, stride_c_block, stride_c_row, tile_lo, tile_hi, key_limit, num_keys, qk_scale, offs_d, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, MASKED, DOT_PRECISION, KV_FP8, FP8_CONVERT,
        )  # fmt: skip
    else:
        acc, m_i, l_i = _attend_tiles_widened(
            acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head_offset, stride_c_block, stride_c_row, tile_lo, tile_hi, key_limit, num_keys, qk_scale, offs_d, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, MASKED, DOT_PRECISION, KV_FP8, FP8_CONVERT,
        )  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def _attend_q_block(
    seq, q_block_local, kv_head, split,
    out_ptr, segm_out_ptr, segm_lse_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr,
    seq_lens_ptr, query_start_loc_ptr, k_scale_ptr, v_scale_ptr, stride_k_scale, stride_v_scale,
    qk_scale, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head, stride_c_block,
    stride_c_row, stride_c_head, stride_bt, num_splits, min_tiles_per_split,
    NUM_QUERIES_PER_KV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr, IS_SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, FP8_CONVERT: tl.constexpr, SEQ_KIND: tl.constexpr,
    DECODE_MAX_Q: tl.constexpr,
):  # fmt: skip
    """Attention of one (Q block, KV head, KV segment): its output rows, or its partial rows
    and log-sum-exps for the merge. Does nothing for a Q block past its sequence's tokens, a
    sequence of the other launch's kind, or a segment past what the block's keys need (guards
    rather than returns: a work-list launch calls this in a loop)."""
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    active = (q_block_local * BLOCK_Q < q_len) & ~_other_kind(q_len, SEQ_KIND, DECODE_MAX_Q)
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len
    # causal pruning (no tile past the Q block's last row's keys); see _segments for splits
    first_pos = q_block_local * BLOCK_Q
    last_pos = tl.minimum(first_pos + BLOCK_Q, q_len) - 1
    num_keys = context_len + last_pos + 1
    num_tiles = tl.cdiv(num_keys, TILE_N)
    tile_lo = 0
    tile_hi = num_tiles
    num_used = 1
    if IS_SPLIT:
        tiles_per_split, num_used = _segments(num_tiles, num_splits, min_tiles_per_split)
        active = active & (split < num_used)  # past the keys' need: no work, nothing to merge
        tile_lo = split * tiles_per_split
        tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)
    if active:
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
        key_limit = context_len + tl.where(row_ok, query_pos, first_pos) + 1
        num_full_tiles = (context_len + first_pos + 1) // TILE_N  # seen whole by every row

        scale = qk_scale
        if KV_FP8:  # scores of the stored k are k_scale times too small: fold it into the scale
            scale = qk_scale * tl.load(k_scale_ptr + kv_head * stride_k_scale)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
        block_table_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
        kv_head_offset = kv_head.to(tl.int64) * stride_c_head

        acc, m_i, l_i = _attend_tiles(
            acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head_offset,
            stride_c_block, stride_c_row,
            tile_lo, tl.minimum(tile_hi, num_full_tiles), key_limit, num_keys, scale, offs_d,
            HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, False, DOT_PRECISION, KV_FP8, FP8_CONVERT,
        )  # fmt: skip
        acc, m_i, l_i = _attend_tiles(
            acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head_offset,
            stride_c_block, stride_c_row,
            tl.maximum(tile_lo, num_full_tiles), tile_hi, key_limit, num_keys, scale, offs_d,
            HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, True, DOT_PRECISION, KV_FP8, FP8_CONVERT,
        )  # fmt: skip

        has_keys = l_i > 0.0
        acc = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        if KV_FP8:  # linear in v: one multiply here instead of one per cached element
            acc = acc * tl.load(v_scale_ptr + kv_head * stride_v_scale)
        if num_used == 1:  # unsplit launch, or a Q block short enough for one segment
            tl.store(
                out_ptr + token[:, None] * stride_o_tok + q_head[:, None] * stride_o_head
                + offs_d[None, :],
                acc.to(out_ptr.dtype.element_ty),
                mask=row_ok[:, None] & d_mask[None, :],
            )  # fmt: skip
        else:
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
    work_ptr,  # USE_WORK: int32 items (sequence << 16 | Q block of the sequence)
    num_work_ptr,  # USE_WORK: int32 [1], the items this launch works (read on the device)
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
    num_splits,  # KV segments per Q block (split-KV only; a run-time value: no recompiles)
    min_tiles_per_split,  # fewer segments than num_splits when a Q block is short (see below)
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
    FP8_CONVERT: tl.constexpr,
    SEQ_KIND: tl.constexpr = 0,  # ALL_SEQS, DECODE_SEQS or PREFILL_SEQS: which sequences to attend
    DECODE_MAX_Q: tl.constexpr = 4,  # a sequence of at most this many query tokens is decode-like
    USE_WORK: tl.constexpr = False,  # Q blocks from a work list, in a loop over the grid's axis 0
):
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if USE_WORK:
        # The host listed this launch's Q blocks; a CUDA graph's grid is sized for the most a
        # replay can bring, and its programs stride over however many the step has (no
        # program spends a launch slot on a padding sequence or on the other kind's blocks)
        for w in range(tl.program_id(0), tl.load(num_work_ptr), tl.num_programs(0)):
            item = tl.load(work_ptr + w)
            _attend_q_block(
                item >> 16, item & 0xFFFF, kv_head, split,
                out_ptr, segm_out_ptr, segm_lse_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, k_scale_ptr, v_scale_ptr, stride_k_scale, stride_v_scale, qk_scale, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head, stride_c_block, stride_c_row, stride_c_head, stride_bt, num_splits, min_tiles_per_split,
                NUM_QUERIES_PER_KV, BLOCK_M, BLOCK_Q, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, IS_SPLIT, DOT_PRECISION, KV_FP8, FP8_CONVERT, SEQ_KIND, DECODE_MAX_Q,
            )  # fmt: skip
    else:
        # Q blocks in reverse: with causal prefill the last blocks of a sequence have the most
        # tiles, so starting them first leaves the short ones to fill the tail of the grid
        q_block_global = tl.num_programs(0) - 1 - tl.program_id(0)
        seq = _find_seq_idx(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        q_block_local = q_block_global - (q_start // BLOCK_Q + seq)
        if q_block_local * BLOCK_Q >= q_len:
            return  # surplus program of the static grid
        if _other_kind(q_len, SEQ_KIND, DECODE_MAX_Q):
            return  # the other launch of a mixed batch attends this sequence
        _attend_q_block(
            seq, q_block_local, kv_head, split,
            out_ptr, segm_out_ptr, segm_lse_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, k_scale_ptr, v_scale_ptr, stride_k_scale, stride_v_scale, qk_scale, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head, stride_c_block, stride_c_row, stride_c_head, stride_bt, num_splits, min_tiles_per_split,
            NUM_QUERIES_PER_KV, BLOCK_M, BLOCK_Q, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, IS_SPLIT, DOT_PRECISION, KV_FP8, FP8_CONVERT, SEQ_KIND, DECODE_MAX_Q,
        )  # fmt: skip


@triton.jit
def _merge_token(token, seq, head, q_end, q_len, out_ptr, segm_out_ptr, segm_lse_ptr, seq_lens_ptr,
                 stride_o_tok, stride_o_head, num_q_heads, num_splits, min_tiles_per_split, block_q,
                 TILE_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                 NUM_SPLITS_PAD: tl.constexpr, SEQ_KIND: tl.constexpr, DECODE_MAX_Q: tl.constexpr):
    """Merge one (token, query head)'s segments into its output row, unless its Q block used a
    single segment (which the attention program stored whole)."""
    # the token's Q block cut its keys (those of the block's last row) as the attention
    # program did: the same count of segments, to merge here unless it is one
    pos = token - (q_end - q_len)
    last_pos = tl.minimum((pos // block_q + 1) * block_q, q_len) - 1
    num_keys = tl.load(seq_lens_ptr + seq) - q_len + last_pos + 1
    num_used = _segments(tl.cdiv(num_keys, TILE_N), num_splits, min_tiles_per_split)[1]
    if num_used > 1:
        segm_tok = token
        if SEQ_KIND == 1:
            segm_tok = seq.to(tl.int64) * DECODE_MAX_Q + pos
        offs_s = tl.arange(0, NUM_SPLITS_PAD)
        offs_d = tl.arange(0, HEAD_DIM_PAD)
        row = (segm_tok * num_q_heads + head) * num_splits
        used = offs_s < num_used  # segments past num_used were never written
        lse = tl.load(segm_lse_ptr + row + offs_s, mask=used, other=float("-inf"))
        lse_max = tl.max(lse, 0)
        weight = tl.math.exp2(lse - lse_max)  # a segment with no keys (lse -inf) weighs 0
        parts = tl.load(
            segm_out_ptr + (row + offs_s)[:, None] * HEAD_DIM_PAD + offs_d[None, :],
            mask=used[:, None],
            other=0.0,
        )
        merged = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
        tl.store(
            out_ptr + token * stride_o_tok + head * stride_o_head + offs_d,
            merged.to(out_ptr.dtype.element_ty),
            mask=offs_d < HEAD_DIM,
        )


@triton.jit(do_not_specialize=["num_splits", "num_seqs", "min_tiles_per_split", "block_q"])
def _merge_splits_kernel(
    out_ptr,
    segm_out_ptr,
    segm_lse_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    work_ptr,  # USE_WORK: the attention launch's work list (its Q blocks)
    num_work_ptr,
    stride_o_tok,
    stride_o_head,
    num_q_heads,
    num_splits,
    min_tiles_per_split,
    num_seqs,
    block_q,  # query tokens per Q block of the attention launch (its segments are per Q block)
    TILE_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS_PAD: tl.constexpr,
    SEQ_KIND: tl.constexpr = 0,
    DECODE_MAX_Q: tl.constexpr = 4,
    USE_WORK: tl.constexpr = False,  # programs stride over the work list's Q blocks and their tokens
):
    head = tl.program_id(1)
    if USE_WORK:
        for w in range(tl.program_id(0), tl.load(num_work_ptr), tl.num_programs(0)):
            item = tl.load(work_ptr + w)
            seq = item >> 16
            q_start = tl.load(query_start_loc_ptr + seq)
            q_end = tl.load(query_start_loc_ptr + seq + 1)
            lo = (q_start + (item & 0xFFFF) * block_q).to(tl.int64)
            for r in range(tl.minimum(lo + block_q, q_end) - lo):
                _merge_token(
                    lo + r, seq, head, q_end, q_end - q_start, out_ptr, segm_out_ptr, segm_lse_ptr, seq_lens_ptr,
                    stride_o_tok, stride_o_head, num_q_heads, num_splits, min_tiles_per_split, block_q,
                    TILE_N, HEAD_DIM, HEAD_DIM_PAD, NUM_SPLITS_PAD, SEQ_KIND, DECODE_MAX_Q,
                )  # fmt: skip
    else:
        token = tl.program_id(0).to(tl.int64)
        # Rows of the other kind beside a prefill launch, padding tokens past every sequence and
        # sequences of one segment (written whole by the attention kernel) are not ours to merge
        seq = _find_token_seq(query_start_loc_ptr, token.to(tl.int32), num_seqs)
        q_end = tl.load(query_start_loc_ptr + seq + 1)
        q_len = q_end - tl.load(query_start_loc_ptr + seq)
        if token >= q_end:
            return
        if _other_kind(q_len, SEQ_KIND, DECODE_MAX_Q):
            return
        _merge_token(
            token, seq, head, q_end, q_len, out_ptr, segm_out_ptr, segm_lse_ptr, seq_lens_ptr,
            stride_o_tok, stride_o_head, num_q_heads, num_splits, min_tiles_per_split, block_q,
            TILE_N, HEAD_DIM, HEAD_DIM_PAD, NUM_SPLITS_PAD, SEQ_KIND, DECODE_MAX_Q,
        )  # fmt: skip


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
    min_tiles_per_split: int  # shortest segment in tiles; 1 when the caller fixed the split count
    seq_kind: int = ALL_SEQS


# Work lists (kernels.work_lists): for a mixed batch the host lists each launch's Q blocks and
# the kernel's programs stride over the list instead of finding their block by binary search
# over a static grid. A CUDA graph's static grid holds a block per token and per sequence of the
# padded batch (H200, Llama-3.2-1B, a 512-token step: 3,072 decode-launch and 6,528 prefill-
# launch programs per layer for ~20 real blocks), and those empty programs took the mixed graph
# from 2.26 to 3.20 ms. With a list a graph's grid is at most WORK_PROGRAMS_PER_SM per SM (all
# heads and segments together), whatever the graph's padding.
WORK_PROGRAMS_PER_SM = 4


def work_block_qs(num_q_heads: int, num_kv_heads: int, kv_fp8: bool = False) -> tuple[int, int]:
    """Query tokens per Q block of the decode launch and of the prefill launch (the units of
    their work lists), from the default tile shapes."""
    qpk = num_q_heads // num_kv_heads
    return (choose_config(1, qpk, kv_fp8).block_m // qpk,
            choose_config(DECODE_MAX_QUERY_LEN + 1, qpk, kv_fp8).block_m // qpk)


def _work_grid(bound: int, programs_per_item: int, work: AttentionWork, device: torch.device) -> int:
    """Grid axis 0 of a work-list launch: one program per item up to `bound` (eager), capped in a
    CUDA graph so all its programs (`programs_per_item` per item) hold WORK_PROGRAMS_PER_SM per SM."""
    if not work.in_graph:
        return bound
    return min(bound, max(1, -(-WORK_PROGRAMS_PER_SM * num_sms_of(device) // programs_per_item)))


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
    heuristic, one Q block per decode-like sequence (all sequences when the count is unknown).
    A prefill-shaped launch (longer queries) splits by `choose_prefill_splits`, counting the Q
    blocks its tokens fill (a PREFILL_SEQS launch: less one token per decode-like sequence)."""
    queries_per_kv = q.shape[1] // num_kv_heads
    if seq_kind == DECODE_SEQS:
        max_query_len = min(max_query_len, DECODE_MAX_QUERY_LEN)
    elif seq_kind == PREFILL_SEQS:  # its sequences are chunks, whatever the caller's bound says
        max_query_len = max(max_query_len, DECODE_MAX_QUERY_LEN + 1)
    cfg = config or choose_config(max_query_len, queries_per_kv, kv_fp8)
    if cfg.block_m < queries_per_kv:
        raise ValueError(f"config.block_m {cfg.block_m} < query heads per KV head {queries_per_kv}")
    block_q = cfg.block_m // queries_per_kv
    num_q_blocks = q.shape[0] // block_q + num_seqs  # static upper bound, no device sync
    splits = num_splits
    min_tiles = 1  # a caller's split count cuts every Q block evenly
    if splits is None and max_query_len > DECODE_MAX_QUERY_LEN:
        tokens = q.shape[0]
        if seq_kind == PREFILL_SEQS:
            tokens -= num_decode_seqs or 0
        splits = choose_prefill_splits(triton.cdiv(max(tokens, 1), block_q), num_kv_heads,
                                       max_seq_len, num_sms_of(q.device))
        min_tiles = triton.cdiv(PREFILL_SPLIT_MIN_TOKENS, cfg.tile_n)
    elif splits is None:
        busy_blocks = num_q_blocks
        if seq_kind == DECODE_SEQS:
            busy_blocks = num_seqs if num_decode_seqs is None else num_decode_seqs
        num_sms = num_sms_of(q.device)
        splits = choose_num_splits(
            busy_blocks, num_kv_heads, max_query_len, max_seq_len, block_q, num_sms
        )
        full = busy_blocks * num_kv_heads >= num_sms  # the regimes of choose_num_splits
        min_tiles = triton.cdiv(SPLIT_LONG_MIN_TOKENS if full else SPLIT_MIN_TOKENS, cfg.tile_n)
    if splits < 1:
        raise ValueError(f"num_splits must be >= 1; got {splits}")
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
    prefill_splits: int | None = None,
    config: AttentionConfig | None = None,
    configs: LaunchConfigs | None = None,
    num_decode_seqs: int | None = None,
    work: AttentionWork | None = None,
) -> torch.Tensor:
    """Causal attention of ``q`` over the paged cache (see the module docstring for layouts).

    ``max_query_len``/``max_seq_len`` are host ints the caller already knows; they pick the
    tile shape and the split-KV count, so nothing is read back from the device. A batch that
    mixes decode-like sequences (q_len <= DECODE_MAX_QUERY_LEN) with longer ones runs as two
    launches (``launch_kinds``); ``num_decode_seqs``, the count of decode-like sequences when
    the caller knows it (None in a CUDA graph, whose batches vary), saves the decode launch
    when it is 0 and sizes its split-KV. ``num_splits`` (KV segments per Q block; 1 = never
    split) fixes the split count of a single launch, or of the decode launch of two;
    ``prefill_splits`` that of the prefill launch of two. They and ``config`` (one launch over
    every sequence with this shape) or ``configs`` (the shapes of the two launches) override
    the heuristics (tests, benchmarks and the engine's warm-up use them).
    ``k_scale``/``v_scale``: an fp8 cache's scales (``kernels.reference``); other caches
    ignore them. ``work``: the host's work lists of this batch (`plan_work`): a decode and a
    prefill launch over exactly the listed Q blocks (a launch whose bound is 0 is skipped).
    """
    _check_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    scales = kv_scale_args(k_cache, v_cache, k_scale, v_scale)
    num_tokens = q.shape[0]
    num_seqs = seq_lens.shape[0]
    out = _output_buffer(q, out)
    if num_tokens == 0 or num_seqs == 0:
        return out
    for kind in _kinds(work, config, num_seqs, max_query_len, num_decode_seqs):
        cfg = config if configs is None else _config_of(configs, kind, max_query_len)
        splits = prefill_splits if kind == PREFILL_SEQS else num_splits
        plan = _plan_launch(q, k_cache.shape[2], num_seqs, max_query_len, max_seq_len, splits,
                            cfg, scales.is_fp8, seq_kind=kind, num_decode_seqs=num_decode_seqs)
        _launch(plan, out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                scales, work)
    return out


def _output_buffer(q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """`out` when it can take the result (q's shape, contiguous in head_dim), else a new one like q."""
    if out is None:
        return torch.empty_like(q)
    if out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(
            f"out must be shaped like q {tuple(q.shape)} and contiguous in head_dim; "
            f"got {tuple(out.shape)} with strides {out.stride()}"
        )
    return out


def _kinds(work: AttentionWork | None, config: AttentionConfig | None, num_seqs: int, max_query_len: int,
           num_decode_seqs: int | None) -> tuple[int, ...]:
    """The launches of this batch: the work lists' non-empty ones, one launch over every
    sequence for a fixed config, else the heuristic split into decode and prefill launches."""
    if work is not None:
        return tuple(k for k, m in zip((DECODE_SEQS, PREFILL_SEQS), work.max_items) if m > 0)
    if config is not None:
        return (ALL_SEQS,)
    return launch_kinds(num_seqs, max_query_len, num_decode_seqs)


def _config_of(configs: LaunchConfigs, kind: int, max_query_len: int) -> AttentionConfig:
    """The tile shape of one launch of two: the prefill one for prefill-shaped sequences."""
    prefill = kind == PREFILL_SEQS or (kind == ALL_SEQS and max_query_len > DECODE_MAX_QUERY_LEN)
    return configs.prefill if prefill else configs.decode


def _launch(plan: _LaunchPlan, out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
            v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
            query_start_loc: torch.Tensor, scale: float, scales: KVScaleArgs,
            work: AttentionWork | None = None) -> None:
    """One launch of the attention kernel (and of the split merge when it splits); over the
    work list of its kind when `work` is given."""
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
    if work is None:
        grid = (num_q_blocks, num_kv_heads, splits)
        items = num_items = query_start_loc  # unused placeholders
    else:
        k = 0 if plan.seq_kind == DECODE_SEQS else 1
        if work.block_qs[k] != block_q:
            raise ValueError(f"the work list counts Q blocks of {work.block_qs[k]} tokens, the launch's "
                             f"tile shape makes {block_q}: plan it with the launch's block_q")
        items = work.items[work.decode_capacity:] if k else work.items
        num_items = work.counts[k:k + 1]
        grid = (_work_grid(work.max_items[k], num_kv_heads * splits, work, q.device), num_kv_heads, splits)
    q_strides, out_strides, cache_strides = q.stride(), out.stride(), k_cache.stride()
    _paged_attention_kernel[grid](
        out, segm_out, segm_lse, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
        scales.k_scale, scales.v_scale, items, num_items, scales.k_stride, scales.v_stride, num_seqs,
        scale * LOG2E,
        q_strides[0], q_strides[1], out_strides[0], out_strides[1],
        cache_strides[0], cache_strides[1], cache_strides[2], block_tables.stride(0), splits, plan.min_tiles_per_split,
        NUM_QUERIES_PER_KV=queries_per_kv, BLOCK_M=cfg.block_m, BLOCK_Q=block_q,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_SIZE=block_size, TILE_N=cfg.tile_n,
        IS_SPLIT=splits > 1, DOT_PRECISION=dot_precision, KV_FP8=scales.is_fp8,
        FP8_CONVERT=fp8_convert_of(cfg, k_cache, v_cache, scales.is_fp8),
        SEQ_KIND=plan.seq_kind, DECODE_MAX_Q=DECODE_MAX_QUERY_LEN, USE_WORK=work is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if splits > 1:
        if work is None:  # a program per (token, head), finding its sequence by binary search
            merge_grid = (num_tokens, num_q_heads)
        else:  # a program per listed Q block and head; a graph's capped as the attention's
            merge_grid = (_work_grid(work.max_items[k], num_q_heads, work, q.device), num_q_heads)
        _merge_splits_kernel[merge_grid](
            out, segm_out, segm_lse, query_start_loc, seq_lens, items, num_items, out_strides[0],
            out_strides[1], num_q_heads, splits, plan.min_tiles_per_split, num_seqs, block_q, TILE_N=cfg.tile_n,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
            NUM_SPLITS_PAD=merge_splits_pad(splits), SEQ_KIND=plan.seq_kind,
            DECODE_MAX_Q=DECODE_MAX_QUERY_LEN, USE_WORK=work is not None, num_warps=4,
        )  # fmt: skip
