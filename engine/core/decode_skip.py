"""Skip-ahead: many pure-decode steps applied at once, exactly as single steps would apply them.

A simulator spends most of its steps in stretches where every running request decodes one
token and nothing else can happen: no request waits, no drafts, enough free blocks. Within
such a stretch the scheduler's decisions are known in advance, so the caller can sleep
through all of them (their durations follow from the per-step batch sizes and context sums
below) and then apply them in one call:

    n = uniform_decode_steps(sched)          # 0: step normally
    if n >= 2:                               # time the stretch from the running requests'
        adv = advance_decode(sched, m)       # contexts and remaining outputs; apply the
                                             # m <= n steps that start before the next event

A stretch runs THROUGH finishes: a request that reaches its output length leaves the batch
after its last step and its freed blocks serve later steps' allocations, exactly as
stepping frees them. `DecodeAdvance` reports each step's batch (`num_seqs_at`,
`sum_decode_context_at`) and the step each finished request left in (`finish_steps`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING

from engine.core.scheduler_output import RequestResult

if TYPE_CHECKING:  # annotations only: the scheduler does not import this module
    from engine.core.scheduler import Scheduler


@dataclass(slots=True)
class DecodeSegment:
    """Consecutive steps of a stretch with one unchanged batch."""

    first_step: int  # 0-based, within the stretch
    num_steps: int
    num_seqs: int
    sum_decode_context_first_step: int  # KV tokens after `first_step`, summed over the batch


@dataclass(slots=True)
class DecodeStretch:
    """Who decodes in which step of `num_steps` pure-decode steps (batch order).

    Request j runs in steps 0 .. steps_each[j] - 1; in step i its KV holds
    context_lens[j] + i + 1 tokens afterwards.
    """

    num_steps: int
    context_lens: list[int]  # KV tokens of each running request before the stretch
    steps_each: list[int]  # steps each request runs: min(num_steps, its remaining output)
    # requests ordered by steps_each: the steps (ascending) and suffix sums of their contexts,
    # so a step's batch is a suffix of that order (who is still running); built on first use
    _sorted_steps: list[int] | None = field(default=None, init=False, repr=False)
    _ctx_suffix: list[int] = field(default_factory=list, init=False, repr=False)

    def _index(self) -> list[int]:
        if self._sorted_steps is None:
            order = sorted(range(len(self.steps_each)), key=self.steps_each.__getitem__)
            self._sorted_steps = [self.steps_each[j] for j in order]
            ctx = [self.context_lens[j] for j in reversed(order)]
            self._ctx_suffix = [*reversed(list(accumulate(ctx))), 0]
        return self._sorted_steps

    def num_seqs_at(self, i: int) -> int:
        """Requests decoding in step i (0-based)."""
        steps = self._index()
        return len(steps) - bisect_right(steps, i)

    def sum_decode_context_at(self, i: int) -> int:
        """KV tokens after step i, summed over the requests decoding in step i."""
        steps = self._index()
        k = bisect_right(steps, i)
        return self._ctx_suffix[k] + (i + 1) * (len(steps) - k)

    def segments(self) -> list[DecodeSegment]:
        """The stretch cut where the batch shrinks: one entry per constant batch."""
        steps = self._index()
        num = len(steps)
        out: list[DecodeSegment] = []
        start = k = 0  # requests k.. (in steps order) run in step `start`
        while start < self.num_steps:
            while k < num and steps[k] <= start:
                k += 1
            if k == num:
                break
            end = min(steps[k], self.num_steps)
            out.append(DecodeSegment(start, end - start, num - k,
                                     self._ctx_suffix[k] + (start + 1) * (num - k)))
            start = end
        return out


@dataclass(slots=True)
class DecodeAdvance:
    """What `advance_decode(sched, n)` applied: the totals of n single steps."""

    stretch: DecodeStretch
    first_step_id: int
    num_blocks_allocated: int
    num_blocks_freed: int
    num_blocks_hashed: int
    finished: list[RequestResult]
    finish_steps: list[int]  # 0-based step of each finished request's last step, non-decreasing

    @property
    def num_steps(self) -> int:
        return self.stretch.num_steps

    @property
    def num_seqs(self) -> int:
        """Requests decoding in the first step."""
        return len(self.stretch.context_lens)

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.stretch.steps_each)

    @property
    def sum_decode_context_first_step(self) -> int:
        return sum(self.stretch.context_lens) + len(self.stretch.context_lens)

    @property
    def max_decode_context_first_step(self) -> int:
        """KV tokens after the first step of the longest sequence."""
        return max(self.stretch.context_lens) + 1

    def num_seqs_at(self, i: int) -> int:
        return self.stretch.num_seqs_at(i)

    def sum_decode_context_at(self, i: int) -> int:
        return self.stretch.sum_decode_context_at(i)


def _remaining_if_uniform(sched: Scheduler) -> list[int] | None:
    """Tokens each running request has left to generate (batch order) when the next step is
    a plain decode of every running request and nothing else; else None."""
    if sched.has_pending_rejections() or sched.num_waiting or not sched.running:
        return None
    if sched.config.num_speculative_tokens or not sched.between_steps():
        return None
    running = sched.running
    if len(running) > sched.config.max_num_batched_tokens:
        return None
    remaining = []
    for r in running:
        if (not r.sampled_since_admission or r.num_tokens - r.num_computed_tokens != 1
                or r.token_ids is not None):
            return None
        remaining.append(r.output_len - r.num_generated)
    return remaining


def _blocks_new(ctx: int, num_blocks: int, steps: int, block_size: int) -> int:
    """Blocks a request holding `num_blocks` blocks for `ctx` KV tokens allocates in `steps`
    decode steps."""
    return max(0, -(-(ctx + steps) // block_size) - num_blocks)


def uniform_decode_steps(sched: Scheduler) -> int:
    """How many further steps are pure decode with nothing else possible: nothing waiting, no
    drafts, and a free block for every block boundary crossed (counting the blocks finished
    requests free for later steps). 0 when the next step is anything else."""
    remaining = _remaining_if_uniform(sched)
    if remaining is None:
        return 0
    n_max = max(remaining)
    n = n_max if _fits(sched, remaining, n_max) else _block_limited_steps(sched, remaining, n_max)
    if n:  # so that advance_decode need not re-derive it (a prefix of a uniform stretch
        # leaves the rest of it uniform)
        sched.note_uniform_until(sched.step_id + n)
    return n


def _fits(sched: Scheduler, remaining: list[int], n: int) -> bool:
    """Whether the free blocks cover every block that n steps open, before any finish frees
    one (the common case: a sufficient condition checked in one pass)."""
    bs = sched.block_size
    need = 0
    for r, m in zip(sched.running, remaining):
        steps = n if n < m else m  # noqa: FURB136 (min() costs a call per request here)
        x = (r.num_computed_tokens + steps + bs - 1) // bs - len(r.block_ids)
        if x > 0:
            need += x
    return need <= sched.kv_cache_manager.num_free_blocks


def _block_limited_steps(sched: Scheduler, remaining: list[int], n_max: int) -> int:
    """The last step before the first allocation that finds no free block, walking the
    stretch from finish to finish (the batch, hence the allocation rate, is constant
    between finishes; blocks freed at a step's end serve the following steps)."""
    bs = sched.block_size
    kv = sched.kv_cache_manager
    order = sorted(range(len(remaining)), key=remaining.__getitem__)
    active = {j: sched.running[j] for j in order}
    done_alloc = freed = 0  # blocks allocated by finished requests; blocks they freed
    drops: dict[int, int] = {}  # references dropped so far on blocks shared at the start
    prev = k = 0
    for end in sorted(set(remaining)):
        end = min(end, n_max)
        cap = kv.num_free_blocks + freed - done_alloc  # what the requests still running may take
        if _blocks_to_step(active.values(), end, bs) > cap:
            lo, hi = prev, end  # enough blocks through step lo, not through hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _blocks_to_step(active.values(), mid, bs) <= cap:
                    lo = mid
                else:
                    hi = mid
            return lo
        if end == n_max:
            return n_max
        while k < len(order) and remaining[order[k]] == end:
            r = active.pop(order[k])
            done_alloc += _blocks_new(r.num_computed_tokens, len(r.block_ids), end, bs)
            if not r.hold_blocks_on_finish:
                freed += _blocks_freed_at_finish(r, end, kv.ref_counts, drops, bs)
            k += 1
        prev = end
    return n_max


def _blocks_to_step(reqs, steps: int, bs: int) -> int:
    """Blocks `reqs` allocate in their next `steps` decode steps."""
    return sum(_blocks_new(r.num_computed_tokens, len(r.block_ids), steps, bs) for r in reqs)


def _blocks_freed_at_finish(r, steps: int, ref: list[int], drops: dict[int, int], bs: int) -> int:
    """Blocks whose last reference `r` drops when it finishes after `steps` more decodes: its
    new decode blocks, plus held blocks no other request still references."""
    n = _blocks_new(r.num_computed_tokens, len(r.block_ids), steps, bs)
    for b in r.block_ids:
        if ref[b] == 1:
            n += 1
        else:
            d = drops.get(b, 0) + 1
            drops[b] = d
            n += ref[b] == d
    return n


def advance_decode(sched: Scheduler, n: int) -> DecodeAdvance:
    """Apply `n` pure-decode steps at once (1 <= n <= uniform_decode_steps(sched)), with the
    very same block allocations, free-queue order, prefix-cache entries, finishes and counters
    as n single schedule()/update_from_output() steps. Within a stretch uniform_decode_steps
    found, with only advance_decode calls since (a simulator's segments), n is not checked
    again; otherwise it is, and a bad n raises ValueError."""
    known = sched.known_uniform(n)
    running = sched.running
    remaining = [r.output_len - r.num_generated for r in running] if known else _check_uniform(sched, n)
    fewest = min(remaining)
    steps_each = [n] * len(remaining) if fewest >= n else [min(n, m) for m in remaining]
    stretch = DecodeStretch(n, [r.num_computed_tokens for r in running], steps_each)
    adv = DecodeAdvance(stretch, sched.step_id + 1, 0, 0, 0, [], [])
    allocs = _new_block_steps(sched, steps_each)
    if fewest > n:  # nobody finishes: one batch throughout
        _take_blocks(sched, allocs, adv)
    else:
        _advance_through_finishes(sched, remaining, steps_each, allocs, adv)
    adv.num_blocks_hashed += _apply_decodes(sched, running, steps_each)
    sched.apply_decode_stretch(n, adv.num_batched_tokens, bool(adv.finished), known)
    return adv


def _check_uniform(sched: Scheduler, n: int) -> list[int]:
    """The running requests' remaining output tokens, after checking from scratch that the
    next n steps are uniform decode steps (a clear error if not)."""
    remaining = _remaining_if_uniform(sched)
    if remaining is None or not 1 <= n <= max(remaining) or not (
            _fits(sched, remaining, n) or _block_limited_steps(sched, remaining, n) == n):
        raise ValueError(f"advance_decode(sched, {n}): only 1..{uniform_decode_steps(sched)} "
                         f"uniform decode steps are possible now; ask uniform_decode_steps(sched)")
    return remaining


def _advance_through_finishes(sched: Scheduler, remaining: list[int], steps_each: list[int],
                              allocs: list[tuple[int, int]], adv: DecodeAdvance) -> None:
    """Walk the stretch from finish to finish: the blocks opened before each finish step's
    end, then the requests finishing there (batch order), whose freed blocks serve later
    allocations."""
    running = sched.running
    order = sorted(range(len(running)), key=steps_each.__getitem__)  # stable: batch order in ties
    taken = k = 0
    for end in sorted(set(steps_each)):
        taken = _take_blocks(sched, allocs, adv, taken, bisect_left(allocs, (end, -1)))
        while k < len(order) and steps_each[order[k]] == end:
            j = order[k]
            if remaining[j] == end:
                adv.num_blocks_hashed += _apply_decodes(sched, [running[j]], [end])
                _finish_at(sched, running[j], end - 1, adv)
            k += 1


def _take_blocks(sched: Scheduler, allocs: list[tuple[int, int]], adv: DecodeAdvance,
                 start: int = 0, stop: int | None = None) -> int:
    """Pop the blocks of allocs[start:stop] from the free queue into their requests' block
    tables; returns stop."""
    stop = len(allocs) if stop is None else stop
    if stop > start:
        running = sched.running
        for (_, j), b in zip(allocs[start:stop], sched.kv_cache_manager.allocate_blocks(stop - start)):
            running[j].block_ids.append(b)
        adv.num_blocks_allocated += stop - start
    return stop


def _new_block_steps(sched: Scheduler, steps_each: list[int]) -> list[tuple[int, int]]:
    """(0-based step, batch position) of every block the running requests open in their
    steps, sorted: the order single steps pop them from the free queue."""
    bs = sched.block_size
    allocs: list[tuple[int, int]] = []
    for j, r in enumerate(sched.running):
        c = r.num_computed_tokens  # step s computes position c + s
        p = len(r.block_ids) * bs  # the first position that needs a new block
        last = c + steps_each[j]
        while p < last:
            allocs.append((p - c, j))
            p += bs
    allocs.sort()
    return allocs


def _apply_decodes(sched: Scheduler, reqs: list, steps_each: list[int]) -> int:
    """Advance each request of `reqs` still running by its `steps_each` decoded tokens (blocks
    already allocated) and register the blocks they complete; returns blocks hashed. Decode
    blocks carry the request's own generated-token keys, never registered before, so
    registering them in one call gives the very keys single steps would, and nothing else
    touches them before the request frees them."""
    bs = sched.block_size
    caching = sched.caching
    completed = []  # (request, its full blocks after the stretch) where that adds some
    for r, steps in zip(reqs, steps_each):
        if r.status != "running":  # finished within the stretch: applied at its finish
            continue
        c = r.num_computed_tokens
        if caching:
            num_full = (c + steps) // bs
            if num_full > c // bs and num_full > r.num_cached_blocks:
                completed.append((r, num_full))
        r.num_computed_tokens = c + steps
        r.num_generated += steps
        r.num_tokens += steps
    return sched.kv_cache_manager.cache_decoded(completed) if completed else 0


def _finish_at(sched: Scheduler, r, last_step: int, adv: DecodeAdvance) -> None:
    """`r` generated its last token in step `last_step`: free (or hold) its blocks and report
    it, as update_from_output does at that step's end."""
    freed, result = sched.finish_decoded(r)
    adv.num_blocks_freed += freed
    adv.finished.append(result)
    adv.finish_steps.append(last_step)
