"""Prefix-cache keys of a request's KV blocks, as a mixin of `Scheduler`.

With token ids (engine) a block's key is a chained hash of its ids (+ extra keys); without
(simulator) content comes from the request's hash ids: see `_sim_keys`. Every block keyed is
counted in `num_blocks_hashed` (the per-block hashing work a real engine pays), whichever
shortcut the simulator takes.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

import numpy as np

from engine.block_pool import pack_extra

if TYPE_CHECKING:
    from engine.scheduler import _ReqState

# Content key tag for blocks that hold generated tokens in the simulator (no token ids):
# such a block is keyed by (GEN_TAG, request_id, block index), so only the request that
# produced it (e.g. after a preemption) can hit it. Hash ids are non-negative.
GEN_TAG = -1

_OFFSET_BYTES = [i.to_bytes(4, "little") for i in range(1 << 12)]  # KV blocks per hash block


class BlockKeyer:
    """Key builders; the host class sets the attributes below (see `Scheduler.__init__`)."""

    block_size: int
    num_blocks_hashed: int
    _builtin_hash: bool
    _int_chain: bool
    _hasher: Callable
    _bytes_hasher: Callable | None
    _root: Hashable

    def _content(self, r: _ReqState, i: int) -> tuple:
        """Flat tuple of ints identifying the tokens of block `i` of request `r`."""
        bs = self.block_size
        s = i * bs
        e = s + bs
        if r.token_ids is not None:
            return tuple(r.token_ids[s:e])
        if e <= r.prompt_len:
            hbs = r.hash_block_size
            if hbs % bs == 0:  # the block lies inside one hash block
                return (r.hash_ids[s // hbs], s % hbs)
            if bs % hbs == 0:  # the block is a run of whole hash blocks
                return tuple(r.hash_ids[s // hbs : e // hbs])
            out: list[int] = []
            p = s
            while p < e:
                h = p // hbs
                q = min(e, (h + 1) * hbs)
                out += (r.hash_ids[h], p - h * hbs, q - h * hbs)
                p = q
            return tuple(out)
        return (GEN_TAG, r.request_id, i)

    def _contents(self, r: _ReqState, start: int, stop: int) -> list[tuple]:
        """`_content(r, i)` for i in [start, stop), in bulk (the per-block hot path)."""
        bs = self.block_size
        if r.token_ids is not None:
            t = r.token_ids
            return [tuple(t[i * bs:(i + 1) * bs]) for i in range(start, stop)]
        # (hash blocks that are multiples of the KV block take `_sim_keys` instead)
        in_prompt = min(stop, r.prompt_len // bs)  # blocks wholly inside the prompt
        out: list[tuple] = []
        if start < in_prompt:
            out = [self._content(r, i) for i in range(start, in_prompt)]
        gen_from = max(start, in_prompt)
        if stop > gen_from:
            rid = r.request_id
            out += [(GEN_TAG, rid, i) for i in range(gen_from, stop)]
        return out

    def _hash_upto(self, r: _ReqState, n: int) -> int:
        """Make sure `r.block_hashes` covers its first `n` blocks; returns how many blocks
        were keyed now (counted in `num_blocks_hashed`: the per-block hashing work a real
        engine pays, whichever shortcut the simulator takes below)."""
        hashes = r.block_hashes
        i = len(hashes)
        if i >= n:
            return 0
        if r.token_ids is None and r.hash_block_size % self.block_size == 0:
            if i >= r.prompt_len // self.block_size:
                # only blocks of generated tokens (a decode crossing a block): their keys
                # are (GEN_TAG, request_id, index), as in _sim_keys, without its set-up
                rid = r.request_id
                if n - i == 1:
                    hashes.append((GEN_TAG, rid, i))
                else:
                    hashes += [(GEN_TAG, rid, j) for j in range(i, n)]
                self.num_blocks_hashed += n - i
                return n - i
            hashes += self._sim_keys(r, i, n)
        elif r.token_ids is not None and not self._builtin_hash:
            # pack the whole run of token ids once, hash byte slices of it
            bs = self.block_size
            step = 8 * bs
            buf = array("q", r.token_ids[i * bs:n * bs]).tobytes()
            extra = pack_extra(r.extra)
            hb = self._bytes_hasher
            parent = hashes[-1] if hashes else self._root
            append = hashes.append
            for off in range(0, len(buf), step):
                parent = hb(parent, buf[off:off + step], extra)
                append(parent)
        else:
            parent = hashes[-1] if hashes else self._root
            extra = r.extra
            append = hashes.append
            if self._builtin_hash:
                for key in self._contents(r, i, n):
                    parent = hash((parent, key, extra))
                    append(parent)
            else:
                hasher = self._hasher
                for key in self._contents(r, i, n):
                    parent = hasher(parent, key, extra)
                    append(parent)
        self.num_blocks_hashed += n - i
        return n - i

    def _sim_keys(self, r: _ReqState, start: int, stop: int) -> list:
        """Keys of blocks [start, stop) of a request without token ids whose hash blocks are
        whole multiples of the KV block (Mooncake: 512 vs 16).

        The chain is hashed once per *hash block* (`r.hash_chain[h]` = H(chain[h-1],
        hash_ids[h], extra)), and KV block i inside hash block h is keyed by
        (chain[h], i mod blocks-per-hash-block): equal keys iff equal whole prefixes, as with
        per-block chaining, at 1/32 of the hashing. Blocks holding generated tokens are keyed
        by (GEN_TAG, request_id, i): only this request (after a preemption) re-finds them.
        """
        bs = self.block_size
        per = r.hash_block_size // bs
        in_prompt = min(stop, r.prompt_len // bs)  # blocks wholly inside the prompt
        keys: list = []
        if start < in_prompt:
            chain = r.hash_chain
            need = (in_prompt - 1) // per + 1
            if len(chain) < need:
                h = len(chain)
                parent = chain[-1] if chain else self._root
                hid = r.hash_ids
                extra = r.extra
                if self._builtin_hash:
                    for x in hid[h:need]:
                        parent = hash((parent, x, extra))
                        chain.append(parent)
                else:
                    hasher = self._hasher
                    for x in hid[h:need]:
                        parent = hasher(parent, (x,), extra)
                        chain.append(parent)
            if per == 1:
                keys = chain[start:in_prompt]
            elif self._int_chain:
                # int keys hash to themselves: every later dict operation on them is cheap
                # (a (chain, offset) tuple would be re-hashed on each lookup). The offset
                # flips low bits of a 64-bit chain hash: a clash needs two chains that
                # differ only there. Vectorized (two's-complement XOR = Python's int XOR):
                # builtin hashes are signed 64-bit, xxh3 digests unsigned.
                if in_prompt - start < 64:  # numpy's fixed cost outweighs its gain
                    keys = [chain[i // per] ^ (i % per) for i in range(start, in_prompt)]
                else:
                    h0 = start // per
                    ch = np.array(chain[h0:(in_prompt - 1) // per + 1],
                                  dtype=np.int64 if self._builtin_hash else np.uint64)
                    idx = np.arange(start, in_prompt, dtype=np.int64)
                    keys = (ch[idx // per - h0] ^ (idx % per).astype(ch.dtype)).tolist()
            else:  # sha256: bytes cache their hash too
                ob = _OFFSET_BYTES if per <= len(_OFFSET_BYTES) else [
                    j.to_bytes(8, "little") for j in range(per)]
                keys = [chain[i // per] + ob[i % per] for i in range(start, in_prompt)]
        gen_from = max(start, in_prompt)
        if stop > gen_from:
            rid = r.request_id
            keys += [(GEN_TAG, rid, i) for i in range(gen_from, stop)]
        return keys
