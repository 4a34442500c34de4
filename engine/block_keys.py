"""Prefix-cache keys of a request's KV blocks: one strategy object per kind of content.

`TokenKeys` (the engine: requests with token ids) keys a block by a chained hash of its
token ids (+ extra keys). `HashIdKeys` (the simulator: no token ids) takes block content
from the request's hash ids. Both fill `req.block_hashes` (the keys of its first full blocks,
kept across preemptions) and return how many blocks they keyed, which the scheduler counts
in `num_blocks_hashed` (the per-block hashing work a real engine pays), whichever shortcut
the simulator takes.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from typing import Protocol

import numpy as np

from engine.block_pool import make_block_hasher, make_bytes_hasher, pack_extra, root_hash

# Content key tag for blocks that hold generated tokens in the simulator (no token ids):
# such a block is keyed by (GEN_TAG, request_id, block index), so only the request that
# produced it (e.g. after a preemption) can hit it. Hash ids are non-negative.
GEN_TAG = -1

_OFFSET_BYTES = [i.to_bytes(4, "little") for i in range(1 << 12)]  # KV blocks per hash block


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


class BlockKeys:
    """Shared set-up: block size and the chained hasher of `prefix_caching_hash_algo`."""

    def __init__(self, block_size: int, algo: str) -> None:
        self.block_size = block_size
        self.hasher = make_block_hasher(algo)
        self.builtin = algo == "builtin"  # Python's hash of a tuple, inlined in the loops
        self.int_chain = algo != "sha256"  # chain hashes are ints
        self.bytes_hasher = None if self.builtin else make_bytes_hasher(algo)
        self.root = root_hash(algo)

    def extend(self, r: KeyedRequest, n: int) -> int:
        """Make `r.block_hashes` cover its first `n` full blocks; returns blocks keyed now."""
        i = len(r.block_hashes)
        if i >= n:
            return 0
        self._append_keys(r, i, n)
        return n - i

    def _append_keys(self, r: KeyedRequest, start: int, stop: int) -> None:
        raise NotImplementedError

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

    def _append_keys(self, r: KeyedRequest, start: int, stop: int) -> None:
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
    hash ids it covers; a block holding generated tokens by (GEN_TAG, request_id, index)."""

    def _append_keys(self, r: KeyedRequest, start: int, stop: int) -> None:
        if r.hash_block_size % self.block_size == 0:
            if start >= r.prompt_len // self.block_size and stop - start == 1:
                # a decode completing a block of generated tokens: the hot case, no set-up
                r.block_hashes.append((GEN_TAG, r.request_id, start))
            else:
                r.block_hashes += self.aligned_keys(r, start, stop)
        else:
            self._chain(r, [self._content(r, i) for i in range(start, stop)])

    def _content(self, r: KeyedRequest, i: int) -> tuple:
        """Flat tuple of ints identifying the tokens of block `i` of `r`."""
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

    def aligned_keys(self, r: KeyedRequest, start: int, stop: int) -> list:
        """Keys of blocks [start, stop) when hash blocks are whole multiples of the KV block
        (Mooncake: 512 vs 16).

        The chain is hashed once per *hash block* (`r.hash_chain[h]` = H(chain[h-1],
        hash_ids[h], extra)), and KV block i inside hash block h is keyed by
        (chain[h], i mod blocks-per-hash-block): equal keys iff equal whole prefixes, as with
        per-block chaining, at 1/32 of the hashing."""
        bs = self.block_size
        in_prompt = min(stop, r.prompt_len // bs)  # blocks wholly inside the prompt
        keys: list = []
        if start < in_prompt:
            keys = self._prompt_keys(r, start, in_prompt)
        gen_from = max(start, in_prompt)
        if stop > gen_from:
            rid = r.request_id
            keys += [(GEN_TAG, rid, i) for i in range(gen_from, stop)]
        return keys

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

    def _prompt_keys(self, r: KeyedRequest, start: int, stop: int) -> list:
        per = r.hash_block_size // self.block_size
        chain = self._extend_chain(r, (stop - 1) // per + 1)
        if per == 1:
            return chain[start:stop]
        if not self.int_chain:  # sha256: bytes cache their hash too
            ob = _OFFSET_BYTES if per <= len(_OFFSET_BYTES) else [
                j.to_bytes(8, "little") for j in range(per)]
            return [chain[i // per] + ob[i % per] for i in range(start, stop)]
        # Int keys hash to themselves: every later dict operation on them is cheap (a
        # (chain, offset) tuple would be re-hashed on each lookup). The offset flips low bits
        # of a 64-bit chain hash: a clash needs two chains that differ only there.
        if stop - start < 64:  # numpy's fixed cost outweighs its gain
            return [chain[i // per] ^ (i % per) for i in range(start, stop)]
        # vectorized (two's-complement XOR = Python's int XOR): builtin hashes are signed
        # 64-bit, xxh3 digests unsigned
        h0 = start // per
        ch = np.array(chain[h0:(stop - 1) // per + 1],
                      dtype=np.int64 if self.builtin else np.uint64)
        idx = np.arange(start, stop, dtype=np.int64)
        return (ch[idx // per - h0] ^ (idx % per).astype(ch.dtype)).tolist()
