"""Lazy private blocks against a plain eager model of the prefix cache, written here.

The KV cache manager told which blocks no other request can hit (`set_private_from`) keys and
registers them only when their request is preempted: its private prompt blocks' keys are None
and its generated blocks' keys are absent until then. `EagerCache` is the straightforward scheme
it must stay equivalent to: every full block keyed (by its whole prefix of hash ids, or by
(request, index) for generated tokens) and registered as it fills, blocks in a plain list as the
LRU free queue. Random request streams (shared prefixes, a pool small enough to evict and
preempt) are driven through both; after every operation they agree on the prefix hits, the
blocks handed out, the blocks hashed and, for the prefix-cache table and its evictions, on every
block the lazy scheme registers: shared blocks, and private ones of a request once preempted
(the blocks of a request that finishes unpreempted are never looked up again); and on the blocks'
owner counts, but for a request private from its first block, whose blocks count none until it
is preempted (it is their only possible owner).
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.block_keys import first_unshared_hash_blocks
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request
from engine.core.request_state import SchedulerRequest


class EagerCache:
    """Refcounts, an LRU free list, a key -> block table, every full block registered as it fills."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.bs = block_size
        self.ref = [0] * num_blocks
        self.free = list(range(num_blocks))  # head first
        self.table: dict[tuple, int] = {}
        self.key_of: dict[int, tuple] = {}
        self.evicted: list[tuple] = []
        self.hashed = 0
        self.blocks: dict[int, list[int]] = {}  # per request
        self.keyed: dict[int, int] = {}  # per request: blocks keyed so far (kept on preemption)
        self.registered: dict[int, int] = {}  # per request: leading blocks registered

    def key(self, req: Request, i: int) -> tuple:
        if (i + 1) * self.bs <= req.prompt_len:  # the whole prefix of hash ids (hash block = KV block)
            return ("prompt", *req.hash_ids[:i + 1])
        return ("generated", req.request_id, i)

    def _key_upto(self, req: Request, n: int) -> None:
        k = self.keyed.get(req.request_id, 0)
        if n > k:
            self.hashed += n - k
            self.keyed[req.request_id] = n

    def lookup(self, req: Request, num_tokens: int) -> list[int]:
        m = (num_tokens - 1) // self.bs
        if m <= 0:
            return []
        self._key_upto(req, m)
        hits = []
        for i in range(m):
            b = self.table.get(self.key(req, i))
            if b is None:
                break
            hits.append(b)
        return hits

    def allocate(self, req: Request, num_tokens_after: int, hits: list[int]) -> list[int] | None:
        """Blocks for `num_tokens_after` KV tokens after taking `hits`; None if the pool cannot."""
        rid = req.request_id
        table = self.blocks.setdefault(rid, [])
        need = max(-(-num_tokens_after // self.bs) - len(table) - len(hits), 0)
        if need + sum(self.ref[b] == 0 for b in hits) > len(self.free):
            return None
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        table += hits
        if hits:
            self.registered[rid] = len(table)
        new = []
        for _ in range(need):
            b = self.free.pop(0)
            k = self.key_of.pop(b, None)
            if k is not None:
                del self.table[k]
                self.evicted.append(k)
            self.ref[b] = 1
            new.append(b)
        table += new
        num_full = num_tokens_after // self.bs
        self._key_upto(req, num_full)
        for i in range(self.registered.get(rid, 0), num_full):
            k = self.key(req, i)
            if k not in self.table:  # first writer wins
                self.table[k] = table[i]
                self.key_of[table[i]] = k
        self.registered[rid] = max(self.registered.get(rid, 0), num_full)
        return new

    def free_all(self, req: Request) -> None:
        for b in reversed(self.blocks.pop(req.request_id, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        self.registered[req.request_id] = 0


class Driver:
    """The lazy manager and the eager model side by side, moved by the same operations."""

    def __init__(self, reqs: list[Request], num_blocks: int, bs: int) -> None:
        self.kv = KVCacheManager(num_blocks, bs)
        self.model = EagerCache(num_blocks, bs)
        self.bs = bs
        unshared = first_unshared_hash_blocks(reqs)
        keys = self.kv.key_strategy(False)
        self.recs = {}
        for i, q in enumerate(reqs):
            r = SchedulerRequest(q, None, (), i, keys)
            self.kv.set_private_from(r, unshared[q.request_id])
            assert r.private_from is not None  # every block past the shared prefix is private
            self.recs[q.request_id] = r
        self.req = {q.request_id: q for q in reqs}
        self.waiting = [q.request_id for q in reqs]
        self.running: list[int] = []
        self.preempted: set[int] = set()  # requests preempted at least once
        self.private_from = {rid: r.private_from for rid, r in self.recs.items()}
        self.counts = SimpleNamespace(num_blocks_allocated=0, num_blocks_hashed=0)

    def admit(self) -> None:
        if not self.waiting:
            return
        rid = self.waiting[0]
        r, q = self.recs[rid], self.req[rid]
        hits, _ = self.kv.get_computed_blocks(r)
        assert hits == self.model.lookup(q, r.num_tokens)
        new = self.kv.allocate_slots(r, r.num_tokens - len(hits) * self.bs, self.counts, 0, hits)
        assert new == self.model.allocate(q, r.num_tokens, hits)
        if new is None:
            return
        self.waiting.pop(0)
        self.running.append(rid)
        r.num_computed_tokens = r.num_tokens
        self._sample(rid)

    def decode(self) -> None:
        for rid in list(self.running):
            if rid not in self.running:  # preempted to make room for an earlier one
                continue
            r, q = self.recs[rid], self.req[rid]
            while True:
                new = self.kv.allocate_slots(r, 1, self.counts)
                assert new == self.model.allocate(q, r.num_computed_tokens + 1, [])
                if new is not None:
                    break
                victim = self.running[-1]
                self.preempt(victim)
                if victim == rid:
                    break
            if new is not None:
                r.num_computed_tokens += 1
                self._sample(rid)

    def preempt(self, rid: int | None = None) -> None:
        if not self.running:
            return
        rid = self.running[-1] if rid is None else rid
        r = self.recs[rid]
        self.running.remove(rid)
        self.kv.free(r)
        self.model.free_all(self.req[rid])
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        self.preempted.add(rid)
        self.waiting.insert(0, rid)

    def _sample(self, rid: int) -> None:
        r = self.recs[rid]
        r.num_generated += 1
        r.num_tokens += 1
        if r.num_generated >= r.output_len:
            self.running.remove(rid)
            self.kv.free_or_hold(r)
            self.model.free_all(self.req[rid])

    def visible(self, key: tuple) -> bool:
        """Whether the lazy scheme registers this key: a shared prompt block's, or any of a
        request once preempted."""
        if key[0] == "generated":
            return key[1] in self.preempted
        n = len(key) - 1  # the block's index + 1
        return any(
            n <= self.private_from[rid] or rid in self.preempted
            for rid, q in self.req.items() if n * self.bs <= q.prompt_len and q.hash_ids[:n] == key[1:])

    def check(self) -> None:
        kv, model = self.kv, self.model
        assert kv.pool.free_block_ids() == model.free
        # a request private from its first block owns its blocks uncounted (refcount 0) until preempted
        want_ref = list(model.ref)
        for r in self.recs.values():
            if r.private_from == 0:
                for b in r.block_ids:
                    assert want_ref[b] == 1
                    want_ref[b] = 0
        assert kv.pool.ref == want_ref
        kv.check_invariants([self.recs[rid] for rid in self.running],
                            [self.recs[rid] for rid in self.waiting])
        assert kv.num_blocks_hashed == model.hashed
        want = {b for k, b in model.table.items() if self.visible(k)}
        assert set(kv.pool.cached.values()) == want
        assert kv.pool.num_evictions == sum(map(self.visible, model.evicted))
        for rid, r in self.recs.items():
            assert r.block_ids == model.blocks.get(rid, [])


streams = st.lists(st.tuples(st.integers(1, 30),  # prompt length
                             st.integers(1, 14),  # output length
                             st.integers(0, 2),  # prefix family
                             st.integers(0, 5)),  # leading hash ids shared with the family
                   min_size=1, max_size=10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=streams, bs=st.sampled_from([1, 2, 4]), num_blocks=st.integers(6, 40),
       ops=st.lists(st.sampled_from(["admit", "admit", "decode", "decode", "decode", "preempt"]),
                    min_size=1, max_size=80))
def test_lazy_private_blocks_hit_evict_and_preempt_as_eager_registration(specs, bs, num_blocks, ops):
    reqs = []
    for rid, (p, o, fam, shared) in enumerate(specs):
        ids = tuple(fam * 100 + j if j < shared else 10_000 + rid * 100 + j for j in range(-(-p // bs)))
        reqs.append(Request(rid, 0.0, p, o, ids, hash_block_size=bs))
    d = Driver(reqs, num_blocks, bs)
    for op in ops:
        getattr(d, op)()
        d.check()


def test_the_model_comparison_sees_preempted_private_blocks_hit_again():
    """The streams exercise what the lazy scheme defers: a preempted request's private blocks
    (prompt and generated) registered on preemption and hit at its re-admission."""
    bs = 2
    reqs = [Request(0, 0.0, 12, 9, tuple(range(6)), hash_block_size=bs),
            Request(1, 0.0, 8, 3, (0, 1, 50, 51), hash_block_size=bs)]
    d = Driver(reqs, 14, bs)
    assert d.private_from == {0: 2, 1: 2}
    d.admit()
    for _ in range(4):
        d.decode()
        d.check()
    d.preempt()  # request 0: 8 full blocks (6 of prompt, 2 generated) registered now
    d.check()
    assert len(d.kv.pool.cached) == 8
    d.admit()
    d.check()
    r = d.recs[0]
    assert r.num_preemptions == 1 and len(r.block_ids) == 9 and d.running == [0]
    # its re-admission hit all 8 of its full blocks: only the last, partial one was allocated
    assert d.counts.num_blocks_allocated == 6 + 2 + 1
