"""The fp8 KV-cache conversion variants of the attention kernel (``AttentionConfig.fp8_convert``):
the integer widening against every e4m3 byte, each variant against the float32 reference on the
dequantised cache, the guards that keep a large q finite, and the config table's new field.
CPU interpreter, tiny shapes."""

from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl

from kernels.paged_attention import (
    CONFIG_TABLE,
    FP8_CONVERTS,
    AttentionConfig,
    _byte_plane,
    _widen_fp8,
    _words_fp16,
    choose_config,
    fp8_convert_of,
    load_config_table,
    paged_attention,
)
from kernels.paged_batches import make_batch, rel_norm_error
from kernels.reference import paged_attention_ref, quantize_kv_ref

FP8 = torch.float8_e4m3fn
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TL_DTYPE = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}


@triton.jit
def _widen_kernel(x_ptr, out_ptr, DOT_DTYPE: tl.constexpr, FP8_CONVERT: tl.constexpr):
    offs = tl.arange(0, 256)
    tl.store(out_ptr + offs, _widen_fp8(tl.load(x_ptr + offs), DOT_DTYPE, FP8_CONVERT))


def e4m3_value(code: int) -> float:
    """The value of an e4m3fn byte from its fields (independent of torch's cast): bias 7,
    exponent field 0 = subnormal (2**-6 * m / 8), no infinities, 0x7F/0xFF are NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and man == 0x7:
        return float("nan")
    if exp == 0:
        return sign * man / 8 * 2.0**-6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


# (fp8_convert, operand dtype) -> the power of two the widened tile carries
WIDEN_CASES = [("native", "bf16", 0), ("native", "fp16", 0), ("native", "fp32", 0),
               ("fp16", "fp16", 0), ("bits", "bf16", -120), ("bits", "fp16", -8),
               ("bits", "fp32", -120)]  # fmt: skip


@pytest.mark.parametrize(("variant", "dtype", "log2_factor"), WIDEN_CASES)
def test_widening_is_exact_for_all_256_bytes(variant, dtype, log2_factor):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = torch.empty(256, dtype=TORCH_DTYPE[dtype])
    _widen_kernel[(1,)](codes.view(FP8), out, DOT_DTYPE=TL_DTYPE[dtype], FP8_CONVERT=variant)
    want = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float64) * 2.0**log2_factor
    finite = ~want.isnan()
    assert finite.sum() == 254
    # bit for bit: the expected values are exact in the operand dtype (subnormals included)
    assert torch.equal(out[finite], want[finite].to(out.dtype))
    assert torch.equal(out[finite].double(), want[finite])
    if variant == "bits":  # the NaN codes (never written by the cache writers) read as +-480
        assert out[~finite].double().tolist() == [480 * 2.0**log2_factor, -480 * 2.0**log2_factor]


def fp8_case(spec: dict, q_dtype: torch.dtype, seed: int):
    """A batch with its caches quantised per KV head (scales 0.02-0.1: unit normal K/V in range)."""
    batch = make_batch(**spec, dtype=torch.float32, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    k_scale, v_scale = (torch.rand(spec["num_kv_heads"], generator=gen) * 0.08 + 0.02 for _ in range(2))
    k8, v8 = quantize_kv_ref(batch.k_cache, k_scale), quantize_kv_ref(batch.v_cache, v_scale)
    return batch, batch.q.to(q_dtype), k8, v8, k_scale, v_scale


def run_variant(batch, q, k8, v8, k_scale, v_scale, variant: str, num_splits: int, block_m: int):
    args = (batch.block_tables, batch.seq_lens, batch.query_start_loc, batch.scale,
            batch.max_query_len, batch.max_seq_len)  # fmt: skip
    out = torch.full_like(q, float("nan"))
    cfg = AttentionConfig(block_m, 16, 4, 2, variant)
    paged_attention(q, k8, v8, *args, out=out, k_scale=k_scale, v_scale=v_scale,
                    num_splits=num_splits, config=cfg)  # fmt: skip
    ref = paged_attention_ref(q.float(), k8, v8, *args, k_scale=k_scale, v_scale=v_scale)
    return out, ref


# decode tokens beside a prefill chunk (one pass), and decode only in split-KV segments
MIXED = {"query_lens": [1, 9, 1], "context_lens": [37, 20, 0], "num_kv_heads": 2,
         "queries_per_kv": 4, "head_dim": 64, "block_size": 8}  # fmt: skip
DECODE = {"query_lens": [1, 1], "context_lens": [70, 33], "num_kv_heads": 1,
          "queries_per_kv": 4, "head_dim": 64, "block_size": 16}  # fmt: skip
# the error of the 16-bit q itself dominates; fp16 q through the fp16 variant rounds once more
# nowhere, and fp32 q through it rounds to fp16 (2**-11 relative per element)
TIGHT = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("variant", FP8_CONVERTS)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_variant_matches_the_reference_on_the_dequantised_cache(variant, q_dtype):
    fp16_dots = variant in ("fp16", "words")
    bound = 2e-3 if fp16_dots and q_dtype == torch.float32 else TIGHT[q_dtype]
    for spec, splits, block_m, seed in ((MIXED, 1, 32, 1), (DECODE, 3, 16, 2)):
        out, ref = run_variant(*fp8_case(spec, q_dtype, seed), variant, splits, block_m)
        assert not out.isnan().any()
        err = rel_norm_error(out, ref)
        assert err <= bound, f"{variant} {q_dtype} splits {splits}: rel err {err:.3g} > {bound}"


@pytest.mark.parametrize(("variant", "q_dtype", "q_amax"), [
    ("fp16", torch.bfloat16, 3e5),  # beyond fp16's 65504
    ("fp16", torch.float32, 1e30),
    ("words", torch.bfloat16, 3e5),
    ("bits", torch.bfloat16, 1e30),  # 2**99.7: times the 2**64 shift it would pass bf16's 2**128
])  # fmt: skip
def test_a_large_q_stays_finite(variant, q_dtype, q_amax):
    """q far beyond the operand's range: the power-of-two guard keeps it finite, and the k scale
    (1 / q_amax) brings the scores back to unit size, so the output must match the reference."""
    batch, q, k8, v8, _, v_scale = fp8_case(DECODE, torch.float32, 4)
    q = (q / q.abs().amax() * q_amax).to(q_dtype)
    k_scale = torch.full((1,), 0.05 / q_amax)
    out, ref = run_variant(batch, q, k8, v8, k_scale, v_scale, variant, 1, 16)
    assert not out.isnan().any() and not out.isinf().any()
    assert rel_norm_error(out, ref) <= 1e-2


def test_an_old_table_without_the_field_loads_with_the_default(tmp_path):
    entry = {"block_m": 16, "tile_n": 128, "num_warps": 4, "num_stages": 3}
    table = {p: {k: dict(entry) for k in ("16bit", "fp8")} for p in ("decode", "prefill")}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(table))
    assert load_config_table(path)["decode", "fp8"] == AttentionConfig(16, 128, 4, 3, "native")
    table["decode"]["fp8"]["fp8_convert"] = "bits"
    path.write_text(json.dumps(table))
    assert load_config_table(path)["decode", "fp8"].fp8_convert == "bits"
    table["decode"]["fp8"]["fp8_convert"] = "fp4"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match="entry decode.fp8 needs .* fp8_convert .* native, fp16, bits, packed, words"):
        load_config_table(path)


def test_the_variant_travels_with_the_chosen_config():
    assert choose_config(1, 4, kv_fp8=True).fp8_convert == CONFIG_TABLE["decode", "fp8"].fp8_convert
    # a group wider than the table's block_m makes a new record: it keeps the variant
    assert choose_config(1, 64, kv_fp8=True).fp8_convert == CONFIG_TABLE["decode", "fp8"].fp8_convert
    assert choose_config(1, 64, kv_fp8=True).block_m == 64
    with pytest.raises(ValueError, match="fp8_convert must be one of native, fp16, bits, packed, words; got 'x'"):
        AttentionConfig(16, 128, 4, 3, "x")


@triton.jit
def _planes_kernel(x_ptr, out_ptr, DOT_DTYPE: tl.constexpr):
    words = tl.load(x_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + tl.arange(0, 64))
    for j in tl.static_range(4):  # byte j of word c is value 4c + j
        tl.store(out_ptr + tl.arange(0, 64) * 4 + j, _byte_plane(words, j, DOT_DTYPE))


@pytest.mark.parametrize(("dtype", "log2_factor"), [("bf16", -120), ("fp16", -8), ("fp32", -120)])
def test_packed_byte_planes_are_exact_for_all_256_bytes(dtype, log2_factor):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = torch.empty(256, dtype=TORCH_DTYPE[dtype])
    _planes_kernel[(1,)](codes, out, DOT_DTYPE=TL_DTYPE[dtype])
    want = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float64) * 2.0**log2_factor
    finite = ~want.isnan()
    assert torch.equal(out[finite].double(), want[finite])


def test_packed_falls_back_where_words_do_not_fit():
    """head_dim 32 leaves planes of 8 columns (below a tensor-core k of 16): "bits" runs
    instead, with the same result as the reference."""
    spec = dict(DECODE, head_dim=32)
    batch, q, k8, v8, ks, vs = fp8_case(spec, torch.bfloat16, 5)
    assert fp8_convert_of(AttentionConfig(16, 16, 4, 2, "packed"), k8, v8, True) == "bits"
    assert fp8_convert_of(AttentionConfig(16, 16, 4, 2, "packed"), batch.k_cache, batch.v_cache,
                          False) == "native"  # fmt: skip
    out, ref = run_variant(batch, q, k8, v8, ks, vs, "packed", 1, 16)
    assert rel_norm_error(out, ref) <= 1e-2
    _, _, k64, v64, _, _ = fp8_case(DECODE, torch.bfloat16, 5)
    assert fp8_convert_of(AttentionConfig(16, 16, 4, 2, "packed"), k64, v64, True) == "packed"
    assert fp8_convert_of(AttentionConfig(16, 16, 4, 2, "packed"), k64[:, :, :, 1:63], v64, True) == "bits"


@pytest.mark.parametrize("variant", FP8_CONVERTS)
def test_a_padded_head_dim(variant):
    """head_dim 96 runs in 128-wide tiles: the columns past 96 (words past 24) are masked."""
    spec = dict(MIXED, head_dim=96)
    out, ref = run_variant(*fp8_case(spec, torch.bfloat16, 6), variant, 1, 32)
    assert rel_norm_error(out, ref) <= 1e-2


@triton.jit
def _words_kernel(x_ptr, out_ptr):
    """64 words (256 bytes) as a [4, 16] tile, widened to [4, 64] fp16 by the "words" path."""
    rows, cols = tl.arange(0, 4), tl.arange(0, 16)
    words = tl.load(x_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + rows[:, None] * 16 + cols[None, :])
    tl.store(out_ptr + rows[:, None] * 64 + tl.arange(0, 64)[None, :], _words_fp16(words))


def test_words_widening_is_exact_and_in_place_for_all_256_bytes():
    """Byte j of word c must land in column 4c + j (the cache's order) with its exact value:
    the bytes 0..255 in order come back as their values in order."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = torch.empty(256, dtype=torch.float16)
    _words_kernel[(1,)](codes, out)
    want = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float64)
    finite = ~want.isnan()
    assert torch.equal(out[finite].double(), want[finite])


def test_words_falls_back_where_words_do_not_fit():
    """A cache view whose rows are not 4-byte aligned (or head_dim % 4 != 0) runs "fp16", the
    same arithmetic on tiles loaded byte by byte; head_dim 32 still fits words (one tile)."""
    words = AttentionConfig(16, 16, 4, 2, "words")
    _, _, k64, v64, _, _ = fp8_case(DECODE, torch.bfloat16, 7)
    assert fp8_convert_of(words, k64, v64, True) == "words"
    assert fp8_convert_of(words, k64[:, :, :, 1:63], v64[:, :, :, 1:63], True) == "fp16"
    assert fp8_convert_of(words, k64[:, :, :, :62], v64[:, :, :, :62], True) == "fp16"
    assert fp8_convert_of(words, k64, v64, False) == "native"
    batch, q, k8, v8, ks, vs = fp8_case(dict(DECODE, head_dim=32), torch.bfloat16, 7)
    assert fp8_convert_of(words, k8, v8, True) == "words"
    out, ref = run_variant(batch, q, k8, v8, ks, vs, "words", 1, 16)
    assert rel_norm_error(out, ref) <= 1e-2
    # an odd head_dim: the fallback's result, through the public call
    batch, q, k8, v8, ks, vs = fp8_case(dict(DECODE, head_dim=30), torch.bfloat16, 8)
    assert fp8_convert_of(words, k8, v8, True) == "fp16"
    out, ref = run_variant(batch, q, k8, v8, ks, vs, "words", 1, 16)
    assert rel_norm_error(out, ref) <= 1e-2


def test_words_compiles_for_sm90_without_byte_loads_or_spills(tmp_path):
    """The variant's point, in the code ptxas makes for an H100/H200 (no GPU needed): the
    "fp16" variant reads its fp8 K tile from shared memory one byte per load; "words" has no
    single-byte shared loads in its KV loop and no spills at the decode tile 128, 4 warps."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "fp8_compile.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--fp8-variants", "words,fp16",
                    "--points", "128,3,4"], check=True, capture_output=True, timeout=300)  # fmt: skip
    rows = {r["variant"]: r for r in json.loads((tmp_path / "fp8_compile.json").read_text())}
    assert rows["fp16"]["main_loop"]["lds_u8"] >= 128  # one per K element a thread holds
    assert rows["words"]["main_loop"]["lds_u8"] == 0
    assert rows["words"]["spill_store_bytes"] == 0
    assert rows["words"]["main_loop"]["hmma"] == rows["fp16"]["main_loop"]["hmma"]  # one dot each
    assert rows["words"]["main_loop"]["lds"] < rows["fp16"]["main_loop"]["lds"] // 2
