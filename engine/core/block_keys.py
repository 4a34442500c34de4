"""Prefix-cache keys of a request's KV blocks: one strategy object per kind of content.

`TokenKeys` (the engine: requests with token ids) keys a block by a chained hash of its
token ids (+ extra keys). `HashIdKeys` (the simulator: no token ids) takes block content
from the request's hash ids. Both append to `req.block_hashes` (the keys of its first full
blocks, kept across preemptions); the scheduler counts every block keyed in
`num_blocks_hashed` (the per-block hashing work a real engine pays), whichever shortcut
the simulator takes.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from typing import Protocol

from engine.core.block_pool import make_block_hasher, make_bytes_hasher, pack_extra, root_hash

# Content key tag for blocks that hold generated tokens in the simulator (no token ids):
# such a block is keyed by (GEN_TAG, request_id, block index), so only the request that
# produced it (e.g. after a preemption) can hit it. Hash ids are non-negative.
GEN_TAG = -1
NO_GEN_KEYS = 1 << 62  # a block index no request reaches

class KeyedRequest(Protocol):
    """What a key strategy reads (and, for the two key lists, fills) of a request."""

    request_id: int
    prompt_len: int
    hash_ids: Sequence[int]
    hash_block_size: int
    token_ids: list[int] | None
    extra_keys: tuple[int, ...]
    block_hashes: list[Hashable]  # keys of the request's first full blocks
    hash_chain: list[Hashable]  # HashIdKeys: chained hash per hash block
    private_from: int | None  # blocks from here are private (KVCacheManager.set_private_from)


class BlockKeys:
    """Shared set-up: block size and the chained hasher of `prefix_caching_hash_algo`."""

    def __init__(self, block_size: int, algo: str) -> None:
        self.block_size = block_size
        self.hasher = make_block_hasher(algo)
        self.builtin = algo == "builtin"  # Python's hash of a tuple, inlined in the loops
        self.int_chain = algo != "sha256"  # chain hashes are ints
        self.bytes_hasher = None if self.builtin else make_bytes_hasher(algo)
        self.root = root_hash(algo)

    def group_size(self, r: KeyedRequest) -> int:
        """KV blocks per cache group for `r`'s prompt blocks (see HashIdKeys); 0: per block."""
        return 0

    def gen_keys_from(self, r: KeyedRequest) -> int:
        """The first block of `r` keyed by the plain tuple (GEN_TAG, request_id, index) (see
        HashIdKeys); `NO_GEN_KEYS` when none is."""
        return NO_GEN_KEYS

    def append_keys(self, r: KeyedRequest, start: int, stop: int) -> None:
        """Append the keys of `r`'s full blocks [start, stop) to `r.block_hashes` (which
        holds the first `start`)."""
        raise NotImplementedError

    def fill_private(self, r: KeyedRequest, first: int) -> None:
        """Compute the keys `append_keys` left out of `r`'s blocks from `first` on (private
        blocks, see KVCacheManager.set_private_from; only HashIdKeys leaves any out)."""

    def _chain(self, r: KeyedRequest, contents: list[tuple]) -> None:
        """Append H(parent, content, extra) per content to r.block_hashes, chained."""
        hashes = r.block_hashes
        parent = hashes[-1] if hashes else self.root
        extra = r.extra_keys
        append = hashes.append
        if self.builtin:
            for key in contents:
                parent = hash((parent, key, extra))
                append(parent)
        else:
            hasher = self.hasher
            for key in contents:
                parent = hasher(parent, key, extra)
                append(parent)


class TokenKeys(BlockKeys):
    """Keys from token ids: block i's key chains the ids of tokens [i*bs, (i+1)*bs)."""

    def append_keys(self, r: KeyedRequest, start: int, stop: int) -> None:
        bs = self.block_size
        t = r.token_ids
        if self.builtin:
            self._chain(r, [tuple(t[i * bs:(i + 1) * bs]) for i in range(start, stop)])
            return
        # pack the whole run of token ids once, hash byte slices of it
        step = 8 * bs
        buf = array("q", t[start * bs:stop * bs]).tobytes()
        extra = pack_extra(r.extra_keys)
        hb = self.bytes_hasher
        hashes = r.block_hashes
        parent = hashes[-1] if hashes else self.root
        for off in range(0, len(buf), step):
            parent = hb(parent, buf[off:off + step], extra)
            hashes.append(parent)


class HashIdKeys(BlockKeys):
    """Keys from hash ids (no token ids). A block wholly inside the prompt is keyed by the
    hash ids it covers; a block holding generated tokens by (GEN_TAG, request_id, index).

    When hash blocks are whole multiples of the KV block (Mooncake: 512 vs 16), the prompt's
    blocks are cached per hash block (`group_size`): the chain is hashed once per hash block
    (`r.hash_chain[h]` = H(chain[h-1], hash_ids[h], extra)) and KV block i inside hash block
    h is cached at offset i mod group_size of the pool's group chain[h]: equal entries iff
    equal whole prefixes, as with per-block chaining, at 1/32 of the hashing and one table
    entry per hash block. `r.block_hashes` then holds None for those blocks (their keys live
    in the chain)."""

    def group_size(self, r: KeyedRequest) -> int:
        per, rest = divmod(r.hash_block_size, self.block_size)
        return per if per > 1 and not rest else 0

    def gen_keys_from(self, r: KeyedRequest) -> int:
        # blocks past the prompt, unless hash blocks do not tile KV blocks (chained keys then)
        return NO_GEN_KEYS if r.hash_block_size % self.block_size else r.prompt_len // self.block_size

    def append_keys(self, r: KeyedRequest, start: int, stop: int) -> None:
        bs = self.block_size
        if r.hash_block_size % bs:
            self._chain(r, [self._content(r, i) for i in range(start, stop)])
            return
        in_prompt = r.prompt_len // bs  # blocks wholly inside the prompt
        if start >= in_prompt and stop - start == 1:  # a decode completing a block: the hot case
            r.block_hashes.append((GEN_TAG, r.request_id, start))
            return
        in_prompt = min(stop, in_prompt)
        if start < in_prompt:
            per = r.hash_block_size // bs
            # private blocks (see KVCacheManager.set_private_from) get their keys only if their
            # request is preempted (`fill_private`): None until then, which no lookup finds
            real = in_prompt if r.private_from is None else min(in_prompt, r.private_from)
            chain = self._extend_chain(r, -(-real // per))
            if per > 1:
                r.block_hashes += [None] * (in_prompt - start)
            else:
                r.block_hashes += chain[start:real]
                r.block_hashes += [None] * (in_prompt - max(start, real))
        gen_from = max(start, in_prompt)
        if stop > gen_from:
            rid = r.request_id
            r.block_hashes += [(GEN_TAG, rid, i) for i in range(gen_from, stop)]

    def fill_private(self, r: KeyedRequest, first: int) -> None:
        """Compute the keys `append_keys` left out of `r`'s prompt blocks from `first` on (they
        were private: see KVCacheManager.set_private_from)."""
        bs = self.block_size
        in_prompt = min(r.prompt_len // bs, len(r.block_hashes))
        if first >= in_prompt or r.hash_block_size % bs:
            return
        per = r.hash_block_size // bs
        chain = self._extend_chain(r, -(-in_prompt // per))
        if per == 1:
            r.block_hashes[first:in_prompt] = chain[first:in_prompt]

    def _content(self, r: KeyedRequest, i: int) -> tuple:
        """Flat tuple of ints identifying the tokens of block `i` of `r` (hash blocks that
        are not multiples of the KV block)."""
        bs = self.block_size
        s = i * bs
        e = s + bs
        if e > r.prompt_len:
            return (GEN_TAG, r.request_id, i)
        hbs = r.hash_block_size
        if bs % hbs == 0:  # the block is a run of whole hash blocks
            return tuple(r.hash_ids[s // hbs: e // hbs])
        out: list[int] = []  # (hash id, first offset, end offset) per hash block it overlaps
        p = s
        while p < e:
            h = p // hbs
            q = min(e, (h + 1) * hbs)
            out += (r.hash_ids[h], p - h * hbs, q - h * hbs)
            p = q
        return tuple(out)

    def _extend_chain(self, r: KeyedRequest, num_hash_blocks: int) -> list:
        chain = r.hash_chain
        h = len(chain)
        if h < num_hash_blocks:
            parent = chain[-1] if chain else self.root
            extra = r.extra_keys
            if self.builtin:
                for x in r.hash_ids[h:num_hash_blocks]:
                    parent = hash((parent, x, extra))
                    chain.append(parent)
            else:
                hasher = self.hasher
                for x in r.hash_ids[h:num_hash_blocks]:
                    parent = hasher(parent, (x,), extra)
                    chain.append(parent)
        return chain


def first_unshared_hash_blocks(requests: Sequence[KeyedRequest]) -> dict[int, int]:
    """Per request id, the length of the longest prefix of its hash ids that another request
    also starts with: no other request shares its prompt's prefix past that many hash blocks,
    so its KV blocks from there are only ever looked up by itself (the scheduler then registers
    them in the prefix cache only if it is preempted: KVCacheManager.set_private_from). In
    lexicographic order of the hash ids, that longest prefix is shared with a neighbour: one
    sort (C-level tuple compares) and two prefix comparisons per request."""
    order = sorted(requests, key=lambda r: r.hash_ids)
    shared = [0] * (len(order) + 1)  # shared[i]: common prefix of order[i - 1] and order[i]
    for i in range(1, len(order)):
        shared[i] = _common_prefix(order[i - 1].hash_ids, order[i].hash_ids)
    return {r.request_id: max(shared[i], shared[i + 1]) for i, r in enumerate(order)}


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of a and b (bisection on C-level slice compares)."""
    if not a or not b or a[0] != b[0]:
        return 0
    lo, hi = 1, min(len(a), len(b)) + 1  # a[:lo] == b[:lo]; a[:hi] != b[:hi] (or past the end)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
