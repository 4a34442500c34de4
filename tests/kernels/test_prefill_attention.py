"""The Hopper prefill kernel (every launch variant) against the float32 PyTorch reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.prefill_attention import (
    SRC_DESC_PAGED,
    SRC_DESC_ROWS,
    SRC_GATHER,
    SRC_ROWS,
    PrefillConfig,
    plan_prefill,
    prefill_attention,
)
from kernels.reference import gather_context, paged_attention_ref, quantize_kv_ref
from tests.kernels.helpers import SETTINGS, PagedBatch, assert_close, make_batch, rel_norm_error

# Tiny tiles keep the interpreter quick; each variant is what the GPU sweep varies, and
# tile_n 16 divides both tested block sizes so kv_tma really takes the descriptor path.
# (name, config, read the new tokens from k_new/v_new)
VARIANTS = [
    ("gather packed", PrefillConfig(32, 16, 4, 2), False),
    ("gather one head", PrefillConfig(16, 16, 4, 2, pack_gqa=False), False),
    ("tma cache packed", PrefillConfig(32, 16, 8, 3, kv_tma=True), False),
    ("new rows packed", PrefillConfig(32, 32, 4, 2), True),
    ("tma new rows packed", PrefillConfig(32, 16, 4, 3, kv_tma=True), True),
    ("tma new rows one head", PrefillConfig(32, 16, 4, 2, pack_gqa=False, kv_tma=True), True),
]
VARIANT_IDS = [v[0] for v in VARIANTS]
# (queries per KV head, head_dim, block_size, cached prefix per sequence): every GQA ratio,
# head_dim and block size once with and once without a prefix
SHAPES = [
    (1, 64, 16, (0, 0)), (4, 128, 32, (0, 0)), (8, 64, 32, (0, 0)),
    (1, 128, 32, (17, 40)), (4, 64, 16, (5, 33)), (8, 128, 16, (16, 48)),
]  # fmt: skip
QUERY_LENS = [9, 37]  # several Q blocks per sequence, diagonals across tiles, ragged ends


def poison_unused_slots(batch: PagedBatch) -> None:
    """NaN in every cache row no sequence owns (past each end, spare blocks): a kernel that
    lets a key it must not see into its sums then returns NaN."""
    owned = torch.zeros(batch.k_cache.shape[:2], dtype=torch.bool)
    for b, seq_len in enumerate(batch.seq_lens.tolist()):
        for pos in range(seq_len):
            bs = batch.k_cache.shape[1]
            owned[batch.block_tables[b, pos // bs], pos % bs] = True
    batch.k_cache[~owned] = float("nan")
    batch.v_cache[~owned] = float("nan")


def new_kv(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens' k and v as strided views of one fused [T, (Hq + 2 Hkv) * D] buffer (a
    fused QKV projection's layout), holding what the cache holds for those tokens."""
    num_tokens, num_q_heads, head_dim = batch.q.shape
    num_kv_heads = batch.k_cache.shape[2]
    fused = torch.zeros(num_tokens, num_q_heads + 2 * num_kv_heads, head_dim, dtype=batch.q.dtype)
    starts, lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        lo, hi = starts[b], starts[b + 1]
        for cache, first in ((batch.k_cache, num_q_heads), (batch.v_cache, num_q_heads + num_kv_heads)):
            ctx = gather_context(cache, batch.block_tables[b], seq_len)
            fused[lo:hi, first : first + num_kv_heads] = ctx[seq_len - (hi - lo) :]
    return fused[:, num_q_heads : num_q_heads + num_kv_heads], fused[:, num_q_heads + num_kv_heads :]


def reference(batch: PagedBatch) -> torch.Tensor:
    return paged_attention_ref(
        batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), batch.block_tables,
        batch.seq_lens, batch.query_start_loc, batch.scale, batch.max_query_len,
        batch.max_seq_len,
    )  # fmt: skip


def run(batch: PagedBatch, config: PrefillConfig, with_new: bool, **kwargs) -> torch.Tensor:
    out = torch.full_like(batch.q, float("nan"))  # every element must be written
    if with_new and "k_new" not in kwargs:
        kwargs["k_new"], kwargs["v_new"] = new_kv(batch)
    returned = prefill_attention(*batch.args(), out=out, config=config, **kwargs)
    assert returned is out
    return out


def fit(config: PrefillConfig, queries_per_kv: int) -> PrefillConfig:
    """The variant with block_m widened to hold one token's packed heads."""
    if not config.pack_gqa or config.block_m % queries_per_kv == 0:
        return config
    return PrefillConfig(queries_per_kv, config.tile_n, config.num_warps, config.num_stages,
                         config.pack_gqa, config.kv_tma)  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_variant_matches_reference(variant, shape):
    _, config, with_new = variant
    queries_per_kv, head_dim, block_size, cached = shape
    batch = make_batch(QUERY_LENS, list(cached), 2, queries_per_kv, head_dim, block_size,
                       torch.bfloat16, seed=head_dim + block_size + queries_per_kv)  # fmt: skip
    poison_unused_slots(batch)
    assert_close(run(batch, fit(config, queries_per_kv), with_new), reference(batch), torch.bfloat16)


def test_variants_take_the_sources_they_name():
    """kv_tma really selects the descriptor paths here (else the tests above prove nothing
    about them), and falls back to gathers where a descriptor cannot describe the layout."""
    batch = make_batch([9], [5], 2, 4, 64, 16, torch.bfloat16, seed=0)
    k_new, _ = new_kv(batch)
    sources = {name: (p.ctx_source, p.new_source) for name, cfg, with_new in VARIANTS
               for p in [plan_prefill(batch.q, batch.k_cache, 1, cfg, k_new if with_new else None)]}
    assert sources == {
        "gather packed": (SRC_GATHER, SRC_GATHER), "gather one head": (SRC_GATHER, SRC_GATHER),
        "tma cache packed": (SRC_DESC_PAGED, SRC_GATHER), "new rows packed": (SRC_GATHER, SRC_ROWS),
        "tma new rows packed": (SRC_DESC_PAGED, SRC_DESC_ROWS),
        "tma new rows one head": (SRC_DESC_PAGED, SRC_DESC_ROWS),
    }  # fmt: skip
    wide = PrefillConfig(32, 32, 4, 2, kv_tma=True)  # a 32-key tile spans two 16-row blocks
    assert plan_prefill(batch.q, batch.k_cache, 1, wide).ctx_source == SRC_GATHER
    odd = make_batch([9], [5], 2, 4, 48, 16, torch.bfloat16, seed=0)  # 48: no power-of-two box
    assert plan_prefill(odd.q, odd.k_cache, 1, VARIANTS[4][1], new_kv(odd)[0]).new_source == SRC_ROWS


@pytest.mark.parametrize("variant", [VARIANTS[1], VARIANTS[4]], ids=[VARIANT_IDS[1], VARIANT_IDS[4]])
def test_head_dim_not_a_power_of_two(variant):
    """head_dim 80 pads tiles to 128 columns (masked loads; descriptors fall back to rows)."""
    _, config, with_new = variant
    batch = make_batch(QUERY_LENS, [0, 21], 2, 4, 80, 16, torch.bfloat16, seed=6)
    poison_unused_slots(batch)
    assert_close(run(batch, config, with_new), reference(batch), torch.bfloat16)


@st.composite
def batches(draw):
    num_seqs = draw(st.integers(1, 3))
    return {
        "query_lens": [draw(st.sampled_from([1, 3, draw(st.integers(5, 40))])) for _ in range(num_seqs)],
        "context_lens": [draw(st.sampled_from([0, draw(st.integers(1, 70))])) for _ in range(num_seqs)],
        "num_kv_heads": draw(st.sampled_from([1, 2])),
        "queries_per_kv": draw(st.sampled_from([1, 4, 8])),
        "head_dim": draw(st.sampled_from([64, 128])),
        "block_size": draw(st.sampled_from([16, 32])),
        "dtype": draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=12, **SETTINGS)
@given(spec=batches(), variant=st.sampled_from(VARIANTS))
def test_ragged_batches_match_reference(spec, variant):
    """Mixed lengths (decode tokens too: the kernel is exact for any query length), dtypes."""
    _, config, with_new = variant
    batch = make_batch(**spec)
    poison_unused_slots(batch)
    out = run(batch, fit(config, spec["queries_per_kv"]), with_new)
    assert_close(out, reference(batch), spec["dtype"])


@pytest.mark.parametrize("kv_tma", [False, True])
def test_fp8_cache_matches_reference_on_the_dequantised_cache(kv_tma):
    batch = make_batch(QUERY_LENS, [5, 33], 2, 4, 64, 16, torch.bfloat16, seed=3)
    k_scale, v_scale = torch.tensor([0.02, 0.05]), torch.tensor([0.03, 0.01])
    k8, v8 = quantize_kv_ref(batch.k_cache, k_scale), quantize_kv_ref(batch.v_cache, v_scale)
    out = torch.full_like(batch.q, float("nan"))
    prefill_attention(batch.q, k8, v8, *batch.args()[3:], out=out, k_scale=k_scale,
                      v_scale=v_scale, config=PrefillConfig(32, 16, 4, 2, kv_tma=kv_tma))  # fmt: skip
    ref = paged_attention_ref(batch.q.float(), k8, v8, *batch.args()[3:], k_scale=k_scale,
                              v_scale=v_scale)  # fmt: skip
    assert_close(out, ref, torch.bfloat16)


def test_negative_control_new_rows_are_read():
    """k_new/v_new that disagree with the cache must change the output (the test above
    would pass vacuously if the kernel read the cache for the new tokens anyway)."""
    batch = make_batch(QUERY_LENS, [5, 33], 2, 4, 64, 16, torch.bfloat16, seed=4)
    k_new, v_new = new_kv(batch)
    config = VARIANTS[4][1]
    good = run(batch, config, True, k_new=k_new, v_new=v_new)
    assert_close(good, reference(batch), torch.bfloat16)
    k_bad, v_bad = new_kv(batch)
    v_bad.add_(1.0)  # in place: the view keeps the fused layout's strides
    bad = run(batch, config, True, k_new=k_bad, v_new=v_bad)
    assert rel_norm_error(bad, reference(batch)) > 10 * 1e-2


@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[2]], ids=VARIANT_IDS[0:3:2])
def test_negative_control_block_table_is_followed(variant):
    """Swapping two blocks of a sequence's table moves keys: the output must then differ."""
    batch = make_batch([37], [33], 2, 4, 64, 16, torch.bfloat16, seed=5)
    swapped = batch.block_tables.clone()
    swapped[0, [0, 2]] = swapped[0, [2, 0]]
    batch_swapped = PagedBatch(**{**vars(batch), "block_tables": swapped})
    assert rel_norm_error(run(batch_swapped, variant[1], False), reference(batch)) > 10 * 1e-2


def test_bad_inputs_name_the_argument():
    batch = make_batch([9], [5], 2, 4, 64, 16, torch.bfloat16, seed=0)
    k_new, v_new = new_kv(batch)
    with pytest.raises(ValueError, match="both k_new and v_new"):
        prefill_attention(*batch.args(), k_new=k_new)
    with pytest.raises(ValueError, match="k_new must be"):
        prefill_attention(*batch.args(), k_new=k_new[:, :1], v_new=v_new)
    with pytest.raises(ValueError, match="block_m 6 must be a multiple"):
        prefill_attention(*batch.args(), config=PrefillConfig(6, 16, 4, 2))
    k8 = quantize_kv_ref(batch.k_cache, None)
    with pytest.raises(ValueError, match="fp8 cache"):
        prefill_attention(batch.q, k8, k8.clone(), *batch.args()[3:], k_new=k_new, v_new=v_new)
