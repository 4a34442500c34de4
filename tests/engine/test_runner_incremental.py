"""The runner's incrementally updated buffers against a full rebuild: a runner that has
prepared every earlier step (block-table rows kept in a host mirror, written only from each
step's first block on, the device sent only the entries that changed, or the rows packed past
the entry capacity) must hand the device exactly what a fresh runner builds from scratch, over
random step sequences driven by the real scheduler: joins, finishes, block boundaries,
preemptions, prefill chunks, speculative drafts with rejections (tables truncated), and
draft-model style calls on subsets of the batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import runner as runner_module
from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.model import LlamaModel
from engine.runner import ModelRunner

MODEL = LlamaModel(get_model("tiny"), max_positions=256, seed=0)
MAX_MODEL_LEN = 128
MAX_SEQS = 8


@dataclass(frozen=True, slots=True)
class Case:
    block_size: int
    spec_k: int
    budget_tokens: int
    num_blocks: int
    seed: int
    num_steps: int = 40
    graphs: bool = True
    row_slice_max_rows: int = runner_module.ROW_SLICE_MAX_ROWS  # 0: always the one-scatter path
    entry_capacity: int | None = None  # block-table entries a step may send (None: the runner's)


def _runner(case: Case) -> ModelRunner:
    r = ModelRunner(MODEL, block_size=case.block_size, max_num_seqs=MAX_SEQS, max_num_batched_tokens=64,
                    max_model_len=MAX_MODEL_LEN)
    if case.graphs:  # as if decode graphs were captured: decode batches are padded to a bucket
        r.graphs = dict.fromkeys((1, 2, 4, 8))
    return r


def _device_view(r: ModelRunner, inp) -> dict[str, list]:
    """Everything a forward reads of the step, from the runner's device buffers."""
    t, n = inp.num_padded_tokens, inp.num_seqs
    padded_seqs = inp.graph_size or n
    return {
        "ids": r.d_input_ids[:t].tolist(), "pos": r.d_positions[:t].tolist(), "slots": r.d_slots[:t].tolist(),
        "seq_lens": r.d_seq_lens[:padded_seqs].tolist(), "qsl": r.d_qsl[: padded_seqs + 1].tolist(),
        "padding_blocks": r.d_block_tables[n:padded_seqs, 0].tolist(),
        "logits_idx": r.d_logits_idx[: inp.num_logits].tolist(),
    }


def _device_ptrs(r: ModelRunner) -> dict[str, int]:
    """Where each persistent device input lives: what a captured CUDA graph reads from."""
    return {name: getattr(r, name).data_ptr() for name in
            ("d_input_ids", "d_positions", "d_slots", "d_seq_lens", "d_qsl", "d_logits_idx", "d_block_tables")}


def _check_step(kept: ModelRunner, case: Case, scheduled, token_ids, verify: bool) -> None:
    ptrs = _device_ptrs(kept)
    inp = kept.prepare(scheduled, token_ids, verify=verify)
    assert _device_ptrs(kept) == ptrs  # the one-copy staging never moves a graph's inputs
    fresh = _runner(case)
    ref = fresh.prepare(scheduled, token_ids, verify=verify)
    assert inp == ref
    assert _device_view(kept, inp) == _device_view(fresh, ref)
    for i, s in enumerate(scheduled):  # the rows' live blocks, against the scheduler's tables
        nb = len(s.block_ids)
        assert kept.d_block_tables[i, :nb].tolist() == s.block_ids
        assert fresh.d_block_tables[i, :nb].tolist() == s.block_ids


def _token_ids(scheduled, tokens: dict[int, list[int]]) -> dict[int, list[int]]:
    """Each request's known tokens, a verifying decode's followed by dummy drafts."""
    return {s.request_id: tokens[s.request_id] + [3] * s.num_spec_tokens for s in scheduled}


def _sampled(scheduled, rng: np.random.Generator) -> dict[int, list[int]]:
    """1 + a random number of accepted drafts per sampling request."""
    return {s.request_id: [int(x) for x in rng.integers(5, 250, size=1 + rng.integers(0, s.num_spec_tokens + 1))]
            for s in scheduled if s.samples}


def _subset_call(kept: ModelRunner, case: Case, scheduled, tokens, rng: np.random.Generator) -> None:
    """A draft-model style call: some of the batch, the same live tables, earlier starts."""
    from engine.core.scheduler_output import ScheduledRequest

    pick = sorted(rng.choice(len(scheduled), size=rng.integers(1, len(scheduled) + 1), replace=False))
    entries = []
    for i in pick:
        s = scheduled[i]
        start = max(0, s.num_computed_tokens - int(rng.integers(0, 3)))
        entries.append(ScheduledRequest(s.request_id, s.num_computed_tokens + 1 - start, start, 0, 0, True, True,
                                        s.block_ids, ()))
    _check_step(kept, case, entries, {e.request_id: tokens[e.request_id] + [3] for e in entries}, False)


def drive(case: Case) -> Scheduler:
    """Run `case`'s random step sequence, checking every prepared step; returns the scheduler."""
    default, capacity = runner_module.ROW_SLICE_MAX_ROWS, runner_module.block_entry_capacity
    runner_module.ROW_SLICE_MAX_ROWS = case.row_slice_max_rows
    if case.entry_capacity is not None:
        runner_module.block_entry_capacity = lambda seqs: case.entry_capacity
    try:
        return _drive(case)
    finally:
        runner_module.ROW_SLICE_MAX_ROWS, runner_module.block_entry_capacity = default, capacity


def _drive(case: Case) -> Scheduler:
    rng = np.random.default_rng(case.seed)
    sched = Scheduler(SchedulerConfig(
        max_num_batched_tokens=case.budget_tokens, max_num_seqs=MAX_SEQS, max_model_len=MAX_MODEL_LEN,
        block_size=case.block_size, num_gpu_blocks=case.num_blocks, enable_prefix_caching=False,
        num_speculative_tokens=case.spec_k, enable_chunked_prefill=True))
    kept = _runner(case)
    tokens: dict[int, list[int]] = {}
    next_id = 0
    for _ in range(case.num_steps):
        for _ in range(int(rng.integers(0, 3))):  # joins
            prompt = int(rng.integers(1, 40))
            tokens[next_id] = rng.integers(5, 250, size=prompt).tolist()
            sched.add_request(Request(next_id, 0.0, prompt, int(rng.integers(1, 30)), (next_id,),
                                      hash_block_size=prompt), prompt_token_ids=list(tokens[next_id]))
            next_id += 1
        out = sched.schedule()
        if not out.scheduled:
            sched.update_from_output(out, {})
            continue
        if rng.random() < 0.3:
            _subset_call(kept, case, out.scheduled, tokens, rng)
        _check_step(kept, case, out.scheduled, _token_ids(out.scheduled, tokens),
                    bool(out.num_spec_tokens))
        sampled = _sampled(out.scheduled, rng)
        for rid, got in sampled.items():
            tokens[rid] += got
        sched.update_from_output(out, sampled)
    return sched


def test_incremental_rows_equal_rebuild_through_preemptions_and_rejected_drafts():
    # Few blocks (preemptions), a small budget (prefill chunks), two drafts (rejections
    # truncate tables): the sequence must exercise each, or the test proves less than it says.
    sched = drive(Case(block_size=2, spec_k=2, budget_tokens=24, num_blocks=40, seed=7, num_steps=80))
    assert sched.num_steps == 80
    stats = sched.stats
    assert sched.num_preemptions > 0
    assert 0 < stats.num_spec_accepted_tokens < stats.num_spec_draft_tokens
    assert stats.num_finished > 5


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_size=st.sampled_from([1, 2, 4, 16]), spec_k=st.integers(0, 3),
       budget_tokens=st.integers(8, 64), num_blocks=st.integers(70, 200), seed=st.integers(0, 2**31),
       graphs=st.booleans(), row_slice_max_rows=st.sampled_from([0, 2, 16]),
       entry_capacity=st.sampled_from([None, 0, 3]))
def test_incremental_rows_equal_rebuild(block_size, spec_k, budget_tokens, num_blocks, seed, graphs,
                                        row_slice_max_rows, entry_capacity):
    # capacity 0: every change goes packed; 3: steps alternate between entries and packed rows
    drive(Case(block_size, spec_k, budget_tokens, max(num_blocks // block_size, MAX_MODEL_LEN // block_size + 1),
               seed, graphs=graphs, row_slice_max_rows=row_slice_max_rows, entry_capacity=entry_capacity))


def test_row_overwritten_by_graph_padding_is_rewritten_whole():
    """A row that served as a graph's padding sequence (its first block id zeroed) and then
    holds the same request again is written whole, not from the step's block on."""
    from engine.core.scheduler_output import ScheduledRequest

    case = Case(block_size=2, spec_k=0, budget_tokens=64, num_blocks=64, seed=0)
    r = _runner(case)
    tables = {rid: [10 * rid + j for j in range(1, 5)] for rid in range(4)}  # 4 blocks, positions 0..7
    tokens = {rid: list(range(8)) for rid in range(4)}

    def decodes(rids: list[int], pos: int) -> list[ScheduledRequest]:
        return [ScheduledRequest(rid, 1, pos, 0, 0, False, True, tables[rid], ()) for rid in rids]

    steps = [([0, 1, 2, 3], 6), ([0, 1, 2, 3], 6), ([0, 1, 2], 6), ([0, 1, 2], 6), ([0, 1, 2, 3], 7)]
    for rids, pos in steps:  # row 3 is a padding sequence at steps 2 and 3, request 3's again at 4
        _check_step(r, case, decodes(rids, pos), tokens, False)
