"""Block pool: free queue order, refcounts, eviction, chained hashes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core import block_pool
from engine.core.block_pool import (
    HASH_ALGOS,
    BlockPool,
    make_block_hasher,
    root_hash,
)


def test_free_queue_fifo_revive_middle_and_free_to_tail():
    pool = BlockPool(5, 4)
    assert pool.free_block_ids() == [0, 1, 2, 3, 4] and pool.num_free == 5
    assert pool.allocate(1) == [0]
    pool.cache_block(0, "x")
    assert pool.free_tail_first([0]) == 1
    assert pool.free_block_ids() == [1, 2, 3, 4, 0]
    pool.touch([3])  # revive from the middle
    assert pool.free_block_ids() == [1, 2, 4, 0] and pool.num_free == 4
    assert pool.allocate(3) == [1, 2, 4]  # the dead entry of 3 is skipped
    assert pool.free_block_ids() == [0] and pool.num_free == 1
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    pool.check_invariants({1: 1, 2: 1, 3: 1, 4: 1})


@pytest.mark.parametrize("small", [1, 8])  # 1: registration always takes its bulk path
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["pop", "popn", "revive", "share", "cache", "group", "free",
                                           "pop_uncounted", "popn_uncounted", "free_uncounted", "count"]),
                          st.integers(0, 40)), max_size=80))
def test_free_queue_matches_a_list_model(small, ops):
    # the append-only queue with dead entries behaves like a plain LRU list
    default, block_pool._SMALL = block_pool._SMALL, small
    try:
        _list_model(ops)
    finally:
        block_pool._SMALL = default


def _list_model(ops):
    pool = BlockPool(12, 1)
    pool.compact_at = 4  # exercise compaction too
    model = list(range(12))  # free blocks, LRU first
    refs = dict.fromkeys(range(12), 0)
    keys: dict[int, int] = {}  # block -> cached key (a block keeps it while free, until reused)
    groups: dict[int, list[int]] = {}  # group key -> block per offset (-1: none), 4 offsets
    grouped: dict[int, tuple[int, int]] = {}  # block -> (group key, offset)
    uncounted: list[int] = []  # owned by one owner that takes no reference count (ref stays 0)
    evictions = 0

    def take(blocks):
        nonlocal evictions
        for b in blocks:
            if keys.pop(b, None) is not None:  # reuse evicts
                evictions += 1
            if b in grouped:
                evictions += 1
                g, off = grouped.pop(b)
                groups[g][off] = -1
                if groups[g] == [-1] * 4:
                    del groups[g]
            refs[b] = 1

    def take_uncounted(blocks):
        take(blocks)
        for b in blocks:
            refs[b] = 0
        uncounted.extend(blocks)

    for op, x in ops:
        owned = [i for i in range(12) if refs[i]]
        if op == "pop" and model:
            b = model.pop(0)
            assert pool.allocate_one() == b
            take([b])
        elif op == "popn" and model:
            n = x % (len(model) + 1)
            assert pool.allocate(n) == model[:n]
            take(model[:n])
            del model[:n]
        elif op == "pop_uncounted" and model:
            b = model.pop(0)
            assert pool.allocate_one(record=False) == b
            take_uncounted([b])
        elif op == "popn_uncounted" and model:
            n = x % (len(model) + 1)
            assert pool.allocate(n, record=False) == model[:n]
            take_uncounted(model[:n])
            del model[:n]
        elif op == "free_uncounted" and uncounted:  # a run of them, freed as their owner does
            run = uncounted[x % len(uncounted):][:1 + x % 3]
            assert pool.free_owned(run, recorded=False) == len(run)
            for b in run:
                uncounted.remove(b)
            model += reversed(run)
        elif op == "count" and uncounted:  # their owner counts them from now on (a preemption)
            run = uncounted[x % len(uncounted):][:1 + x % 3]
            pool.record_owned(run)
            for b in run:
                uncounted.remove(b)
                refs[b] = 1
        elif op == "revive" and model:
            bid = model[x % len(model)]
            pool.touch([bid])
            model.remove(bid)
            refs[bid] = 1
        elif op == "share" and owned:
            bid = owned[x % len(owned)]
            pool.touch([bid])
            refs[bid] += 1
        elif op == "cache" and owned:
            bid = owned[x % len(owned)]
            if bid not in keys and bid not in grouped:
                pool.cache_block(bid, 100 + x)
                if 100 + x not in keys.values():
                    keys[bid] = 100 + x
        elif op == "group" and owned:  # offset x % 4 of group 200 + x % 3, first writer wins
            bid = owned[x % len(owned)]
            g, off = 200 + x % 3, x % 4
            if bid not in keys and bid not in grouped:
                pool.cache_group(g, 4, off, [bid])
                slots = groups.setdefault(g, [-1] * 4)
                if slots[off] < 0:
                    slots[off] = bid
                    grouped[bid] = (g, off)
        elif op == "free" and owned:
            run = owned[x % len(owned):][:1 + x % 3]
            gone = []
            for b in reversed(run):
                refs[b] -= 1
                if not refs[b]:
                    gone.append(b)
            if x % 2 and all(refs[b] == 0 for b in run):  # held by one owner each: the owned path
                assert pool.free_owned(run) == len(gone)
            else:
                assert pool.free_tail_first(run) == len(gone)
            model += gone
        assert pool.free_block_ids() == model and pool.num_free == len(model)
        assert pool.cached == {k: b for b, k in keys.items()}
        assert {k: g.blocks for k, g in pool.groups.items()} == groups
        assert pool.num_evictions == evictions
        assert pool.ref == [refs[i] for i in range(12)]
    pool.check_invariants({i: refs[i] for i in range(12) if refs[i]}, set(uncounted))


def test_pack_ints_rejects_ints_beyond_int64():
    h = make_block_hasher("xxhash")
    with pytest.raises(ValueError, match="int64"):
        h(root_hash("xxhash"), (1, 2**63), ())


def test_pool_eviction_order_revive_and_counters():
    pool = BlockPool(4, 2)
    a = pool.allocate(2)  # blocks 0, 1
    pool.cache_blocks(a, ["h0", "h1"])
    # free tail first: block 1 then block 0 go to the queue tail -> [2, 3, 1, 0]
    assert pool.free_tail_first(a) == 2
    assert pool.free_block_ids() == [2, 3, 1, 0]
    pool.check_invariants({})
    # a prefix hit revives block 0 from the middle/tail
    hit = pool.cached.get("h0")
    assert hit == a[0] == 0
    pool.touch([hit])
    assert pool.free_block_ids() == [2, 3, 1] and pool.ref[hit] == 1
    # allocating 3 evicts cached block 1 (its hash leaves the table), not the live block 0
    got = pool.allocate(3)
    assert got == [2, 3, 1]
    assert pool.num_evictions == 1 and pool.cached.get("h1") is None and pool.cached.get("h0") == hit
    assert pool.key_of[1] is None and pool.key_of[0] == "h0"
    owners = {0: 1, 1: 1, 2: 1, 3: 1}
    pool.check_invariants(owners)
    assert pool.usage() == 1.0
    assert (pool.num_allocated, pool.num_revived, pool.num_freed) == (5, 1, 2)
    with pytest.raises(AssertionError, match="owners"):
        pool.check_invariants({0: 2, 1: 1, 2: 1, 3: 1})


def test_shared_block_freed_only_when_last_owner_leaves():
    pool = BlockPool(3, 4)
    (b,) = pool.allocate(1)
    pool.cache_block(b, 7)
    pool.touch([b])  # second owner
    assert pool.free_tail_first([b]) == 0 and pool.ref[b] == 1
    assert pool.free_tail_first([b]) == 1 and pool.ref[b] == 0
    assert pool.num_freed == 1 and pool.cached.get(7) == b


def test_duplicate_content_keeps_first_block_cached():
    pool = BlockPool(4, 4)
    x, y, z = pool.allocate(3)
    pool.cache_block(x, 5)
    pool.cache_block(y, 5)
    assert pool.cached.get(5) == x and pool.key_of[y] is None
    pool.cache_blocks([z, y], [6, 5])  # not disjoint: the slow path, first writer still wins
    assert pool.cached.get(6) == z and pool.cached.get(5) == x and pool.key_of[y] is None
    pool.check_invariants({0: 1, 1: 1, 2: 1})


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_chained_hash_depends_on_parent_content_and_extra(algo):
    h = make_block_hasher(algo)
    r = root_hash(algo)
    a = h(r, (1, 2, 3, 4), ())
    assert a == h(r, (1, 2, 3, 4), ())
    assert a != h(r, (1, 2, 3, 5), ())
    assert a != h(r, (1, 2, 3, 4), (9,))
    assert h(a, (5, 6, 7, 8), ()) != h(h(r, (0, 2, 3, 4), ()), (5, 6, 7, 8), ())


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_hashes_are_identical_across_processes(algo):
    code = ("from engine.core.block_pool import make_block_hasher as m, root_hash as r; "
            f"h=m('{algo}'); x=h(r('{algo}'), (3, 1, 4, 1, 5), (2,)); print(repr(h(x, (9, 2, 6), ())))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONPATH": ".", "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    assert len(outs) == 1


def test_unknown_hash_algo_is_named():
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        make_block_hasher("md5")
