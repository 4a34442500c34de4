"""The Triton paged-attention kernel against the per-sequence float32 PyTorch reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.paged_attention as pa
from kernels import get_backend
from kernels.paged_attention import (
    DECODE_CONFIG,
    PREFILL_CONFIG,
    SPLIT_LONG_MAX,
    SPLIT_LONG_MIN_TOKENS,
    AttentionConfig,
    choose_config,
    choose_num_splits,
    paged_attention,
)
from kernels.paged_batches import PagedBatch, make_batch, rel_norm_error
from kernels.reference import paged_attention_ref
from tests.kernels.helpers import SETTINGS, assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# small tiles keep the CPU interpreter quick and make tiles smaller/larger than the block size
SMALL_DECODE = AttentionConfig(block_m=16, tile_n=16, num_warps=4, num_stages=2)
SMALL_PREFILL = AttentionConfig(block_m=32, tile_n=32, num_warps=4, num_stages=2)


def reference(batch: PagedBatch) -> torch.Tensor:
    """Float32 reference from the same (possibly low-precision) inputs."""
    return paged_attention_ref(
        batch.q.float(), batch.k_cache.float(), batch.v_cache.float(), batch.block_tables,
        batch.seq_lens, batch.query_start_loc, batch.scale, batch.max_query_len,
        batch.max_seq_len,
    )  # fmt: skip


def run_kernel(batch: PagedBatch, **kwargs) -> torch.Tensor:
    out = torch.full_like(batch.q, float("nan"))  # poison: every element must be written
    returned = paged_attention(*batch.args(), out=out, **kwargs)
    assert returned is out
    return out


@st.composite
def mixed_batches(draw, max_seqs: int = 4, decode_only: bool = False):
    num_seqs = draw(st.integers(1, max_seqs))
    if decode_only:
        query_lens = [1] * num_seqs
    else:  # mix decode tokens, short speculative runs and prefill chunks
        query_lens = [
            draw(st.sampled_from([1, 1, 2, 3, draw(st.integers(4, 40))])) for _ in range(num_seqs)
        ]
    context_lens = [draw(st.integers(0, 90)) for _ in range(num_seqs)]
    return {
        "query_lens": query_lens,
        "context_lens": context_lens,
        "num_kv_heads": draw(st.sampled_from([1, 2])),
        "queries_per_kv": draw(st.sampled_from([1, 4, 8])),
        "head_dim": draw(st.sampled_from([64, 128])),
        "block_size": draw(st.sampled_from([8, 16, 32, 64])),
        "dtype": draw(st.sampled_from(DTYPES)),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=16, **SETTINGS)
@given(spec=mixed_batches(), small_tiles=st.booleans())
def test_mixed_prefill_and_decode_match_reference(spec, small_tiles):
    batch = make_batch(**spec)
    config = None
    if small_tiles:
        config = SMALL_PREFILL if batch.max_query_len > 4 else SMALL_DECODE
        config = AttentionConfig(
            max(config.block_m, spec["queries_per_kv"]), config.tile_n, 4, 2
        )
    out = run_kernel(batch, config=config, num_splits=1)
    assert_close(out, reference(batch), spec["dtype"])


@settings(max_examples=10, **SETTINGS)
@given(spec=mixed_batches(decode_only=True), num_splits=st.integers(2, 7))
def test_split_kv_decode_matches_reference(spec, num_splits):
    """Forced split-KV: segments of uneven length, empty segments for short sequences."""
    batch = make_batch(**spec)
    out = run_kernel(batch, config=SMALL_DECODE, num_splits=num_splits)
    assert_close(out, reference(batch), spec["dtype"])


@pytest.mark.parametrize("block_size", [8, 16, 32, 64])
@pytest.mark.parametrize("queries_per_kv", [1, 4, 8])
def test_every_block_size_and_gqa_ratio(block_size, queries_per_kv):
    """Each (block size, GQA ratio) once, in bf16, with the production tile shapes."""
    head_dim = 64 if queries_per_kv == 4 else 128
    batch = make_batch(
        query_lens=[1, 9, 1], context_lens=[70, 23, 0], num_kv_heads=2,
        queries_per_kv=queries_per_kv, head_dim=head_dim, block_size=block_size,
        dtype=torch.bfloat16, seed=block_size * 10 + queries_per_kv,
    )  # fmt: skip
    out = run_kernel(batch)
    assert_close(out, reference(batch), torch.bfloat16)


def test_split_and_unsplit_agree_on_a_long_decode():
    batch = make_batch([1, 1], [300, 45], 2, 4, 64, 16, torch.float32, seed=7)
    ref = reference(batch)
    for splits in (1, 2, 5):
        assert_close(run_kernel(batch, config=SMALL_DECODE, num_splits=splits), ref, torch.float32)


def test_sequence_with_no_new_tokens_is_left_alone():
    """A sequence with q_len 0 owns no output rows; its neighbours are still right."""
    batch = make_batch([3, 0, 1], [5, 20, 8], 1, 4, 64, 16, torch.float32, seed=3)
    assert_close(run_kernel(batch), reference(batch), torch.float32)


def test_a_wrong_kernel_would_fail():
    """The checks can fail: a shifted causal limit or an unwritten row is caught."""
    batch = make_batch([4], [10], 1, 4, 64, 16, torch.float32, seed=11)
    ref = reference(batch)
    out = run_kernel(batch)
    shifted = batch.seq_lens.clone() + 1  # attends one key too many
    batch.seq_lens = shifted
    batch.block_tables[0, 1] = batch.block_tables[0, 0]
    wrong = run_kernel(batch)
    assert rel_norm_error(wrong, ref) > 1e-2
    holey = out.clone()
    holey[2, 1, 5] = float("nan")
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(holey, ref, torch.float32)
    assert math.isnan(rel_norm_error(holey, ref))


def test_backends_agree():
    batch = make_batch([2, 1], [12, 30], 2, 4, 64, 8, torch.float32, seed=5)
    outs = {name: get_backend(name).paged_attention(*batch.args()) for name in ("triton", "torch")}
    assert_close(outs["triton"], outs["torch"], torch.float32)


def test_bad_shapes_name_the_field():
    batch = make_batch([1], [4], 1, 4, 64, 16, torch.float32, seed=1)
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                        batch.seq_lens, batch.query_start_loc[:1], batch.scale, 1, 5)  # fmt: skip
    with pytest.raises(ValueError, match="num_q_heads"):
        paged_attention(batch.q[:, :3], batch.k_cache[:, :, :1].expand(-1, -1, 2, -1),
                        batch.v_cache[:, :, :1].expand(-1, -1, 2, -1), batch.block_tables,
                        batch.seq_lens, batch.query_start_loc, batch.scale, 1, 5)  # fmt: skip
    with pytest.raises(ValueError, match="out must be shaped like q"):
        paged_attention(*batch.args(), out=torch.empty(batch.q.shape[0], 4, 128)[:, :, ::2])
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        paged_attention(*make_batch([40], [4], 1, 4, 64, 16, torch.float32, 1).args(),
                        num_splits=0)  # fmt: skip


def test_heuristics_on_the_h200_shapes():
    """Llama-3.1-8B layer (8 KV heads, 4 query heads each) on 132 SMs."""
    assert choose_config(1, 4) == DECODE_CONFIG
    assert choose_config(2048, 4) == PREFILL_CONFIG
    assert choose_config(1, 32).block_m == 32  # a group larger than the tile widens it
    block_q = DECODE_CONFIG.block_m // 4

    def splits(batch: int, context: int) -> int:
        return choose_num_splits(batch // block_q + batch, 8, 1, context, block_q, 132)

    assert splits(1, 32768) > 16  # one sequence: cut it up to fill the SMs
    assert splits(1, 4096) > 1
    # 512 programs already fill 132 SMs: only sequences past SPLIT_LONG_MIN_TOKENS are cut
    assert splits(64, 1024) == 1
    assert splits(64, 4096) == 4096 // SPLIT_LONG_MIN_TOKENS
    assert splits(16, 131072) == SPLIT_LONG_MAX  # a graph captured at a long max_model_len
    # ... but a large batch's graph gets few segments: each unused one is a program that exits
    assert splits(256, 131072) == 1 and splits(128, 131072) == 3
    assert splits(1, 100) == 1  # too short to be worth a merge
    assert choose_num_splits(9, 8, 2048, 4096, block_q, 132) == 1  # chunks: choose_prefill_splits


def test_prefill_split_heuristic_on_the_h200_shapes():
    """Llama-3.1-8B layer, prefill tiles (32 tokens x 4 heads per program): a short chunk over a
    long context is cut, a long prompt (enough programs) or a short context is not."""
    block_q = PREFILL_CONFIG.block_m // 4

    def splits(tokens: int, keys: int) -> int:
        return pa.choose_prefill_splits(-(-tokens // block_q), 8, keys, 132)

    assert splits(64, 8256) == pa.PREFILL_SPLIT_MAX  # 16 programs: to 2 per SM, capped
    assert splits(128, 2688) == 2688 // pa.PREFILL_SPLIT_MIN_TOKENS  # 32 programs: cut by length
    assert splits(512, 8704) == 1  # 128 programs, about one per SM: left whole
    assert splits(8192, 16384) == 1  # 2,048 programs fill the GPU
    assert splits(64, 700) == 1  # under 2 x PREFILL_SPLIT_MIN_TOKENS keys: no merge to pay for
    assert splits(1, 1 << 20) == pa.PREFILL_SPLIT_MAX
    plan = pa._plan_launch(torch.empty(128, 32, 128), 8, 1, 128, 2688, None, None)
    assert plan.splits == 5 and plan.min_tiles_per_split * PREFILL_CONFIG.tile_n >= pa.PREFILL_SPLIT_MIN_TOKENS


@settings(max_examples=8, **SETTINGS)
@given(spec=mixed_batches(), num_splits=st.integers(2, 6))
def test_split_kv_prefill_matches_reference(spec, num_splits):
    """Forced split-KV on prefill-shaped launches: every Q block of a chunk cut into segments of
    its own keys (causal rows of a block find no key in a late segment; the merge weighs them
    0), chunks of several Q blocks, decodes beside them in the same launch."""
    batch = make_batch(**spec)
    config = AttentionConfig(max(SMALL_PREFILL.block_m, spec["queries_per_kv"]), SMALL_PREFILL.tile_n, 4, 2)
    out = run_kernel(batch, config=config, num_splits=num_splits)
    assert_close(out, reference(batch), spec["dtype"])


def test_split_prefill_heuristic_over_a_long_context(monkeypatch):
    """The heuristic's own cut (segments of >= PREFILL_SPLIT_MIN_TOKENS keys, here 64: a
    20-token chunk over 300 cached keys is cut into 5 segments, the 6-token prompt keeps one
    and is stored without a merge): as the reference."""
    monkeypatch.setattr(pa, "PREFILL_SPLIT_MIN_TOKENS", 64)
    monkeypatch.setattr(pa, "num_sms_of", lambda device: 132)
    batch = make_batch([20, 6], [300, 10], 2, 4, 64, 16, torch.float32, seed=9)
    plan = pa._plan_launch(batch.q, 2, 2, batch.max_query_len, batch.max_seq_len, None, SMALL_PREFILL)
    assert plan.splits == 320 // 64 and plan.min_tiles_per_split == 2
    assert_close(run_kernel(batch, config=SMALL_PREFILL), reference(batch), torch.float32)


def test_split_count_fixed_at_capture_serves_short_sequences():
    """A decode CUDA graph is captured with max_seq_len = max_model_len, so the launch's split
    count comes from that length (64 segments here); each sequence then works only the
    segments its real length needs (>= SPLIT_MIN_TOKENS keys each) and the empty ones weigh
    nothing in the merge: the result is the reference's."""
    batch = make_batch([1, 1], [40, 700], 1, 4, 64, 16, torch.float32, seed=11)
    block_q = DECODE_CONFIG.block_m // 4
    assert choose_num_splits(2 // block_q + 2, 1, 1, 131072, block_q, 132) == 64
    args = list(batch.args())
    args[-1] = 131072  # max_seq_len as at capture
    out = paged_attention(*args)
    assert_close(out, reference(batch), torch.float32)


def test_full_gpu_splits_only_long_sequences(monkeypatch):
    """With the SMs already full of programs, a long sequence is still cut (a batch would
    otherwise wait on its longest sequence's single program) while a short one keeps one
    segment, stored by the attention kernel itself (the merge skips it) and unused segments
    exit without writing: here 4 SMs, 2 sequences x 2 KV heads, segments of >= 128 keys, so
    the 700-token sequence uses 3 of 4 segments and the 40-token one 1."""
    monkeypatch.setattr(pa, "num_sms_of", lambda device: 4)
    monkeypatch.setattr(pa, "SPLIT_LONG_MIN_TOKENS", 128)
    monkeypatch.setattr(pa, "SPLIT_LONG_MAX", 4)
    batch = make_batch([1, 1], [40, 700], 2, 4, 64, 16, torch.float32, seed=5)
    block_q = DECODE_CONFIG.block_m // 4
    assert pa.choose_num_splits(2 // block_q + 2, 2, 1, batch.max_seq_len, block_q, 4) == 4
    plan = pa._plan_launch(batch.q, 2, 2, 1, batch.max_seq_len, None, None)
    assert (plan.splits, plan.min_tiles_per_split) == (4, 1)
    assert_close(run_kernel(batch), reference(batch), torch.float32)
