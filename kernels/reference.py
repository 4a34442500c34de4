"""Plain-PyTorch versions of every kernel: the tests' reference and the "torch" backend.

Written for clarity, not speed: attention goes one sequence at a time, gathers the pages it owns
and computes the softmax in float32; the element-wise steps compute in float32 and round once,
as the Triton kernels do. Same signatures as the Triton versions (see docs/interfaces.md).
There is one KV-cache writer here, `write_kv_cache_ref`; `rope_store_kv_ref` rotates and then
calls it.

FP8 KV cache (vLLM's scale convention): a cache of dtype ``torch.float8_e4m3fn`` stores
``fp8(clamp(x / scale, -448, 448))`` (round to nearest even, saturating: no inf/NaN from a large
value) and reads back ``fp8 * scale``. ``k_scale``/``v_scale`` are float32 tensors of one element
(per tensor) or ``num_kv_heads`` (per head); None means 1.0, vLLM's default when a checkpoint
carries no scales. Caches of any other dtype ignore the scales.
"""

from __future__ import annotations

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_E4M3_MAX = 448.0  # largest finite e4m3fn value


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8_KV_DTYPE


def _head_scale(scale: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``scale`` shaped to broadcast over ``like [..., Hkv, D]`` (one value, or one per head)."""
    if scale is None:
        return torch.ones((), dtype=torch.float32, device=like.device)
    return scale.float().reshape(-1, 1).to(like.device)


def quantize_kv_ref(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``x [..., Hkv, D]`` as e4m3fn: ``x / scale`` in float32, saturated to +-448, rounded."""
    scaled = x.float() / _head_scale(scale, x)
    return scaled.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_KV_DTYPE)


def dequantize_kv_ref(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """float32 values of an e4m3fn ``x [..., Hkv, D]`` stored with ``scale``."""
    return x.float() * _head_scale(scale, x)


def read_kv(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """The float32 values a cache (any dtype) holds; fp8 caches are dequantised with ``scale``."""
    return dequantize_kv_ref(cache, scale) if is_fp8(cache) else cache.float()


def gather_context(
    cache: torch.Tensor, block_table_row: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Tokens ``[0, num_tokens)`` of one sequence from a paged cache, as ``[num_tokens, Hkv, D]``.

    ``cache`` is ``[num_blocks, block_size, Hkv, D]``; token t lives in block
    ``block_table_row[t // block_size]`` at row ``t % block_size``.
    """
    block_size = cache.shape[1]
    num_blocks_used = (num_tokens + block_size - 1) // block_size
    blocks = block_table_row[:num_blocks_used].long()
    pages = cache.index_select(0, blocks)  # [n, block_size, Hkv, D]
    return pages.reshape(-1, cache.shape[2], cache.shape[3])[:num_tokens]


def paged_attention_ref(
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
    num_decode_seqs: int | None = None,
    work=None,
) -> torch.Tensor:
    """Causal paged attention, computed per sequence with a float32 softmax.

    Query token i of sequence b (of q_len new tokens) sees context positions
    ``< seq_lens[b] - q_len + i + 1``. ``max_query_len``/``max_seq_len`` are accepted for
    signature parity and not needed here, as is the Triton kernel's launch hint
    ``num_decode_seqs`` and work lists ``work``. An fp8 cache is read through its scales.
    """
    del max_query_len, max_seq_len, num_decode_seqs, work
    group = q.shape[1] // k_cache.shape[2]  # query heads per KV head
    if out is None:
        out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        k = read_kv(gather_context(k_cache, block_tables[b], seq_len), k_scale)  # [S, Hkv, D]
        v = read_kv(gather_context(v_cache, block_tables[b], seq_len), v_scale)
        # one query head per row: expand the KV heads to the query heads they serve
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, S, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        qb = q[q_start:q_end].float().transpose(0, 1)  # [Hq, L, D]
        scores = torch.matmul(qb, k.transpose(1, 2)) * scale  # [Hq, L, S]
        context_len = seq_len - q_len
        query_pos = torch.arange(q_len, device=q.device).unsqueeze(1)
        key_pos = torch.arange(seq_len, device=q.device).unsqueeze(0)
        visible = key_pos <= context_len + query_pos  # [L, S]
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
    return out


def write_kv_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store token t's ``k[t]``/``v[t]`` at flat slot ``slot_mapping[t]``; slots < 0 are padding.
    An fp8 cache stores them quantised with ``k_scale``/``v_scale``."""
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, rows = slots // block_size, slots % block_size
    k_cache[blocks, rows] = _to_cache(k[keep], k_cache, k_scale)
    v_cache[blocks, rows] = _to_cache(v[keep], v_cache, v_scale)


def _to_cache(x: torch.Tensor, cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    return quantize_kv_ref(x, scale) if is_fp8(cache) else x.to(cache.dtype)


def rotate_half_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary in the rotate-half convention, in float32: x [T, H, D], cos/sin [T, D/2]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def rotate_qkv_ref(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rotated q ``[T, Hq, D]``, rotated k ``[T, Hkv, D]``, v ``[T, Hkv, D]``) of a fused qkv.

    ``qkv [T, (Hq + 2 Hkv) D]`` holds q heads, then k heads, then v heads (a fused projection's
    output); ``cos``/``sin`` are float32 tables ``[max_positions, D/2]`` indexed by ``positions``.
    """
    heads = qkv.unflatten(1, (num_q_heads + 2 * num_kv_heads, head_dim))
    num_qk = num_q_heads + num_kv_heads
    rotated = rotate_half_ref(heads[:, :num_qk], cos[positions], sin[positions]).to(qkv.dtype)
    return rotated[:, :num_q_heads].contiguous(), rotated[:, num_q_heads:], heads[:, num_qk:]


def rope_store_kv_ref(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotated q ``[T, Hq, D]``; rotated k and plain v stored at ``slot_mapping`` (< 0: padding).

    Layouts as in `rotate_qkv_ref`; the caches are ``[num_blocks, block_size, Hkv, D]``.
    """
    q, k, v = rotate_qkv_ref(qkv, positions, cos, sin, num_q_heads, num_kv_heads, head_dim)
    write_kv_cache_ref(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for ``gate_up [T, 2 I]`` (gate first): ``[T, I]``, computed in float32."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, RMSNorm(x + delta) * weight)``; the sum is rounded to x's dtype first,
    because the residual stream is kept in the model dtype and the norm reads that."""
    total = (x.float() + delta.float()).to(x.dtype)
    t = total.float()
    inv_rms = torch.rsqrt(t.square().mean(dim=-1, keepdim=True) + eps)
    return total, (t * inv_rms * weight.float()).to(x.dtype)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` through torch's BLAS; ``out`` (2-D x only) receives it in place."""
    if out is None:
        return torch.nn.functional.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


# float8_e4m3fn's largest finite value: a scale maps a tensor's (or row's) absolute maximum to it
FP8_MAX = 448.0


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `x` [M, K] as float8_e4m3fn with its own scale (dynamic per-token quantization):
    (x_fp8, scale [M, 1] float32), x ~ x_fp8 * scale."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def quantize_fp8_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` as float8_e4m3fn with one scale for the whole tensor (vLLM's dynamic per-tensor
    activation scheme, the default of `--quantization fp8`): (x_fp8, scale [] float32)."""
    scale = x.abs().amax().float().clamp_min(1e-12) / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def linear_fp8_ref(x: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (weight_fp8 * weight_scale).T (+ bias)`` with `x` [M, K] quantized to FP8 with one
    dynamic scale (vLLM's dynamic W8A8) and `weight_scale` [] float32 the weight's per-tensor scale:
    torch._scaled_mm (cuBLASLt's FP8 GEMM on a GPU), fp32 accumulation; out in x's dtype."""
    xq, xs = quantize_fp8_tensor(x)
    return torch._scaled_mm(xq, weight_fp8.t(), scale_a=xs, scale_b=weight_scale, bias=bias, out_dtype=x.dtype)


def work_block_qs_ref(num_q_heads: int, num_kv_heads: int, kv_fp8: bool = False) -> None:
    """The reference attends sequence by sequence: it takes no work lists (None)."""
    del num_q_heads, num_kv_heads, kv_fp8
