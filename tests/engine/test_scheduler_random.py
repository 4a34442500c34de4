"""Random streams (hypothesis): invariants after every step; bulk decode == single steps."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import block_pool
from engine.core.request import Request
from engine.core.scheduler import FINISHED, REJECTED, Scheduler, SchedulerConfig
from engine.core.scheduler_output import StepColumns
from tests.engine.scheduler_strategies import scheduler_configs

configs = scheduler_configs()

request_specs = st.lists(
    st.tuples(
        st.integers(0, 12),  # arrival step
        st.integers(1, 40),  # prompt length
        st.integers(1, 12),  # output length
        st.integers(0, 3),  # prefix family
        st.integers(0, 2),  # priority
    ),
    min_size=1, max_size=14,
)


def build_requests(specs, hbs: int, with_tokens: bool):
    reqs = []
    for rid, (arr, p, o, fam, prio) in enumerate(sorted(specs, key=lambda x: x[0])):
        nh = -(-p // hbs)
        # family members share leading hash ids; the tail is private to the request
        hash_ids = tuple(fam * 100 + j if j < 3 else 10_000 + rid * 100 + j for j in range(nh))
        toks = None
        if with_tokens:
            toks = [h % 7 + 1 for h in hash_ids for _ in range(hbs)][:p]
        reqs.append((arr, Request(rid, float(arr), p, o, hash_ids, hash_block_size=hbs,
                                  priority=prio), toks))
    return reqs


def run_stream(cfg, reqs, seed: int, with_tokens: bool, max_steps: int = 3000, pd: bool = False):
    """`pd`: requests randomly arrive with external KV (prompt_len - 1, or prompt_len without
    token ids) and/or hold their blocks on finish, released 0-2 steps later."""
    rng = random.Random(seed)
    pd_rng = random.Random(seed + 1)
    s = Scheduler(cfg)
    results = {}
    pending = list(reqs)
    held: dict[int, int] = {}  # request -> step at which its transfer completes
    ext_of: dict[int, int] = {}
    step = 0
    while pending or s.has_unfinished() or held:
        for rid in [k for k, t in held.items() if t <= step]:
            del held[rid]
            s.release_held(rid)
        while pending and pending[0][0] <= step:
            _, r, toks = pending.pop(0)
            if pd:
                choices = [0, r.prompt_len - 1] + ([r.prompt_len] if toks is None and r.output_len >= 2 else [])
                ext = pd_rng.choice(choices)
                ext_of[r.request_id] = ext
                s.add_request(r, prompt_token_ids=toks, num_external_computed_tokens=ext,
                              hold_blocks_on_finish=pd_rng.random() < 0.5)
            else:
                s.add_request(r, prompt_token_ids=toks)
        step += 1
        assert step < max_steps, "scheduler made no progress"
        head = s.waiting.peek()
        if head is not None and head.failed_admission_hits is not None:
            # the memoized re-lookup of a blocked queue head equals a plain scan
            m = (head.num_tokens - 1) // cfg.block_size
            ref = []
            if not head.group_size:  # (grouped prompts are always scanned)
                for k in head.block_hashes[:m]:
                    b = s.kv_cache_manager.pool.cached.get(k)
                    if b is None:
                        break
                    ref.append(b)
                assert s.kv_cache_manager.get_computed_blocks(head)[0] == ref
        out = s.schedule()
        # the runner's columns, read from the records before any entry is built, are the entries'
        if out.num_scheduled:
            cols = out.record_columns()
            assert cols == StepColumns.of(out.scheduled) == out.columns()
            assert all(a is x.block_ids for a, x in zip(cols.block_ids, out.scheduled))  # live tables
        # budget and caps
        assert out.num_batched_tokens == sum(x.num_new_tokens for x in out.scheduled)
        assert out.num_batched_tokens <= cfg.max_num_batched_tokens
        assert len(out.scheduled) <= cfg.max_num_seqs
        assert len({x.request_id for x in out.scheduled}) == len(out.scheduled)
        assert all(x.num_new_tokens >= 1 for x in out.scheduled)
        assert out.num_prefill_tokens + out.num_decode_tokens == out.num_batched_tokens
        pre = [x for x in out.scheduled if x.is_prefill]
        dec = [x for x in out.scheduled if not x.is_prefill]
        assert (out.num_prefill_seqs, out.num_decode_seqs) == (len(pre), len(dec))
        assert out.num_prefill_tokens == sum(x.num_new_tokens for x in pre)
        assert out.sum_prefill_context == sum(x.num_computed_tokens + x.num_new_tokens for x in pre)
        assert out.prefill_attn_pairs == sum(x.num_new_tokens * x.num_computed_tokens
                                             + x.num_new_tokens * (x.num_new_tokens + 1) // 2 for x in pre)
        assert out.sum_decode_context == sum(x.num_computed_tokens + x.num_new_tokens for x in dec)
        assert out.max_decode_context == max((x.num_computed_tokens + x.num_new_tokens for x in dec), default=0)
        assert out.num_spec_tokens == sum(x.num_spec_tokens for x in out.scheduled)
        assert all(x.num_spec_tokens == 0 for x in pre)
        n_new = sum(len(x.new_block_ids) for x in out.scheduled)
        # a request preempted later in the same step took its fresh blocks with it
        assert out.num_blocks_allocated == n_new if not out.preempted_ids else out.num_blocks_allocated >= n_new
        sampled = {}
        for x in out.scheduled:
            if x.samples:
                n = 1 + rng.randint(0, x.num_spec_tokens)
                sampled[x.request_id] = ([rng.randint(1, 9) for _ in range(n)] if with_tokens else n)
        before = [(x.request_id, x.num_new_tokens, x.num_computed_tokens, x.num_cached_tokens,
                   x.num_spec_tokens, x.is_prefill, x.samples, tuple(x.block_ids), x.new_block_ids)
                  for x in out.scheduled]
        # the engine's stop rule (token 9 = EOS here): keep tokens up to the stop, name it
        stopped = set()
        if with_tokens:
            for rid, toks in sampled.items():
                if 9 in toks:
                    del toks[toks.index(9) + 1:]
                    stopped.add(rid)
        res = s.update_from_output(out, sampled, stopped)
        s.check_invariants()
        out._scheduled = None  # rebuilt after the update: the records must not have moved
        after = [(x.request_id, x.num_new_tokens, x.num_computed_tokens, x.num_cached_tokens,
                  x.num_spec_tokens, x.is_prefill, x.samples, x.new_block_ids)
                 for x in out.scheduled]
        assert after == [b[:7] + b[8:] for b in before]
        for r in res:
            assert r.request_id not in results, "request reported twice"
            results[r.request_id] = r
            if r.status == FINISHED and s.requests[r.request_id].hold_blocks_on_finish:
                held[r.request_id] = step + pd_rng.randint(0, 2)
    # nothing lost, all blocks home
    assert sorted(results) == [r.request_id for _, r, _ in reqs]
    for _, r, _ in reqs:
        res = results[r.request_id]
        assert res.status in (FINISHED, REJECTED)
        if res.status == REJECTED:
            assert res.reason
        elif res.reason == "length":
            assert res.num_generated == r.output_len
        else:
            assert with_tokens and res.reason == "stop" and res.num_generated <= r.output_len
    st_ = s.stats
    assert st_.num_free_blocks == cfg.num_gpu_blocks and st_.kv_usage == 0.0
    assert st_.num_blocks_allocated + st_.num_blocks_revived == st_.num_blocks_freed
    assert st_.prefix_cache_hits_tokens <= st_.prefix_cache_queries_tokens
    assert st_.num_held_requests == 0 and st_.num_held_blocks == 0
    # external tokens: at most what was announced, and only on first admissions
    assert st_.external_computed_tokens <= sum(ext_of.values())
    return s


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, specs=request_specs, hbs=st.sampled_from([2, 4, 8]), seed=st.integers(0, 99),
       with_tokens=st.booleans(), small=st.sampled_from([1, block_pool._SMALL]))
def test_random_streams_keep_invariants(cfg, specs, hbs, seed, with_tokens, small):
    # small = 1: block registration always takes its bulk path (these pools are small)
    default, block_pool._SMALL = block_pool._SMALL, small
    try:
        run_stream(cfg, build_requests(specs, hbs, with_tokens), seed, with_tokens)
    finally:
        block_pool._SMALL = default


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, specs=request_specs, hbs=st.sampled_from([2, 4, 8]), seed=st.integers(0, 99),
       with_tokens=st.booleans())
def test_random_streams_with_external_kv_and_held_blocks_keep_invariants(cfg, specs, hbs, seed,
                                                                         with_tokens):
    run_stream(cfg, build_requests(specs, hbs, with_tokens), seed, with_tokens, pd=True)


def state_of(s: Scheduler):
    reqs = tuple(
        (rid, r.status, r.num_tokens, r.num_computed_tokens, r.num_generated, tuple(r.block_ids),
         tuple(r.block_hashes), r.num_cached_blocks)
        for rid, r in sorted(s.requests.items()))
    pool = s.kv_cache_manager.pool
    st_ = s.stats
    return (reqs, tuple(pool.free_block_ids()),
            tuple(sorted((repr(h), b) for h, b in pool.cached.items())),
            tuple(sorted((repr(h), tuple(g.blocks)) for h, g in pool.groups.items())),
            [r.request_id for r in s.running], s.step_id,
            (st_.num_evictions, st_.num_blocks_allocated, st_.num_blocks_freed, st_.num_blocks_hashed,
             st_.num_generated_tokens, st_.num_steps, st_.fragmentation_slots))


def test_random_streams_exercise_every_mechanism():
    """The random streams above really preempt, hit, evict, reject and speculate."""
    rng = random.Random(7)
    tot = {"pre": 0, "hit": 0, "ev": 0, "rej": 0, "acc": 0, "stop": 0}
    for seed in range(150):
        cfg = SchedulerConfig(
            max_num_batched_tokens=rng.randint(4, 48), max_num_seqs=rng.randint(1, 6),
            max_model_len=rng.randint(20, 80), block_size=rng.choice([2, 4]),
            num_gpu_blocks=rng.randint(6, 30), num_speculative_tokens=rng.choice([0, 2]),
            scheduling_policy=rng.choice(["fcfs", "priority"]))
        specs = [(rng.randint(0, 8), rng.randint(1, 40), rng.randint(1, 12), rng.randint(0, 2),
                  rng.randint(0, 2)) for _ in range(10)]
        with_tokens = seed % 2 == 0
        s = run_stream(cfg, build_requests(specs, 4, with_tokens), seed, with_tokens)
        st_ = s.stats
        tot["pre"] += st_.num_preemptions
        tot["hit"] += st_.prefix_cache_hits_tokens
        tot["ev"] += st_.num_evictions
        tot["rej"] += st_.num_rejected
        tot["acc"] += st_.num_spec_accepted_tokens
    assert all(v > 0 for k, v in tot.items() if k != "stop"), tot
