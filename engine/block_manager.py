"""The KV block pool: physical blocks, reference counts, an LRU free queue and the prefix cache.

Pure Python (no torch): the simulator and the real engine share it. The GPU side only
ever sees block ids; which block holds what is decided here.

Design (vLLM V1's, re-derived):
- A block is *free* when no request owns it (`ref_cnt == 0`). Free blocks sit in a
  doubly linked queue in LRU order; allocation pops from the head.
- A free block may still hold a cached prefix (`block_hash` set). A prefix-cache hit on
  such a block takes it out of the middle of the queue in O(1) ("revives" it); popping
  it for a new allocation evicts its hash (counted).
- Prefix caching keys *full* blocks only, by a chained hash
  `H(parent_hash, block content, extra keys)`, so equal hashes mean equal whole prefixes.
- A request frees its blocks tail first, so the heads of shared prefixes reach the
  head of the queue last and survive longest.
- One block per key: when two requests compute the same block concurrently, the first
  registration wins and the duplicate stays an uncached block. vLLM keeps both under the
  key, so it can still hit after the first copy is evicted while the duplicate lives; that
  rare case is the only way hits differ.

Hash algorithms (`prefix_caching_hash_algo`): `builtin` (Python's `hash` of a tuple of
ints: fast and deterministic across processes for ints, 64-bit, not collision-resistant
against an adversary), `xxhash` (xxh3-64 of packed bytes), `sha256` (cryptographic, what
vLLM defaults to). Every block hashed is counted so a cost model can charge for it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Hashable, Iterable
from typing import Literal

import xxhash

HashAlgo = Literal["builtin", "xxhash", "sha256"]
HASH_ALGOS: tuple[str, ...] = ("builtin", "xxhash", "sha256")

# Parent "hash" of the first block of every sequence. An int (not None): in Python 3.11
# hash(None) is address-based and would differ between processes.
ROOT_HASH_INT = 0
ROOT_HASH_BYTES = b""


class KVBlock:
    """One physical KV block. `prev_free`/`next_free` link it into the free queue."""

    __slots__ = ("block_hash", "block_id", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: Hashable | None = None  # set while the block is in the prefix cache
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash!r})"


class FreeBlockQueue:
    """Doubly linked list of free blocks in eviction order (head = evicted first).

    O(1) popleft, append and removal from the middle; sentinels keep the code branch-free.
    """

    __slots__ = ("head", "num_free", "tail")

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self.head = KVBlock(-1)
        self.tail = KVBlock(-2)
        self.head.next_free = self.tail
        self.tail.prev_free = self.head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def popleft(self) -> KVBlock:
        b = self.head.next_free
        if b is self.tail:
            raise RuntimeError("no free KV block (caller must check num_free first)")
        nxt = b.next_free
        self.head.next_free = nxt
        nxt.prev_free = self.head
        b.prev_free = b.next_free = None
        self.num_free -= 1
        return b

    def popleft_n(self, n: int) -> list[KVBlock]:
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} free KV blocks, {self.num_free} free")
        out = []
        b = self.head.next_free
        for _ in range(n):
            out.append(b)
            nxt = b.next_free
            b.prev_free = b.next_free = None
            b = nxt
        self.head.next_free = b
        b.prev_free = self.head
        self.num_free -= n
        return out

    def remove(self, b: KVBlock) -> None:
        p, n = b.prev_free, b.next_free
        p.next_free = n
        n.prev_free = p
        b.prev_free = b.next_free = None
        self.num_free -= 1

    def append(self, b: KVBlock) -> None:
        last = self.tail.prev_free
        last.next_free = b
        b.prev_free = last
        b.next_free = self.tail
        self.tail.prev_free = b
        self.num_free += 1

    def __iter__(self):
        b = self.head.next_free
        while b is not self.tail:
            yield b
            b = b.next_free

    def block_ids(self) -> list[int]:
        return [b.block_id for b in self]


def _pack_ints(values: tuple) -> bytes:
    """Little-endian int64 bytes of a flat tuple of ints (repr fallback for huge ints)."""
    try:
        return array("q", values).tobytes()
    except (OverflowError, TypeError):
        return repr(values).encode()


def make_bytes_hasher(algo: str) -> Callable[[Hashable, bytes, bytes], Hashable]:
    """`hasher(parent, content_bytes, extra_bytes) -> hash` for the byte-level algorithms
    (content = little-endian int64 token ids). The parent is the previous block's hash."""
    if algo == "xxhash":
        digest = xxhash.xxh3_64_intdigest

        def h_xx(parent: int, content: bytes, extra: bytes) -> int:
            return digest(parent.to_bytes(8, "little") + content + extra)
        return h_xx
    if algo == "sha256":
        sha = hashlib.sha256

        def h_sha(parent: bytes, content: bytes, extra: bytes) -> bytes:
            return sha(parent + content + extra).digest()
        return h_sha
    raise ValueError(f"no byte-level hasher for {algo!r}; use one of ('xxhash', 'sha256')")


def pack_extra(extra: tuple) -> bytes:
    """Extra keys as bytes, behind a separator so they cannot alias token content."""
    return b"|" + _pack_ints(extra) if extra else b""


def make_block_hasher(algo: str) -> Callable[[Hashable, tuple, tuple], Hashable]:
    """`hasher(parent, content, extra) -> hash`. `content`/`extra` are flat tuples of ints.

    `builtin` hashes the tuple itself; the byte-level algorithms hash its int64 packing
    (so that hashing a run of token ids packed once gives the same values)."""
    if algo == "builtin":
        def h_builtin(parent: Hashable, content: tuple, extra: tuple) -> int:
            return hash((parent, content, extra))
        return h_builtin
    if algo not in HASH_ALGOS:
        raise ValueError(f"prefix_caching_hash_algo must be one of {HASH_ALGOS}, got {algo!r}")
    hb = make_bytes_hasher(algo)

    def h_tuple(parent: Hashable, content: tuple, extra: tuple) -> Hashable:
        return hb(parent, _pack_ints(content), pack_extra(extra))
    return h_tuple


def root_hash(algo: str) -> Hashable:
    return ROOT_HASH_BYTES if algo == "sha256" else ROOT_HASH_INT


class BlockPool:
    """`num_blocks` physical blocks, their free queue and the prefix-cache table.

    Counters (cumulative): `num_allocated` (popped from the free queue), `num_revived` (free
    cached blocks taken back by a prefix hit), `num_freed` (refcount went to 0), so that
    `num_allocated + num_revived - num_freed` = blocks owned now,
    `num_evictions` (cached hashes dropped because their free block was reused). Blocks
    hashed are counted by the scheduler, which keys blocks per request.
    """

    __slots__ = (
        "block_size",
        "blocks",
        "cached",
        "free_queue",
        "num_allocated",
        "num_blocks",
        "num_evictions",
        "num_freed",
        "num_revived",
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[Hashable, KVBlock] = {}
        self.num_allocated = 0
        self.num_freed = 0
        self.num_evictions = 0
        self.num_revived = 0  # free cached blocks taken back by a prefix hit

    @property
    def num_free(self) -> int:
        return self.free_queue.num_free

    def usage(self) -> float:
        """Fraction of blocks owned by some request (vLLM's kv_cache_usage_perc; free cached
        blocks count as free)."""
        return 1.0 - self.free_queue.num_free / self.num_blocks

    def allocate(self, n: int) -> list[KVBlock]:
        """Pop `n` blocks from the LRU head, evicting any cached hash they carry.

        One pass, no per-block calls: this and `free_reversed` are the per-block hot path.
        (A block's free-queue links are meaningful only while it is free.)"""
        fq = self.free_queue
        if n > fq.num_free:
            raise RuntimeError(f"asked for {n} free KV blocks, {fq.num_free} free")
        out = []
        append = out.append
        cached = self.cached
        evicted = 0
        b = fq.head.next_free
        for _ in range(n):
            h = b.block_hash
            if h is not None:
                del cached[h]  # invariant: cached[h] is b
                b.block_hash = None
                evicted += 1
            b.ref_cnt = 1
            append(b)
            b = b.next_free
        fq.head.next_free = b
        b.prev_free = fq.head
        fq.num_free -= n
        self.num_evictions += evicted
        self.num_allocated += n
        return out

    def allocate_one(self) -> KVBlock:
        b = self.free_queue.popleft()
        h = b.block_hash
        if h is not None:
            del self.cached[h]
            b.block_hash = None
            self.num_evictions += 1
        b.ref_cnt = 1
        self.num_allocated += 1
        return b

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on prefix-cache hits, reviving free ones out of the queue."""
        fq = self.free_queue
        for b in blocks:
            if b.ref_cnt == 0:
                fq.remove(b)
                self.num_revived += 1
            b.ref_cnt += 1

    def free_reversed(self, blocks: list[KVBlock]) -> int:
        """Drop one reference on each of `blocks`, tail first; those left unowned are spliced
        onto the queue tail in that order. Returns how many became free."""
        fq = self.free_queue
        tail = fq.tail
        last = tail.prev_free
        n = 0
        for b in reversed(blocks):
            rc = b.ref_cnt - 1
            b.ref_cnt = rc
            if rc == 0:
                last.next_free = b
                b.prev_free = last
                last = b
                n += 1
        last.next_free = tail
        tail.prev_free = last
        fq.num_free += n
        self.num_freed += n
        return n

    def cache_block(self, b: KVBlock, h: Hashable) -> None:
        """Register a full block under hash `h` (first writer wins: a duplicate with the same
        content stays uncached and simply becomes a plain free block later)."""
        if b.block_hash is None and h not in self.cached:
            b.block_hash = h
            self.cached[h] = b

    def lookup(self, h: Hashable) -> KVBlock | None:
        return self.cached.get(h)

    def check_invariants(self, owners: dict[int, int]) -> None:
        """Raise AssertionError unless refcounts, free queue and cache table agree.

        `owners[block_id]` = how many request block tables hold that block.
        """
        for b in self.blocks:
            want = owners.get(b.block_id, 0)
            assert b.ref_cnt == want, f"block {b.block_id}: ref_cnt {b.ref_cnt} != {want} owners"
        free_ids = []
        prev = self.free_queue.head
        b = prev.next_free
        while b is not self.free_queue.tail:
            assert b.prev_free is prev, f"free queue back link broken at block {b.block_id}"
            assert b.ref_cnt == 0, f"block {b.block_id} in the free queue with ref_cnt {b.ref_cnt}"
            free_ids.append(b.block_id)
            prev, b = b, b.next_free
        assert len(free_ids) == len(set(free_ids)), "a block is twice in the free queue"
        assert len(free_ids) == self.free_queue.num_free, "free queue count is off"
        n_zero = sum(1 for b in self.blocks if b.ref_cnt == 0)
        assert n_zero == len(free_ids), f"{n_zero} blocks with ref 0 but {len(free_ids)} queued"
        for h, b in self.cached.items():
            assert b.block_hash == h, f"cache entry for block {b.block_id} has a stale hash"
        n_hashed = sum(1 for b in self.blocks if b.block_hash is not None)
        assert n_hashed == len(self.cached), "a block carries a hash the cache table lacks"
