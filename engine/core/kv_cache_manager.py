"""The KV cache manager: every request's KV blocks, the block pool and the prefix cache.

As vLLM's v1 `KVCacheManager` (`vllm/v1/core/kv_cache_manager.py`), re-derived: the
scheduler decides who runs and how many tokens; this manager answers whether the blocks
for them exist and keeps the tables. One per scheduler (per replica). No torch here.

- `get_computed_blocks(req)`: the longest cached prefix of `req` in full blocks (never the
  whole sequence: one token must be computed), keying its blocks on the first lookup.
- `allocate_slots(req, num_new, counts, ...)`: blocks for `num_new` more tokens after the
  prefix hits and any KV transferred in; None if the pool cannot. Registers the blocks the
  step fills with known tokens (not drafts) in the prefix cache (first writer wins).
- `cache_full_blocks`, `cache_decoded`: register blocks a decode completed.
- `allocate_decode_block(req)`: the one-block allocation of a plain decode at a block
  boundary (the hot path), `allocate_blocks(n)`: blocks popped in free-queue order.
- `free(req)`: give its blocks back, tail first (its cached full blocks stay findable until
  evicted); `free_tail(req, keep)`: the rejected drafts' blocks.
- `hold(req)` / `release(request_id)`: a finished request's blocks kept for a P/D transfer.
- Stats: `num_free_blocks`, `usage`, `num_blocks_hashed`, `block_stats()`, `ref_counts`.

The per-request KV fields live on the request record (`SchedulerRequest.block_ids`,
`block_hashes`, `hash_chain`, `num_cached_blocks`, `failed_admission_*`); only this
manager changes them. `counts` arguments are the step's record (a `SchedulerOutput`, or
skip-ahead's `DecodeAdvance`): the manager adds its `num_blocks_allocated`,
`num_blocks_hashed` and `num_blocks_freed`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from functools import partial
from itertools import islice, takewhile

from engine.core.block_keys import GEN_TAG, NO_GEN_KEYS, BlockKeys, HashIdKeys, TokenKeys
from engine.core.block_pool import BlockPool
from engine.core.request_state import SchedulerRequest

_not_none = partial(operator.is_not, None)


class KVCacheManager:
    """Blocks, prefix cache and held blocks of one scheduler. See the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 hash_algo: str = "builtin") -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, block_size)
        self.caching = enable_caching
        self.token_keys = TokenKeys(block_size, hash_algo)  # requests with token ids (engine)
        self.hash_id_keys = HashIdKeys(block_size, hash_algo)  # requests with hash ids (simulator)
        self.held: dict[int, SchedulerRequest] = {}  # finished, blocks kept until release()
        self.num_blocks_hashed = 0  # blocks keyed, cumulative

    def key_strategy(self, has_token_ids: bool) -> BlockKeys:
        """How a request's blocks are keyed: by token ids (engine) or by hash ids (simulator)."""
        return self.token_keys if has_token_ids else self.hash_id_keys

    # ------------------------------------------------------------------ stats

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def ref_counts(self) -> list[int]:
        """Owners per block id (read only), less requests private from their first block, whose
        blocks count 0 while they hold them (see `set_private_from`)."""
        return self.pool.ref

    def usage(self) -> float:
        """Fraction of KV blocks owned by requests (vllm:kv_cache_usage_perc); O(1). (BlockPool.usage's
        expression, inlined: a skip-ahead reads it per segment)"""
        pool = self.pool
        return 1.0 - pool.num_free / pool.num_blocks

    def change_counters(self) -> tuple[int, int, int]:
        """(allocated, freed, revived) block counts, cumulative: any change of a block's
        owners moves one of them."""
        pool = self.pool
        return pool.num_allocated, pool.num_freed, pool.num_revived

    def block_stats(self) -> dict[str, int | float]:
        """The pool's counters under `SchedulerStats`' names."""
        pool = self.pool
        return {
            "num_evictions": pool.num_evictions,
            "num_blocks_allocated": pool.num_allocated,
            "num_blocks_freed": pool.num_freed,
            "num_blocks_revived": pool.num_revived,
            "num_blocks_hashed": self.num_blocks_hashed,
            "num_cached_blocks": pool.num_cached_blocks,
            "num_free_blocks": pool.num_free,
            "num_gpu_blocks": pool.num_blocks,
            "kv_usage": pool.usage(),
            "num_held_requests": len(self.held),
            "num_held_blocks": sum(len(r.block_ids) for r in self.held.values()),
        }

    # ------------------------------------------------------------------ lookup

    def _key_blocks(self, r: SchedulerRequest, n: int) -> int:
        """Make sure `r.block_hashes` covers its first `n` full blocks; returns (and counts)
        the blocks keyed now."""
        i = len(r.block_hashes)
        if i >= n:
            return 0
        if r.private_from == 0 and n <= r.gen_keys_from:
            # prompt blocks of a request private from the first: None each (HashIdKeys.append_keys
            # gives no key to a private block before a preemption), without the strategy's calls
            r.block_hashes += [None] * (n - i)
        else:
            r.keys.append_keys(r, i, n)
        self.num_blocks_hashed += n - i
        return n - i

    def get_computed_blocks(self, r: SchedulerRequest) -> tuple[list[int], int]:
        """Longest cached prefix of `r` in full blocks, leaving at least one token to compute.
        Returns (hit blocks, blocks hashed now); ([], 0) without prefix caching. Like vLLM,
        all full blocks up to that limit are hashed on the first lookup (later lookups
        reuse the hashes)."""
        m = (r.num_tokens - 1) // self.block_size
        if m <= 0 or not self.caching:
            return [], 0
        hashed = self._key_blocks(r, m)
        if r.private_from == 0:  # every block of it private (set_private_from): none can be hit
            return [], hashed
        if r.group_size:
            return self._lookup_grouped(r, m, r.group_size), hashed
        keys = r.block_hashes
        get = self.pool.cached.get
        prev = r.failed_admission_hits
        if prev is not None:
            # A queue head that could not be admitted is looked up again every step. If
            # its previous hits are all still registered under their keys, the scan would
            # return them again: check that (3x cheaper than probing the table; free when
            # nothing was evicted since, as only an eviction unregisters a key) and scan
            # only past them.
            n = len(prev)
            if n <= m and (r.failed_admission_evictions == self.pool.num_evictions
                           or self.pool.keys_of(prev) == keys[:n]):
                return prev + list(takewhile(_not_none, map(get, islice(keys, n, m)))), hashed
        # C-level scan: stop at the first key not in the cache
        return list(takewhile(_not_none, map(get, islice(keys, m)))), hashed

    def _lookup_grouped(self, r: SchedulerRequest, m: int, per: int) -> list[int]:
        """`get_computed_blocks`' scan when the prompt's blocks are cached per hash block
        (`per` blocks each, see HashIdKeys): group by group, then the request's own
        generated blocks."""
        pool = self.pool
        in_prompt = min(m, r.prompt_len // self.block_size)
        hits: list[int] = []
        chain = r.hash_chain
        for h in range(-(-in_prompt // per)):
            if h == len(chain):  # a private hash block: no key yet, as none of them is cached
                return hits
            want = min(per, in_prompt - h * per)
            run = pool.group_hits(chain[h], want)
            hits += run
            if len(run) < want:
                return hits
        if m > in_prompt:
            hits += takewhile(_not_none, map(pool.cached.get, islice(r.block_hashes, in_prompt, m)))
        return hits

    def note_blocked(self, r: SchedulerRequest, hits: list[int] | None) -> None:
        """`r` was not admitted with prefix hits `hits` (None: forget them), so that its next
        lookup may reuse them while nothing was evicted."""
        r.failed_admission_hits = hits
        if hits is not None:
            r.failed_admission_evictions = self.pool.num_evictions

    # ------------------------------------------------------------------ cache

    def cache_full_blocks(self, r: SchedulerRequest, num_full: int) -> int:
        """Register blocks [r.num_cached_blocks, num_full) of `r`; returns blocks hashed.
        First writer wins: a block whose content is already cached stays unregistered.
        Blocks from `r.private_from` on are counted now (their keys made: see _key_only),
        registered only if `r` is preempted (see `set_private_from`)."""
        lazy = r.private_from
        if lazy is not None and num_full > lazy:
            start = r.num_cached_blocks
            if start >= r.gen_keys_from:  # (a private decode's blocks: _key_only's count, inlined)
                if start >= num_full:
                    return 0
                self.num_blocks_hashed += num_full - start
                r.num_cached_blocks = num_full
                return num_full - start
            hashed = self.cache_full_blocks(r, lazy) if start < lazy else 0
            return hashed + self._key_only(r, num_full)
        start = r.num_cached_blocks
        keys = self._key_generated(r, num_full) if start >= r.gen_keys_from else None
        if keys is not None:
            if len(keys) == 1:
                self.pool.cache_block(r.block_ids[start], keys[0])
            else:
                self.pool.cache_blocks(r.block_ids[start:num_full], keys)
            return len(keys)
        hashed = self._key_blocks(r, num_full)
        if r.group_size and start < r.prompt_len // self.block_size:
            start = self._cache_grouped(r, start, num_full, r.group_size)
            if start == num_full:
                r.num_cached_blocks = num_full
                return hashed
        # blocks past num_cached_blocks are never registered yet (fresh allocations)
        if num_full - start == 1:
            self.pool.cache_block(r.block_ids[start], r.block_hashes[start])
        else:
            self.pool.cache_blocks(r.block_ids[start:num_full], r.block_hashes[start:num_full])
        r.num_cached_blocks = num_full
        return hashed

    def _key_generated(self, r: SchedulerRequest, num_full: int) -> list[tuple] | None:
        """The hot case of `cache_full_blocks` (a simulated decode completing blocks): when all
        of `r`'s blocks [r.num_cached_blocks, num_full) hold generated tokens keyed
        (GEN_TAG, request_id, index) and are not keyed yet, key them here (no key strategy
        calls), count them and mark them cached; returns their keys for the caller to
        register. None otherwise (nothing done)."""
        start = r.num_cached_blocks
        if start < r.gen_keys_from or len(r.block_hashes) != start:
            return None
        rid = r.request_id
        if num_full - start == 1:  # (a list display: no comprehension frame for the usual one)
            keys = [(GEN_TAG, rid, start)]
        else:
            keys = [(GEN_TAG, rid, i) for i in range(start, num_full)]
        r.block_hashes += keys
        self.num_blocks_hashed += num_full - start
        r.num_cached_blocks = num_full
        return keys

    def _key_only(self, r: SchedulerRequest, num_full: int) -> int:
        """`cache_full_blocks`' keying and counting of blocks [r.num_cached_blocks, num_full),
        without registering them (private blocks); returns blocks hashed. Blocks of generated
        tokens are counted, not keyed: their keys are made only if `r` is preempted
        (`_register_private`), as nothing reads them before."""
        start = r.num_cached_blocks
        if start >= num_full:
            return 0
        if start >= r.gen_keys_from:
            self.num_blocks_hashed += num_full - start
            r.num_cached_blocks = num_full
            return num_full - start
        hashed = self._key_blocks(r, num_full)
        r.num_cached_blocks = num_full
        return hashed

    def set_private_from(self, r: SchedulerRequest, first_unshared: int | None) -> None:
        """The caller knows the whole workload (a simulator) and that no other request holds
        the content of `r`'s blocks from `first_unshared` on (its prompt's hash ids from there,
        and its generated tokens, keyed by its own id). Only `r` itself could then hit them,
        after a preemption: they are registered when that happens (`free`), which registers
        exactly what registering them as they filled would have (nobody else has their keys,
        and they are `r`'s since), and never when `r` finishes. Hits, schedules and
        preemptions stay those of eager registration; the prefix-cache tables are smaller
        (`num_cached_blocks`, `num_evictions` count less). Only for requests keyed by hash ids
        whose hash blocks tile the KV block, that hold no blocks on finish nor take KV in.

        The keys of such a request's private blocks are made lazily too: its prompt's are None
        until then (HashIdKeys), its generated blocks' are not in `block_hashes` at all (which
        ends at the first of them; `num_cached_blocks` counts them) until `_register_private`
        appends them: they are counted in `num_blocks_hashed` as they fill all the same.

        A request private from its first block (`private_from == 0`) is its blocks' only
        possible owner: nothing can hit them. Its ownership is not counted: they are taken with
        `record=False` and stay at 0 in `ref_counts` (a reference count per block less, taken
        and dropped, for every block of such a request), until a preemption counts it
        (`free`)."""
        if (first_unshared is not None and r.token_ids is None and r.gen_keys_from != NO_GEN_KEYS
                and not r.hold_blocks_on_finish and not r.num_external_computed_tokens
                and r.num_preemptions == 0 and not r.block_ids):
            r.private_from = min(first_unshared, r.gen_keys_from)

    def _register_private(self, r: SchedulerRequest) -> None:
        """Register `r`'s private blocks computed so far (it is being preempted), as eager
        registration would have; from now on its blocks register as they fill."""
        lazy = r.private_from
        r.private_from = None
        r.keys.fill_private(r, lazy)
        end = r.num_cached_blocks
        keyed = len(r.block_hashes)
        if end > keyed:  # generated blocks, counted but not keyed while private (see _key_only)
            rid = r.request_id
            r.block_hashes += [(GEN_TAG, rid, i) for i in range(keyed, end)]
        if end > lazy:
            r.num_cached_blocks = lazy
            self.cache_full_blocks(r, end)  # keys exist: nothing is hashed (or counted) again

    def count_private_completed(self, n: int) -> None:
        """n generated blocks of private requests were completed (a decode stretch counts them
        in bulk, and sets those requests' `num_cached_blocks` itself): counted as hashed, keyed
        only if their request is preempted (see `_key_only`)."""
        self.num_blocks_hashed += n

    def cache_decoded(self, completed: list[tuple[SchedulerRequest, int]]) -> int:
        """`cache_full_blocks(r, num_full)` for each (r, num_full) of a decode stretch, the
        blocks of generated tokens of them all registered in one call (no lookup comes in
        between, and their keys are distinct: each holds its request's id). Returns blocks
        hashed."""
        blocks: list[int] = []
        keys: list[tuple] = []
        hashed = private = 0
        for r, num_full in completed:
            start = r.num_cached_blocks
            lazy = r.private_from
            if lazy is not None and lazy <= start and r.gen_keys_from <= start:
                # the hot case, inlined: generated blocks of a private request, counted as
                # _key_only does, keyed and registered only if r is preempted (set_private_from)
                r.num_cached_blocks = num_full
                private += num_full - start
                continue
            new = self._key_generated(r, num_full)
            if new is None:
                hashed += self.cache_full_blocks(r, num_full)
            else:
                blocks += r.block_ids[start:num_full]
                keys += new
        self.num_blocks_hashed += private
        if keys:
            self.pool.cache_blocks(blocks, keys)
        return hashed + private + len(keys)

    def _cache_grouped(self, r: SchedulerRequest, start: int, num_full: int, per: int) -> int:
        """Register `r`'s prompt blocks from `start` (below num_full) in their hash blocks'
        groups; returns the first block left (generated tokens, keyed per block)."""
        stop = min(num_full, r.prompt_len // self.block_size)
        chain, table = r.hash_chain, r.block_ids
        i = start
        while i < stop:
            h = i // per
            end = min(stop, (h + 1) * per)
            self.pool.cache_group(chain[h], per, i - h * per, table[i:end])
            i = end
        return stop

    # ------------------------------------------------------------------ allocate, free

    def allocate_slots(
        self, r: SchedulerRequest, num_new: int, counts, num_spec: int = 0,
        hits: Sequence[int] = (), num_external: int = 0,
    ) -> list[int] | None:
        """Give `r` the slots for `num_new` more tokens (after its prefix hits `hits` and
        `num_external` tokens whose KV was transferred in); returns the new blocks, or None
        (nothing changed) if the pool cannot. Caches the blocks this step fills with known
        tokens (not with the `num_spec` drafts)."""
        bs = self.block_size
        pool = self.pool
        computed = r.num_computed_tokens + len(hits) * bs + num_external
        need = max(-(-(computed + num_new) // bs) - len(r.block_ids) - len(hits), 0)
        free = pool.num_free
        if need > free:
            return None
        # hits that sit free in the queue leave it too; count them only when it matters
        if hits and need + len(hits) > free and need + pool.num_unowned(hits) > free:
            return None
        if hits:
            pool.touch(hits)
            r.block_ids.extend(hits)
            r.num_cached_blocks = len(r.block_ids)
        new = pool.allocate(need, r.private_from != 0) if need else []
        if need:
            r.block_ids.extend(new)
            counts.num_blocks_allocated += need
        if self.caching:
            num_full = (computed + num_new - num_spec) // bs
            if num_full > r.num_cached_blocks:
                counts.num_blocks_hashed += self.cache_full_blocks(r, num_full)
        return new

    def allocate_decode_block(self, r: SchedulerRequest) -> int | None:
        """A plain decode at a block boundary: append a free block to `r`'s table and return
        it; None if none is free."""
        if not self.pool.num_free:
            return None
        b = self.pool.allocate_one(r.private_from != 0)
        r.block_ids.append(b)
        return b

    def allocate_blocks(self, n: int, record: bool = True) -> list[int]:
        """Pop `n` free blocks in free-queue order (skip-ahead appends them to tables);
        `record=False`: for requests private from their first block, and those given to any
        other request then go to `record_owned` (see `set_private_from`)."""
        return self.pool.allocate(n, record)

    def record_owned(self, blocks: list[int]) -> None:
        """Give blocks taken with `allocate_blocks(n, record=False)` for a request that counts
        its blocks' owners (not private from the first) their one reference."""
        self.pool.record_owned(blocks)

    def free(self, r: SchedulerRequest) -> int:
        """Free all of `r`'s blocks, tail first (registering its private ones first: it may
        come back, see `set_private_from`); returns how many became free."""
        if r.private_from is not None:
            if r.private_from == 0:  # its blocks' owner (r) is counted from now on
                self.pool.record_owned(r.block_ids)
            self._register_private(r)
        return self._free_table(r)

    def _free_table(self, r: SchedulerRequest) -> int:
        # all of a request's blocks private from the first: nobody else can have hit any, and
        # none counts its owner (see set_private_from)
        freed = (self.pool.free_owned(r.block_ids, recorded=False) if r.private_from == 0
                 else self.pool.free_tail_first(r.block_ids))
        r.block_ids = []  # a new list: earlier outputs keep the table they were given
        r.num_cached_blocks = 0
        return freed

    def free_tail(self, r: SchedulerRequest, keep: int) -> int:
        """Free `r`'s blocks past its first `keep` (rejected drafts' slots)."""
        if len(r.block_ids) <= keep:
            return 0
        tail = r.block_ids[keep:]
        del r.block_ids[keep:]
        if r.private_from == 0:  # (its own, uncounted: see set_private_from)
            return self.pool.free_owned(tail, recorded=False)
        return self.pool.free_tail_first(tail)

    def free_or_hold(self, r: SchedulerRequest) -> int:
        """Free a finishing request's blocks, or hold them for its KV transfer."""
        if r.hold_blocks_on_finish:
            self.held[r.request_id] = r
            return 0
        return self._free_table(r)  # finished: its private blocks are never looked up again

    def release(self, request_id: int) -> int | None:
        """Free a held request's blocks; returns how many became free, None if it holds none."""
        r = self.held.pop(request_id, None)
        return None if r is None else self.free(r)

    def check_invariants(self, running: Iterable[SchedulerRequest],
                         waiting: Iterable[SchedulerRequest] = ()) -> None:
        """AssertionError unless each running request's block table fits its computed tokens,
        waiting ones hold no KV, and the running and held requests' references are every
        block's refcount (the blocks of requests private from the first: owned uncounted, by
        them alone). O(all blocks): for tests."""
        owners: dict[int, int] = {}
        unrecorded: set[int] = set()
        bs = self.block_size
        for r in running:
            rid = r.request_id
            assert len(r.block_ids) == -(-r.num_computed_tokens // bs), (
                f"request {rid}: {len(r.block_ids)} blocks for {r.num_computed_tokens} tokens")
            assert r.num_cached_blocks <= len(r.block_ids)
            assert len(set(r.block_ids)) == len(r.block_ids), f"request {rid}: dup block"
            if r.private_from == 0:
                unrecorded.update(r.block_ids)
                continue
            for bid in r.block_ids:
                owners[bid] = owners.get(bid, 0) + 1
        for r in waiting:
            assert not r.block_ids and r.num_computed_tokens == 0, (
                f"waiting request {r.request_id} holds KV")
        for r in self.held.values():
            assert r.status == "finished", f"held request {r.request_id} has status {r.status}"
            for bid in r.block_ids:
                owners[bid] = owners.get(bid, 0) + 1
        assert not unrecorded & owners.keys(), "a block owned uncounted has another owner"
        self.pool.check_invariants(owners, unrecorded)


__all__ = ["KVCacheManager"]
