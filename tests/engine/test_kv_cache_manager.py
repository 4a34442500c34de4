"""The KV cache manager driven through its public interface alone (no scheduler): allocate,
cache, look up hits, free, preempt and re-admit, hold and release, against hand-computed
block ids, free-queue orders and counters."""

from dataclasses import dataclass

import pytest

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request
from engine.core.request_state import FINISHED, SchedulerRequest


@dataclass
class Counts:
    """What a step record carries for the manager to add to."""

    num_blocks_allocated: int = 0
    num_blocks_hashed: int = 0
    num_blocks_freed: int = 0


def mk(kv: KVCacheManager, rid: int, tokens: list[int], output_len: int = 4,
       hold: bool = False) -> SchedulerRequest:
    req = Request(rid, 0.0, len(tokens), output_len, (rid,), hash_block_size=len(tokens))
    r = SchedulerRequest(req, list(tokens), (), rid, kv.key_strategy(has_token_ids=True))
    r.hold_blocks_on_finish = hold
    return r


def admit(kv: KVCacheManager, r: SchedulerRequest, counts: Counts) -> tuple[list[int], list[int]]:
    """What the scheduler does to admit `r` whole: look up, allocate, advance."""
    hits, hashed = kv.get_computed_blocks(r)
    counts.num_blocks_hashed += hashed
    num_new = r.num_tokens - len(hits) * kv.block_size
    new = kv.allocate_slots(r, num_new, counts, hits=hits)
    assert new is not None
    r.num_computed_tokens = r.num_tokens
    return hits, new


def test_allocate_cache_hit_free_preempt_readmit():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    counts = Counts()
    a = mk(kv, 0, list(range(100, 110)))  # 10 tokens: 2 full blocks + 2 tokens
    assert admit(kv, a, counts) == ([], [0, 1, 2])
    assert counts.num_blocks_allocated == 3 and counts.num_blocks_hashed == 2
    assert a.num_cached_blocks == 2 and kv.num_free_blocks == 5
    # same first 8 tokens: hits a's two full blocks, allocates one block for the rest
    b = mk(kv, 1, [*range(100, 108), 200, 201])
    assert admit(kv, b, counts) == ([0, 1], [3])
    assert kv.ref_counts[:4] == [2, 2, 1, 1] and kv.num_free_blocks == 4
    assert kv.block_stats()["num_cached_blocks"] == 2
    kv.check_invariants([a, b])
    # a finishes: only its own last block becomes free; shared blocks stay owned by b
    assert kv.free_or_hold(a) == 1 and a.block_ids == []
    # b is preempted (freed tail first, its cached blocks stay findable) ...
    assert kv.free(b) == 3
    assert kv.pool.free_block_ids() == [4, 5, 6, 7, 2, 3, 1, 0]
    b.num_computed_tokens = 0
    # ... and re-admitted: its keys are kept (nothing hashed again), its blocks revived
    hashed_before = kv.num_blocks_hashed
    assert admit(kv, b, counts) == ([0, 1], [4])
    assert kv.num_blocks_hashed == hashed_before
    stats = kv.block_stats()
    assert stats["num_blocks_revived"] == 2 and stats["num_evictions"] == 0
    assert stats["num_blocks_allocated"] == 5 and stats["num_blocks_freed"] == 4
    assert kv.usage() == pytest.approx(3 / 8)
    kv.check_invariants([b])


def test_decode_blocks_drafts_and_a_blocked_admission():
    kv = KVCacheManager(num_blocks=3, block_size=2)
    counts = Counts()
    a = mk(kv, 0, [1, 2, 3, 4])
    admit(kv, a, counts)  # blocks 0, 1, both full and cached
    assert kv.allocate_decode_block(a) == 2  # position 4 opens a block
    a.num_computed_tokens += 1
    assert kv.allocate_decode_block(a) is None  # none left
    # a blocked admission changes nothing, and its hits are remembered for the next lookup
    b = mk(kv, 1, [1, 2, 3, 4, 9, 9, 9])
    hits, _ = kv.get_computed_blocks(b)
    assert hits == [0, 1]
    assert kv.allocate_slots(b, 3, counts, hits=hits) is None
    assert b.block_ids == [] and kv.ref_counts == [1, 1, 1]
    kv.note_blocked(b, hits)
    assert kv.get_computed_blocks(b) == ([0, 1], 0)
    # rejected drafts give back the blocks only they occupied
    assert kv.free_tail(a, 2) == 1 and a.block_ids == [0, 1]
    assert kv.allocate_blocks(1) == [2]


def test_hold_and_release_for_a_kv_transfer():
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_caching=False)
    counts = Counts()
    p = mk(kv, 7, list(range(6)), hold=True)
    assert admit(kv, p, counts) == ([], [0, 1])
    assert counts.num_blocks_hashed == 0 and kv.block_stats()["num_cached_blocks"] == 0
    p.status = FINISHED
    assert kv.free_or_hold(p) == 0
    assert kv.block_stats()["num_held_requests"] == 1 and kv.block_stats()["num_held_blocks"] == 2
    kv.check_invariants([])
    assert kv.release(7) == 2 and kv.release(7) is None
    assert kv.num_free_blocks == 4
    kv.check_invariants([])
