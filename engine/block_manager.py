"""The KV block pool: physical blocks, reference counts, an LRU free queue and the prefix cache.

Pure Python (no torch): the simulator and the real engine share it. The GPU side only
ever sees block ids; which block holds what is decided here.

Design (vLLM V1's, re-derived):
- A block is *free* when no request owns it (`ref_cnt == 0`). Free blocks sit in a
  queue in LRU order; allocation pops from the head.
- A free block may still hold a cached prefix (a hash). A prefix-cache hit on such a
  block takes it out of the middle of the queue in O(1) ("revives" it); popping it for a
  new allocation evicts its hash (counted).
- Representation (for speed: the simulator moves millions of blocks): blocks are ints,
  their state lives in numpy arrays indexed by block id, so that a request's n blocks are
  allocated, freed and registered with a few array operations instead of n Python-level
  object updates. The LRU queue is an append-only list of block ids in which each free
  block's *latest* entry is the live one: `stamp[b]` holds the absolute position of that
  entry. Removal from the middle just invalidates it (`stamp[b] = -1`); the head skips
  dead entries. Same order, same evictions as a doubly linked list, O(1) amortized.
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
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Literal

import numpy as np
import xxhash

HashAlgo = Literal["builtin", "xxhash", "sha256"]
HASH_ALGOS: tuple[str, ...] = ("builtin", "xxhash", "sha256")

# Parent "hash" of the first block of every sequence. An int (not None): in Python 3.11
# hash(None) is address-based and would differ between processes.
ROOT_HASH_INT = 0
ROOT_HASH_BYTES = b""


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


# below this many blocks an operation loops in Python (numpy's fixed cost per call is
# ~1 us, a scalar loop ~0.3 us per block)
_SMALL = 8


class BlockPool:
    """`num_blocks` physical blocks (ids 0..num_blocks-1), their LRU free queue and the
    prefix-cache table (`cached`: key -> block id; `key_of[b]`: block b's key while
    `has_hash[b]`).

    Counters (cumulative): `num_allocated` (popped from the free queue), `num_revived` (free
    cached blocks taken back by a prefix hit), `num_freed` (refcount went to 0), so that
    `num_allocated + num_revived - num_freed` = blocks owned now,
    `num_evictions` (cached hashes dropped because their free block was reused). Blocks
    hashed are counted by the scheduler, which keys blocks per request.
    """

    __slots__ = (
        "block_size",
        "cached",
        "compact_at",
        "has_hash",
        "head",
        "key_of",
        "num_allocated",
        "num_blocks",
        "num_evictions",
        "num_free",
        "num_freed",
        "num_revived",
        "qbase",
        "queue",
        "ref",
        "stamp",
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = np.zeros(num_blocks, dtype=np.int64)  # owners per block
        self.stamp = np.arange(num_blocks, dtype=np.int64)  # live queue position, -1 if none
        self.has_hash = np.zeros(num_blocks, dtype=bool)
        self.queue: list[int] = list(range(num_blocks))  # block ids, LRU first (with dead entries)
        self.qbase = 0  # absolute position of queue[0]
        self.head = 0  # index in `queue` of the first entry not yet consumed
        self.num_free = num_blocks
        self.cached: dict[Hashable, int] = {}
        self.key_of = np.full(num_blocks, None, dtype=object)  # valid where has_hash
        self.num_allocated = 0
        self.num_freed = 0
        self.num_evictions = 0
        self.num_revived = 0  # free cached blocks taken back by a prefix hit
        # drop consumed queue entries once this many have piled up (and they are most of it)
        self.compact_at = 1 << 16

    def usage(self) -> float:
        """Fraction of blocks owned by some request (vLLM's kv_cache_usage_perc; free cached
        blocks count as free)."""
        return 1.0 - self.num_free / self.num_blocks

    def free_block_ids(self) -> list[int]:
        """Free blocks in eviction order (head first)."""
        q, h, stamp = self.queue, self.head, self.stamp
        base = self.qbase + h
        return [b for i, b in enumerate(q[h:]) if stamp[b] == base + i]

    def allocate(self, n: int) -> list[int]:
        """Pop `n` blocks from the LRU head, evicting any cached hash they carry."""
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} free KV blocks, {self.num_free} free")
        if n <= 0:
            return []
        if n < _SMALL:  # numpy's per-call overhead beats its per-block gain
            one = self.allocate_one
            return [one() for _ in range(n)]
        q, stamp = self.queue, self.stamp
        h = self.head
        arr = np.array(q[h:h + n], dtype=np.int64)
        pos = self.qbase + h
        live = stamp[arr] == np.arange(pos, pos + n)
        h += n
        if not live.all():
            # dead entries (revived blocks) in the way: keep the live ones, take more
            parts = [arr[live]]
            need = n - len(parts[0])
            while need:
                w = np.array(q[h:h + need], dtype=np.int64)
                pos = self.qbase + h
                sel = w[stamp[w] == np.arange(pos, pos + len(w))]
                parts.append(sel)
                need -= len(sel)
                h += len(w)
            arr = np.concatenate(parts)
        self.head = h
        self.ref[arr] = 1
        hh = self.has_hash[arr]
        if hh.any():
            ev = arr[hh]
            self.has_hash[ev] = False
            # invariant: cached[key_of[b]] == b; delete them at C speed
            deque(map(self.cached.__delitem__, self.key_of[ev].tolist()), maxlen=0)
            self.num_evictions += len(ev)
        self.num_free -= n
        self.num_allocated += n
        if h >= self.compact_at and 2 * h >= len(q):
            self._compact()
        return arr.tolist()

    def allocate_one(self) -> int:
        if self.num_free <= 0:
            raise RuntimeError("no free KV block (caller must check num_free first)")
        q, stamp = self.queue, self.stamp
        h = self.head
        p = self.qbase + h
        b = q[h]
        while stamp[b] != p:  # dead entry
            h += 1
            p += 1
            b = q[h]
        self.head = h + 1
        self.ref[b] = 1
        if self.has_hash[b]:
            self.has_hash[b] = False
            del self.cached[self.key_of[b]]
            self.num_evictions += 1
        self.num_free -= 1
        self.num_allocated += 1
        if h >= self.compact_at and 2 * h >= len(q):
            self._compact()
        return b

    def _compact(self) -> None:
        h = self.head
        del self.queue[:h]
        self.qbase += h
        self.head = 0

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on prefix-cache hits, reviving free ones out of the queue."""
        if len(blocks) < _SMALL:
            ref, stamp = self.ref, self.stamp
            for b in blocks:
                if ref[b] == 0:
                    stamp[b] = -1
                    self.num_free -= 1
                    self.num_revived += 1
                ref[b] += 1
            return
        arr = np.array(blocks, dtype=np.int64)
        ref = self.ref
        z = arr[ref[arr] == 0]
        if len(z):
            self.stamp[z] = -1  # their queue entries are dead now
            self.num_free -= len(z)
            self.num_revived += len(z)
        ref[arr] += 1  # a request's hits are distinct blocks

    def num_unowned(self, blocks: Sequence[int]) -> int:
        """How many of `blocks` are free (would leave the queue if touched)."""
        return int((self.ref[np.array(blocks, dtype=np.int64)] == 0).sum())

    def free_reversed(self, blocks: Sequence[int]) -> int:
        """Drop one reference on each of `blocks` (distinct), tail first; those left unowned
        are appended to the queue tail in that order. Returns how many became free."""
        if len(blocks) < _SMALL:
            ref, stamp, q = self.ref, self.stamp, self.queue
            p = self.qbase + len(q)
            n = 0
            for b in reversed(blocks):
                ref[b] -= 1
                if ref[b] == 0:
                    stamp[b] = p + n
                    q.append(b)
                    n += 1
            self.num_free += n
            self.num_freed += n
            return n
        arr = np.array(blocks[::-1], dtype=np.int64)
        ref = self.ref
        ref[arr] -= 1
        freed = arr[ref[arr] == 0]
        n = len(freed)
        if n:
            q = self.queue
            p = self.qbase + len(q)
            self.stamp[freed] = np.arange(p, p + n)
            q.extend(freed.tolist())
            self.num_free += n
            self.num_freed += n
        return n

    def register(self, blocks: Sequence[int], keys: Sequence[Hashable]) -> None:
        """Register full blocks under their keys (first writer wins: a block whose key is
        already cached stays uncached and becomes a plain free block later). The blocks
        must not be registered yet."""
        cached = self.cached
        if len(keys) < _SMALL:
            for b, h in zip(blocks, keys):
                if h not in cached:
                    cached[h] = b
                    self.key_of[b] = h
                    self.has_hash[b] = True
            return
        if cached.keys().isdisjoint(keys):
            # keys are distinct within a request (its chain), so all are new: bulk insert
            cached.update(zip(keys, blocks))
            arr = np.array(blocks, dtype=np.int64)
            self.key_of[arr] = np.fromiter(keys, dtype=object, count=len(arr))
            self.has_hash[arr] = True
            return
        setdefault = cached.setdefault
        key_of = self.key_of
        has_hash = self.has_hash
        for b, h in zip(blocks, keys):
            if setdefault(h, b) == b:
                key_of[b] = h
                has_hash[b] = True

    def cache_block(self, b: int, h: Hashable) -> None:
        """Register one full block under hash `h` (first writer wins)."""
        if not self.has_hash[b] and h not in self.cached:
            self.cached[h] = b
            self.key_of[b] = h
            self.has_hash[b] = True

    def lookup(self, h: Hashable) -> int | None:
        return self.cached.get(h)

    def ref_cnt(self, b: int) -> int:
        return int(self.ref[b])

    def block_hash(self, b: int) -> Hashable | None:
        return self.key_of[b] if self.has_hash[b] else None

    def keys_of(self, blocks: Sequence[int]) -> list:
        """`block_hash` of each of `blocks` (None where uncached)."""
        arr = np.array(blocks, dtype=np.int64)
        ks = self.key_of[arr]
        ks[~self.has_hash[arr]] = None
        return ks.tolist()

    def check_invariants(self, owners: dict[int, int]) -> None:
        """Raise AssertionError unless refcounts, free queue and cache table agree.

        `owners[block_id]` = how many request block tables hold that block.
        """
        ref = self.ref.tolist()
        for b in range(self.num_blocks):
            want = owners.get(b, 0)
            assert ref[b] == want, f"block {b}: ref_cnt {ref[b]} != {want} owners"
        free_ids = self.free_block_ids()
        assert len(free_ids) == len(set(free_ids)), "a block is twice in the free queue"
        assert len(free_ids) == self.num_free, "free queue count is off"
        for b in free_ids:
            assert ref[b] == 0, f"block {b} in the free queue with ref_cnt {ref[b]}"
        n_zero = ref.count(0)
        assert n_zero == len(free_ids), f"{n_zero} blocks with ref 0 but {len(free_ids)} queued"
        for b in range(self.num_blocks):
            if ref[b] > 0:
                assert self.stamp[b] == -1 or self.stamp[b] < self.qbase + self.head or \
                    self.queue[self.stamp[b] - self.qbase] != b, f"owned block {b} has a live entry"
        for h, b in self.cached.items():
            assert self.has_hash[b] and self.key_of[b] == h, f"cache entry for block {b} has a stale hash"
        assert int(self.has_hash.sum()) == len(self.cached), "a block carries a hash the cache table lacks"
