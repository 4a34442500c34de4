"""Private blocks (KVCacheManager.set_private_from): a scheduler told which blocks no other
request can hit registers them only on preemption, and schedules exactly as one that
registers every block as it fills (the reference, no hints): same batches, block tables, hits,
preemptions, finishes and counters, step by step, through single steps and skip-ahead. Its
private prompt blocks' keys are None and its generated blocks' keys absent until a preemption
makes them."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.block_keys import first_unshared_hash_blocks
from engine.core.decode_skip import advance_decode, uniform_decode_steps
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerConfig
from tests.engine.scheduler_strategies import scheduler_configs

# prefix caching always on (private blocks are a prefix-caching matter); block sizes that tile the
# hash blocks
configs = scheduler_configs(block_sizes=(1, 2, 4), prefix_caching=True, spec_tokens=(0, 0, 0, 2))

streams = st.lists(
    st.tuples(st.integers(0, 10),  # arrival step
              st.integers(1, 40),  # prompt length
              st.integers(1, 12),  # output length
              st.integers(0, 3),  # prefix family: members share leading hash ids
              st.integers(0, 4)),  # how many leading hash ids they share
    min_size=1, max_size=14)


def requests_of(specs, hbs: int) -> list[Request]:
    reqs = []
    for rid, (arr, p, o, fam, shared) in enumerate(sorted(specs, key=lambda x: x[0])):
        nh = -(-p // hbs)
        ids = tuple(fam * 100 + j if j < shared else 10_000 + rid * 100 + j for j in range(nh))
        reqs.append(Request(rid, float(arr), p, o, ids, hash_block_size=hbs, priority=rid % 3))
    return reqs


def _step_view(out):
    return ([(x.request_id, x.num_new_tokens, x.num_computed_tokens, x.num_cached_tokens,
              x.num_spec_tokens, x.is_prefill, x.samples, tuple(x.block_ids), x.new_block_ids)
             for x in out.scheduled],
            out.preempted_ids, out.num_blocks_allocated, out.num_blocks_hashed, out.num_blocks_freed)


def _state(s: Scheduler):
    """The requests' and the pool's state, less the prefix-cache tables; and the block keys."""
    reqs = [(rid, r.status, r.num_computed_tokens, r.num_generated, tuple(r.block_ids),
             r.num_cached_blocks, r.num_preemptions)
            for rid, r in sorted(s.requests.items())]
    key_lists = {rid: (r.block_hashes, r.private_from is not None) for rid, r in s.requests.items()}
    st_ = s.stats
    return (reqs, s.kv_cache_manager.pool.free_block_ids(), [r.request_id for r in s.running],
            st_.prefix_cache_hits_tokens, st_.prefix_cache_preempted_hits_tokens, st_.num_preemptions,
            st_.num_blocks_allocated, st_.num_blocks_freed, st_.num_blocks_revived, st_.num_blocks_hashed,
            st_.num_generated_tokens, st_.num_steps), key_lists


def lockstep(cfg: SchedulerConfig, reqs: list[Request], seed: int, max_steps: int = 3000) -> tuple:
    """Run the reference and the hinted scheduler side by side, asserting equality after every
    step; returns (preemptions, blocks registered on preemption) of the hinted one."""
    ref, lazy = Scheduler(cfg), Scheduler(cfg)
    hint = first_unshared_hash_blocks(reqs)
    rng = random.Random(seed)
    pending = list(reqs)
    step = flushed = 0
    hints: dict[int, int | None] = {}
    while pending or ref.has_unfinished():
        while pending and pending[0].arrival_s <= step:
            r = pending.pop(0)
            per, rest = divmod(r.hash_block_size, cfg.block_size)
            ref.add_request(r)
            hints[r.request_id] = hint[r.request_id] * per if not rest else None
            lazy.add_request(r, unshared_from_block=hints[r.request_id])
        step += 1
        assert step < max_steps, "no progress"
        n = uniform_decode_steps(ref)
        assert n == uniform_decode_steps(lazy)
        if n >= 2 and rng.random() < 0.5:
            m = rng.randint(1, n)
            a, b = advance_decode(ref, m), advance_decode(lazy, m)
            assert (a.num_blocks_allocated, a.num_blocks_freed, a.num_blocks_hashed, a.finished,
                    a.finish_steps) == (b.num_blocks_allocated, b.num_blocks_freed, b.num_blocks_hashed,
                                        b.finished, b.finish_steps)
        else:
            before = lazy.kv_cache_manager.pool.num_cached_blocks
            oa, ob = ref.schedule(), lazy.schedule()
            assert _step_view(oa) == _step_view(ob)
            if ob.preempted_ids:
                flushed += lazy.kv_cache_manager.pool.num_cached_blocks > before
            sampled = {x.request_id: 1 + rng.randint(0, x.num_spec_tokens) for x in oa.scheduled if x.samples}
            assert ref.update_from_output(oa, dict(sampled)) == lazy.update_from_output(ob, dict(sampled))
            assert oa.num_blocks_freed == ob.num_blocks_freed
        lazy.check_invariants()
        (want, want_keys), (got, got_keys) = _state(ref), _state(lazy)
        assert want == got
        for rid, (ks, private) in got_keys.items():
            want_ks = want_keys[rid][0]
            # private prompt blocks' keys: None until a preemption; generated blocks' keys: absent
            # (the list ends at the prompt's blocks) until then; all there once not private
            assert len(ks) == len(want_ks) if not private else len(ks) <= len(want_ks)
            assert all(k == w or (k is None and i >= hints[rid]) for i, (k, w) in enumerate(zip(ks, want_ks)))
        # what the hinted scheduler registered, the reference registered too (same block)
        pa, pb = ref.kv_cache_manager.pool, lazy.kv_cache_manager.pool
        assert pb.cached.items() <= pa.cached.items()
        for key, g in pb.groups.items():
            assert all(x < 0 or x == y for x, y in zip(g.blocks, pa.groups[key].blocks))
    return lazy.num_preemptions, flushed


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, specs=streams, per=st.sampled_from([1, 2, 3]), seed=st.integers(0, 99))
def test_hinted_scheduler_schedules_exactly_as_eager_registration(cfg, specs, per, seed):
    # per: hash blocks of 1, 2, 3 KV blocks (3 at block size 2 or 4 does not tile: no hints)
    lockstep(cfg, requests_of(specs, per * cfg.block_size if per < 3 else 3), seed)


def test_hints_are_exercised_through_preemptions():
    """The lockstep streams really preempt requests holding private blocks, which then hit
    their own re-registered blocks."""
    rng = random.Random(3)
    preempted = flushed = 0
    for seed in range(120):
        cfg = SchedulerConfig(max_num_batched_tokens=rng.randint(8, 48), max_num_seqs=rng.randint(2, 6),
                              max_model_len=80, block_size=2, num_gpu_blocks=rng.randint(8, 24))
        specs = [(rng.randint(0, 6), rng.randint(4, 40), rng.randint(2, 12), rng.randint(0, 2),
                  rng.randint(0, 4)) for _ in range(10)]
        p, f = lockstep(cfg, requests_of(specs, 4), seed)
        preempted += p
        flushed += f
    assert preempted > 20 and flushed > 10, (preempted, flushed)


def test_first_unshared_hash_blocks_by_hand():
    reqs = [Request(0, 0.0, 8, 1, (1, 2, 3, 4), hash_block_size=2),
            Request(1, 0.0, 6, 1, (1, 2, 9), hash_block_size=2),
            Request(2, 0.0, 4, 1, (7, 7), hash_block_size=2),  # (its own repeated id shares nothing)
            Request(3, 0.0, 2, 1, (5,), hash_block_size=2)]
    assert first_unshared_hash_blocks(reqs) == {0: 2, 1: 2, 2: 0, 3: 0}


def test_a_request_with_token_ids_or_held_blocks_takes_no_hint():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=32,
                                  block_size=2, num_gpu_blocks=20))
    s.add_request(Request(0, 0.0, 4, 2, (1, 2), hash_block_size=2), prompt_token_ids=[1, 2, 3, 4],
                  unshared_from_block=0)
    s.add_request(Request(1, 0.0, 4, 2, (3, 4), hash_block_size=2), hold_blocks_on_finish=True,
                  unshared_from_block=0)
    s.add_request(Request(2, 0.0, 4, 2, (5, 6), hash_block_size=2), unshared_from_block=1)
    assert [s.requests[i].private_from for i in range(3)] == [None, None, 1]


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=12))
def test_first_unshared_hash_blocks_is_the_longest_prefix_shared_with_another_request(ids):
    reqs = [Request(i, 0.0, 2 * len(x), 1, tuple(x), hash_block_size=2) for i, x in enumerate(ids)]

    def common(a, b):  # brute force, element by element
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    want = {i: max((common(x, y) for j, y in enumerate(ids) if j != i), default=0) for i, x in enumerate(ids)}
    assert first_unshared_hash_blocks(reqs) == want
