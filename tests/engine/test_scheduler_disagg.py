"""Disaggregated-prefill hooks, hand-computed: KV that arrives from a prefill replica
(`num_external_computed_tokens`) and blocks held until the KV transfer ends
(`hold_blocks_on_finish` + `release_held`)."""

from __future__ import annotations

import pytest

from engine.core.request import Request
from engine.core.scheduler import FINISHED, Scheduler, SchedulerConfig


def _step(s: Scheduler):
    out = s.schedule()
    rows = [(x.request_id, x.num_new_tokens, x.num_computed_tokens, x.num_cached_tokens, x.is_prefill,
             x.samples, x.new_block_ids) for x in out.scheduled]
    res = s.update_from_output(out)
    s.check_invariants()
    return out, rows, res


def test_external_kv_all_but_last_prompt_token_is_vllm_connector_admission():
    # block 4, budget 4 < prompt 10: the 9 transferred tokens cost no budget; the admission
    # step computes token 10 only (context 9 before, 10 after) and allocates all 3 blocks.
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=4, num_gpu_blocks=8, block_size=4,
                                  enable_prefix_caching=False))
    s.add_request(Request(0, 0.0, 10, 3, (1, 2, 3), hash_block_size=4), num_external_computed_tokens=9)
    out, rows, res = _step(s)
    assert rows == [(0, 1, 9, 0, True, True, (0, 1, 2))]
    assert (out.num_batched_tokens, out.num_prefill_tokens, out.num_prefill_seqs, out.sum_prefill_context,
            out.num_blocks_allocated) == (1, 1, 1, 10, 3)
    st = s.stats
    assert st.external_computed_tokens == 9 and st.num_prompt_tokens_computed == 1
    assert st.prefix_cache_hits_tokens == 0
    # then plain decodes: contexts 10 -> 11 (tokens 11, 12 fit in block 2: no new block)
    _, rows2, _ = _step(s)
    assert rows2 == [(0, 1, 10, 0, False, True, ())]
    _, rows3, res = _step(s)
    assert rows3 == [(0, 1, 11, 0, False, True, ())]
    assert [(r.request_id, r.status, r.num_generated) for r in res] == [(0, FINISHED, 3)]
    assert not s.has_unfinished() and s.stats.num_free_blocks == 8


def test_external_kv_counts_only_past_local_prefix_hits():
    # block 4, hash block 4. Request 0 (prompt 8: hash ids 7, 8) computes and caches 2 blocks.
    # Request 1 (prompt 12: 7, 8, 9) arrives with 11 transferred tokens: 8 are local hits,
    # 3 are external, 1 is computed.
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4))
    s.add_request(Request(0, 0.0, 8, 1, (7, 8), hash_block_size=4))
    _step(s)
    s.add_request(Request(1, 0.0, 12, 2, (7, 8, 9), hash_block_size=4), num_external_computed_tokens=11)
    out, rows, _ = _step(s)
    # request 0 finished and freed blocks 1, 0 (tail first) -> free queue 2..7, 1, 0; request 1
    # revives 0, 1 by hit and takes block 2 fresh
    assert rows == [(1, 1, 11, 8, True, True, (2,))]
    assert out.num_blocks_allocated == 1
    st = s.stats
    assert st.external_computed_tokens == 3 and st.prefix_cache_hits_tokens == 8
    assert s.block_ids_of(1) == [0, 1, 2]


def test_external_kv_whole_prompt_starts_with_decode():
    # N = prompt_len: the first output token came with the KV. Step 1 computes that token's KV
    # (a decode at context 8 -> 9, one new block) and samples output token 2; step 2 the 3rd.
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4))
    s.add_request(Request(0, 0.0, 8, 3, (1, 2), hash_block_size=4), num_external_computed_tokens=8)
    out, rows, res = _step(s)
    assert rows == [(0, 1, 8, 0, False, True, (0, 1, 2))]
    assert (out.num_decode_seqs, out.num_decode_tokens, out.sum_decode_context, out.num_prefill_seqs,
            out.num_blocks_allocated) == (1, 1, 9, 0, 3)
    assert res == [] and s.stats.num_prompt_tokens_computed == 0
    _, rows2, res = _step(s)
    assert rows2 == [(0, 1, 9, 0, False, True, ())]
    assert [(r.status, r.num_generated) for r in res] == [(FINISHED, 3)]
    assert s.stats.num_steps == 2 and s.stats.num_generated_tokens == 2  # 1 came from the prefill side


def test_external_kv_bad_values_are_clear_errors():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4))
    with pytest.raises(ValueError, match="num_external_computed_tokens"):
        s.add_request(Request(0, 0.0, 8, 3, (1, 2), hash_block_size=4), num_external_computed_tokens=9)
    with pytest.raises(ValueError, match="output_len must be >= 2"):
        s.add_request(Request(1, 0.0, 8, 1, (1, 2), hash_block_size=4), num_external_computed_tokens=8)


def test_preempted_external_request_recomputes_everything():
    # 5 blocks of 4. r0 (prompt 4, output 9) runs; r1 arrives with 7 of 8 tokens transferred and
    # takes 2 blocks. Decoding, r0 needs blocks at 4, 8 (positions): r1 (later arrival) is the
    # victim when the pool runs dry, and is re-admitted computing its whole 9 tokens (8 + 1 output).
    s = Scheduler(SchedulerConfig(num_gpu_blocks=4, block_size=4, enable_prefix_caching=False))
    s.add_request(Request(0, 0.0, 4, 9, (1,), hash_block_size=4))
    s.add_request(Request(1, 1.0, 8, 3, (2, 3), hash_block_size=4), num_external_computed_tokens=7)
    _, rows, _ = _step(s)
    assert rows == [(0, 4, 0, 0, True, True, (0,)), (1, 1, 7, 0, True, True, (1, 2))]
    _, rows, _ = _step(s)  # r0 at 4 needs block 3; r1 at 8 needs a block: none left -> r1 preempted
    assert rows == [(0, 1, 4, 0, False, True, (3,))]
    assert s.requests[1].num_preemptions == 1 and s.stats.external_computed_tokens == 7
    while s.requests[1].status != "running":
        _, rows, _ = _step(s)
    assert rows[-1][:3] == (1, 9, 0)  # recomputed locally: prompt 8 + its 1 output token


def test_held_blocks_stay_until_release():
    # prefill side: prompt 8, output 1, hold. The request finishes at step 1 and is returned, but
    # its 2 blocks stay owned; request 1 (12 tokens: 3 blocks) cannot be admitted in a 4-block
    # pool until release_held frees them.
    s = Scheduler(SchedulerConfig(num_gpu_blocks=4, block_size=4, enable_prefix_caching=False))
    s.add_request(Request(0, 0.0, 8, 1, (1, 2), hash_block_size=4), hold_blocks_on_finish=True)
    out, rows, res = _step(s)
    assert [(r.request_id, r.status) for r in res] == [(0, FINISHED)]
    assert out.num_blocks_freed == 0 and s.stats.num_held_requests == 1
    st = s.stats
    assert (st.num_free_blocks, st.kv_usage, st.num_held_blocks, st.num_held_requests) == (2, 0.5, 2, 1)
    assert s.block_ids_of(0) == [0, 1]  # what a KV connector would send
    assert not s.has_unfinished()
    s.add_request(Request(1, 0.0, 12, 2, (3, 4, 5), hash_block_size=4))
    out, rows, _ = _step(s)
    assert rows == [] and out.num_batched_tokens == 0
    assert s.release_held(0) == 2
    assert s.stats.num_free_blocks == 4 and s.stats.num_held_requests == 0
    out, rows, _ = _step(s)
    assert rows[0][:2] == (1, 12)
    with pytest.raises(ValueError, match="no held blocks"):
        s.release_held(0)
    with pytest.raises(ValueError, match="no held blocks"):
        s.release_held(1)  # running, not held


def test_held_blocks_remain_prefix_hits_and_free_tail_first():
    # held blocks keep their cache entries; a second request sharing the prefix hits them while
    # they are held (refcount 2); after release and its finish all blocks are free again.
    s = Scheduler(SchedulerConfig(num_gpu_blocks=6, block_size=4))
    s.add_request(Request(0, 0.0, 8, 1, (1, 2), hash_block_size=4), hold_blocks_on_finish=True)
    _step(s)
    s.add_request(Request(1, 0.0, 9, 1, (1, 2, 3), hash_block_size=4))
    _, rows, _ = _step(s)
    assert rows == [(1, 1, 8, 8, True, True, (2,))]
    assert s.kv_cache_manager.ref_counts[0] == 1 and s.kv_cache_manager.ref_counts[1] == 1  # r1 finished; r0 holds
    assert s.release_held(0) == 2
    assert s.stats.num_free_blocks == 6
    s.check_invariants()
