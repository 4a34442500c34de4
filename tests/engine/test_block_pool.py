"""Block pool: free queue order, refcounts, eviction, chained hashes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_manager import (
    HASH_ALGOS,
    BlockPool,
    FreeBlockQueue,
    KVBlock,
    make_block_hasher,
    root_hash,
)


def test_free_queue_fifo_remove_middle_and_append():
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert q.block_ids() == [0, 1, 2, 3, 4] and q.num_free == 5
    q.remove(blocks[2])
    assert q.block_ids() == [0, 1, 3, 4] and q.num_free == 4
    assert q.popleft() is blocks[0]
    q.append(blocks[2])
    assert q.block_ids() == [1, 3, 4, 2]
    assert [b.block_id for b in q.popleft_n(3)] == [1, 3, 4]
    assert q.block_ids() == [2] and q.num_free == 1
    with pytest.raises(RuntimeError):
        q.popleft_n(2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["pop", "popn", "remove", "append"]), st.integers(0, 40)),
                max_size=60))
def test_free_queue_matches_a_list_model(ops):
    blocks = [KVBlock(i) for i in range(12)]
    q = FreeBlockQueue(blocks)
    model = list(range(12))
    out: list[int] = []
    for op, x in ops:
        if op == "pop" and model:
            assert q.popleft().block_id == model.pop(0)
            out.append(x)
        elif op == "popn" and model:
            n = x % (len(model) + 1)
            got = [b.block_id for b in q.popleft_n(n)]
            assert got == model[:n]
            del model[:n]
        elif op == "remove" and model:
            bid = model[x % len(model)]
            q.remove(blocks[bid])
            model.remove(bid)
        elif op == "append":
            missing = [i for i in range(12) if i not in model]
            if missing:
                bid = missing[x % len(missing)]
                q.append(blocks[bid])
                model.append(bid)
        assert q.block_ids() == model and q.num_free == len(model)


def test_pool_eviction_order_revive_and_counters():
    pool = BlockPool(4, 2)
    a = pool.allocate(2)  # blocks 0, 1
    for b, h in zip(a, ("h0", "h1")):
        pool.cache_block(b, h)
    # free tail first: block 1 then block 0 go to the queue tail -> [2, 3, 1, 0]
    assert pool.free_reversed(a) == 2
    assert pool.free_queue.block_ids() == [2, 3, 1, 0]
    pool.check_invariants({})
    # a prefix hit revives block 0 from the middle/tail
    hit = pool.lookup("h0")
    assert hit is a[0]
    pool.touch([hit])
    assert pool.free_queue.block_ids() == [2, 3, 1] and hit.ref_cnt == 1
    # allocating 3 evicts cached block 1 (its hash leaves the table), not the live block 0
    got = pool.allocate(3)
    assert [b.block_id for b in got] == [2, 3, 1]
    assert pool.num_evictions == 1 and pool.lookup("h1") is None and pool.lookup("h0") is hit
    owners = {0: 1, 1: 1, 2: 1, 3: 1}
    pool.check_invariants(owners)
    assert pool.usage() == 1.0
    with pytest.raises(AssertionError, match="owners"):
        pool.check_invariants({0: 2, 1: 1, 2: 1, 3: 1})


def test_shared_block_freed_only_when_last_owner_leaves():
    pool = BlockPool(3, 4)
    (b,) = pool.allocate(1)
    pool.cache_block(b, 7)
    pool.touch([b])  # second owner
    assert pool.free_reversed([b]) == 0 and b.ref_cnt == 1
    assert pool.free_reversed([b]) == 1 and b.ref_cnt == 0
    assert pool.num_freed == 1 and pool.lookup(7) is b


def test_duplicate_content_keeps_first_block_cached():
    pool = BlockPool(3, 4)
    x, y = pool.allocate(2)
    pool.cache_block(x, 5)
    pool.cache_block(y, 5)
    assert pool.lookup(5) is x and y.block_hash is None
    pool.check_invariants({0: 1, 1: 1})


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
