"""Mixed batches as two launches (decode-like sequences with the decode shape and split-KV, the
others with the prefill shape) against the float32 reference, on the CPU interpreter."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.paged_attention as pa
from kernels.paged_attention import (
    ALL_SEQS,
    DECODE_MAX_QUERY_LEN,
    DECODE_SEQS,
    PREFILL_SEQS,
    AttentionConfig,
    LaunchConfigs,
    launch_kinds,
    paged_attention,
)
from kernels.paged_batches import PagedBatch, make_batch, rel_norm_error
from kernels.reference import paged_attention_ref, quantize_kv_ref
from tests.kernels.helpers import SETTINGS, assert_close

FP8 = torch.float8_e4m3fn
SMALL = LaunchConfigs(decode=AttentionConfig(16, 16, 4, 2), prefill=AttentionConfig(32, 16, 4, 2))


def small_configs(queries_per_kv: int) -> LaunchConfigs:
    return LaunchConfigs(
        AttentionConfig(max(16, queries_per_kv), 16, 4, 2),
        AttentionConfig(max(32, queries_per_kv), 16, 4, 2),
    )


def reference(batch: PagedBatch, k_cache=None, v_cache=None, **scales) -> torch.Tensor:
    k = batch.k_cache.float() if k_cache is None else k_cache
    v = batch.v_cache.float() if v_cache is None else v_cache
    return paged_attention_ref(batch.q.float(), k, v, batch.block_tables, batch.seq_lens,
                               batch.query_start_loc, batch.scale, batch.max_query_len,
                               batch.max_seq_len, **scales)  # fmt: skip


def num_decode_like(query_lens: list[int]) -> int:
    return sum(n <= DECODE_MAX_QUERY_LEN for n in query_lens)


@st.composite
def mixed_cases(draw):
    """At least one decode-like sequence (1 token or a spec-like run of 2..4) and one chunk
    (5..24 tokens), each with or without cached context, in random order."""
    decodes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    chunks = draw(st.lists(st.integers(5, 24), min_size=1, max_size=2))
    query_lens = draw(st.permutations(decodes + chunks))
    return {
        "query_lens": list(query_lens),
        "context_lens": [draw(st.sampled_from([0, draw(st.integers(1, 80))])) for _ in query_lens],
        "num_kv_heads": draw(st.sampled_from([1, 2])),
        "queries_per_kv": draw(st.sampled_from([1, 4])),
        "head_dim": 32,
        "block_size": draw(st.sampled_from([8, 16])),
        "dtype": draw(st.sampled_from([torch.float32, torch.bfloat16])),
        "seed": draw(st.integers(0, 2**16)),
    }


def run(batch: PagedBatch, k_cache=None, v_cache=None, **kwargs) -> torch.Tensor:
    out = torch.full_like(batch.q, float("nan"))  # poison: every row must be written
    paged_attention(batch.q, batch.k_cache if k_cache is None else k_cache,
                    batch.v_cache if v_cache is None else v_cache, batch.block_tables,
                    batch.seq_lens, batch.query_start_loc, batch.scale, batch.max_query_len,
                    batch.max_seq_len, out=out, **kwargs)  # fmt: skip
    return out


@settings(max_examples=16, **SETTINGS)
@given(spec=mixed_cases(), splits=st.sampled_from([None, 1, 3]),
       prefill_splits=st.sampled_from([None, 1, 2, 4]), hint=st.booleans())
def test_mixed_batch_matches_reference(spec, splits, prefill_splits, hint):
    """16-bit caches; either launch split or not (each with its own scratch and merge); with
    and without the caller's count."""
    batch = make_batch(**spec)
    n_dec = num_decode_like(spec["query_lens"]) if hint else None
    out = run(batch, configs=small_configs(spec["queries_per_kv"]), num_splits=splits,
              prefill_splits=prefill_splits, num_decode_seqs=n_dec)
    assert_close(out, reference(batch), spec["dtype"])


@settings(max_examples=8, **SETTINGS)
@given(spec=mixed_cases(), splits=st.sampled_from([1, 2]), per_head=st.booleans())
def test_mixed_batch_over_an_fp8_cache(spec, splits, per_head):
    """Both launches split `splits` ways over an fp8 cache (scales per tensor or per head)."""
    batch = make_batch(**spec)
    gen = torch.Generator().manual_seed(spec["seed"])
    n = spec["num_kv_heads"] if per_head else 1
    k_scale, v_scale = (torch.rand(n, generator=gen) * 0.08 + 0.02 for _ in range(2))
    k8, v8 = quantize_kv_ref(batch.k_cache, k_scale), quantize_kv_ref(batch.v_cache, v_scale)
    out = run(batch, k8, v8, k_scale=k_scale, v_scale=v_scale, num_splits=splits,
              prefill_splits=splits, configs=small_configs(spec["queries_per_kv"]))
    ref = reference(batch, k8, v8, k_scale=k_scale, v_scale=v_scale)
    assert rel_norm_error(out, ref) <= (1e-5 if spec["dtype"] == torch.float32 else 1e-2)


def test_production_shapes_split_heuristic_on_a_mixed_batch():
    """The table's tile shapes and the split heuristic (long decodes beside a chunk: the decode
    launch splits, which the single prefill-shaped launch never could)."""
    batch = make_batch([1, 20, 3], [600, 7, 300], 2, 4, 32, 16, torch.float32, seed=4)
    plan = pa._plan_launch(batch.q, 2, 3, 20, 620, None, None, seq_kind=DECODE_SEQS,
                           num_decode_seqs=2)
    assert plan.splits > 1 and plan.config == pa.choose_config(1, 4)
    assert_close(run(batch, num_decode_seqs=2), reference(batch), torch.float32)
    assert_close(run(batch), reference(batch), torch.float32)


def test_launch_kinds():
    assert launch_kinds(5, DECODE_MAX_QUERY_LEN, None) == (ALL_SEQS,)
    assert launch_kinds(1, 300, None) == (ALL_SEQS,)  # one sequence: its kind is known
    assert launch_kinds(5, 300, 0) == (ALL_SEQS,)  # the caller says: no decodes
    assert launch_kinds(5, 300, None) == (DECODE_SEQS, PREFILL_SEQS)
    assert launch_kinds(5, 300, 2) == (DECODE_SEQS, PREFILL_SEQS)


def test_padding_tokens_and_zero_length_sequences_are_left_alone():
    """The mixed CUDA-graph layout: tokens past the last sequence's end belong to no sequence
    and zero-length dummy sequences follow; neither is written, the rest is right."""
    real = make_batch([2, 9, 1], [40, 5, 300], 1, 4, 32, 16, torch.float32, seed=9)
    pad_tokens, pad_seqs = 5, 3
    q = torch.cat([real.q, torch.randn(pad_tokens, *real.q.shape[1:])])
    end = int(real.query_start_loc[-1])
    qsl = torch.cat([real.query_start_loc, torch.full((pad_seqs,), end, dtype=torch.int32)])
    seq_lens = torch.cat([real.seq_lens, torch.zeros(pad_seqs, dtype=torch.int32)])
    tables = torch.cat([real.block_tables, torch.zeros(pad_seqs, real.block_tables.shape[1],
                                                       dtype=torch.int32)])
    for splits in (1, 4):
        out = torch.full_like(q, float("nan"))
        paged_attention(q, real.k_cache, real.v_cache, tables, seq_lens, qsl, real.scale,
                        q.shape[0], 1024, out=out, num_splits=splits, configs=SMALL)  # fmt: skip
        assert_close(out[:end], reference(real), torch.float32)
        assert out[end:].isnan().all()


class _PatchedLaunch:
    """A kernel whose launches get some constexprs replaced: a deliberately wrong filter."""

    def __init__(self, kernel, override) -> None:
        self.kernel, self.override = kernel, override

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kw: launch(*args, **{**kw, **self.override(kw)})


def test_a_wrong_filter_is_caught(monkeypatch):
    """The checks can fail: a decode launch whose filter drops 4-token sequences (which the
    prefill launch leaves to it) leaves their rows unwritten; a merge without the filter reads
    the decode launch's per-sequence scratch by token (row 12 = sequence 3's first token) and
    gives the decode at token 12 another sequence's output."""
    real_attn, real_merge = pa._paged_attention_kernel, pa._merge_splits_kernel
    assert "SEQ_KIND" in real_merge.arg_names and "DECODE_MAX_Q" in real_attn.arg_names
    batch = make_batch([4, 12, 1, 3], [30, 0, 50, 9], 1, 4, 32, 16, torch.float32, seed=2)
    ref = reference(batch)
    assert_close(run(batch, configs=SMALL, num_splits=1), ref, torch.float32)
    monkeypatch.setattr(pa, "_paged_attention_kernel", _PatchedLaunch(
        real_attn, override=lambda kw: {"DECODE_MAX_Q": 3} if kw["SEQ_KIND"] == DECODE_SEQS else {}))
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(run(batch, configs=SMALL, num_splits=1), ref, torch.float32)
    monkeypatch.setattr(pa, "_paged_attention_kernel", real_attn)

    batch = make_batch([12, 1, 1, 1, 1], [0, 40, 20, 60, 33], 1, 4, 32, 16, torch.float32, seed=3)
    ref = reference(batch)
    assert_close(run(batch, configs=SMALL, num_splits=2), ref, torch.float32)
    monkeypatch.setattr(pa, "_merge_splits_kernel", _PatchedLaunch(
        real_merge, override=lambda kw: {"SEQ_KIND": ALL_SEQS}))
    wrong = run(batch, configs=SMALL, num_splits=2)
    assert not torch.allclose(wrong[12], ref[12], atol=1e-3)  # NaN compares unequal too


def test_a_merge_that_ignores_q_blocks_is_caught(monkeypatch):
    """Split-KV over a chunk: each Q block cuts its own keys, so the first block of a 40-token
    prompt (8 keys: one segment, stored by the attention program) and its last (40 keys: three)
    differ. A merge that counts every token's segments from the whole sequence (the single-Q-
    block rule of decode launches) merges segments the first block never wrote over its
    output, and the check catches it."""
    batch = make_batch([40], [0], 1, 4, 32, 16, torch.float32, seed=5)
    cfg = AttentionConfig(32, 16, 4, 2)  # 8 tokens per Q block
    ref = reference(batch)
    assert_close(run(batch, config=cfg, num_splits=3), ref, torch.float32)
    real_merge = pa._merge_splits_kernel
    block_q_arg = real_merge.arg_names.index("block_q")

    class WholeSequenceMerge:
        def __getitem__(self, grid):
            launch = real_merge[grid]

            def wrong(*args, **kw):
                args = list(args)
                args[block_q_arg] = 1 << 20  # one Q block spanning the whole sequence
                return launch(*args, **kw)
            return wrong

    monkeypatch.setattr(pa, "_merge_splits_kernel", WholeSequenceMerge())
    wrong = run(batch, config=cfg, num_splits=3)
    assert not torch.allclose(wrong[:8], ref[:8], atol=1e-3)
