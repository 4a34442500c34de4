"""FP8 (e4m3) KV cache: the quantisation rule, the two Triton writers, and paged attention over
an fp8 cache, against float32 references (CPU interpreter; kernels/_interpreter_compat.py routes
the interpreter's fp8 casts through torch, which rounds as the GPU does)."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.cache_write import write_kv_cache
from kernels.fused import rope_store_kv
from kernels.paged_attention import (
    CONFIG_TABLE,
    AttentionConfig,
    choose_config,
    load_config_table,
    paged_attention,
)
from kernels.paged_batches import make_batch, rel_norm_error
from kernels.reference import (
    FP8_E4M3_MAX,
    dequantize_kv_ref,
    paged_attention_ref,
    quantize_kv_ref,
    write_kv_cache_ref,
)
from tests.kernels.helpers import SETTINGS
from tests.kernels.test_fused import rope_case, rope_tables

FP8 = torch.float8_e4m3fn
# e4m3 keeps 3 mantissa bits: a value in the normal range is off by at most 2**-4 of itself
# after rounding, and below the smallest normal (2**-6) by at most half the subnormal step 2**-9
HALF_ULP_REL = 2.0**-4
HALF_SUBNORMAL_STEP = 2.0**-10
# Attention over an fp8 cache vs over the 16-bit cache it was quantised from. Each cached value
# carries a relative rounding error uniform within +-2**-4, RMS 2**-4 / sqrt(3) = 0.036; the
# output mixes many values; its relative error measured 0.029-0.044 over 30 random batches of unit
# normal K/V); the bound leaves room for the worst draws of the hypothesis cases below.
FP8_VS_BF16_BOUND = 0.06


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def all_finite_e4m3() -> torch.Tensor:
    """Every finite e4m3fn value (254 codes: the two NaN codes 0x7F/0xFF left out)."""
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(FP8).float()
    return values[~values.isnan()]


def scales_for(num_kv_heads: int, per_head: bool, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    n = num_kv_heads if per_head else 1
    return tuple(torch.rand(n, generator=gen) * 0.5 + 0.01 for _ in range(2))


def test_quantisation_rule_against_every_e4m3_value():
    """An independent check of the reference rule: each finite e4m3 value times a power-of-two
    scale (exact) quantises back to itself; midpoints between neighbours round to the even
    code; values past 448 saturate instead of turning into NaN."""
    values = all_finite_e4m3()
    scale = torch.tensor([0.25])
    back = quantize_kv_ref((values * 0.25).view(-1, 1, 1), scale).float().flatten()
    assert torch.equal(back, values)
    pos = values[values > 0].sort().values
    mid = (pos[:-1] + pos[1:]) / 2  # exact in float32
    got = quantize_kv_ref(mid.view(-1, 1, 1), None).flatten()
    low = quantize_kv_ref(pos[:-1].view(-1, 1, 1), None).flatten()
    high = quantize_kv_ref(pos[1:].view(-1, 1, 1), None).flatten()
    even = torch.where(raw(low) % 2 == 0, raw(low), raw(high))
    assert torch.equal(raw(got), even)
    huge = torch.tensor([1e6, -1e6, float("inf"), 449.0]).view(-1, 1, 1)
    assert quantize_kv_ref(huge, None).float().flatten().tolist() == [448.0, -448.0, 448.0, 448.0]


@settings(max_examples=12, **SETTINGS)
@given(
    num_tokens=st.integers(1, 16),
    num_kv_heads=st.sampled_from([1, 2, 8]),
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([8, 16]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    per_head=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_writer_round_trip_is_the_reference_quantisation(num_tokens, num_kv_heads, head_dim,
                                                         block_size, dtype, per_head, seed):
    gen = torch.Generator().manual_seed(seed)
    # magnitudes from 1e-4 to 1e4: subnormal, normal and saturating values after the scale
    mag = 10 ** (torch.rand(num_tokens, 2, num_kv_heads, head_dim, generator=gen) * 8 - 4)
    kv = (torch.randn(mag.shape, generator=gen).sign() * mag).to(dtype)
    k, v = kv[:, 0], kv[:, 1]
    k_scale, v_scale = scales_for(num_kv_heads, per_head, gen)
    num_blocks = num_tokens // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::3] = -1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache, k_ref, v_ref = (torch.zeros(shape, dtype=FP8) for _ in range(4))
    write_kv_cache(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    write_kv_cache_ref(k, v, k_ref, v_ref, slots, k_scale, v_scale)
    assert torch.equal(raw(k_cache), raw(k_ref)) and torch.equal(raw(v_cache), raw(v_ref))
    assert not k_cache.float().isnan().any() and not v_cache.float().isnan().any()
    keep = slots >= 0
    blocks, rows = slots[keep] // block_size, slots[keep] % block_size
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        back = dequantize_kv_ref(cache[blocks, rows], scale)
        exact = x[keep].float()
        s = scale.view(-1, 1)
        in_range = exact.abs() <= FP8_E4M3_MAX * s
        bound = HALF_ULP_REL * exact.abs() + HALF_SUBNORMAL_STEP * s
        assert ((back - exact).abs() <= bound * 1.0001)[in_range].all()
        assert torch.equal(back[~in_range], (exact.sign() * FP8_E4M3_MAX * s).expand_as(back)[~in_range])


@settings(max_examples=10, **SETTINGS)
@given(
    num_tokens=st.integers(1, 10),
    num_kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 4]),
    head_dim=st.sampled_from([16, 64]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    per_head=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_rotary_writer_stores_what_the_plain_writer_stores(num_tokens, num_kv_heads, group,
                                                                 head_dim, dtype, per_head, seed):
    """As in test_fused: the k heads copy the first q heads, so the rotated q the fused kernel
    returns is the k it quantised."""
    qkv, positions, slots, _, hq = rope_case(num_tokens, num_kv_heads, group, head_dim, 4, dtype, seed)
    heads = qkv.unflatten(1, (hq + 2 * num_kv_heads, head_dim))
    heads[:, hq: hq + num_kv_heads] = heads[:, :num_kv_heads]
    cos, sin = rope_tables(64, head_dim)
    k_scale, v_scale = scales_for(num_kv_heads, per_head, torch.Generator().manual_seed(seed))
    shape = (num_tokens // 4 + 2, 4, num_kv_heads, head_dim)
    kc_fused, vc_fused, kc_plain, vc_plain = (torch.zeros(shape, dtype=FP8) for _ in range(4))
    q = rope_store_kv(qkv, positions, cos, sin, kc_fused, vc_fused, slots, hq, num_kv_heads,
                      head_dim, k_scale, v_scale)
    write_kv_cache(q[:, :num_kv_heads], heads[:, hq + num_kv_heads:], kc_plain, vc_plain, slots,
                   k_scale, v_scale)
    assert torch.equal(raw(kc_fused), raw(kc_plain)) and torch.equal(raw(vc_fused), raw(vc_plain))


def fp8_batch(spec: dict, per_head: bool):
    """make_batch's random batch with its caches quantised, and the scales: 0.02-0.1, so unit
    normal values (|x| < 5) land inside e4m3's range (|x / scale| < 448) and mostly above its
    smallest normal."""
    batch = make_batch(**spec)
    gen = torch.Generator().manual_seed(spec["seed"])
    n = spec["num_kv_heads"] if per_head else 1
    k_scale, v_scale = (torch.rand(n, generator=gen) * 0.08 + 0.02 for _ in range(2))
    return batch, quantize_kv_ref(batch.k_cache, k_scale), quantize_kv_ref(batch.v_cache, v_scale), \
        k_scale, v_scale


@st.composite
def fp8_cases(draw, decode_only: bool):
    num_seqs = draw(st.integers(1, 3))
    if decode_only:
        query_lens = [1] * num_seqs
    else:
        query_lens = [draw(st.sampled_from([1, 2, draw(st.integers(5, 30))])) for _ in range(num_seqs)]
    return {
        "query_lens": query_lens,
        "context_lens": [draw(st.integers(0, 70)) for _ in range(num_seqs)],
        "num_kv_heads": draw(st.sampled_from([1, 2])),
        "queries_per_kv": draw(st.sampled_from([1, 4])),
        "head_dim": 64,
        "block_size": draw(st.sampled_from([8, 16])),
        "dtype": draw(st.sampled_from([torch.float32, torch.bfloat16])),
        "seed": draw(st.integers(0, 2**16)),
    }


def check_fp8_attention(spec: dict, per_head: bool, num_splits: int) -> None:
    batch, k8, v8, k_scale, v_scale = fp8_batch(spec, per_head)
    args = (batch.block_tables, batch.seq_lens, batch.query_start_loc, batch.scale,
            batch.max_query_len, batch.max_seq_len)
    small = AttentionConfig(max(16 if batch.max_query_len <= 4 else 32, spec["queries_per_kv"]),
                            16, 4, 2)
    out = torch.full_like(batch.q, float("nan"))
    paged_attention(batch.q, k8, v8, *args, out=out, k_scale=k_scale, v_scale=v_scale,
                    num_splits=num_splits, config=small)
    # tight: the float32 reference over the dequantised cache (the kernel's only extra
    # rounding is q's dtype, as for a 16-bit cache)
    ref = paged_attention_ref(batch.q.float(), k8, v8, *args, k_scale=k_scale, v_scale=v_scale)
    tight = 1e-5 if spec["dtype"] == torch.float32 else 1e-2
    assert rel_norm_error(out, ref) <= tight
    # bounded: against the unquantised cache
    exact = paged_attention_ref(batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), *args)
    assert rel_norm_error(out, exact) <= FP8_VS_BF16_BOUND


@settings(max_examples=14, **SETTINGS)
@given(spec=fp8_cases(decode_only=False), per_head=st.booleans())
def test_prefill_and_decode_over_an_fp8_cache(spec, per_head):
    check_fp8_attention(spec, per_head, num_splits=1)


@settings(max_examples=8, **SETTINGS)
@given(spec=fp8_cases(decode_only=True), per_head=st.booleans(), num_splits=st.sampled_from([2, 5]))
def test_split_kv_decode_over_an_fp8_cache(spec, per_head, num_splits):
    check_fp8_attention(spec, per_head, num_splits)


def test_the_scales_matter():
    """A kernel that ignored either scale would miss the reference by far more than the bound."""
    spec = {"query_lens": [1, 7], "context_lens": [40, 20], "num_kv_heads": 2, "queries_per_kv": 4,
            "head_dim": 64, "block_size": 16, "dtype": torch.float32, "seed": 3}
    batch = make_batch(**spec)
    k_scale, v_scale = torch.tensor([0.02, 0.05]), torch.tensor([0.03, 0.08])
    k8, v8 = quantize_kv_ref(batch.k_cache, k_scale), quantize_kv_ref(batch.v_cache, v_scale)
    args = (batch.block_tables, batch.seq_lens, batch.query_start_loc, batch.scale,
            batch.max_query_len, batch.max_seq_len)
    ref = paged_attention_ref(batch.q, k8, v8, *args, k_scale=k_scale, v_scale=v_scale)
    ones = torch.ones(2)
    for wrong_k, wrong_v in ((ones, v_scale), (k_scale, ones), (k_scale, v_scale.flip(0))):
        out = paged_attention(batch.q, k8, v8, *args, k_scale=wrong_k, v_scale=wrong_v, num_splits=1)
        assert rel_norm_error(out, ref) > 0.1


def test_bad_scales_are_named():
    cache = torch.zeros(2, 8, 2, 64, dtype=FP8)
    k = torch.zeros(1, 2, 64)
    slot = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="k_scale must be a contiguous float32 tensor of 1 or num_kv_heads=2"):
        write_kv_cache(k, k, cache, cache.clone(), slot, torch.ones(3), None)
    with pytest.raises(ValueError, match="v_scale must be a contiguous float32"):
        write_kv_cache(k, k, cache, cache.clone(), slot, None, torch.ones(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="must share a dtype"):
        write_kv_cache(k, k, cache, torch.zeros(2, 8, 2, 64), slot)


def test_config_table_picks_by_path_and_kv_kind(tmp_path):
    assert choose_config(1, 4, kv_fp8=True) == CONFIG_TABLE["decode", "fp8"]
    assert choose_config(1, 4) == CONFIG_TABLE["decode", "16bit"]
    assert choose_config(64, 4, kv_fp8=True) == CONFIG_TABLE["prefill", "fp8"]
    entry = {"block_m": 32, "tile_n": 64, "num_warps": 8, "num_stages": 2}
    table = {p: {k: dict(entry, tile_n=64 * (i + 1)) for i, k in enumerate(("16bit", "fp8"))}
             for p in ("decode", "prefill")}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    assert load_config_table(path)["prefill", "fp8"] == AttentionConfig(32, 128, 8, 2)
    del table["decode"]["fp8"]["num_stages"]
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match="entry decode.fp8 needs integer"):
        load_config_table(path)
