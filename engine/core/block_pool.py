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
  their state lives in plain lists indexed by block id (no per-block objects; bulk reads
  go through C-level map/slices). The LRU queue is an append-only list of block ids in which each free
  block's *latest* entry is the live one. Removal from the middle (a revival) just leaves the
  entry dead and counts it (`dead[b]`: b's dead entries still queued, which precede its live
  one); the head skips an entry while its block has dead ones counted. Same order, same
  evictions as a doubly linked list, O(1) amortized. Freeing writes nothing per block but its
  refcount (no positions to stamp): with no block shared, one C-level check, a store per
  block and one list extend; allocating checks the dead counts only when some are pending
  (revivals: prefix hits on free blocks) and then with one C-level disjointness test.
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
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from operator import itemgetter
from typing import Literal

import xxhash

HashAlgo = Literal["builtin", "xxhash", "sha256"]
HASH_ALGOS: tuple[str, ...] = ("builtin", "xxhash", "sha256")

# Parent "hash" of the first block of every sequence. An int (not None): in Python 3.11
# hash(None) is address-based and would differ between processes.
ROOT_HASH_INT = 0
ROOT_HASH_BYTES = b""


def _pack_ints(values: tuple) -> bytes:
    """Little-endian int64 bytes of a flat tuple of ints."""
    try:
        return array("q", values).tobytes()
    except (OverflowError, TypeError) as e:
        # a different packing would silently change what a block key means
        raise ValueError(
            f"block keys hash token ids and extra keys as int64; got {values[:8]!r}"
            f"{' ...' if len(values) > 8 else ''}: pass ints in [-2**63, 2**63) "
            f"(token ids, extra_keys)") from e


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


class KeyGroup:
    """Prefix-cache entries of consecutive blocks sharing one chained key (the simulator's
    hash block: `size` KV blocks). Block at offset j is cached under (key, j): one table
    entry per group instead of one per block, with the same first-writer-wins rule."""

    __slots__ = ("blocks", "key", "num_cached")

    def __init__(self, key: Hashable, size: int) -> None:
        self.key = key
        self.blocks = [-1] * size  # block id per offset, -1 where none is cached
        self.num_cached = 0


# below this many blocks `cache_blocks` takes its per-block loop (the bulk check + insert has a
# fixed cost not worth paying)
_SMALL = 8


class BlockPool:
    """`num_blocks` physical blocks (ids 0..num_blocks-1), their LRU free queue and the
    prefix-cache tables (`cached`: key -> block id; `groups`: group key -> `KeyGroup`;
    `key_of[b]`: block b's key, its KeyGroup, or None).

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
        "dead",
        "group_offset",
        "groups",
        "head",
        "key_of",
        "num_allocated",
        "num_blocks",
        "num_evictions",
        "num_free",
        "num_freed",
        "num_grouped",
        "num_revived",
        "queue",
        "ref",
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = [0] * num_blocks  # owners per block
        self.key_of: list[Hashable | None] = [None] * num_blocks  # prefix-cache key, if cached
        self.queue: list[int] = list(range(num_blocks))  # block ids, LRU first (with dead entries)
        self.dead: dict[int, int] = {}  # block -> its dead entries still queued (none: absent)
        self.head = 0  # index in `queue` of the first entry not yet consumed
        self.num_free = num_blocks
        self.cached: dict[Hashable, int] = {}
        self.groups: dict[Hashable, KeyGroup] = {}  # group key -> its cached blocks
        self.group_offset = [0] * num_blocks  # offset of a grouped block in its KeyGroup
        self.num_grouped = 0  # blocks cached in groups
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
        dead = dict(self.dead)
        out = []
        for b in self.queue[self.head:]:
            d = dead.get(b)
            if d:
                dead[b] = d - 1
            else:
                out.append(b)
        return out

    def allocate(self, n: int, record: bool = True) -> list[int]:
        """Pop `n` blocks from the LRU head, evicting any cached key they carry. `record=False`:
        for one owner that takes no reference count (see `record_owned`): they stay at 0."""
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} free KV blocks, {self.num_free} free")
        q = self.queue
        h = self.head
        # Take entries from the head, keeping the live ones (dead ones: revived blocks); each
        # round takes exactly as many entries as blocks are still missing.
        out: list[int] = []
        need = n
        while need:
            w = q[h:h + need]
            h += need
            if self.dead and not self.dead.keys().isdisjoint(w):
                w = self._live(w)
            if self.cached or self.groups:
                self._take(w, 1 if record else 0)
            elif record:  # (_take's no-key case, inlined: no block carries a key to evict)
                ref = self.ref
                for b in w:
                    ref[b] = 1
            if out:
                out += w
            else:  # (the first round, and mostly the only one: no copy)
                out = w
            need = n - len(out)
        self.head = h
        self.num_free -= n
        self.num_allocated += n
        if h >= self.compact_at and 2 * h >= len(q):
            self._compact()
        return out

    def _live(self, entries: list[int]) -> list[int]:
        """The live ones of consecutive queue entries, using up the dead ones' counts."""
        dead = self.dead
        out = []
        for b in entries:
            d = dead.get(b)
            if not d:
                out.append(b)
            elif d == 1:
                del dead[b]
            else:
                dead[b] = d - 1
        return out

    def _take(self, blocks: list[int], owners: int = 1) -> None:
        """Give each of `blocks` (free, popped) a reference (`owners` 0: an unrecorded owner),
        evicting the cached key it carries."""
        # A plain loop: CPython's specialised list/dict bytecodes beat map() over slot wrappers
        # here (measured: 2x on the conversation benchmark). Most of the cost per block is the
        # eviction's dict delete (a cache miss on a large table), inherent to reusing a block.
        ref, key_of, cached = self.ref, self.key_of, self.cached
        groups, offset = self.groups, self.group_offset
        if not cached and not groups:  # nothing is cached (yet): no block carries a key to evict
            for b in blocks:
                ref[b] = owners
            return
        ungrouped = 0
        num_keyed = len(cached)  # evictions of plain keys: what the loop deletes from `cached`
        for b in blocks:
            ref[b] = owners
            k = key_of[b]
            if k is not None:  # evict (invariant: cached[key_of[b]] == b)
                if k.__class__ is KeyGroup:  # (inlined _ungroup: the hot case)
                    k.blocks[offset[b]] = -1
                    k.num_cached -= 1
                    if not k.num_cached:
                        del groups[k.key]
                    ungrouped += 1
                else:
                    del cached[k]
                key_of[b] = None
        self.num_evictions += num_keyed - len(cached) + ungrouped
        self.num_grouped -= ungrouped

    def allocate_one(self, record: bool = True) -> int:
        """Pop one block (`record`: as in `allocate`)."""
        if self.num_free <= 0:
            raise RuntimeError("no free KV block (caller must check num_free first)")
        q = self.queue
        h = self.head
        b = q[h]
        while self.dead.get(b):  # a dead entry
            self._live([b])
            h += 1
            b = q[h]
        self.head = h + 1
        if self.cached or self.groups:
            self._take([b], 1 if record else 0)
        elif record:  # (_take's no-key case, for the one block of a decode at a block boundary)
            self.ref[b] = 1
        self.num_free -= 1
        self.num_allocated += 1
        if h + 1 >= self.compact_at and 2 * (h + 1) >= len(q):
            self._compact()
        return b

    def _ungroup(self, b: int, g: KeyGroup) -> None:
        g.blocks[self.group_offset[b]] = -1
        g.num_cached -= 1
        self.num_grouped -= 1
        if not g.num_cached:
            del self.groups[g.key]

    def cache_group(self, key: Hashable, size: int, first_offset: int, blocks: Sequence[int]) -> None:
        """Register full blocks at offsets first_offset.. of the group `key` (`size` blocks);
        first writer wins per offset. The blocks must not be registered yet."""
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = KeyGroup(key, size)
        gb, key_of, offset = g.blocks, self.key_of, self.group_offset
        end = first_offset + len(blocks)
        if gb[first_offset:end].count(-1) == len(blocks):  # all offsets free: the usual case
            gb[first_offset:end] = blocks
            for j, b in enumerate(blocks, first_offset):
                key_of[b] = g
                offset[b] = j
            n = len(blocks)
        else:
            n = 0
            for j, b in enumerate(blocks, first_offset):
                if gb[j] < 0:
                    gb[j] = b
                    key_of[b] = g
                    offset[b] = j
                    n += 1
        g.num_cached += n
        self.num_grouped += n

    def group_hits(self, key: Hashable, n: int) -> list[int]:
        """The cached blocks at offsets 0, 1, ... of group `key`, up to the first gap or n."""
        g = self.groups.get(key)
        if g is None:
            return []
        run = g.blocks[:n]
        return run[:run.index(-1)] if -1 in run else run

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (owned or free)."""
        return len(self.cached) + self.num_grouped

    def _compact(self) -> None:
        del self.queue[:self.head]
        self.head = 0

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-cache hits, reviving free ones out of the queue."""
        ref, dead = self.ref, self.dead
        revived = 0
        for b in blocks:
            if ref[b] == 0:
                dead[b] = dead.get(b, 0) + 1  # its queue entry is dead now
                revived += 1
            ref[b] += 1
        self.num_free -= revived
        self.num_revived += revived

    def num_unowned(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` are free (would leave the queue if touched)."""
        return list(map(self.ref.__getitem__, blocks)).count(0)

    def free_tail_first(self, blocks: Sequence[int]) -> int:
        """Drop one reference on each of `blocks` (distinct), last block first; those left
        unowned join the queue tail in that order, so a shared prefix's head is evicted
        last. Returns how many became free."""
        ref, q = self.ref, self.queue
        n = len(blocks)
        owners = itemgetter(*blocks)(ref) if n > 1 else ()
        ones = owners.count(1)
        if ones == n:  # the most usual case (no block shared): no slices to take
            for b in blocks:
                ref[b] = 0
            q += reversed(blocks)
        elif ones and owners[n - ones:].count(1) == ones:
            # the usual case: the blocks only this table holds are its tail (any shared ones,
            # prefix hits, come first and stay owned): one C-level check, a store per block
            for b in blocks[:n - ones]:
                ref[b] -= 1
            tail = blocks[n - ones:]
            for b in tail:
                ref[b] = 0
            q += reversed(tail)
            n = ones
        else:
            start = len(q)
            append = q.append
            for b in reversed(blocks):
                rc = ref[b] - 1
                ref[b] = rc
                if not rc:
                    append(b)
            n = len(q) - start
        self.num_free += n
        self.num_freed += n
        return n

    def free_owned(self, blocks: Sequence[int], recorded: bool = True) -> int:
        """`free_tail_first(blocks)` for blocks the caller alone holds (one reference each, as
        a request's whose blocks were never registered nor hit: no count of owners to read);
        `recorded=False`: taken without reference counts (`allocate(..., record=False)`), so
        none to drop either."""
        if recorded:
            ref = self.ref
            for b in blocks:
                ref[b] = 0
        self.queue += reversed(blocks)
        n = len(blocks)
        self.num_free += n
        self.num_freed += n
        return n

    def record_owned(self, blocks: Iterable[int]) -> None:
        """Blocks taken with `record=False` get the one reference of their owner (before it can
        share them: a block a second owner may touch must count its owners)."""
        ref = self.ref
        for b in blocks:
            ref[b] = 1

    def cache_blocks(self, blocks: Sequence[int], keys: Sequence[Hashable]) -> None:
        """Register full blocks under their keys (first writer wins: a block whose key is
        already cached stays uncached and becomes a plain free block later). The blocks
        must not be registered yet."""
        cached = self.cached
        key_of = self.key_of
        if len(keys) >= _SMALL and cached.keys().isdisjoint(keys):
            # keys are distinct within a request (its chain), so all are new: bulk insert
            cached.update(zip(keys, blocks))
            for b, h in zip(blocks, keys):
                key_of[b] = h
            return
        setdefault = cached.setdefault
        for b, h in zip(blocks, keys):
            if setdefault(h, b) == b:
                key_of[b] = h

    def cache_block(self, b: int, h: Hashable) -> None:
        """Register one full block under key `h` (first writer wins)."""
        # (setdefault: one hash of h, which a tuple key does not cache)
        if self.key_of[b] is None and self.cached.setdefault(h, b) == b:
            self.key_of[b] = h

    def keys_of(self, blocks: Iterable[int]) -> list:
        """`block_hash` of each of `blocks` (None where uncached)."""
        return list(map(self.key_of.__getitem__, blocks))

    def check_invariants(self, owners: dict[int, int], unrecorded: frozenset[int] | set[int] = frozenset()) -> None:
        """Raise AssertionError unless refcounts, free queue and cache table agree.

        `owners[block_id]` = how many request block tables hold that block, blocks taken
        without reference counts (`unrecorded`: one owner each, see `allocate`) left out.
        """
        ref = self.ref
        for b in range(self.num_blocks):
            want = owners.get(b, 0)
            assert ref[b] == want, f"block {b}: ref_cnt {ref[b]} != {want} owners"
        free_ids = self.free_block_ids()
        assert len(free_ids) == len(set(free_ids)), "a block is twice in the free queue"
        assert len(free_ids) == self.num_free, "free queue count is off"
        for b in free_ids:
            assert ref[b] == 0, f"block {b} in the free queue with ref_cnt {ref[b]}"
            assert b not in unrecorded, f"block {b} is owned (unrecorded) and in the free queue"
        for b in unrecorded:
            assert self.key_of[b] is None, f"block {b}, owned unrecorded, carries a prefix-cache key"
        n_zero = ref.count(0)
        assert n_zero == len(free_ids) + len(unrecorded), (
            f"{n_zero} blocks with ref 0 but {len(free_ids)} queued and {len(unrecorded)} owned unrecorded")
        # every queued entry of a block is dead but a free block's last one
        entries = Counter(self.queue[self.head:])
        for b, c in entries.items():
            assert c == self.dead.get(b, 0) + (ref[b] == 0), f"block {b}: {c} queue entries"
        assert all(b in entries and d > 0 for b, d in self.dead.items()), "a dead count without entries"
        for h, b in self.cached.items():
            assert self.key_of[b] == h, f"cache entry for block {b} has a stale key"
        n_grouped = 0
        for h, g in self.groups.items():
            assert g.key == h and g.num_cached == sum(b >= 0 for b in g.blocks) > 0
            for j, b in enumerate(g.blocks):
                if b >= 0:
                    assert self.key_of[b] is g and self.group_offset[b] == j, f"block {b}: stale group"
            n_grouped += g.num_cached
        assert n_grouped == self.num_grouped, "grouped block count is off"
        n_keyed = sum(1 for k in self.key_of if k is not None)
        assert n_keyed == self.num_cached_blocks, "a block carries a key the cache tables lack"
