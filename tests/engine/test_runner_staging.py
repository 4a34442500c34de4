"""The runner's one-buffer input staging: every input a typed view into one byte buffer (host
and device, same layout), sections apart and aligned, and a step's host-to-device traffic ONE
copy (plus one fixed-size index_copy_ of the block-table entries it changed, or the spread of
its packed rows when they are many), counted with a TorchDispatchMode over a real prepare()."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.model_spec import get_model
from engine.core.scheduler_output import ScheduledRequest
from engine.model import LlamaModel
from engine.op_counter import OpCounter
from engine.runner import STAGING_ALIGN_BYTES, ModelRunner, _staging_sections, block_entry_capacity

MODEL = LlamaModel(get_model("tiny"), max_positions=256, seed=0)
BLOCK_SIZE = 4



@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 600), st.integers(1, 700), st.integers(0, 900))
def test_sections_are_apart_aligned_and_sized(tokens, seqs, max_blocks, work):
    secs = _staging_sections(tokens, seqs, max_blocks, work)
    want = {"ids": tokens + 1, "pos": tokens, "slots": tokens, "logits_idx": tokens, "seq_lens": seqs,
            "qsl": seqs + 1, "gather_dst": seqs, "gather_src": seqs, "bt_packed": seqs * max_blocks,
            "work_counts": 2, "work": max(work, 1), "bt_idx": block_entry_capacity(seqs),
            "bt_val": block_entry_capacity(seqs)}
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
                 "d_gather_dst", "d_gather_src", "d_bt_packed", "d_work", "d_work_counts", "d_bt_idx", "d_bt_val"):
        assert getattr(r, name).untyped_storage().data_ptr() == base, name
    assert r.d_block_tables.data_ptr() == r.d_bt_flat.data_ptr()  # the flat table has one spare element
    assert r.d_bt_flat.numel() == r.d_block_tables.numel() + 1


def test_decode_step_is_one_copy():
    r = _runner()
    sched, toks = _decodes(5, 9)
    with OpCounter() as first:
        r.prepare(sched, toks)  # first use of staging set 0: every row written
    assert first.counts.get("copy_") == 1 and first.counts.get("index_copy_") == 1
    r.prepare(sched, toks)  # first use of set 1
    with OpCounter() as ops:
        inp = r.prepare(sched, toks)
    assert ops.counts == {"copy_": 1}  # the one staging copy; no row changed, no view made
    assert r.d_input_ids[:5].tolist() == [toks[i][9] for i in range(5)]
    assert r.d_positions[:5].tolist() == [9] * 5 and inp.num_seqs == 5
    assert r.d_block_tables[1, :3].tolist() == [3, 4, 5]


def test_a_row_crossing_into_a_block_sends_its_entry():
    r = _runner()
    sched, toks = _decodes(3, 7)  # 8 tokens after this step: 2 blocks of 4
    r.prepare(sched, toks)
    r.prepare(sched, toks)  # both staging sets used
    sched[1].block_ids.append(99)  # request 1's next token opens a block
    sched[1].num_computed_tokens = 8
    toks[1].append(5)
    with OpCounter() as ops:
        r.prepare(sched, toks)
    assert ops.counts == {"copy_": 1, "index_copy_": 1}
    assert r.d_block_tables[1, :3].tolist() == [2, 3, 99]
    assert r.d_bt_idx.tolist()[:2] == [1 * r.max_blocks_per_seq + 2, r.d_bt_flat.numel() - 1]
    assert r.d_block_tables[0, :2].tolist() == [0, 1] and r.d_block_tables[2, :2].tolist() == [4, 5]


def test_many_changed_entries_go_packed():
    r = ModelRunner(MODEL, block_size=1, max_num_seqs=2, max_num_batched_tokens=32, max_model_len=300)
    cap = block_entry_capacity(2)
    sched = [ScheduledRequest(0, 1, cap + 3, 0, 0, False, True, list(range(1, cap + 5)), ())]
    toks = {0: list(range(cap + 4))}
    with OpCounter() as ops:
        r.prepare(sched, toks)
    assert ops.counts.get("copy_") == 2 and "index_copy_" not in ops.counts  # the copy and the spread
    assert r.d_block_tables[0, : cap + 4].tolist() == list(range(1, cap + 5))


def test_inflight_gather_indices_ride_the_same_copy():
    r = _runner()
    sched, toks = _decodes(3, 9)
    held = {i: t[:9] for i, t in toks.items()}  # token 9 sampled by the previous step, not on the host
    inflight = torch.tensor([70, 71, 72])
    rows = {0: 2, 1: 0, 2: 1}
    with OpCounter() as ops:
        r.prepare(sched, held, (rows, inflight))
    # the staging copy and the tokens' copy into the persistent sampled-token buffer; the
    # block-table entries (all new) and the eager step's gather
    assert ops.counts.get("copy_") == 2
    assert ops.counts.get("index_copy_") == 2 and ops.counts.get("index_select") == 1
    assert r.d_input_ids[:3].tolist() == [72, 70, 71]
    assert r.d_gather_dst.tolist() == [0, 1, 2] + [r.d_input_ids.numel()] * 5  # the spare id past them


def test_inflight_tokens_in_the_sampled_buffer_need_no_copy():
    r = _runner()
    sched, toks = _decodes(3, 9)
    held = {i: t[:9] for i, t in toks.items()}
    r.prepare(sched, toks)
    r.prepare(sched, toks)
    out = r.sampled_tokens_out(3)
    assert r.sampled_tokens_out(3) is out  # one view per size
    out.copy_(torch.tensor([70, 71, 72]))
    with OpCounter() as ops:
        r.prepare(sched, held, ({0: 2, 1: 0, 2: 1}, out))
    assert ops.counts == {"copy_": 1, "index_copy_": 1, "index_select": 1}  # an eager step gathers here
    assert r.d_input_ids[:3].tolist() == [72, 70, 71]
