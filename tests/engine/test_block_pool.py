"""Block pool: free queue order, refcounts, eviction, chained hashes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import block_manager
from engine.block_manager import (
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
    assert pool.free_reversed([0]) == 1
    assert pool.free_block_ids() == [1, 2, 3, 4, 0]
    pool.touch([3])  # revive from the middle
    assert pool.free_block_ids() == [1, 2, 4, 0] and pool.num_free == 4
    assert pool.allocate(3) == [1, 2, 4]  # the dead entry of 3 is skipped
    assert pool.free_block_ids() == [0] and pool.num_free == 1
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    pool.check_invariants({1: 1, 2: 1, 3: 1, 4: 1})


@pytest.mark.parametrize("small", [1, 8])  # 1: registration always takes its bulk path
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["pop", "popn", "revive", "free"]), st.integers(0, 40)),
                max_size=80))
def test_free_queue_matches_a_list_model(small, ops):
    # the append-only queue with dead entries behaves like a plain LRU list
    default, block_manager._SMALL = block_manager._SMALL, small
    try:
        _list_model(ops)
    finally:
        block_manager._SMALL = default


def _list_model(ops):
    pool = BlockPool(12, 1)
    pool.compact_at = 4  # exercise compaction too
    model = list(range(12))
    owned: list[int] = []
    for op, x in ops:
        if op == "pop" and model:
            assert pool.allocate_one() == model.pop(0)
        elif op == "popn" and model:
            n = x % (len(model) + 1)
            assert pool.allocate(n) == model[:n]
            del model[:n]
        elif op == "revive" and model:
            bid = model[x % len(model)]
            pool.touch([bid])
            model.remove(bid)
        elif op == "free":
            owned = [i for i in range(12) if i not in model]
            if owned:
                run = owned[x % len(owned):][:1 + x % 3]
                assert pool.free_reversed(run) == len(run)
                model += run[::-1]
        assert pool.free_block_ids() == model and pool.num_free == len(model)
    pool.check_invariants({i: 1 for i in range(12) if i not in model})


def test_pool_eviction_order_revive_and_counters():
    pool = BlockPool(4, 2)
    a = pool.allocate(2)  # blocks 0, 1
    pool.register(a, ["h0", "h1"])
    # free tail first: block 1 then block 0 go to the queue tail -> [2, 3, 1, 0]
    assert pool.free_reversed(a) == 2
    assert pool.free_block_ids() == [2, 3, 1, 0]
    pool.check_invariants({})
    # a prefix hit revives block 0 from the middle/tail
    hit = pool.lookup("h0")
    assert hit == a[0] == 0
    pool.touch([hit])
    assert pool.free_block_ids() == [2, 3, 1] and pool.ref_cnt(hit) == 1
    # allocating 3 evicts cached block 1 (its hash leaves the table), not the live block 0
    got = pool.allocate(3)
    assert got == [2, 3, 1]
    assert pool.num_evictions == 1 and pool.lookup("h1") is None and pool.lookup("h0") == hit
    assert pool.block_hash(1) is None and pool.block_hash(0) == "h0"
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
    assert pool.free_reversed([b]) == 0 and pool.ref_cnt(b) == 1
    assert pool.free_reversed([b]) == 1 and pool.ref_cnt(b) == 0
    assert pool.num_freed == 1 and pool.lookup(7) == b


def test_duplicate_content_keeps_first_block_cached():
    pool = BlockPool(4, 4)
    x, y, z = pool.allocate(3)
    pool.cache_block(x, 5)
    pool.cache_block(y, 5)
    assert pool.lookup(5) == x and pool.block_hash(y) is None
    pool.register([z, y], [6, 5])  # not disjoint: the slow path, first writer still wins
    assert pool.lookup(6) == z and pool.lookup(5) == x and pool.block_hash(y) is None
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
    code = ("from engine.block_manager import make_block_hasher as m, root_hash as r; "
            f"h=m('{algo}'); x=h(r('{algo}'), (3, 1, 4, 1, 5), (2,)); print(repr(h(x, (9, 2, 6), ())))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONPATH": ".", "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    assert len(outs) == 1


def test_unknown_hash_algo_is_named():
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        make_block_hasher("md5")
