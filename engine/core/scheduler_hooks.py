"""What the scheduler shows the modules beside it, apart from its policy (engine/core/scheduler.py):
the hooks decode skip-ahead drives (engine/core/decode_skip.py), its stats and its invariant
checks. A base class of `Scheduler`, kept in its own module so the policy reads on its own; the
attributes it uses (`running`, `waiting`, `kv_cache_manager`, the counters) are the scheduler's.

Torch-free: the simulator imports it.
"""

from __future__ import annotations

import operator

from engine.core.request_state import PREEMPTED, RUNNING, WAITING, SchedulerRequest
from engine.core.scheduler_output import RequestResult, SchedulerStats


class SchedulerHooks:
    """Skip-ahead hooks, stats and checks of a `Scheduler` (mixed into it)."""

    _uniform_until: tuple[tuple, int] | None = None  # note_uniform_until(): (change key, last step)

    # ------------------------------------------------------------------ skip-ahead's (decode_skip.py)
    def change_key(self) -> tuple:
        """Counters that every change of the scheduler outside `apply_decode_stretch` moves: a
        step (step_id), an added request, a finish (finish_requests), blocks taken or given
        back (release_held), a new running list. (The pool's counters of KVCacheManager.change_counters,
        read here: three keys a stretch.)"""
        pool = self.kv_cache_manager.pool
        return (self.step_id, self.num_added, self.num_finished, pool.num_allocated, pool.num_freed,
                pool.num_revived, id(self.running), len(self.running))

    def note_uniform_until(self, last_step_id: int) -> None:
        """Remember that the steps through `last_step_id` are uniform decode steps for as long as
        the scheduler stays as it is now (or as `apply_decode_stretch` leaves it)."""
        self._uniform_until = (self.change_key(), last_step_id)

    def known_uniform(self, n: int) -> bool:
        """Whether `note_uniform_until` already showed the next n steps uniform."""
        u = self._uniform_until
        return u is not None and 1 <= n and self.step_id + n <= u[1] and u[0] == self.change_key()

    def finish_decoded(self, r: SchedulerRequest) -> tuple[int, RequestResult]:
        """`r` reached its output length in a decode stretch: free (or hold) its blocks and
        mark it finished. Returns (blocks freed, its result)."""
        freed = self.kv_cache_manager.free_or_hold(r)
        return freed, self.mark_finished(r, "length")

    def apply_decode_stretch(self, n: int, num_tokens: int, any_finished: bool, known: bool) -> None:
        """Close a skip-ahead of n steps that generated `num_tokens` tokens: drop finished
        requests from the running list and count the steps; `known`: it ran within the
        stretch `note_uniform_until` recorded, which stays valid for the rest of it."""
        if any_finished:
            self.running = [r for r in self.running if r.status == RUNNING]
        self.step_id += n
        self.num_steps += n
        self.num_generated_tokens += num_tokens
        if known:
            self._uniform_until = (self.change_key(), self._uniform_until[1])

    # ------------------------------------------------------------------ stats, checks

    @property
    def stats(self) -> SchedulerStats:
        frag = sum(len(r.block_ids) for r in self.running) * self.block_size - sum(
            map(_kv_tokens, self.running))
        return SchedulerStats(
            num_running=len(self.running), num_waiting=self.num_waiting,
            fragmentation_slots=frag, **{name: getattr(self, name) for name in _COUNTERS},
            **self.kv_cache_manager.block_stats())

    def check_invariants(self) -> None:
        """AssertionError unless every block's refcount equals its owners and each request's
        bookkeeping is consistent. O(all blocks): for tests."""
        for r in self.running:
            assert r.status == RUNNING, f"request {r.request_id} in running with status {r.status}"
        assert len(self.running) <= self.config.max_num_seqs, "max_num_seqs exceeded"
        for r in self.waiting:
            assert r.status in (WAITING, PREEMPTED)
        self.kv_cache_manager.check_invariants(self.running, self.waiting)


_kv_tokens = operator.attrgetter("num_computed_tokens")
# the scheduler's own counters in SchedulerStats (the KV cache manager reports the blocks')
_COUNTERS = ("num_steps", "num_finished", "num_rejected", "num_preemptions",
             "prefix_cache_queries_tokens", "prefix_cache_hits_tokens",
             "prefix_cache_preempted_queries_tokens", "prefix_cache_preempted_hits_tokens",
             "num_prompt_tokens_computed", "num_generated_tokens", "num_spec_drafts",
             "num_spec_draft_tokens", "num_spec_accepted_tokens", "external_computed_tokens")


__all__ = ["SchedulerHooks"]
