"""Simulator keys (from hash ids) and engine keys (from token ids) find the same prefixes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.request import Request, materialize_prompt
from engine.core.scheduler import Scheduler, SchedulerConfig

VOCAB = 1000


def make_requests(specs, hbs):
    reqs = []
    for rid, (fam, n_shared, p, o) in enumerate(specs):
        nh = -(-p // hbs)
        # members of a family share their first n_shared hash ids
        hids = tuple(fam * 1000 + j if j < n_shared else 100_000 + rid * 1000 + j for j in range(nh))
        reqs.append(Request(rid, float(rid), p, o, hids, hash_block_size=hbs))
    return reqs


def run(reqs, cfg, with_tokens):
    s = Scheduler(cfg)
    trace = []
    pending = list(reqs)
    pos = {}
    while pending or s.has_unfinished():
        if pending:  # one arrival per step
            r = pending.pop(0)
            s.add_request(r, materialize_prompt(r, VOCAB) if with_tokens else None)
        out = s.schedule()
        sampled = None
        if with_tokens:  # generated tokens no prompt contains: unique per (request, index)
            sampled = {}
            for x in out.scheduled:
                if x.samples:
                    pos[x.request_id] = pos.get(x.request_id, 0) + 1
                    sampled[x.request_id] = [VOCAB + x.request_id * 10_000 + pos[x.request_id]]
        trace.append(([(x.request_id, x.num_new_tokens, x.num_cached_tokens, tuple(x.block_ids))
                       for x in out.scheduled], out.preempted_ids))
        s.update_from_output(out, sampled)
        s.check_invariants()
    st_ = s.stats
    return trace, (st_.prefix_cache_hits_tokens, st_.num_evictions, st_.num_blocks_hashed)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 6), st.integers(1, 60),
                             st.integers(1, 6)), min_size=1, max_size=10),
    bs_hbs=st.sampled_from([(4, 4), (4, 8), (2, 8), (1, 4), (4, 16)]),
    num_gpu_blocks=st.integers(16, 80),
    budget=st.integers(4, 64),
    algo=st.sampled_from(["builtin", "xxhash", "sha256"]),
)
def test_sim_and_engine_keys_schedule_identically(specs, bs_hbs, num_gpu_blocks, budget, algo):
    bs, hbs = bs_hbs
    reqs = make_requests(specs, hbs)
    cfg = SchedulerConfig(num_gpu_blocks=num_gpu_blocks, block_size=bs, max_num_batched_tokens=budget,
                          max_model_len=200, prefix_caching_hash_algo=algo)
    sim = run(reqs, cfg, with_tokens=False)
    eng = run(reqs, cfg, with_tokens=True)
    assert sim == eng


def test_extra_keys_separate_caches():
    cfg = SchedulerConfig(num_gpu_blocks=32, block_size=4)
    s = Scheduler(cfg)
    r0 = Request(0, 0.0, 9, 1, (1, 2, 3), hash_block_size=4)
    s.add_request(r0, extra_keys=(7,))
    s.update_from_output(s.schedule())
    s.add_request(Request(1, 0.0, 9, 1, (1, 2, 3), hash_block_size=4), extra_keys=(8,))
    s.add_request(Request(2, 0.0, 9, 1, (1, 2, 3), hash_block_size=4), extra_keys=(7,))
    out = s.schedule()
    assert [x.num_cached_tokens for x in out.scheduled] == [0, 8]


def test_hash_blocks_are_cached_as_groups_of_kv_blocks():
    # 16-token hash blocks over 4-token KV blocks: the pool holds one entry per hash block
    s = Scheduler(SchedulerConfig(num_gpu_blocks=64, block_size=4))
    s.add_request(Request(0, 0.0, 40, 2, (1, 2, 3), hash_block_size=16))  # 10 full blocks
    out = s.schedule()
    s.update_from_output(out)
    table = out.scheduled[0].block_ids[:10]
    assert len(s.kv_cache_manager.pool.groups) == 3 and not s.kv_cache_manager.pool.cached  # hash blocks 0, 1 and half of 2
    assert s.stats.num_cached_blocks == 10 and s.stats.num_blocks_hashed == 10
    s.add_request(Request(1, 0.0, 36, 1, (1, 2, 9), hash_block_size=16))  # shares 2 hash blocks
    s.add_request(Request(2, 0.0, 41, 1, (1, 2, 3), hash_block_size=16))  # shares all 10 blocks
    out = s.schedule()
    hit = {x.request_id: x for x in out.scheduled if x.request_id != 0}
    assert hit[1].num_cached_tokens == 32 and hit[1].block_ids[:8] == table[:8]
    assert hit[2].num_cached_tokens == 40 and hit[2].block_ids[:10] == table
    s.check_invariants()
