"""Which replica of a pool gets a request: round-robin, least-loaded, or prefix-aware."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.core.request import Request

# The prefix-aware router only considers replicas whose load score (4 x waiting + running) is
# within this of the least loaded one, so cache affinity never piles a queue onto one replica
# (8 = two waiting requests more than the least loaded replica).
PREFIX_ROUTER_LOAD_SLACK = 8


class Routable(Protocol):
    idx: int

    @property
    def load(self) -> int: ...


class Router:
    """One policy for a deployment; `pick(req, pool)` for the front pool and the decode pool."""

    def __init__(self, policy: str) -> None:
        if policy not in ("round_robin", "least_loaded", "prefix_aware"):
            raise ValueError(f"router {policy!r}: choose round_robin, least_loaded or prefix_aware")
        self.policy = policy
        self._rr = 0
        self._prefix_index: dict[int, set[int]] = {}

    def pick(self, req: Request, pool: Sequence[Routable]) -> Routable:
        if len(pool) == 1:
            return pool[0]
        if self.policy == "round_robin":
            self._rr = (self._rr + 1) % len(pool)
            return pool[self._rr - 1]
        if self.policy == "least_loaded":
            return min(pool, key=lambda r: r.load)
        return self._pick_by_prefix(req, pool)

    def _pick_by_prefix(self, req: Request, pool: Sequence[Routable]) -> Routable:
        """Longest known prefix among replicas whose load is near the minimum.

        The router keeps an approximate index (prefix-hash chain -> replicas that were sent
        it), like llm-d's approximate prefix-cache scorer: it does not see evictions.
        """
        loads = [r.load for r in pool]  # read once: each read of a skipping replica's load searches
        lo = min(loads)
        near = {r.idx for r, ld in zip(pool, loads) if ld <= lo + PREFIX_ROUTER_LOAD_SLACK}
        keys = self._chain_keys(req.hash_ids)
        best_set = _longest_match(near, keys, self._prefix_index)
        best = min((i for i, r in enumerate(pool) if r.idx in best_set), key=loads.__getitem__)
        idx = pool[best].idx
        index = self._prefix_index
        for k in keys:
            holders = index.get(k)
            if holders is None:
                index[k] = {idx}
            else:
                holders.add(idx)
        return pool[best]

    @staticmethod
    def _chain_keys(hash_ids: Sequence[int]) -> list[int]:
        """One key per hash block, chaining all blocks before it (a prefix, not a block)."""
        keys, key = [], 0
        for h in hash_ids:
            key = hash((key, h))
            keys.append(key)
        return keys


def _longest_match(candidates: set[int], keys: list[int], index: dict[int, set[int]]) -> set[int]:
    """The candidates that were sent the longest chain of `keys` (all of them if none was)."""
    best = candidates
    for key in keys:
        inter = best & index.get(key, _NOBODY)
        if not inter:
            break
        best = inter
    return best


_NOBODY: frozenset[int] = frozenset()


__all__ = ["PREFIX_ROUTER_LOAD_SLACK", "Router"]
