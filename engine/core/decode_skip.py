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

import operator
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
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
    """What `advance_decode(sched, n)` applied: the totals of n single steps (or of one
    segment of `advance_decode_segments`), and the scheduler's gauges after them."""

    num_steps: int
    first_step_id: int
    num_seqs: int  # requests decoding in the first step
    sum_decode_context_first_step: int  # KV tokens after the first step, summed over its batch
    max_decode_context_first_step: int  # KV tokens after the first step of the longest sequence
    num_batched_tokens: int
    source: _SegmentWalk = field(repr=False)  # the batch of each step, read when `stretch` is
    start: int = 0  # the first step's index in the source's stretch
    num_blocks_allocated: int = 0
    num_blocks_freed: int = 0
    num_blocks_hashed: int = 0
    finished: list[RequestResult] = field(default_factory=list)
    finish_steps: list[int] = field(default_factory=list)  # 0-based last step of each, non-decreasing
    num_running_after: int = 0
    kv_usage_after: float = 0.0

    @property
    def stretch(self) -> DecodeStretch:
        """Who decodes in which of its steps (built on demand: a simulator reads the totals)."""
        return self.source.stretch_of(self.start, self.start + self.num_steps)

    def num_seqs_at(self, i: int) -> int:
        return self.stretch.num_seqs_at(i)

    def sum_decode_context_at(self, i: int) -> int:
        return self.stretch.sum_decode_context_at(i)


def _remaining_if_uniform(sched: Scheduler) -> tuple[list[int], int, list[int]] | None:
    """Tokens each running request has left to generate (batch order) when the next step is
    a plain decode of every running request and nothing else, the blocks they all open on
    the way to their ends and their KV tokens now (read in the same pass); else None."""
    if sched.waiting.items or sched.has_pending_rejections() or not sched.running:  # (the usual exit first)
        return None
    if sched.config.num_speculative_tokens or not sched.between_steps():
        return None
    running = sched.running
    if len(running) > sched.config.max_num_batched_tokens:
        return None
    bs = sched.block_size
    remaining = []
    ctx = []
    need = 0
    for r in running:
        c = r.num_computed_tokens
        if not r.sampled_since_admission or r.num_tokens - c != 1 or r.token_ids is not None:
            return None
        m = r.output_len - r.num_generated
        remaining.append(m)
        ctx.append(c)
        x = (c + m + bs - 1) // bs - len(r.block_ids)
        if x > 0:
            need += x
    return remaining, need, ctx


def _blocks_new(ctx: int, num_blocks: int, steps: int, block_size: int) -> int:
    """Blocks a request holding `num_blocks` blocks for `ctx` KV tokens allocates in `steps`
    decode steps."""
    return max(0, -(-(ctx + steps) // block_size) - num_blocks)


def uniform_decode_steps(sched: Scheduler) -> int:
    """How many further steps are pure decode with nothing else possible: nothing waiting, no
    drafts, and a free block for every block boundary crossed (counting the blocks finished
    requests free for later steps). 0 when the next step is anything else."""
    return uniform_decode_batch(sched)[0]


def uniform_decode_batch(sched: Scheduler) -> tuple[int, list[int], list[int]]:
    """`uniform_decode_steps(sched)`, and the running requests' remaining outputs and KV tokens
    (batch order) it read on the way when that is not 0: a caller timing the stretch needs
    them, and reading them again costs two more passes over the batch per stretch."""
    found = _remaining_if_uniform(sched)
    if found is None:
        return 0, [], []
    remaining, need, ctx = found
    n_max = max(remaining)
    # every request runs to its end within n_max steps: enough free blocks for all they open
    # (before any finish frees one) is _fits(sched, remaining, n_max), counted in that pass
    n = n_max if need <= sched.kv_cache_manager.num_free_blocks else _block_limited_steps(sched, remaining, n_max)
    if n:  # so that advance_decode need not re-derive it (a prefix of a uniform stretch
        # leaves the rest of it uniform)
        sched.note_uniform_until(sched.step_id + n)
    return n, remaining, ctx


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
    if r.private_from == 0:  # its own blocks, uncounted (KVCacheManager.set_private_from)
        return n + len(r.block_ids)
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
    return advance_decode_segments(sched, (n,))[0]


def advance_decode_segments(sched: Scheduler, ends: Sequence[int], start: StretchStart | None = None
                            ) -> list[DecodeAdvance]:
    """`advance_decode(sched, e)` for each segment [previous end, e) of `ends` (increasing, the
    first >= 1) in turn, in one call: the same state and the same report per segment (with
    its gauges after it: `num_running_after`, `kv_usage_after`). A simulator applies a stretch
    cut where its batch shrinks this way: the per-request work (remaining outputs, block
    openings, token counters) is done once for the stretch instead of once per segment.
    `start`: `stretch_start(sched, steps, ...)` of the running requests as they are now (a
    caller that timed the stretch has it), with steps >= ends[-1]; computed here if None, or if
    the scheduler changed since uniform_decode_steps."""
    n = ends[-1]
    if ends[0] < 1 or (len(ends) > 1 and not all(map(operator.lt, ends, ends[1:]))):
        raise ValueError(f"advance_decode_segments: segment ends {list(ends)} must increase from >= 1")
    known = sched.known_uniform(n)
    running = sched.running
    if not known:
        start = None
        remaining = _check_uniform(sched, n)
    elif start is None:
        remaining = [r.output_len - r.num_generated for r in running]
    else:
        remaining = start.remaining
        if len(remaining) != len(running) or start.context_lens[-1] != running[-1].num_computed_tokens:
            raise ValueError("advance_decode_segments: `start` describes another batch than the running one")
    if start is None:
        start = stretch_start(sched, n, remaining, [r.num_computed_tokens for r in running])
    walk = _SegmentWalk(sched, start, n)
    out = []
    first = 0
    for end in ends:
        out.append(walk.segment(first, end))
        first = end
    walk.advance_running(n)
    sched.apply_decode_stretch(n, walk.num_tokens(n), walk.any_finished, known)
    return out


def _check_uniform(sched: Scheduler, n: int) -> list[int]:
    """The running requests' remaining output tokens, after checking from scratch that the
    next n steps are uniform decode steps (a clear error if not)."""
    found = _remaining_if_uniform(sched)
    remaining = found and found[0]
    if not remaining or not 1 <= n <= max(remaining) or not (
            _fits(sched, remaining, n) or _block_limited_steps(sched, remaining, n) == n):
        raise ValueError(f"advance_decode(sched, {n}): only 1..{uniform_decode_steps(sched)} "
                         f"uniform decode steps are possible now; ask uniform_decode_steps(sched)")
    return remaining


class _SegmentWalk:
    """The state of `advance_decode_segments` along a stretch: the running requests as it
    started (batch order), their KV tokens then (`ctx`) and remaining outputs, the blocks they
    open and complete (`StretchStart`: the order single steps pop them), who finishes after
    how many steps, and the live batch's size and summed KV. A segment costs its finishes,
    blocks and completions, not a pass over the batch (but for registering blocks when it is
    block-size steps or longer): token counters of the requests still running are advanced
    once, at the end."""

    __slots__ = ("allocs", "comps", "comps_done", "ctx", "done", "eager", "eager_done", "finishing", "live",
                 "live_ctx", "max_ctx", "points", "remaining", "running", "sched", "step_id", "taken", "width")

    def __init__(self, sched: Scheduler, start: StretchStart, n: int) -> None:
        self.sched, self.step_id = sched, sched.step_id
        # (the list itself, no copy: nothing changes it while the walk applies its segments, and
        # apply_decode_stretch replaces it afterwards; DecodeAdvance.stretch reads ctx, remaining)
        self.running = sched.running
        self.ctx, self.remaining = start.context_lens, start.remaining
        remaining = self.remaining
        self.allocs, self.comps, self.eager, self.width = start.opened, start.completed, start.eager, start.width
        # allocs[:taken] are popped, comps[:comps_done] and eager[:eager_done] registered
        self.taken = self.comps_done = self.eager_done = 0
        self.finishing: dict[int, list[int]] = {}  # step count -> who finishes after it (batch order)
        for j in [j for j, m in enumerate(remaining) if m <= n] if min(remaining) <= n else ():  # (few finish)
            self.finishing.setdefault(remaining[j], []).append(j)
        self.points = sorted(self.finishing, reverse=True)  # finish steps still ahead, last first
        self.done = [False] * len(remaining)  # finished within the stretch
        self.live, self.live_ctx = len(remaining), sum(self.ctx)
        self.max_ctx: int | None = max(self.ctx)  # over the live requests (None: to recompute)

    @property
    def any_finished(self) -> bool:
        return self.live < len(self.running)

    def num_tokens(self, n: int) -> int:
        """Tokens decoded in n steps: n each, less the steps of those finishing before."""
        total = n * len(self.running)
        for p, js in self.finishing.items():  # (a few: a loop costs less than a generator)
            total -= len(js) * (n - p)
        return total

    def segment(self, start: int, end: int) -> DecodeAdvance:
        """Apply steps [start, end) as `advance_decode(sched, end - start)` would: the blocks
        opened before each finish, the finishing requests (batch order, their blocks freed for
        later steps), then the blocks completed by those still running."""
        live = self.live
        if self.max_ctx is None:
            self.max_ctx = max(c for c, d in zip(self.ctx, self.done) if not d)
        adv = DecodeAdvance(end - start, self.step_id + 1 + start, live, self.live_ctx + live * (start + 1),
                            self.max_ctx + start + 1, live * (end - start), self, start)
        points, allocs, w = self.points, self.allocs, self.width
        while points and points[-1] <= end:
            point = points.pop()
            stop = bisect_left(allocs, point * w, self.taken)  # the blocks opened before it
            if stop > self.taken:
                self._take(stop, adv)
            for j in self.finishing[point]:
                self._finish(j, start, point, adv)
            adv.num_batched_tokens -= len(self.finishing[point]) * (end - point)
        stop = bisect_left(allocs, end * w, self.taken)
        if stop > self.taken:
            self._take(stop, adv)
        if self.comps:
            adv.num_blocks_hashed += self._cache_completed(start, end)
        adv.num_running_after = self.live
        adv.kv_usage_after = self.sched.kv_cache_manager.usage()  # (Scheduler.kv_usage's)
        return adv

    def _finish(self, j: int, start: int, point: int, adv: DecodeAdvance) -> None:
        """Request j's last step is `point` - 1: register what it completed since `start`,
        count its tokens, free (or hold) its blocks."""
        r, c = self.running[j], self.ctx[j]
        bs = self.sched.block_size
        num_full = (c + point) // bs
        # (a private request's completed blocks are counted with the segment's: _cache_completed)
        if (self.sched.caching and r.private_from is None and num_full > (c + start) // bs
                and num_full > r.num_cached_blocks):
            adv.num_blocks_hashed += self.sched.kv_cache_manager.cache_decoded([(r, num_full)])
        r.num_computed_tokens = c + point
        r.num_generated += point
        r.num_tokens += point
        # its last token came in step point - 1: free (or hold) its blocks and report it, as
        # update_from_output does at that step's end
        freed, result = self.sched.finish_decoded(r)
        adv.num_blocks_freed += freed
        adv.finished.append(result)
        adv.finish_steps.append(point - 1 - start)
        self.done[j] = True
        self.live -= 1
        self.live_ctx -= c
        if c == self.max_ctx:
            self.max_ctx = None

    def _take(self, stop: int, adv: DecodeAdvance) -> None:
        """Pop the blocks of opening entries [taken, stop) into their requests' tables."""
        allocs, w = self.allocs, self.width
        running = self.running
        kv = self.sched.kv_cache_manager
        counted = []  # blocks of requests that count their blocks' owners (see set_private_from)
        for e, b in zip(allocs[self.taken:stop], kv.allocate_blocks(stop - self.taken, record=False)):
            r = running[e % w]
            r.block_ids.append(b)
            if r.private_from != 0:
                counted.append(b)
        if counted:
            kv.record_owned(counted)
        adv.num_blocks_allocated += stop - self.taken
        self.taken = stop

    def _cache_completed(self, start: int, end: int) -> int:
        """Register the blocks the requests still running completed in steps [start, end), in
        batch order, as the steps' updates would; returns blocks hashed. Decode blocks carry
        the request's own generated-token keys, never registered before, so registering them in
        one call gives the very keys single steps would, and nothing else touches them before
        the request frees them. Those of private requests (KVCacheManager.set_private_from),
        finished ones included, are only counted (their `num_cached_blocks` is set at the end:
        advance_running): every entry of theirs completes one block."""
        comps, eager, w = self.comps, self.eager, self.width
        stop = bisect_left(comps, end * w, self.comps_done)
        if stop == self.comps_done:
            return 0
        kv = self.sched.kv_cache_manager
        num_all = stop - self.comps_done
        self.comps_done = stop
        first = self.eager_done
        stop = bisect_left(eager, end * w, first) if eager is not comps else self.comps_done
        self.eager_done = stop
        if stop - first < num_all:
            kv.count_private_completed(num_all - (stop - first))
        if stop == first:
            return num_all
        bs = self.sched.block_size
        # fewer than bs steps: a request completes at most one block in them, so its position
        # appears once (C-level map and sort); bs or more: every request decoding through them does
        ids = sorted(map(w.__rmod__, eager[first:stop])) if end - start < bs else range(w)
        done, ctx, running = self.done, self.ctx, self.running
        completed = []  # (request, its full blocks after the steps) where that adds some
        for j in ids:
            r = running[j]
            if not done[j] and r.private_from is None:
                num_full = (ctx[j] + end) // bs
                if num_full > r.num_cached_blocks:
                    completed.append((r, num_full))
        return num_all - (stop - first) + (kv.cache_decoded(completed) if completed else 0)

    def advance_running(self, n: int) -> None:
        """The token counters of the requests that ran through all n steps (and, with prefix
        caching, their full blocks: all counted, see _cache_completed)."""
        done, ctx = self.done, self.ctx
        if self.comps:
            bs = self.sched.block_size
            for j, r in enumerate(self.running):
                if not done[j]:
                    r.num_computed_tokens = c = ctx[j] + n
                    r.num_generated += n
                    r.num_tokens += n
                    r.num_cached_blocks = c // bs
            return
        for j, r in enumerate(self.running):
            if not done[j]:
                r.num_computed_tokens = ctx[j] + n
                r.num_generated += n
                r.num_tokens += n

    def stretch_of(self, start: int, end: int) -> DecodeStretch:
        """Steps [start, end) of the stretch as a DecodeStretch of their own."""
        batch = [j for j, m in enumerate(self.remaining) if m > start]
        return DecodeStretch(end - start, [self.ctx[j] + start for j in batch],
                             [min(self.remaining[j], end) - start for j in batch])


@dataclass(slots=True)
class StretchStart:
    """The running requests (batch order) as a decode stretch starts: their remaining outputs
    and KV tokens, and the blocks they open and complete in their next decode steps, sorted:
    the order single steps pop free blocks in, and (with prefix caching; else empty) the steps
    computing a block's last position. Each block entry is `step * width + batch position`
    (width: the batch size): ints sort and bisect at C speed, (step, position) tuples do not.
    `eager`: the entries of `completed` of requests whose blocks are registered as they fill
    (not private, see KVCacheManager.set_private_from); `completed` itself when all are."""

    remaining: list[int]
    context_lens: list[int]
    opened: list[int]
    completed: list[int]
    width: int
    eager: list[int]


def stretch_start(sched: Scheduler, steps: int, remaining: list[int], context_lens: list[int]) -> StretchStart:
    """`StretchStart` of the running requests, whose remaining outputs and KV tokens the caller
    read (`remaining`, `context_lens`), the blocks counted over their first `steps` steps (each
    request's own, up to its remaining output)."""
    bs = sched.block_size
    w = len(context_lens)
    period = bs * w  # between two entries of one request
    opened: list[int] = []
    completed: list[int] = []
    eager: list[int] = []
    num_eager = 0
    caching = sched.caching
    for j, r in enumerate(sched.running):
        c = context_lens[j]  # step s computes position c + s
        m = remaining[j]
        end = (m if m < steps else steps) * w  # noqa: FURB136 (min() costs a call per request here)
        # a block at every bs-th step from the first position past the table; a stretch shorter
        # than bs steps (the usual one) has at most one: appended (a range per request and an
        # extend from it cost three times as much)
        e = (len(r.block_ids) * bs - c) * w + j
        if e < end:
            if e + period < end:
                opened += range(e, end, period)
            else:
                opened.append(e)
        if caching:
            e = (bs - 1 - c) % bs * w + j
            if e < end:
                if e + period < end:
                    completed += range(e, end, period)
                else:
                    completed.append(e)
            if r.private_from is None:  # (one check per request: most are private)
                num_eager += 1
                if e < end:
                    eager += range(e, end, period)
    opened.sort()
    completed.sort()
    if num_eager == w:
        eager = completed
    elif eager:
        eager.sort()
    return StretchStart(remaining, context_lens, opened, completed, w, eager)
