"""Work-list launches (the host lists each launch's Q blocks, the kernel's programs stride over
them) against the float32 reference, on the CPU interpreter: eager grids, CUDA-graph-like grids
capped below the number of items, padded batches (zero-length dummy sequences, tokens of no
sequence), split-KV on either launch; and the planner itself by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.paged_attention as pa
from kernels.paged_attention import paged_attention, work_block_qs
from kernels.paged_batches import PagedBatch, make_batch
from kernels.reference import paged_attention_ref
from kernels.work_lists import AttentionWork, plan_work, work_capacity
from tests.kernels.helpers import SETTINGS, assert_close


def reference(batch: PagedBatch) -> torch.Tensor:
    return paged_attention_ref(batch.q.float(), batch.k_cache.float(), batch.v_cache.float(),
                               batch.block_tables, batch.seq_lens, batch.query_start_loc, batch.scale,
                               batch.max_query_len, batch.max_seq_len)  # fmt: skip


def planned(q_lens: list[int], seq_lens: list[int], num_q_heads: int, num_kv_heads: int,
            max_seqs: int, max_tokens: int, in_graph: bool) -> AttentionWork:
    bqs = work_block_qs(num_q_heads, num_kv_heads)
    cap = work_capacity(max_seqs, max_tokens, bqs)
    items = np.full(sum(cap), -1, dtype=np.int32)  # poison: only listed items may be read
    counts = plan_work(np.array(q_lens, dtype=np.int64), np.array(seq_lens, dtype=np.int64), bqs, items, cap[0])
    bound = cap if in_graph else counts
    return AttentionWork(torch.from_numpy(items), torch.tensor(counts, dtype=torch.int32), cap[0], bound,
                         bqs, in_graph)


def test_plan_by_hand():
    """Decode blocks of 4 tokens, chunk blocks of 32 (32 q heads over 8 KV heads); each list
    ordered by keys per block, most first; a zero-length sequence lists nothing."""
    bqs = work_block_qs(32, 8)
    assert bqs == (4, 32)
    q_lens = np.array([1, 70, 0, 3, 5])
    seq_lens = np.array([10, 100, 0, 500, 5])
    cap = work_capacity(8, 128, bqs)
    assert cap == (8, 4 + 8)
    out = np.zeros(sum(cap), dtype=np.int32)
    assert plan_work(q_lens, seq_lens, bqs, out, cap[0]) == (2, 4)
    assert out[:2].tolist() == [3 << 16, 0 << 16]  # 500 keys before 10
    # chunk of 70 over 30 cached: blocks 2 (100 keys), 1 (94), 0 (62); the 5-token prompt: 5
    assert out[8:12].tolist() == [1 << 16 | 2, 1 << 16 | 1, 1 << 16 | 0, 4 << 16]


@st.composite
def padded_batches(draw):
    """Decodes and chunks with or without context, then the graph layout's padding: tokens past
    the last sequence and empty dummy sequences."""
    decodes = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    chunks = draw(st.lists(st.integers(5, 40), min_size=1, max_size=2))
    q_lens = list(draw(st.permutations(decodes + chunks)))
    return {"query_lens": q_lens, "context_lens": [draw(st.sampled_from([0, draw(st.integers(1, 120))])) for _ in q_lens],
            "queries_per_kv": draw(st.sampled_from([1, 4])), "dtype": draw(st.sampled_from([torch.float32, torch.bfloat16])),
            "pad_tokens": draw(st.integers(0, 6)), "pad_seqs": draw(st.integers(0, 3)),
            "splits": draw(st.sampled_from([1, 3])), "in_graph": draw(st.booleans()), "seed": draw(st.integers(0, 2**16))}


@settings(max_examples=12, **SETTINGS)
@given(spec=padded_batches())
def test_work_lists_match_reference(spec):
    real = make_batch(spec["query_lens"], spec["context_lens"], 2, spec["queries_per_kv"], 32, 16,
                      spec["dtype"], seed=spec["seed"])
    pad_t, pad_s = spec["pad_tokens"], spec["pad_seqs"]
    end = int(real.query_start_loc[-1])
    q = torch.cat([real.q, torch.randn(pad_t, *real.q.shape[1:]).to(spec["dtype"])])
    qsl = torch.cat([real.query_start_loc, torch.full((pad_s,), end, dtype=torch.int32)])
    seq_lens = torch.cat([real.seq_lens, torch.zeros(pad_s, dtype=torch.int32)])
    tables = torch.cat([real.block_tables, torch.zeros(pad_s, real.block_tables.shape[1], dtype=torch.int32)])
    n = len(spec["query_lens"]) + pad_s
    work = planned(spec["query_lens"] + [0] * pad_s, seq_lens.tolist(), q.shape[1], 2, n, q.shape[0],
                   spec["in_graph"])
    out = torch.full_like(q, float("nan"))
    s = spec["splits"]
    saved = pa.WORK_PROGRAMS_PER_SM, pa.num_sms_of
    pa.WORK_PROGRAMS_PER_SM, pa.num_sms_of = 1, (lambda device: 1)  # a graph's grid: 1 program per head
    try:
        paged_attention(q, real.k_cache, real.v_cache, tables, seq_lens, qsl, real.scale, q.shape[0], 2048,
                        out=out, num_splits=s, prefill_splits=s, work=work)
    finally:
        pa.WORK_PROGRAMS_PER_SM, pa.num_sms_of = saved
    assert_close(out[:end], reference(real), spec["dtype"])
    assert out[end:].isnan().all()  # padding tokens belong to no sequence: never written


def test_a_planner_that_drops_a_block_is_caught():
    """The checks can fail: a list without a chunk's last Q block leaves its rows unwritten."""
    real = make_batch([1, 40], [30, 7], 2, 4, 32, 16, torch.float32, seed=1)
    work = planned([1, 40], real.seq_lens.tolist(), 8, 2, 2, 41, in_graph=False)
    out = torch.full_like(real.q, float("nan"))
    paged_attention(*real.args(), out=out, work=work)
    assert_close(out, reference(real), torch.float32)
    dropped = AttentionWork(work.items, torch.tensor([1, work.max_items[1] - 1], dtype=torch.int32),
                            work.decode_capacity, work.max_items, work.block_qs)
    out = torch.full_like(real.q, float("nan"))
    paged_attention(*real.args(), out=out, work=dropped)
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(out, reference(real), torch.float32)


def test_a_list_of_other_blocks_is_refused():
    real = make_batch([1, 40], [30, 7], 2, 4, 32, 16, torch.float32, seed=1)
    work = planned([1, 40], real.seq_lens.tolist(), 8, 2, 2, 41, in_graph=False)
    wrong = AttentionWork(work.items, work.counts, work.decode_capacity, work.max_items, (4, 16))
    with pytest.raises(ValueError, match="work list counts Q blocks of 16 tokens"):
        paged_attention(*real.args(), work=wrong)
