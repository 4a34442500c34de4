"""The proposers' own runners keep block tables that match the scheduler's after verification
replaced blocks: a draft model's single-token rounds run ahead of the committed tokens (their
rows must still be rewritten past the step's first position), the EAGLE-3 head's catch-up comes
last in a step. Checked on every prepare of every runner through a tight pool (rejections free
tail blocks, preemptions), and end to end: the draft model's drafts equal a dense fp64 greedy
continuation of the draft (a stale block id reads another request's KV)."""

from __future__ import annotations

import pytest

from engine.core.scheduler_output import StepColumns
from engine.dense_reference import greedy_reference
from engine.loader import _hf_tensors
from engine.spec_decode.eagle import EagleHead
from tests.engine.test_spec_decode import OTHER_DRAFT, TARGET, drive, engine, prompts_of


def watch_tables(runner, stale: list) -> None:
    """After each prepare: every scheduled row's blocks up to its last token as the scheduler's."""
    prepare = runner.prepare

    def checked(scheduled, token_ids, inflight=None, *, verify=False):
        inp = prepare(scheduled, token_ids, inflight, verify=verify)
        cols = scheduled if isinstance(scheduled, StepColumns) else StepColumns.of(scheduled)
        for i, (table, c, q) in enumerate(zip(cols.block_ids, cols.num_computed_tokens, cols.num_new_tokens)):
            need = -(-(c + q) // runner.block_size)
            if runner._bt_host[i, :need].tolist() != list(table[:need]):
                stale.append((i, runner._bt_host[i, :need].tolist(), list(table[:need])))
        return inp

    runner.prepare = checked


WORK = [(0, p) for p in prompts_of(11, [7, 30])] + [(2, prompts_of(12, [12])[0])]


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_proposer_block_tables_follow_the_scheduler(method):
    if method == "draft_model":
        core = engine({"model": "tiny", "num_speculative_tokens": 3}, OTHER_DRAFT, enable_prefix_caching=False,
                      num_gpu_blocks_override=15)
        proposer = core.drafter
    else:
        core = engine({"method": "eagle3", "model": "random", "num_speculative_tokens": 3}, EagleHead(TARGET, seed=7),
                      enable_prefix_caching=False, num_gpu_blocks_override=15)
        proposer = core.eagle
    stale: list = []
    watch_tables(proposer.runner, stale)
    watch_tables(core.runner, stale)
    drive(core, WORK, max_tokens=9)
    s = core.scheduler.stats
    assert s.num_spec_accepted_tokens < s.num_spec_draft_tokens and s.num_preemptions > 0  # rejections, tight pool
    assert stale == []


def test_draft_model_drafts_equal_a_dense_greedy_continuation():
    core = engine({"model": "tiny", "num_speculative_tokens": 3}, OTHER_DRAFT, enable_prefix_caching=False,
                  num_gpu_blocks_override=15)
    seen = []
    propose = core.drafter.propose

    def spy(scheduled, token_ids, params, sampler):
        out = propose(scheduled, token_ids, params, sampler)
        seen.extend((list(token_ids[s.request_id]), out[s.request_id].tokens, s.num_spec_tokens)
                    for s in scheduled if s.num_spec_tokens)
        return out

    core.drafter.propose = spy
    drive(core, WORK, max_tokens=9)
    weights = _hf_tensors(OTHER_DRAFT)
    assert len(seen) > 10
    for tokens, drafts, d in seen:
        assert drafts == greedy_reference(OTHER_DRAFT.spec, weights, tokens, d)
