"""Skip-ahead (engine/core/decode_skip.py): n steps at once == n single steps, through finishes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.core.decode_skip import (
    DecodeStretch,
    advance_decode,
    advance_decode_segments,
    uniform_decode_steps,
)
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerConfig
from tests.engine.test_scheduler_random import state_of


def _warm_scheduler(block_size, num_gpu_blocks, caching, lens, warm) -> Scheduler:
    s = Scheduler(SchedulerConfig(num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                                  enable_prefix_caching=caching, max_num_batched_tokens=64))
    for rid, (p, o, fam, hold) in enumerate(lens):
        # fam > 0: requests of one family share prompt blocks (shared, refcount > 1)
        ids = tuple(fam * 50 + j if fam else 10_000 + rid * 50 + j for j in range(-(-p // 4)))
        s.add_request(Request(rid, 0.0, p, o, ids, hash_block_size=4), hold_blocks_on_finish=hold)
    for _ in range(warm):  # reach a mid-run state, possibly with a cache and free cached blocks
        if s.has_unfinished():
            s.update_from_output(s.schedule())
    return s


# mid-run schedulers: (prompt, output, prefix family, hold) per request, `warm` steps taken
WARM_SCHEDULERS = {
    "block_size": st.sampled_from([1, 2, 4, 16]),
    "num_gpu_blocks": st.integers(4, 60),
    "caching": st.booleans(),
    "lens": st.lists(st.tuples(st.integers(1, 30), st.integers(2, 40), st.integers(0, 2), st.booleans()),
                  min_size=1, max_size=6),
    "warm": st.integers(1, 8),
}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**WARM_SCHEDULERS, take=st.integers(1, 60))
def test_advance_decode_equals_stepping(block_size, num_gpu_blocks, caching, lens, warm, take):
    a = _warm_scheduler(block_size, num_gpu_blocks, caching, lens, warm)
    b = _warm_scheduler(block_size, num_gpu_blocks, caching, lens, warm)
    assert state_of(a) == state_of(b)
    n = uniform_decode_steps(a)
    assert n == uniform_decode_steps(b)
    if n == 0:
        return
    n_take = min(n, take)
    seqs, ctx, longest, finished, finish_steps = [], [], [], [], []
    alloc = freed = hashed = tokens = 0
    for i in range(n_take):
        out = a.schedule()
        assert out.num_prefill_seqs == 0 and not out.preempted_ids and not out.num_spec_tokens
        seqs.append(out.num_decode_seqs)
        ctx.append(out.sum_decode_context)
        longest.append(out.max_decode_context)
        res = a.update_from_output(out)
        finished += res
        finish_steps += [i] * len(res)
        alloc += out.num_blocks_allocated
        freed += out.num_blocks_freed
        hashed += out.num_blocks_hashed
        tokens += out.num_batched_tokens
    event(f"finishes inside the advance: {len(finished) > 0}")
    event(f"batch shrinks before the last step: {len(set(seqs)) > 1}")
    adv = advance_decode(b, n_take)
    assert state_of(a) == state_of(b)
    assert (adv.num_blocks_allocated, adv.num_blocks_freed, adv.num_blocks_hashed,
            adv.num_batched_tokens) == (alloc, freed, hashed, tokens)
    assert adv.finished == finished and adv.finish_steps == finish_steps
    assert [adv.num_seqs_at(i) for i in range(n_take)] == seqs
    assert [adv.sum_decode_context_at(i) for i in range(n_take)] == ctx
    assert adv.max_decode_context_first_step == longest[0]
    segments = adv.stretch.segments()
    assert [g.num_seqs for g in segments for _ in range(g.num_steps)] == [x for x in seqs if x]
    assert all(g.sum_decode_context_first_step == ctx[g.first_step] for g in segments)
    b.check_invariants()
    # maximal: after all n steps, the next one is not a plain decode of the same kind
    for _ in range(n - n_take):
        a.update_from_output(a.schedule())
    if a.num_running:
        out = a.schedule()
        event("stopped by a block shortage")
        assert out.preempted_ids, "uniform_decode_steps stopped early: the next step was a plain decode"


def _two_requests(num_gpu_blocks: int, out0: int = 10, out1: int = 9) -> Scheduler:
    s = Scheduler(SchedulerConfig(num_gpu_blocks=num_gpu_blocks, block_size=4))
    s.add_request(Request(0, 0.0, 4, out0, (1,), hash_block_size=4))
    s.add_request(Request(1, 0.0, 4, out1, (2,), hash_block_size=4))
    s.update_from_output(s.schedule())  # both prefilled, 1 token generated each
    return s


def test_uniform_decode_steps_by_hand():
    # After prefill each request holds 4 KV tokens (1 block); request 0 has 9 tokens left to
    # generate, request 1 has 8. Decode step i (0-based) computes position 4 + i.
    s = _two_requests(num_gpu_blocks=6)
    # blocks opened at positions 4 and 8: 2 each, 4 free -> through both finishes: 9 steps
    assert uniform_decode_steps(s) == 9
    # 4 blocks: 2 free -> both open position 4's block at step 0; position 8 (step 4) needs 2 more
    assert uniform_decode_steps(_two_requests(num_gpu_blocks=4)) == 4
    # 5 blocks, request 1 ends after 3 more steps (positions 4..6) and frees 2 blocks at
    # step 2's end: request 0's block at position 8 (step 4) then fits, position 12 (step 8) too
    s3 = _two_requests(num_gpu_blocks=5, out0=14, out1=4)
    assert uniform_decode_steps(s3) == 13


def test_advance_reports_batches_through_a_finish():
    s = _two_requests(num_gpu_blocks=6, out0=10, out1=4)  # 9 and 3 tokens left
    adv = advance_decode(s, 6)
    assert [r.request_id for r in adv.finished] == [1] and adv.finish_steps == [2]
    assert [adv.num_seqs_at(i) for i in range(6)] == [2, 2, 2, 1, 1, 1]
    # KV after step i: 5 + i tokens each
    assert [adv.sum_decode_context_at(i) for i in range(6)] == [10, 12, 14, 8, 9, 10]
    assert adv.num_batched_tokens == 3 * 2 + 3 and s.num_running == 1
    with pytest.raises(ValueError, match="uniform decode steps"):
        advance_decode(s, 4)  # only 3 tokens left: 3 steps


def test_stretch_segments():
    st_ = DecodeStretch(5, [10, 20, 30], [2, 5, 2])
    segs = [(g.first_step, g.num_steps, g.num_seqs, g.sum_decode_context_first_step) for g in st_.segments()]
    assert segs == [(0, 2, 3, 63), (2, 3, 1, 23)]


def test_shared_prefix_block_is_free_only_after_its_last_owner_finishes():
    # Block size 4. A (ids 7, 8) and B (ids 7, 9) share their first prompt block X (B hits
    # it at admission); C holds one block. 5 blocks: X, A's and B's second blocks, C's, and
    # one free. Each of A and B has 1 token left, C 13.
    s = Scheduler(SchedulerConfig(num_gpu_blocks=5, block_size=4))
    s.add_request(Request(0, 0.0, 5, 2, (7, 8), hash_block_size=4))
    s.add_request(Request(1, 0.0, 5, 2, (7, 9), hash_block_size=4))
    s.add_request(Request(2, 0.0, 4, 14, (20,), hash_block_size=4))
    s.update_from_output(s.schedule())
    assert s.running[0].block_ids[0] == s.running[1].block_ids[0]  # X, shared
    # Step 0: C opens position 4's block (the free one); A and B finish, freeing their second
    # blocks and X (its last reference): 3 free. C opens blocks at positions 8, 12, 16
    # (steps 4, 8, 12): exactly 3, so all 13 steps fit (2 freed would stop it at 12).
    assert uniform_decode_steps(s) == 13
    adv = advance_decode(s, 13)
    assert adv.finish_steps == [0, 0, 12] and adv.num_blocks_freed == 3 + 5


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**WARM_SCHEDULERS, cut=st.floats(0.0, 1.0))
def test_advance_in_parts_equals_one_advance(block_size, num_gpu_blocks, caching, lens, warm, cut):
    # advance_decode trusts the stretch uniform_decode_steps found while only advance_decode
    # changed the scheduler since: the parts of one stretch (the simulator's segments) must
    # give what one advance gives, and what parts checked from scratch give
    whole, trusted, checked = (_warm_scheduler(block_size, num_gpu_blocks, caching, lens, warm)
                               for _ in range(3))
    n = uniform_decode_steps(whole)
    if n == 0:
        return
    assert uniform_decode_steps(trusted) == n
    k = min(max(1, round(cut * n)), n)
    advance_decode(whole, n)
    for part in (k, n - k):
        if part:
            advance_decode(trusted, part)
            advance_decode(checked, part)  # never asked uniform_decode_steps: full check
    assert state_of(whole) == state_of(trusted) == state_of(checked)
    trusted.check_invariants()


def test_advance_rechecks_after_a_change_outside_it():
    s = _two_requests(num_gpu_blocks=6)
    assert uniform_decode_steps(s) == 9
    with pytest.raises(ValueError, match="uniform decode steps"):
        advance_decode(s, 10)  # one step past the stretch found
    advance_decode(s, 2)  # within it
    with pytest.raises(ValueError, match="uniform decode steps"):
        advance_decode(s, 8)  # past what is left of it
    s.add_request(Request(2, 0.0, 4, 5, (3,), hash_block_size=4))  # now one waits
    with pytest.raises(ValueError, match="uniform decode steps"):
        advance_decode(s, 2)
    s.update_from_output(s.schedule())  # admits request 2; a step invalidates the old stretch
    assert s.step_id == 4 and uniform_decode_steps(s) > 0


def _report(adv):
    return (adv.num_steps, adv.first_step_id, adv.num_seqs, adv.sum_decode_context_first_step,
            adv.max_decode_context_first_step, adv.num_batched_tokens, adv.num_blocks_allocated,
            adv.num_blocks_freed, adv.num_blocks_hashed, adv.finished, adv.finish_steps,
            [adv.num_seqs_at(i) for i in range(adv.num_steps)],
            [adv.sum_decode_context_at(i) for i in range(adv.num_steps)])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**WARM_SCHEDULERS, cuts=st.lists(st.floats(0.0, 1.0), max_size=5))
def test_advance_segments_equal_one_advance_per_segment(block_size, num_gpu_blocks, caching, lens, warm, cuts):
    # the simulator applies a stretch's segments (cut where its batch shrinks, or anywhere) in
    # one call: each segment's report and gauges, and the state after, must be those of one
    # advance_decode per segment
    one, each = (_warm_scheduler(block_size, num_gpu_blocks, caching, lens, warm) for _ in range(2))
    n = uniform_decode_steps(one)
    if n == 0:
        return
    assert uniform_decode_steps(each) == n
    ends = sorted({max(1, round(c * n)) for c in cuts} | {n})
    reports = advance_decode_segments(one, ends)
    for adv, start, end in zip(reports, [0, *ends], ends):
        ref = advance_decode(each, end - start)
        assert _report(adv) == _report(ref)
        assert (adv.num_running_after, adv.kv_usage_after) == (each.num_running, each.kv_usage)
    assert state_of(one) == state_of(each)
    one.check_invariants()
    with pytest.raises(ValueError, match="must increase"):
        advance_decode_segments(each, [2, 2])
