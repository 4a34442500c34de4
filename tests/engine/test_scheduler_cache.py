"""Prefix caching, eviction, preemption, priority and speculative hooks, hand-computed."""

from __future__ import annotations

from engine.core.request import Request
from engine.core.scheduler import PREEMPTED, Scheduler, SchedulerConfig


def mk(rid, prompt, out, hash_ids, hbs=4, arrival=None, priority=0):
    return Request(rid, float(rid if arrival is None else arrival), prompt, out, tuple(hash_ids),
                   hash_block_size=hbs, priority=priority)


def step(s, sampled=None):
    out = s.schedule()
    res = s.update_from_output(out, sampled)
    s.check_invariants()
    return out, res


def drain(s):
    while s.has_unfinished():
        step(s)


def test_prefix_hits_between_requests_sharing_hash_ids():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=32, block_size=4))
    s.add_request(mk(0, 12, 2, (1, 2, 3)))
    drain(s)
    # shares hash blocks 1, 2 -> 8 tokens hit
    s.add_request(mk(1, 10, 1, (1, 2, 9)))
    # identical prompt: 3 full blocks cached, but one token must be computed -> 8 hit
    s.add_request(mk(2, 12, 1, (1, 2, 3)))
    # diverges at the first block: no hit
    s.add_request(mk(3, 8, 1, (5, 2)))
    out, _ = step(s)
    got = {x.request_id: (x.num_cached_tokens, x.num_computed_tokens, x.num_new_tokens)
           for x in out.scheduled}
    assert got == {1: (8, 8, 2), 2: (8, 8, 4), 3: (0, 0, 8)}
    # 1 and 2 share the two cached blocks of request 0
    b1, b2 = (x.block_ids[:2] for x in out.scheduled[:2])
    assert b1 == b2
    st = s.stats
    assert st.prefix_cache_queries_tokens == 12 + 10 + 12 + 8
    assert st.prefix_cache_hits_tokens == 16


def test_hash_block_larger_than_kv_block():
    # Mooncake-style: 8-token hash blocks, 4-token KV blocks. Same first hash id ->
    # the two KV blocks inside it hit; a different second id stops the chain.
    s = Scheduler(SchedulerConfig(num_gpu_blocks=32, block_size=4))
    s.add_request(mk(0, 16, 1, (7, 8), hbs=8))
    drain(s)
    s.add_request(mk(1, 16, 1, (7, 9), hbs=8))
    out, _ = step(s)
    assert out.scheduled[0].num_cached_tokens == 8


def test_token_id_prefix_hits_engine_path():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=32, block_size=4, prefix_caching_hash_algo="sha256"))
    toks = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    s.add_request(mk(0, 9, 2, (0, 0, 0)), prompt_token_ids=toks)
    out, _ = step(s, {0: [50]})
    out, res = step(s, {0: [51]})
    assert res and res[0].num_generated == 2
    # a follow-up turn: prompt = previous prompt + the generated token + new text
    s.add_request(mk(1, 12, 1, (0, 0, 0)), prompt_token_ids=toks + [50, 60, 61])
    out, _ = step(s, {1: [1]})
    # blocks [11..14], [15..18] cached from the prompt; [19, 50, ...] was never full in KV
    assert out.scheduled[0].num_cached_tokens == 8
    s.add_request(mk(2, 9, 1, (0, 0, 0)), prompt_token_ids=[11, 12, 13, 99, 15, 16, 17, 18, 19])
    out, _ = step(s, {2: [1]})
    assert out.scheduled[0].num_cached_tokens == 0


def test_generated_blocks_are_cached_for_multi_turn_with_tokens():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=32, block_size=4))
    s.add_request(mk(0, 3, 4, (0,)), prompt_token_ids=[1, 2, 3])
    step(s, {0: [4]})
    step(s, {0: [5]})
    step(s, {0: [6]})
    step(s, {0: [7]})  # KV holds 1..6; block [1,2,3,4] full and cached
    s.add_request(mk(1, 8, 1, (0, 0)), prompt_token_ids=[1, 2, 3, 4, 5, 6, 7, 9])
    out, _ = step(s, {1: [1]})
    assert out.scheduled[0].num_cached_tokens == 4


def test_eviction_order_lru_and_chain_tail_first():
    # 6 blocks of 2 tokens. Request 0 (prompt 6 = 3 full blocks A B C) finishes: its blocks
    # are freed tail first, so the queue is [3, 4, 5, C, B, A] (ids 3, 4, 5 never used).
    s = Scheduler(SchedulerConfig(num_gpu_blocks=6, block_size=2))
    s.add_request(mk(0, 6, 1, (1, 2, 3), hbs=2))
    drain(s)
    assert s.kv_cache_manager.pool.free_block_ids() == [3, 4, 5, 2, 1, 0]
    # A 9-token unrelated prompt needs 5 blocks: takes 3, 4, 5, then evicts C (2) and B (1).
    s.add_request(mk(1, 9, 1, (7, 8, 9, 10, 11), hbs=2))
    out, _ = step(s)
    assert out.scheduled[0].block_ids == [3, 4, 5, 2, 1]
    assert s.stats.num_evictions == 2
    # The head block A survived: a request sharing it hits it
    s.add_request(mk(2, 3, 1, (1, 4), hbs=2))
    out, _ = step(s)
    assert out.scheduled[0].num_cached_tokens == 2 and out.scheduled[0].block_ids[0] == 0


def test_preemption_victim_is_latest_arrival_and_resumes_first():
    # 5 blocks of 2 tokens. Step 1 prefills 0, 1, 2 (prompt 2, 3 outputs) and 3 (1 output,
    # finishes at once): 4 blocks. Step 2: decodes at position 2 need a block each; 0 takes the
    # free block, 1 takes request 3's freed block, 2 finds none and, being the latest
    # arrival, preempts itself. Its prompt block (hash 12) stays cached at the queue head.
    # Step 3: 0 and 1 decode inside their blocks; 2 would need its cached block plus a new
    # one, only one is free: it waits. Step 3 finishes 0 and 1; step 4 re-admits 2, which
    # re-finds its own prompt block.
    s = Scheduler(SchedulerConfig(num_gpu_blocks=5, block_size=2, max_num_batched_tokens=64))
    for i in range(3):
        s.add_request(mk(i, 2, 3, (10 + i,), hbs=2))
    s.add_request(mk(3, 2, 1, (20,), hbs=2, arrival=3.0))
    out, _ = step(s)
    assert [x.request_id for x in out.scheduled] == [0, 1, 2, 3]
    out, _ = step(s)
    assert out.preempted_ids == [2]
    assert s.requests[2].status == PREEMPTED and s.requests[2].num_preemptions == 1
    assert [x.request_id for x in out.scheduled] == [0, 1]
    out, res = step(s)
    assert [x.request_id for x in out.scheduled] == [0, 1]  # no admission of 2 yet
    assert [r.request_id for r in res] == [0, 1]
    out, _ = step(s)
    x = out.scheduled[0]
    assert (x.request_id, x.num_cached_tokens, x.num_new_tokens) == (2, 2, 1)
    drain(s)
    st = s.stats
    # evicted: request 3's prompt block (step 2), request 0's full decode block (step 4)
    assert st.num_preemptions == 1 and st.num_evictions == 2
    # the resumed request 2 (prompt 2 + 1 generated = 3 tokens) re-found its prompt block:
    # counted apart from vLLM's first-admission counters (vllm#25780)
    assert st.prefix_cache_preempted_queries_tokens == 3
    assert st.prefix_cache_preempted_hits_tokens == 2
    assert st.prefix_cache_queries_tokens == 8 and st.prefix_cache_hits_tokens == 0
    assert st.prefix_cache_queries_tokens_incl_preempted == 11
    assert st.prefix_cache_hits_tokens_incl_preempted == 2


def test_preempted_request_goes_to_front_of_waiting():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=3, block_size=2, max_num_batched_tokens=64,
                                  max_num_seqs=2, enable_prefix_caching=False))
    s.add_request(mk(0, 2, 4, (1,), hbs=2))
    s.add_request(mk(1, 2, 4, (2,), hbs=2))
    s.add_request(mk(2, 2, 1, (3,), hbs=2))  # waits: max_num_seqs = 2
    step(s)
    out, _ = step(s)  # decodes at position 2: 2 more blocks needed, 1 free -> 1 preempts itself
    assert out.preempted_ids == [1] and [x.request_id for x in out.scheduled] == [0]
    admitted = []
    while s.has_unfinished():
        out, _ = step(s)
        admitted += [x.request_id for x in out.scheduled if x.num_computed_tokens == 0]
    # request 1 (preempted) is re-admitted before request 2, which was queued before it
    assert admitted == [1, 2]


def test_priority_policy_orders_waiting_and_picks_victims():
    cfg = SchedulerConfig(num_gpu_blocks=64, block_size=4, max_num_seqs=1,
                          scheduling_policy="priority")
    s = Scheduler(cfg)
    s.add_request(mk(0, 4, 1, (1,), priority=5))
    s.add_request(mk(1, 4, 1, (2,), priority=1))
    s.add_request(mk(2, 4, 1, (3,), priority=1))
    s.add_request(mk(3, 4, 1, (4,), priority=0))
    order = []
    while s.has_unfinished():
        out, _ = step(s)
        order += [x.request_id for x in out.scheduled]
    assert order == [3, 1, 2, 0]
    # victim: largest priority value even if it arrived first
    s = Scheduler(SchedulerConfig(num_gpu_blocks=3, block_size=2, scheduling_policy="priority"))
    s.add_request(mk(0, 2, 3, (1,), hbs=2, priority=9))
    s.add_request(mk(1, 2, 3, (2,), hbs=2, priority=0))
    step(s)
    out, _ = step(s)
    assert out.preempted_ids == [0]


def test_speculative_decoding_accept_and_release():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4, num_speculative_tokens=3))
    s.add_request(mk(0, 3, 10, (1,)))
    out, _ = step(s)  # prefill 3 tokens
    assert out.scheduled[0].num_new_tokens == 3
    out = s.schedule()  # 1 + 3 drafts at positions 3..6 -> a second block
    x = out.scheduled[0]
    assert (x.num_new_tokens, x.num_spec_tokens, x.num_computed_tokens) == (4, 3, 3)
    assert len(x.block_ids) == 2 and x.new_block_ids == (1,)
    s.update_from_output(out, {0: 1})  # all drafts rejected: back to 4 tokens in KV, 1 block
    s.check_invariants()
    assert s.block_ids_of(0) == [0] and s.stats.num_free_blocks == 7
    out = s.schedule()
    x = out.scheduled[0]
    assert (x.num_new_tokens, x.num_computed_tokens) == (4, 4)
    s.update_from_output(out, {0: 4})  # all 3 accepted + bonus
    s.check_invariants()
    st = s.stats
    assert st.num_spec_drafts == 2 and st.num_spec_draft_tokens == 6 and st.num_spec_accepted_tokens == 3
    # generated: 1 (prefill) + 1 + 4 = 6; 4 left -> 3 drafts; accept 2 -> 9; 1 left -> none
    out = s.schedule()
    assert out.scheduled[0].num_spec_tokens == 3
    s.update_from_output(out, {0: 3})
    out = s.schedule()
    assert out.scheduled[0].num_spec_tokens == 0 and out.scheduled[0].num_new_tokens == 1
    res = s.update_from_output(out, {0: 1})
    assert res[0].num_generated == 10
    assert s.stats.num_free_blocks == 8


def test_spec_tokens_trimmed_by_budget():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=16, block_size=4, num_speculative_tokens=4,
                                  max_num_batched_tokens=6))
    s.add_request(mk(0, 2, 10, (1,)))
    s.add_request(mk(1, 2, 10, (2,)))
    step(s)
    out = s.schedule()
    assert [(x.num_new_tokens, x.num_spec_tokens) for x in out.scheduled] == [(5, 4), (1, 0)]


def test_stop_with_accepted_drafts_keeps_its_tokens_and_frees_blocks():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4, num_speculative_tokens=2))
    s.add_request(mk(0, 2, 10, (1,)), prompt_token_ids=[5, 6])
    out = s.schedule()
    s.update_from_output(out, {0: [7]})
    out = s.schedule()
    # 1 + 2 drafts verified; the caller found its stop token at the 2nd: it passes the
    # tokens up to the stop and names the request in `stopped`
    res = s.update_from_output(out, {0: [8, 2]}, stopped={0})
    assert [(r.reason, r.num_generated) for r in res] == [("stop", 3)]
    assert s.stats.num_free_blocks == 8


def test_determinism_same_stream_same_schedule():
    def run():
        s = Scheduler(SchedulerConfig(num_gpu_blocks=12, block_size=2, max_num_batched_tokens=7))
        for i in range(12):
            s.add_request(mk(i, 3 + (i * 7) % 9, 1 + (i * 5) % 6,
                             tuple((i % 3, i, 7)[: -(-(3 + (i * 7) % 9) // 4)]), hbs=4))
        trace = []
        while s.has_unfinished():
            out, res = step(s)
            trace.append(([(x.request_id, x.num_new_tokens, tuple(x.block_ids)) for x in out.scheduled],
                          out.preempted_ids, [r.request_id for r in res]))
        return trace, s.stats
    assert run() == run()


def test_victim_already_scheduled_this_step_is_taken_back():
    # Priority policy: A (priority 9) prefills 2 tokens a step; B (priority 0) decodes.
    # Step 4: A's chunk takes the last free block, then B crosses a block boundary: the
    # victim is A (largest priority value), already in this step's batch: its entry and
    # its tokens leave the batch again.
    cfg = SchedulerConfig(num_gpu_blocks=5, block_size=2, long_prefill_token_threshold=2,
                          scheduling_policy="priority")
    s = Scheduler(cfg)
    s.add_request(mk(0, 8, 1, (1, 2), priority=9))
    step(s)
    s.add_request(mk(1, 1, 4, (3,), priority=0))
    out, _ = step(s)
    assert [(x.request_id, x.num_new_tokens) for x in out.scheduled] == [(0, 2), (1, 1)]
    out, _ = step(s)
    assert [(x.request_id, x.num_new_tokens) for x in out.scheduled] == [(0, 2), (1, 1)]
    out, _ = step(s)
    assert out.preempted_ids == [0]
    assert [(x.request_id, x.num_new_tokens, x.num_computed_tokens) for x in out.scheduled] == [(1, 1, 2)]
    assert (out.num_batched_tokens, out.num_prefill_seqs, out.num_prefill_tokens) == (1, 0, 0)
    assert out.sum_prefill_context == 0 and out.sum_decode_context == 3
    # A's fresh block was allocated and freed within the step
    assert out.num_blocks_allocated == 2 and out.num_blocks_freed == 4
    drain(s)
    assert s.requests[0].num_preemptions == 1 and s.stats.num_prompt_tokens_computed >= 8 + 1
