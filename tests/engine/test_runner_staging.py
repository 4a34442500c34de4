"""The runner's one-buffer input staging: every input a typed view into one byte buffer (host
and device, same layout), sections apart and aligned, and a step's host-to-device traffic ONE
copy (plus the device-side spread of the packed block-table rows), counted with a
TorchDispatchMode over a real prepare()."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.engine.bench_host_prep import OpCounter
from engine.model import LlamaModel
from engine.model_spec import get_model
from engine.runner import STAGING_ALIGN_BYTES, ModelRunner, _staging_sections
from engine.scheduler_output import ScheduledRequest

MODEL = LlamaModel(get_model("tiny"), max_positions=256, seed=0)
BLOCK_SIZE = 4



@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 600), st.integers(1, 700), st.integers(0, 900))
def test_sections_are_apart_aligned_and_sized(tokens, seqs, max_blocks, work):
    secs = _staging_sections(tokens, seqs, max_blocks, work)
    want = {"ids": tokens, "pos": tokens, "slots": tokens, "logits_idx": tokens, "seq_lens": seqs,
            "qsl": seqs + 1, "gather_dst": seqs, "gather_src": seqs, "bt_packed": seqs * max_blocks,
            "work_counts": 2, "work": max(work, 1)}
    assert {s.name: s.numel for s in secs} == want
    for a, b in itertools.pairwise(secs):
        assert a.end_bytes <= b.offset_bytes < a.end_bytes + STAGING_ALIGN_BYTES
    assert all(s.offset_bytes % STAGING_ALIGN_BYTES == 0 for s in secs)
    assert secs[-1].name == "bt_packed"  # a step copies up to the end of its packed rows


def _runner() -> ModelRunner:
    return ModelRunner(MODEL, block_size=BLOCK_SIZE, max_num_seqs=8, max_num_batched_tokens=32, max_model_len=64)


def _decodes(n: int, ctx: int) -> tuple[list[ScheduledRequest], dict[int, list[int]]]:
    blocks = -(-(ctx + 1) // BLOCK_SIZE)
    sched = [ScheduledRequest(i, 1, ctx, 0, 0, True, True, list(range(i * blocks, (i + 1) * blocks)), ())
             for i in range(n)]
    return sched, {i: list(range(10 + i, 10 + i + ctx + 1)) for i in range(n)}


def test_device_inputs_are_views_of_one_buffer():
    r = _runner()
    base = r.d_raw.untyped_storage().data_ptr()
    for name in ("d_input_ids", "d_positions", "d_slots", "d_seq_lens", "d_qsl", "d_logits_idx",
                 "d_gather_dst", "d_gather_src", "d_bt_packed", "d_work", "d_work_counts"):
        assert getattr(r, name).untyped_storage().data_ptr() == base, name


def test_decode_step_is_one_copy_and_one_spread():
    r = _runner()
    sched, toks = _decodes(5, 9)
    r.prepare(sched, toks)  # first use of staging set 0
    r.prepare(sched, toks)  # first use of set 1
    with OpCounter() as ops:
        inp = r.prepare(sched, toks)
    assert ops.counts.get("copy_") == 2  # the one staging copy + the block-table spread
    assert not {"index_copy_", "index_select"} & set(ops.counts)
    assert r.d_input_ids[:5].tolist() == [toks[i][9] for i in range(5)]
    assert r.d_positions[:5].tolist() == [9] * 5 and inp.num_seqs == 5
    assert r.d_block_tables[1, :3].tolist() == [3, 4, 5]


def test_inflight_gather_indices_ride_the_same_copy():
    r = _runner()
    sched, toks = _decodes(3, 9)
    held = {i: t[:9] for i, t in toks.items()}  # token 9 sampled by the previous step, not on the host
    inflight = torch.tensor([70, 71, 72])
    rows = {0: 2, 1: 0, 2: 1}
    with OpCounter() as ops:
        r.prepare(sched, held, (rows, inflight))
    assert ops.counts.get("copy_") == 2
    assert ops.counts.get("index_copy_") == 1 and ops.counts.get("index_select") == 1
    assert r.d_input_ids[:3].tolist() == [72, 70, 71]
