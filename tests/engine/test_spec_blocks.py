"""Block-pool invariants under speculative decoding (hypothesis): random streams where every
request's draft count changes between steps (`set_num_drafts`, as n-gram lookup does), random
acceptance, stops inside accepted runs, tight pools (preemptions) and prefix caching. After
every step no block is leaked or owned twice and refcounts equal owners (check_invariants);
at the end every block is home; the per-position counters add up."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.request import Request
from engine.core.scheduler import FINISHED, Scheduler, SchedulerConfig

configs = st.builds(
    SchedulerConfig,
    max_num_batched_tokens=st.integers(2, 40),
    max_num_seqs=st.integers(1, 6),
    max_model_len=st.just(64),
    block_size=st.sampled_from([1, 2, 4]),
    num_gpu_blocks=st.integers(16, 48),
    enable_prefix_caching=st.booleans(),
    enable_chunked_prefill=st.just(True),
    num_speculative_tokens=st.integers(1, 5),
)
streams = st.lists(st.tuples(st.integers(0, 8), st.integers(1, 30), st.integers(1, 14), st.integers(0, 2)),
                   min_size=1, max_size=10)


def run(cfg: SchedulerConfig, stream, seed: int) -> Scheduler:
    rng = random.Random(seed)
    s = Scheduler(cfg)
    pending = sorted(stream, key=lambda x: x[0])
    k = cfg.num_speculative_tokens
    done: set[int] = set()
    step = 0
    while pending or s.has_unfinished():
        while pending and pending[0][0] <= step:
            arr, p, o, fam = pending.pop(0)
            rid = len(s.requests)
            toks = [fam + 1] * min(p, 8) + [rng.randint(1, 5) for _ in range(p - min(p, 8))]
            s.add_request(Request(rid, float(arr), p, o, tuple(range(-(-p // 16)))), prompt_token_ids=toks)
        for rid in list(s.requests):  # a new draft count for some live requests
            if rid not in done and rng.random() < 0.5:
                s.set_num_drafts(rid, rng.randint(0, k))
        out = s.schedule()
        for x in out.scheduled:
            assert x.num_spec_tokens <= k
        sampled, stopped = {}, set()
        for x in out.scheduled:
            if x.samples:
                toks = [rng.randint(1, 9) for _ in range(1 + rng.randint(0, x.num_spec_tokens))]
                if 9 in toks:  # a stop token inside the accepted run: the rest is dropped
                    del toks[toks.index(9) + 1:]
                    stopped.add(x.request_id)
                sampled[x.request_id] = toks
        for res in s.update_from_output(out, sampled, stopped):
            done.add(res.request_id)
        s.check_invariants()
        step += 1
        assert step < 2000, "no progress"
    return s


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, stream=streams, seed=st.integers(0, 1000))
def test_random_spec_streams_keep_the_block_pool_consistent(cfg, stream, seed):
    s = run(cfg, stream, seed)
    stats = s.stats
    assert stats.num_free_blocks == cfg.num_gpu_blocks and stats.kv_usage == 0.0
    assert stats.num_blocks_allocated + stats.num_blocks_revived == stats.num_blocks_freed
    assert all(r.status == FINISHED or r.status == "rejected" for r in s.requests.values())
    per_pos = s.num_spec_accepted_per_pos
    assert sum(per_pos) == stats.num_spec_accepted_tokens
    assert all(a >= b for a, b in itertools.pairwise(per_pos))  # position i+1 needs position i


def test_streams_really_preempt_and_vary_drafts():
    """The random streams above reach preemption and per-request draft counts below k."""
    cfg = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=4, max_model_len=64, block_size=2,
                          num_gpu_blocks=20, num_speculative_tokens=4)
    s = run(cfg, [(0, 20, 12, 0), (0, 18, 12, 1), (1, 15, 12, 0), (2, 9, 12, 2)], seed=3)
    st_ = s.stats
    assert st_.num_preemptions > 0
    assert 0 < st_.num_spec_draft_tokens < 4 * st_.num_spec_drafts


def test_set_num_drafts_is_bounded_by_k():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, num_speculative_tokens=2))
    s.add_request(Request(0, 0.0, 4, 4, (0,)), prompt_token_ids=[1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"must be 0\.\.2"):
        s.set_num_drafts(0, 3)
