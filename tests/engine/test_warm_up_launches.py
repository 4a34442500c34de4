"""The engine's warm-up compiles every attention launch variant an eager step can make.

Triton compiles one variant per (launch kind, tile config, split or not, merge width); an eager
step that meets a new one mid-replay stalls for about a second on the H200 (the first step of
the disaggregated runs and of two calibration sweeps did). `ModelRunner.warm_up_attention_launches`
launches each eager shape with and without split-KV; here its launches are recorded (the kernel
is not run) and compared with the variants the launch planner produces for arbitrary batches.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.paged_attention as pa
from engine.core.model_spec import get_model
from engine.model import LlamaModel
from engine.runner import ModelRunner
from kernels import DECODE_MAX_QUERY_LEN

BLOCK = 16
MAX_LEN = 65536


def _signature(plan, work=None) -> tuple:
    """What selects a compiled variant of the attention kernel and of its merge."""
    merge = pa.merge_splits_pad(plan.splits) if plan.splits > 1 else None
    return plan.seq_kind, plan.config, plan.splits > 1, merge, work is not None


@pytest.fixture(scope="module")
def warmed() -> set[tuple]:
    model = LlamaModel(get_model("tiny"), max_positions=MAX_LEN, dtype=torch.float32, seed=0,
                       attention_backend="triton")
    runner = ModelRunner(model, block_size=BLOCK, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=MAX_LEN)
    runner.allocate_kv_cache(num_gpu_blocks_override=32)
    seen: list[tuple] = []
    mp = pytest.MonkeyPatch()
    mp.setattr(pa, "_launch", lambda plan, *a, **k: seen.append(_signature(plan, (a[9:] or [None])[0])))
    try:
        assert runner.warm_up_attention_launches() == 9
    finally:
        mp.undo()
    return set(seen)


def test_warm_up_launches_each_kind_split_and_unsplit(warmed):
    kinds = {(kind, split, work) for kind, _, split, _, work in warmed}
    # pure-decode batches: one launch over all sequences; batches with a chunk: the work-list
    # launches, of decodes and of chunks, as an eager step with chunks makes them
    assert kinds == {(pa.ALL_SEQS, False, False), (pa.ALL_SEQS, True, False),
                     (pa.DECODE_SEQS, False, True), (pa.DECODE_SEQS, True, True),
                     (pa.PREFILL_SEQS, False, True), (pa.PREFILL_SEQS, True, True)}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(batch=st.lists(st.tuples(st.integers(1, 300), st.integers(0, MAX_LEN - 300)), min_size=1, max_size=300))
def test_every_planned_launch_was_warmed(warmed, batch):
    """Any eager batch (query lengths, contexts) plans only launches whose variant the warm-up
    launched: a pure-decode batch its launch over all sequences, a batch with chunks the
    work-list launches of the kinds it has (as the runner stages them)."""
    q_lens = [q for q, _ in batch]
    seq_lens = [q + c for q, c in batch]
    num_decode = sum(q <= DECODE_MAX_QUERY_LEN for q in q_lens)
    spec = get_model("tiny")
    q = torch.empty((sum(q_lens), spec.num_heads, spec.head_dim))
    if max(q_lens) <= DECODE_MAX_QUERY_LEN:
        kinds, work = pa.launch_kinds(len(batch), max(q_lens), num_decode), None
    else:
        kinds = (pa.DECODE_SEQS,) * (num_decode > 0) + (pa.PREFILL_SEQS,)
        work = object()
    for kind in kinds:
        plan = pa._plan_launch(q, spec.num_kv_heads, len(batch), max(q_lens), max(seq_lens), None, None,
                               seq_kind=kind, num_decode_seqs=num_decode)
        assert _signature(plan, work) in warmed, (kind, plan)


def test_merge_widths_cover_every_heuristic_split_count():
    assert pa.merge_splits_pad(pa.SPLIT_LONG_MAX) == pa.MERGE_SPLITS_PADS[0]
    assert pa.merge_splits_pad(pa.SPLIT_MAX) == pa.MERGE_SPLITS_PADS[-1]
    assert pa.merge_splits_pad(2 * pa.SPLIT_MAX) == 2 * pa.SPLIT_MAX  # an override past them


def test_warm_up_launches_run_and_leave_the_kv_cache_alone():
    """The real kernels (interpreted) through every warm-up launch, split 17 ways included; the
    launches store no KV (every slot -1) and leave the block tables zeroed."""
    model = LlamaModel(get_model("tiny"), max_positions=4096, dtype=torch.float32, seed=0,
                       attention_backend="triton")
    runner = ModelRunner(model, block_size=BLOCK, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096)
    runner.allocate_kv_cache(num_gpu_blocks_override=32)
    runner.kv_caches.normal_(generator=torch.Generator().manual_seed(1))
    before = runner.kv_caches.clone()
    assert runner.warm_up_attention_launches() == 9
    assert torch.equal(runner.kv_caches, before)
    assert not runner.d_block_tables.any()
