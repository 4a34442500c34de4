"""The SimPy model of a vLLM-style deployment serving a workload.

One process feeds arrivals (in trace order) to a router; the router picks a replica
(round-robin, least-loaded, or prefix-aware); each replica is one process that loops

    out = scheduler.schedule()                     # engine/core/scheduler.py, the object the engine drives
    gpu_s, cpu_s = cost.gpu_time_s(out), cost.cpu_time_s(out)   # sim/cost_model.py
    yield env.timeout(cost.combine(gpu_s, cpu_s))
    scheduler.update_from_output(out, counts)      # token counts, no token ids in the simulator

Each replica writes what happens to a request into the `RequestLog` (scheduled, first token,
finished, rejected) and one `StepRecord` per step (or per skipped stretch) into the `StepLog`;
those become the result's request and step tables, with the engine's column names.

Skip-ahead (engine/core/decode_skip.py): when the next n steps can only be pure decode of the
running requests (`uniform_decode_steps`; requests reaching their output length leave the
batch on the way), the replica sleeps through them at once: between two finishes the batch
is constant and the step durations have a closed form (`DecodeRun`, one per segment,
`DecodeRuns` for the stretch). It then applies them with `advance_decode`, one step-table
row per constant-batch segment, each finish reported at the end of its last step. An
arrival routed to a sleeping replica wakes it: it then applies only the steps that started
before the arrival, exactly as stepping would (a request that arrives mid-step is
scheduled at the next step boundary); the router sees the replica's load as stepping would
(`load` discounts requests whose last step has ended). Speculative decoding draws random
accepted counts per step, so it always steps.

A lone replica (one replica, no P/D, skip-ahead, `Simulation.run`) spends fewer SimPy events on
the same timeline: it applies a step as it starts when no arrival comes before its end, then
sleeps once through the stretch after it (`_after_folded_step`). Every clock time is SimPy's
very sum and every order at equal times SimPy's own (tests/sim/test_simulator.py compares it
with a clock driven by `env.run`).

Disaggregated prefill: prefill replicas run each request with output_len = 1 and hold its
blocks when it finishes (`hold_blocks_on_finish`); its KV (whole blocks x KV bytes per
token, each TP rank its shard over its own link) then queues for the prefill replica's
link (a SimPy Resource: bandwidth + latency, one transfer at a time) once the decode replica
reaches a step boundary (a decode instance takes a transfer up between its steps), and the
link's end releases the held blocks (`release_held`). The decode pool admits the request with
`num_external_computed_tokens = prompt_len - 1`: blocks for the whole prompt are taken,
and its first step computes only the last prompt token, to get the logits of the first
output token, which is what vLLM's KV connectors do (the scheduler's
`_update_waiting_for_remote_kv` backs one token off a fully transferred prompt).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from bisect import bisect_left
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import simpy

from engine.core.block_keys import first_unshared_hash_blocks
from engine.core.config import scheduler_config
from engine.core.decode_skip import (
    DecodeAdvance,
    StretchStart,
    advance_decode_segments,
    stretch_start,
    uniform_decode_batch,
)
from engine.core.model_spec import blocks_for_tokens
from engine.core.records import StepRecord, with_step_composition
from engine.core.request import Request
from engine.core.run_counters import per_position_counters
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import RequestResult, SchedulerOutput
from sim.config import DeploymentConfig, EngineConfig
from sim.cost_model import CostModel, CostProfile, DecodeRun, DecodeRuns
from sim.hardware import transfer_time_s
from sim.memory import MemoryPlan, draft_spec
from sim.metrics import SLO, SimResult
from sim.resolved import ResolvedDeployment, Role, resolve_deployment
from sim.router import Router
from sim.run_log import RequestLog, StepLog
from sim.serve_line import ServeLine, serve_line
from sim.speculative import AcceptanceModel, SpecTokens

Process = Generator[simpy.Event, Any, Any]


def _first_of(env: simpy.Environment, a: simpy.Event, b: simpy.Event) -> simpy.Event:
    """An event that fires after whichever of a and b is processed first: SimPy's `a | b` with
    the very same event order (one event scheduled when the first fires), without a Condition's
    bookkeeping (value dicts, callback removal), which a skip pays at every wake-up."""
    either = env.event()

    def fire(_: simpy.Event) -> None:
        if not either.triggered:
            either.succeed()

    a.callbacks.append(fire)
    b.callbacks.append(fire)
    return either


def delay_until(now: float, t: float) -> float:
    """The timeout that lands on the clock's first time not before t. SimPy adds delays to `now`,
    and `now + (t - now)` can round one ulp below t (and t itself may be unreachable from now by
    rounding), so the delay is stepped up until the sum is >= t: nothing happens before its time."""
    d = t - now
    while now + d < t:
        d = math.nextafter(d, math.inf)
    return d


@dataclasses.dataclass(slots=True)
class _ReplicaContext:
    """What a replica shares with the simulation: where it reports (request events, step rows,
    speculative draws, the P/D hand-off) and when the next request arrives."""

    requests: RequestLog
    steps: StepLog
    spec: SpecTokens | None
    on_prefilled: Callable[[_Replica, Request, float], None] | None  # a prefill replica's finish
    next_arrival_s: Callable[[], float]  # when the next request enters the deployment (inf: none)
    # request id -> its first hash block no other request shares (None: unknown)
    unshared_from: Callable[[int], int | None]
    # the clock time the arrival process wakes at for the next request (inf: none)
    next_arrival_at: Callable[[], float]
    # whether an arrival after that one resumes the arrival process at exactly this clock time
    arrival_lands_on: Callable[[float], bool]


class _Replica:
    """One vLLM instance: a scheduler, a cost model and the SimPy process driving them."""

    def __init__(self, env: simpy.Environment, idx: int, role: str, engine: EngineConfig, plan: MemoryPlan,
                 cost: CostModel, ctx: _ReplicaContext, *, skip_ahead: bool, kv_block_coarsening: int = 1) -> None:
        self.env, self.idx, self.role, self.engine, self.plan, self.cost = env, idx, role, engine, plan, cost
        self.log, self.step_log, self.spec, self.on_prefilled = ctx.requests, ctx.steps, ctx.spec, ctx.on_prefilled
        self.next_arrival_s, self.unshared_from = ctx.next_arrival_s, ctx.unshared_from
        self.next_arrival_at, self.arrival_lands_on = ctx.next_arrival_at, ctx.arrival_lands_on
        # every arrival is routed here and nothing else wakes it (one replica, no P/D): a stretch
        # the next arrival cuts sleeps until that arrival wakes it, with no timeout of its own
        self.sole = False
        # a lone replica applies a step as it starts when nothing can happen before its end, and
        # the run goes on past it: before this clock time (Simulation.run sets it; -inf: never,
        # for a caller driving the clock itself, whose stop time the replica cannot see)
        self.fold_before = -math.inf
        # KV block coarsening (a speed option): the scheduler tracks blocks of this many engine
        # blocks; CPU costs are charged per engine block (counts x coarsening).
        self.coarsening = kv_block_coarsening
        # CPU seconds per block allocated and per block hashed (skip-ahead charges them apart)
        self.block_unit_s = (cost.block_cpu_s(kv_block_coarsening, 0), cost.block_cpu_s(0, kv_block_coarsening))
        self.sched = Scheduler(scheduler_config(
            engine, num_gpu_blocks=max(plan.num_gpu_blocks // kv_block_coarsening, 1),
            block_size=engine.block_size * kv_block_coarsening,
            num_speculative_tokens=engine.num_speculative_tokens))
        self.skip_ahead = skip_ahead and not cost.k  # speculative steps draw at random: always step
        # async scheduling (the engine runs speculative decoding synchronously): the loop runs a
        # step ahead of the device, as engine/engine_loop.py's _step_async does
        self.pipelined = cost.async_scheduling and not cost.k
        self.inflight: _InFlight | None = None  # pipelined: the step whose tokens are not in yet
        self.left_out_ids: set[int] = set()  # decoders a step left out, until they decode again
        self.wake: simpy.Event | None = None
        self.skipping = False
        self._skip_plan: _Stretch | None = None  # the skip in progress, started at _skip_t0
        self._skip_t0 = 0.0
        self.pending: list[tuple[Request, int]] = []  # (request, external tokens) while skipping
        self.link = simpy.Resource(env, capacity=1) if role == "prefill" else None
        self.boundary_waiters: list[simpy.Event] = []  # see next_step_boundary
        self.proc = env.process(self.run())

    # --- intake -------------------------------------------------------------------
    def add(self, req: Request, external_tokens: int = 0) -> None:
        if self.skipping:
            # the scheduler is mid-way through a bulk decode: hand it over once the steps
            # that started before this arrival are applied (as a step boundary would)
            self.pending.append((req, external_tokens))
        else:
            self._admit(req, external_tokens)
        self.kick()

    def _admit(self, req: Request, external_tokens: int) -> None:
        # a prefill replica keeps the blocks of a finished prompt until its KV transfer ends
        h = self.unshared_from(req.request_id)
        per, rest = divmod(req.hash_block_size, self.sched.block_size)
        self.sched.add_request(req, num_external_computed_tokens=external_tokens,
                               hold_blocks_on_finish=self.role == "prefill",
                               unshared_from_block=h * per if h is not None and per and not rest else None)

    def kick(self) -> None:
        """Wake the step loop if it sleeps waiting for work (or for free blocks)."""
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def next_step_boundary(self) -> simpy.Event:
        """An event at this replica's next step boundary (at once when it is idle). A decode
        instance takes up a new KV transfer only between its steps: the engine's loop posts
        the receive, vLLM's scheduler starts the connector's read. Mid-stretch, the replica is
        woken so that the stretch ends at that boundary."""
        ev = self.env.event()
        if self.wake is not None and not self.skipping:  # idle, waiting for work
            ev.succeed()
            return ev
        self.boundary_waiters.append(ev)
        if self.skipping:
            self.kick()
        return ev

    def _at_boundary(self) -> None:
        for ev in self.boundary_waiters:
            ev.succeed()
        self.boundary_waiters.clear()

    def release(self, request_id: int) -> None:
        """The KV transfer of a finished prompt is done: its held blocks return to the pool."""
        self.sched.release_held(request_id)
        self.kick()

    @property
    def load(self) -> int:
        """vLLM's data-parallel balancing score: 4 x waiting + running. Mid-skip, requests whose
        last step has ended are no longer running (stepping would have finished them by now)."""
        running = self.sched.num_running
        if self.skipping:
            running -= self._skip_plan.num_finished_by(self.env.now - self._skip_t0)
        return 4 * (self.sched.num_waiting + len(self.pending)) + running

    # --- the step loop --------------------------------------------------------------
    def run(self) -> Process:
        sched = self.sched
        step = self._pipelined_step if self.pipelined else self._one_step
        no_stretch = False  # the step before found the batch no uniform decode (see _after_folded_step)
        while True:
            if self.boundary_waiters:  # rare (a disaggregated decode replica): keep the hot loop bare
                self._at_boundary()
            if not sched.running and not sched.has_unfinished() and self.inflight is None:  # (running: no call)
                yield from self._wait_for_work()
                continue
            # (a left-out decoder resumes in a step of its own; a waiting request is scheduled
            # first: both make the next step no uniform decode, known here without a call)
            if self.skip_ahead and not self.left_out_ids and not sched.waiting.items and not no_stretch:
                n, remaining, ctx = uniform_decode_batch(sched)
                if n >= 2:
                    yield from self._skip(n, remaining, ctx)
                    continue
            no_stretch = yield from step()

    def _wait_for_work(self) -> Process:
        self.wake = self.env.event()
        yield self.wake
        self.wake = None

    def _one_step(self) -> Process:
        """Synchronous scheduling: schedule, run the step, then apply its tokens at its end."""
        env, sched, cost = self.env, self.sched, self.cost
        t0 = env.now
        out = sched.schedule()
        for rid, reason in out.rejected:
            self.log.rejected(rid, reason)
        if not out.num_batched_tokens:
            yield from self._empty_step(out, t0)
            return
        # a pure decode step has no first-scheduled or first-token events: skip the per-request view
        samplers = self._samplers(out, t0) if out.num_prefill_seqs or cost.k else None
        gpu_s, cpu_s = cost.gpu_time_s(out), cost.cpu_time_s(out, self.coarsening)
        dt = cost.combine(gpu_s, cpu_s)
        # (every running request in the batch, the usual step: nobody left out, no call)
        left_out = sched.unscheduled_decoders(out) if len(out.batch_records) < len(sched.running) else None
        resumed = self._resuming(out) if self.left_out_ids else None
        t1 = t0 + dt  # the clock time SimPy's timeout lands on (its very sum)
        # a lone replica applies the step now when nothing can happen before t1 (the next arrival
        # comes later; the run goes on past t1), to sleep through to the stretch after it at once
        folded = t1 < self.fold_before and t1 < self.next_arrival_at()
        if not folded:
            yield env.timeout(dt)
        counts, drafted, accepted = None, 0, 0
        if cost.k and samplers:
            counts, drafted, accepted = self.spec.counts(samplers, t1)
            self.log.spec_counts(samplers, counts)
        results = sched.update_from_output(out, counts)
        cut = self.log.decoded_after_gap(resumed, t1) if resumed else 0
        if samplers is None:
            n_out = out.num_decode_seqs
        else:
            n_out = sum(counts.values()) if counts is not None else out.num_scheduled - out.num_silent
            if self.role != "prefill":
                for sr in samplers:
                    self.log.token(sr.request_id, t1)
        for rid in out.preempted_ids:
            # its last token came at the end of the previous step; the gap until its next token
            # is an inter-token latency the step-weighted ITL does not see
            self.log.preempted(rid, t0)
        if left_out:
            self._leave_out(left_out, t0)
        self._ended(results, t1)
        self.step_log.append(self._step_record(out, t0, dt, gpu_s, cpu_s, n_out, drafted, accepted), cut)
        if folded:
            return (yield from self._after_folded_step(t0, dt, t1))
        return False

    def _after_folded_step(self, t0: float, dt: float, t1: float) -> Process:
        """A lone replica's step scheduled at t0 was applied early (nothing can happen before its
        end t1). Where a stretch with its wake-up known in advance follows (the usual case after a
        new request's prefill), sleep once from t0 to that wake-up: one timeout and one turn of
        the loop less per arrival. Else sleep until t1, and the loop goes on as it would have.

        Identical to stepping: the clock lands on the very sum SimPy would have computed,
        (t0 + dt) + delay, checked as t0 + delay' (else two sleeps, as before); the state the
        stretch is planned from is the state at t1 (no arrival before then; `uniform_decode_batch`
        only notes its answer); and its wake-up timeout coming earlier in SimPy's queue changes
        no order, as no other event lands on its time (`_wake_up` checks the arrivals).
        Returns True where it found that no stretch follows (the loop need not look again)."""
        env, sched = self.env, self.sched
        if self.skip_ahead and not self.left_out_ids and not sched.waiting.items and sched.running:
            n, remaining, ctx = uniform_decode_batch(sched)
            if n < 2:
                yield env.timeout(dt)
                return True
            plan = self._plan_stretch(n, remaining, ctx, self.next_arrival_s() - t1,
                                      self.next_arrival_at(), t1)
            if plan.wake_up is not None:
                end = t1 + plan.wake_up.delay_s  # the clock time sleeping from t1 lands on
                delay = end - t0
                if t0 + delay == end:
                    self._skip_plan, self._skip_t0 = plan, t1
                    self.skipping = True
                    yield env.timeout(delay)
                    self.skipping = False
                    self._stretch_ended(plan, t1, plan.wake_up.steps)
                    return False
        yield env.timeout(dt)
        return False

    def _pipelined_step(self) -> Process:
        """Async scheduling, as engine/engine_loop.py's `_step_async` runs it: schedule and prepare step
        i (the scheduler takes its token counts at once), launch it, then collect step i - 1's
        tokens, which arrive when i - 1's device work has ended and i's launch is done; then the
        next schedule() runs. Step i's device work starts when i - 1's ends or its launching
        begins, whichever is later: an eager step's launches (seconds of Python on a slow host)
        overlap its own device work, so they lengthen this period and shorten the next; a long
        one blocks on the device until part of its work has run (CostModel.blocked_device_s). So step
        i admits what arrived before i - 1's device work ended, not before i - 1's tokens came
        back (the one-step-earlier cut that groups arrivals into fewer, larger steps when missed)."""
        env, sched, cost = self.env, self.sched, self.cost
        t0 = env.now
        out = sched.schedule()
        for rid, reason in out.rejected:
            self.log.rejected(rid, reason)
        prev = self.inflight
        if not out.num_batched_tokens:
            self._ended(sched.update_from_output(out, None), t0)
            if prev is None:
                yield from self._empty_step(out, t0, updated=True)
                return
            self.inflight = None  # nothing new to launch: wait for the last step's tokens
            if prev.gpu_end_s > t0:
                yield env.timeout(delay_until(t0, prev.gpu_end_s))
            self._collect(prev, env.now, t0)
            # its decoders' previous tokens came at t0: a gap no step row's period measures
            self.log.gaps(env.now - t0, prev.num_decodes - len(prev.resumed or ()))
            return
        samplers = self._samplers(out, t0) if out.num_prefill_seqs else None
        gpu_s, cpu_s = cost.gpu_time_s(out), cost.cpu_time_s(out, self.coarsening)
        device_s, host_s = cost.device_and_host_s(gpu_s, cpu_s)
        launch_s = cost.launch_s(out)  # an eager step's launches: its device work runs meanwhile
        left_out = sched.unscheduled_decoders(out)
        resumed = self._resuming(out) if self.left_out_ids else None
        results = sched.update_from_output(out, None)
        launching = t0 + host_s
        start = launching if prev is None or prev.gpu_end_s <= launching else prev.gpu_end_s
        # an eager step's launch returns once its own kernels are launched and, past the launch
        # queue's depth, once the device has run part of its work
        launched = max(launching + launch_s, start + cost.blocked_device_s(out, device_s))
        done = launched if prev is None or prev.gpu_end_s <= launched else prev.gpu_end_s  # i - 1 collected
        n_out = out.num_decode_seqs if samplers is None else out.num_scheduled - out.num_silent
        self.inflight = _InFlight(t0, start + max(device_s, launch_s), results, out.num_decode_seqs, samplers, resumed,
                                  out, gpu_s, cpu_s, n_out)
        yield env.timeout(delay_until(t0, done))
        now = env.now
        if prev is not None:
            self._collect(prev, now, t0)
        for rid in out.preempted_ids:  # its last token: the one collected just now at the latest
            self.log.preempted(rid, now)
        if left_out:
            self._leave_out(left_out, now)

    def _collect(self, fl: _InFlight, t: float, next_t0: float) -> None:
        """A pipelined step's tokens reached the host at t; the step after it started at next_t0."""
        cut = self.log.decoded_after_gap(fl.resumed, t) if fl.resumed else 0
        if fl.samplers is not None and self.role != "prefill":
            for sr in fl.samplers:
                self.log.token(sr.request_id, t)
        self._ended(fl.results, t)
        if fl.out is not None:  # a stretch's last step has its row already
            self.step_log.append(self._step_record(fl.out, fl.t_start_s, next_t0 - fl.t_start_s, fl.gpu_s,
                                                   fl.cpu_s, fl.n_out, 0, 0), cut)

    def _resuming(self, out: SchedulerOutput) -> list[int]:
        """Left-out decoders that decode in `out` (read before its update)."""
        ids = [sr.request_id for sr in out.scheduled if not sr.is_prefill and sr.request_id in self.left_out_ids]
        self.left_out_ids.difference_update(ids)
        return ids

    def _leave_out(self, request_ids: list[int], last_token_s: float) -> None:
        self.left_out_ids.update(request_ids)
        self.log.left_out(request_ids, last_token_s)

    def _empty_step(self, out: SchedulerOutput, t0: float, *, updated: bool = False) -> Process:
        """Nothing runnable (e.g. only rejections this step): report, then wait for new work."""
        if not updated:
            self._ended(self.sched.update_from_output(out, None), t0)
        if self.sched.num_running:  # would spin forever at one instant: a scheduler bug
            raise RuntimeError(f"replica {self.idx}: scheduler returned an empty step with "
                               f"{self.sched.num_running} running requests at t={t0:.6f} s")
        if self.sched.num_waiting:
            yield from self._wait_for_work()

    def _samplers(self, out: SchedulerOutput, t0: float) -> list:
        """The entries of the scheduled requests whose token times are logged, in batch order;
        stamps first scheduling of prefills. Without speculative decoding, plain decodes (one
        token into a block the request holds, no entry: the bulk of a step) are left out: such a
        request has sampled since its admission, so its first token is logged already, and a
        left-out decoder's open token gap is closed by `decoded_after_gap` before tokens are
        logged: `RequestLog.token` would do nothing for it. Under speculative decoding all are
        entries (their drafts are read)."""
        log = self.log
        samplers = []
        for e in out.scheduled if self.cost.k else out.entries.values():
            if e.samples:
                samplers.append(e)
            if e.is_prefill:
                log.scheduled(e.request_id, t0)
        return samplers

    def _step_record(self, out: SchedulerOutput, t0: float, dt: float, gpu_s: float, cpu_s: float,
                     n_out: int, drafted: int, accepted: int) -> StepRecord:
        # (fields set on a default record: a call with many keywords matches each against the
        # record's 36 parameter names, about twice the cost of the stores)
        rec = StepRecord()
        rec.replica, rec.t_start_s, rec.total_s, rec.first_dt_s, rec.last_dt_s = self.idx, t0, dt, dt, dt
        rec.gpu_s, rec.cpu_s, rec.num_output_tokens = gpu_s, cpu_s, n_out
        rec.drafted, rec.accepted, rec.num_spec_accepted_tokens = drafted, accepted, accepted
        return with_step_composition(rec, out, self.sched)

    def _ended(self, results: list[RequestResult], t: float) -> None:
        """Report requests that left the scheduler at t."""
        for res in results:
            if self.role == "prefill" and res.status == "finished":
                self.log.prefilled(res)
                self.on_prefilled(self, self.log.requests[self.log.index(res.request_id)], t)
            else:
                self.log.finished(res, t, cache_hits_here=self.role == "mixed")

    # --- skip-ahead ---------------------------------------------------------------------
    def _skip(self, n: int, remaining: list[int], ctx: list[int]) -> Process:
        """Sleep through up to n pure-decode steps (the batch shrinking where requests finish);
        stop early at a wake-up (new work), then apply the steps that started before it.
        `remaining`, `ctx`: the running requests' remaining outputs and KV tokens (batch order)."""
        t0 = self.env.now
        plan = self._plan_stretch(n, remaining, ctx, self.next_arrival_s() - t0,
                                  self.next_arrival_at() if self.sole else math.inf, t0)
        self._skip_plan, self._skip_t0 = plan, t0
        if plan.wake_up is not None:  # the arrival that wakes it comes to pending meanwhile
            self.skipping = True
            yield self.env.timeout(plan.wake_up.delay_s)  # (here: one generator less to resume)
            self.skipping = False
            m = plan.wake_up.steps
        else:
            m = yield from self._sleep_through(plan, plan.runs.n)
        self._stretch_ended(plan, t0, m)

    def _stretch_ended(self, plan: _Stretch, t0: float, m: int) -> None:
        """The stretch that started at t0 ends after its first m steps: apply them, then admit
        the requests that arrived meanwhile."""
        if self.pipelined:
            self._apply_pipelined(plan, t0, m)
        elif m:
            segments = plan.segments_within(m)
            mixed = self.role == "mixed"
            report = self._ended if self.role == "prefill" else None  # (else _ended's report, inlined)
            for (k, first, num_steps), adv in zip(segments, self._advance(plan, segments)):
                for res, s in zip(adv.finished, adv.finish_steps):
                    if report is None:
                        self.log.finished(res, t0 + plan.step_start_s(first + s + 1), cache_hits_here=mixed)
                    else:
                        report((res,), t0 + plan.step_start_s(first + s + 1))
                self.step_log.append(self._skip_record(plan, adv, t0, k, num_steps))
        for req, ext in self.pending:
            self._admit(req, ext)
        self.pending.clear()
        if m:  # the gauges after the stretch: what was admitted at the wake-up is waiting
            last = self.step_log.records[-1]
            sched = self.sched  # (its gauges, read without their property calls)
            last.num_running, last.num_waiting = len(sched.running), len(sched.waiting.items)
            last.kv_usage = sched.kv_cache_manager.usage()

    def _apply_pipelined(self, plan: _Stretch, t0: float, m: int) -> None:
        """The first m steps of a stretch under async scheduling: the step before it is collected
        at the end of the stretch's first period, step s's tokens at the end of period s + 1, and
        step m - 1 stays in flight (the next step collects it)."""
        if not m:
            return
        prev = self.inflight
        if prev is not None:
            self.inflight = None
            self._collect(prev, t0 + plan.step_start_s(1), t0)
        in_flight: list[RequestResult] = []  # finished in step m - 1
        segments = plan.segments_within(m)
        for (k, first, num_steps), adv in zip(segments, self._advance(plan, segments)):
            for res, s in zip(adv.finished, adv.finish_steps):
                if first + s + 2 <= m:
                    self._ended([res], t0 + plan.step_start_s(first + s + 2))
                else:
                    in_flight.append(res)
            self.step_log.append(self._skip_record(plan, adv, t0, k, num_steps))
        end = t0 + plan.step_start_s(m)  # step m - 1's device work starts here
        self.inflight = _InFlight(t0 + plan.step_start_s(m - 1), end + plan.device_s(m - 1), in_flight,
                                  adv.num_seqs_at(num_steps - 1))

    def _advance(self, plan: _Stretch, segments: list[tuple[int, int, int]]) -> list[DecodeAdvance]:
        """Apply the (run index, first step, steps) segments of a stretch: one advance, one report each."""
        return advance_decode_segments(self.sched, [first + num_steps for _, first, num_steps in segments],
                                       plan.start)

    def _plan_stretch(self, n: int, remaining: list[int], ctx: list[int], horizon_s: float,
                      wake_at: float, t0: float) -> _Stretch:
        """Durations of up to n decode steps from clock time t0, cut after the segment that passes
        `horizon_s` (the next arrival, which will most likely wake the replica: steps past it are
        rarely used). `wake_at`: the clock time an arrival will wake the replica at for sure (inf:
        unknown)."""
        sched = self.sched
        batches = self._decode_runs(remaining, ctx, n, horizon_s)
        runs, own = batches, None
        if self.pipelined:
            fl = self.inflight
            runs, own = _pipelined_runs(batches, max(fl.gpu_end_s - t0, 0.0) if fl is not None else 0.0)
        # woken before its last step ends (block CPU time only adds to the runs' time): it then
        # applies only the steps started by the wake-up, at most those the runs alone start by then
        woken = wake_at < t0 + runs.elapsed_s(runs.n)
        last = runs.steps_started_before(wake_at - t0) if woken else runs.n
        # the batch as it starts, with which step opens and completes which block: the CPU time
        # of block work below, and what the stretch's application reads (once for both)
        start = stretch_start(sched, last, remaining, ctx)
        block_s, known = (None, None) if self.cost.async_scheduling else self._block_cpu_fn(start)
        plan = _Stretch(runs, block_s, start, last if woken else None, own_device=own, block_known=known)
        if woken:
            plan.wake_up = self._wake_up(plan, t0, wake_at)
        return plan

    def _wake_up(self, plan: _Stretch, t0: float, wake_at: float) -> _WakeUp | None:
        """When an arrival wakes the replica at `wake_at` for sure: the steps it will apply then
        and the very clock time the wake-up would have slept until (the end of the last of
        them), as a delay from now, so that it sleeps once and needs no wake-up event. None
        where that would not resume it exactly as the wake-up does: no step to wait for, a sum
        SimPy would round differently, or another arrival resuming at that very time (the
        wake-up's timeout would have come after it)."""
        m = plan.runs.steps_started_before(wake_at - t0, plan.block_s, plan.woken_after)
        if not m:
            return None
        end = wake_at + max(t0 + plan.step_start_s(m) - wake_at, 0.0)  # SimPy's sum at the wake-up
        delay = end - t0
        if end <= wake_at or t0 + delay != end or self.arrival_lands_on(end):
            return None
        return _WakeUp(m, delay)

    def _decode_runs(self, remaining: list[int], ctx: list[int], n: int, horizon_s: float) -> DecodeRuns:
        """One DecodeRun per constant batch of the first n steps (the batch shrinks where
        requests finish), until the one that passes `horizon_s`. Walks the (remaining steps,
        KV tokens) of the requests in order, the batches `advance_decode` will report
        (`DecodeAdvance.stretch.segments()`), but stops at the horizon. The first batch is
        the whole one: timed before sorting the requests by who leaves first, which the
        stretch needs only if it runs past that batch (often not: an arrival cuts it)."""
        num = len(ctx)
        ctx_left = sum(ctx)  # KV tokens of the requests still decoding at step `first`
        runs = DecodeRuns()
        if not 0.0 <= horizon_s:  # (the horizon passed already: no batch, as the loop below has it)
            return runs
        first = min(min(remaining), n)
        elapsed_s = runs.add(self.cost.decode_run(num, ctx_left + num, first, max(ctx) + 1))
        if first >= n or elapsed_s > horizon_s:
            return runs
        by_remaining = sorted(zip(remaining, ctx))  # who leaves the batch first
        ctxs = [c for _, c in by_remaining]
        k = 0
        while first < n and elapsed_s <= horizon_s:
            while by_remaining[k][0] <= first:
                ctx_left -= by_remaining[k][1]
                k += 1
            end = min(by_remaining[k][0], n)
            b = num - k
            # (the longest KV among requests k..: a C-level max per batch, a few per stretch)
            elapsed_s = runs.add(self.cost.decode_run(b, ctx_left + (first + 1) * b, end - first,
                                                      max(ctxs[k:]) + first + 1))
            first = end
        return runs

    def _sleep_through(self, plan: _Stretch, n: int) -> Process:
        """Sleep until n steps are done or new work arrives; returns how many steps to apply:
        those that started before the wake-up, whose end it then waits for. (A wake-up known in
        advance, `plan.wake_up`, is slept through by `_skip`.)"""
        env = self.env
        t0 = env.now
        self.wake = env.event()
        self.skipping = True
        # (block times are known only for the steps up to the wake-up then)
        yield self.wake if plan.woken_after is not None else _first_of(env, env.timeout(plan.step_start_s(n)),
                                                                        self.wake)
        woke = self.wake.triggered
        self.wake = None
        m = n
        if woke:
            m = plan.runs.steps_started_before(env.now - t0, plan.block_s, plan.woken_after)
            if m:
                yield env.timeout(max(t0 + plan.step_start_s(m) - env.now, 0.0))
        self.skipping = False
        return m

    def _skip_record(self, plan: _Stretch, adv: DecodeAdvance, t0: float, k: int, num_steps: int) -> StepRecord:
        """One step-table row: the first `num_steps` steps of the stretch's segment k (one batch)."""
        run = plan.runs.runs[k]
        first = plan.runs.first_steps[k]
        end = first + num_steps
        starts = plan.starts  # (step_start_s's cache read here: both are mostly in it by now)
        start_s = starts.get(first)
        if start_s is None:
            start_s = plan.step_start_s(first)
        end_s = starts.get(end)
        if end_s is None:
            end_s = plan.step_start_s(end)
        cpu_s = run.cpu_elapsed_s(num_steps)
        if plan.own_device is not None:  # pipelined: the periods mix neighbouring steps' device time
            gpu_s = plan.device_elapsed_s(first, end) - num_steps * self.cost.async_gap_s
        else:
            gpu_s = run.elapsed_s(num_steps) - (0.0 if self.cost.async_scheduling else cpu_s)
        if plan.block_s is not None:
            known = plan.block_known  # (block_s's own cache, read here: both ends are mostly in it)
            b_end, b_first = known.get(end), known.get(first)
            cpu_s += ((plan.block_s(end) if b_end is None else b_end)
                      - (plan.block_s(first) if b_first is None else b_first))
        b = adv.num_seqs
        rec = StepRecord()  # (fields set on a default record: see _step_record)
        rec.replica, rec.step_id, rec.n_steps = self.idx, adv.first_step_id, num_steps
        rec.t_start_s, rec.total_s = t0 + start_s, end_s - start_s
        if run.overlap:
            rec.first_dt_s, rec.last_dt_s = run.dt(0), run.dt(num_steps - 1)
        else:  # (DecodeRun.dt's sync sum, inlined)
            i = num_steps - 1
            rec.first_dt_s = run.g0 + run.cpu
            rec.last_dt_s = (run.g0 + run.slope * i) + (run.cpu + run.cpu_slope * i)
        rec.gpu_s, rec.cpu_s = gpu_s, cpu_s
        rec.num_batched_tokens = rec.num_decode_tokens = rec.num_decode_seqs = b
        rec.sum_decode_context = adv.sum_decode_context_first_step
        rec.max_decode_context = adv.max_decode_context_first_step
        rec.num_blocks_allocated, rec.num_blocks_hashed = adv.num_blocks_allocated, adv.num_blocks_hashed
        rec.num_output_tokens, rec.num_running = num_steps * b, adv.num_running_after
        rec.num_waiting, rec.kv_usage = len(self.sched.waiting.items), adv.kv_usage_after  # (num_waiting's)
        return rec

    def _block_cpu_fn(self, blocks: StretchStart) -> tuple[Callable[[int], float], dict[int, float]]:
        """CPU seconds of the blocks allocated and hashed in the first m steps of a stretch
        (bisections of its sorted block steps: no per-call pass over the batch), and the dict
        of those it computed (by m)."""
        caching = self.engine.enable_prefix_caching
        opened, completed, w = blocks.opened, blocks.completed, blocks.width
        blk_s, hash_s = self.block_unit_s

        known: dict[int, float] = {}  # a skip asks for the same few steps several times

        def block_s(m: int) -> float:
            t = known.get(m)
            if t is None:
                t = 0.0 if m <= 0 else blk_s * bisect_left(opened, m * w)
                if caching and m > 0:
                    t += hash_s * bisect_left(completed, m * w)
                known[m] = t
            return t

        return block_s, known


@dataclasses.dataclass(slots=True)
class _InFlight:
    """Async scheduling: the step launched last, whose tokens reach the host once its device work
    has ended (the engine's `_Pending`). Its finished requests end then; its row is written then
    too, when its period (up to the next schedule) is known, unless a stretch wrote it already."""

    t_start_s: float  # its schedule() ran then
    gpu_end_s: float  # its device work ends then
    results: list[RequestResult]  # requests it finished
    num_decodes: int  # its decoding sequences
    samplers: list | None = None  # entries whose token time is logged (None: plain decodes only)
    resumed: list[int] | None = None  # left-out decoders back in it: their gaps close at its tokens
    out: SchedulerOutput | None = None  # None: its row is written already (a stretch's last step)
    gpu_s: float = 0.0
    cpu_s: float = 0.0
    n_out: int = 0


def _pipelined_runs(batches: DecodeRuns, lead_s: float) -> tuple[DecodeRuns, list[tuple[float, float]]]:
    """A pipelined stretch's runs and their steps' own device terms (see `_Stretch`).
    `batches`: one DecodeRun per constant batch, each step's device and host terms (as
    `CostModel.decode_run` gives them); `lead_s`: device seconds the in-flight step has left."""
    runs, own = [], []
    prev_device_s = lead_s
    for r in batches.runs:
        runs.append(DecodeRun(g0=prev_device_s, slope=0.0, cpu=r.cpu, n=1, overlap=True))
        own.append((r.g0, 0.0))
        if r.n > 1:
            runs.append(DecodeRun(g0=r.g0, slope=r.slope, cpu=r.cpu + r.cpu_slope, n=r.n - 1, overlap=True,
                                  cpu_slope=r.cpu_slope))
            own.append((r.g0 + r.slope, r.slope))
        prev_device_s = r.g0 + r.slope * (r.n - 1)
    return DecodeRuns(runs), own


@dataclasses.dataclass(slots=True)
class _WakeUp:
    """A lone replica's stretch that the next arrival cuts, known in advance (`_Replica._wake_up`)."""

    steps: int  # the steps it applies: those started by the wake-up
    delay_s: float  # from the stretch's start to the end of the last of them, as SimPy would sum it


@dataclasses.dataclass(slots=True)
class _Stretch:
    """A skip's plan: step durations (`runs`, each a DecodeRun of steps whose duration is linear,
    `runs.first_steps` where each starts), the CPU time of the blocks its first m steps allocate
    and hash (None when async scheduling hides it), and the batch as it starts.

    Pipelined (async scheduling, `own_device` set): step i's period is max(its host time, step
    i - 1's device time), so each constant batch is two runs, its first step (paired with the
    previous batch's last device time, or with what is left of the in-flight step's) and the
    rest; `own_device[j]` = (d0, slope): run j's steps' own device seconds d0 + slope * i."""

    runs: DecodeRuns
    block_s: Callable[[int], float] | None
    start: StretchStart  # the running requests as it starts, and the blocks they open and complete
    # an arrival wakes it before its last step ends (see _Replica.sole), after this many steps
    # started (without block CPU time: at most so many); None: not known to
    woken_after: int | None = None
    wake_up: _WakeUp | None = None  # known in advance: the steps applied and the sleep until then
    own_device: list[tuple[float, float]] | None = None
    block_known: dict[int, float] | None = None  # block_s's values computed so far, by step
    # step -> step_start_s: a skip asks for the same few steps (segment ends, finishes,
    # the router's load probes) many times
    starts: dict[int, float] = dataclasses.field(default_factory=dict, init=False, repr=False)
    # after how many steps each finishing request is done, sorted (built when a load probe asks)
    _finish_after: list[int] | None = dataclasses.field(default=None, init=False, repr=False)

    def step_start_s(self, m: int) -> float:
        """Seconds from the stretch's start to the start of its step m (the end of step m - 1)."""
        t = self.starts.get(m)
        if t is None:
            t = self.runs.elapsed_s(m) + (self.block_s(m) if self.block_s is not None else 0.0)
            self.starts[m] = t
        return t

    def device_s(self, i: int) -> float:
        """Pipelined: step i's own device seconds."""
        k = self.runs.run_of(i)
        d0, slope = self.own_device[k]
        return d0 + slope * (i - self.runs.first_steps[k])

    def device_elapsed_s(self, first: int, end: int) -> float:
        """Pipelined: the own device seconds of steps [first, end), all in one run."""
        k = self.runs.run_of(first)
        d0, slope = self.own_device[k]
        i0 = first - self.runs.first_steps[k]
        n = end - first
        return n * d0 + slope * (2 * i0 + n - 1) * n / 2

    def num_finished_by(self, elapsed_s: float) -> int:
        """Finishing requests that have left the scheduler `elapsed_s` into the stretch: at the
        end of their last step, or (pipelined) when it was scheduled."""
        steps = self._finish_after
        if steps is None:
            n = self.runs.n
            steps = self._finish_after = sorted([x for x in self.start.remaining if x <= n])
        lag = 1 if self.own_device is not None else 0
        lo, hi = 0, len(steps)  # finishes [0, lo) are done by then, [hi, end) are not
        while lo < hi:
            mid = (lo + hi) // 2
            if self.step_start_s(steps[mid] - lag) <= elapsed_s:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def segments_within(self, m: int) -> list[tuple[int, int, int]]:
        """(run index, first step, steps) of the runs, cut to the first m steps."""
        return [(k, f, min(r.n, m - f)) for k, (f, r) in enumerate(zip(self.runs.first_steps, self.runs.runs))
                if f < m]


def kv_block_coarsening_for(want: int | str, block_size: int, requests: Sequence[Request]) -> int:
    """Engine blocks per scheduler block. "auto": as many as fit in the workload's hash block
    (its prefix structure is no finer than that), a power of two, at most 64.

    Coarse blocks make the simulation faster (the scheduler's work is per block) at the price of
    fragmentation: a request's last block wastes up to coarsening x block_size - 1 slots instead
    of block_size - 1, and prefix hits end on coarse-block boundaries.
    """
    if want == "auto":
        hash_block = min(r.hash_block_size for r in requests)
        factor = 1
        while factor < 64 and hash_block % (block_size * factor * 2) == 0:
            factor *= 2
        return factor
    if not isinstance(want, int) or want < 1:
        raise ValueError(f"kv_block_coarsening {want!r}: use a positive integer or 'auto'")
    return want


class Simulation:
    """A deployment serving a list of requests; `run()` returns a `SimResult`."""

    def __init__(self, deployment: DeploymentConfig, requests: Sequence[Request], *, seed: int = 0,
                 profile: CostProfile | None = None, slo: SLO | None = None, skip_ahead: bool = True,
                 progress: Callable[[float], None] | None = None, label: str | None = None,
                 meta: dict[str, Any] | None = None, kv_block_coarsening: int | str = 1,
                 resolved: ResolvedDeployment | None = None) -> None:
        if not requests:
            raise ValueError("the workload has no requests")
        if resolved is not None and (resolved.deployment is not deployment or resolved.profile is not profile):
            raise ValueError("resolved: resolved for another deployment or profile; pass the ones it was built from")
        self.dep = deployment
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self.log = RequestLog(self.requests)
        self.step_log = StepLog()
        self.router = Router(deployment.router)
        self.seed, self.slo, self.skip_ahead, self.progress = seed, slo, skip_ahead, progress
        self.label, self.extra_meta = label, meta or {}
        self.env = simpy.Environment()
        self.profile = profile or CostProfile.load("default")
        # flags and memory plans, once per run (sim.run resolves them before its size check)
        self.resolved = resolved or resolve_deployment(deployment, self.profile)
        self.coarsen = kv_block_coarsening_for(kv_block_coarsening, deployment.engine.block_size,
                                              self.requests)
        self._next_arrival = 0  # index of the next request to arrive
        self._arrival_at = math.inf  # the clock time the arrival process resumes at (see _arrivals)
        self._build_replicas()
        self.env.process(self._arrivals())

    # --- construction -------------------------------------------------------------------
    def _build_replicas(self) -> None:
        dep = self.dep
        res = self.resolved
        base = res.engine
        self.max_model_len = base.max_model_len
        draft = draft_spec(dep.model, base.speculative_config)
        category = {r.request_id: r.category for r in self.requests}
        self.spec = (SpecTokens(AcceptanceModel(base.speculative_config, self.seed, dep.model.name),
                                category.__getitem__)
                     if base.speculative_config else None)
        self._unshared: dict[int, int] = {}  # filled when the arrivals start
        ctx = _ReplicaContext(self.log, self.step_log, self.spec, self._start_transfer, self._next_arrival_s,
                              self._unshared.get, self._next_arrival_at, self._arrival_lands_on)
        self.prefill_pool: list[_Replica] = []
        self.decode_pool: list[_Replica] = []

        def replica(idx: int, role: Role, with_draft: bool) -> _Replica:
            inst = res.instance(role)  # flags and memory plan resolved once per run, not per replica
            cost = CostModel(dep.model, dep.gpu, inst.engine, self.profile, draft if with_draft else None)
            return _Replica(self.env, idx, role, inst.engine, inst.plan, cost, ctx,
                            skip_ahead=self.skip_ahead, kv_block_coarsening=self.coarsen)

        if dep.disaggregation is None:
            self.replicas = [replica(i, "mixed", True) for i in range(dep.num_replicas)]
            self.front = self.replicas
            self.replicas[0].sole = len(self.replicas) == 1
            return
        d = dep.disaggregation
        self.prefill_pool = [replica(i, "prefill", False) for i in range(d.num_prefill_replicas)]
        self.decode_pool = [replica(d.num_prefill_replicas + j, "decode", True)
                            for j in range(d.num_decode_replicas)]
        self.replicas = self.prefill_pool + self.decode_pool
        self.front = self.prefill_pool
        self.link_gb_per_s = d.link_bandwidth_gb_per_s(dep.gpu)
        self.link_latency_s = d.link_latency(dep.gpu)

    # --- arrivals and disaggregated hand-off ------------------------------------------------
    def _arrivals(self) -> Process:
        env, reqs = self.env, self.requests
        n = len(reqs)
        every = max(n // 100, 1)
        disagg = self.dep.disaggregation is not None
        self._unshared.update(first_unshared_hash_blocks(reqs))  # (part of the run's time)
        sole = self.front[0] if len(self.front) == 1 else None  # (Router.pick's answer then)
        for i, req in enumerate(reqs):
            self._next_arrival = i
            now = env.now
            t = req.arrival_s
            if t > now:
                d = t - now  # (delay_until's first guess, mostly its answer: no call then)
                if now + d < t:
                    d = delay_until(now, t)
                self._arrival_at = now + d  # when SimPy will resume this process (its sum)
                yield env.timeout(d)
            rep = sole or self.router.pick(req, self.front)
            self.log.routed(req.request_id, rep.idx)
            rep.add(dataclasses.replace(req, output_len=1) if disagg else req)
            if self.progress is not None and i % every == 0:
                self.progress(i / n)
        self._next_arrival = n
        self._arrival_at = math.inf

    def _next_arrival_at(self) -> float:
        return self._arrival_at

    def _arrival_lands_on(self, t: float) -> bool:
        """Whether an arrival after the one the arrival process waits for resumes it at exactly
        clock time t (as it will compute its resume times)."""
        reqs = self.requests
        now = self._arrival_at
        for k in range(self._next_arrival + 1, len(reqs)):
            a = reqs[k].arrival_s
            if a > now:
                d = a - now  # (delay_until's first guess, mostly its answer: no call then)
                now += d if now + d >= a else delay_until(now, a)
            if now >= t:
                return now == t
        return False

    def _next_arrival_s(self) -> float:
        i = self._next_arrival
        return self.requests[i].arrival_s if i < len(self.requests) else math.inf

    def _start_transfer(self, src: _Replica, req: Request, t_ready: float) -> None:
        self.env.process(self._transfer(src, req, t_ready))

    def _transfer(self, src: _Replica, req: Request, t_ready: float) -> Process:
        """Move the prompt's KV (whole blocks; each TP rank its shard) over src's link."""
        nbytes = (blocks_for_tokens(req.prompt_len, src.engine.block_size) * src.engine.block_size
                  * src.plan.kv_bytes_per_token / src.engine.tensor_parallel_size)
        dst = self.router.pick(req, self.decode_pool)
        self.log.routed(req.request_id, dst.idx)
        yield dst.next_step_boundary()  # the decode side takes the transfer up between steps
        with src.link.request() as slot:
            yield slot
            yield self.env.timeout(transfer_time_s(nbytes, self.link_gb_per_s, self.link_latency_s))
        src.release(req.request_id)
        self.log.transferred(req.request_id, self.env.now - t_ready)
        # the last prompt token is recomputed on the decode side to produce logits; admitted
        # at the decode side's next step boundary
        dst.add(req, external_tokens=req.prompt_len - 1)

    # --- run ---------------------------------------------------------------------------------
    def run(self, until_s: float | None = None) -> SimResult:
        t_wall = time.perf_counter()
        for rep in self.replicas:  # (see _Replica.fold_before: only a lone replica that skips)
            rep.fold_before = (math.inf if until_s is None else until_s) if rep.sole and rep.skip_ahead else -math.inf
        with _cyclic_gc_paused():
            self.env.run(until=until_s)
        wall = time.perf_counter() - t_wall
        return self._result(wall)

    def _serve_line(self) -> ServeLine:
        """The `vllm serve` line of this run (the decode side's flags, plus the connector, for P/D)."""
        dep, pd = self.dep, self.dep.disaggregation
        eng = (self.decode_pool or self.replicas)[0].engine
        return serve_line(dep.model.name, eng, baseline=self.resolved.defaults,
                          replicas=dep.num_replicas, kv_connector=pd.kv_connector if pd else None,
                          prefill_replicas=pd.num_prefill_replicas if pd else 0,
                          decode_replicas=pd.num_decode_replicas if pd else 0)

    def _counters(self) -> dict[str, float]:
        q = h = 0
        for rep in self.replicas:
            if rep.role != "decode":  # transferred prompts are not cache lookups
                q += rep.sched.stats.prefix_cache_queries_tokens
                h += rep.sched.stats.prefix_cache_hits_tokens
        sp = self.spec
        per_pos = [sum(col) for col in zip(*(rep.sched.num_spec_accepted_per_pos for rep in self.replicas))]
        return {"prefix_cache_queries_tokens": q, "prefix_cache_hits_tokens": h,
                "spec_num_drafts": sp.num_drafts if sp else 0, "spec_draft_tokens": sp.draft_tokens if sp else 0,
                "spec_accepted_tokens": sp.accepted_tokens if sp else 0, **per_position_counters(per_pos)}

    def _meta(self) -> dict[str, Any]:
        dep, reqs = self.dep, self.requests
        first, last = reqs[0].arrival_s, reqs[-1].arrival_s
        rate = (len(reqs) - 1) / (last - first) if len(reqs) > 1 and last > first else "inf"
        line = self._serve_line()
        return {"endpoint_type": "simulated", "backend": "costline-sim", "model": dep.model.name,
                "gpu": dep.gpu.name, "num_gpus": dep.num_gpus, "num_replicas": len(self.replicas),
                "deployment": dep.describe(), "seed": self.seed, "label": self.label, "request_rate": rate,
                "slo": self.slo, "num_gpu_blocks": self.replicas[0].plan.num_gpu_blocks,
                "max_model_len": self.max_model_len, "kv_block_coarsening": self.coarsen,
                "vllm_args": line.args, "serve_command": line.command, **self._engine_meta()} | self.extra_meta

    def _engine_meta(self) -> dict[str, Any]:
        """The scheduling mode and speculative config simulated (engine/core/run_summary.ENGINE_META_KEYS)."""
        eng = self.dep.engine
        sc = eng.speculative_config
        return {"async_scheduling": eng.async_scheduling, "speculative_config": sc.vllm_json() if sc else None}

    def _result(self, wall_s: float) -> SimResult:
        return SimResult(requests=self.log.table(), steps=self.step_log.table(), meta=self._meta(),
                         counters=self._counters(), wall_s=wall_s,
                         itl_gaps_s=np.asarray(self.log.stall_gaps_s, dtype=np.float64),
                         itl_weight_cuts=self.step_log.itl_weight_cuts(),
                         pipelined=any(rep.pipelined for rep in self.replicas if rep.role != "prefill"))


@contextlib.contextmanager
def _cyclic_gc_paused() -> Generator[None, None, None]:
    """Pause Python's cyclic garbage collector while the clock runs. A run keeps many small
    tracked objects alive (requests, block tables, step records) that the collector would
    rescan at every threshold (about a sixth of the CPU of the Mooncake trace on 8 replicas)
    while finding nothing: a run creates no reference cycles (tests/sim/test_simulator.py
    checks it), so reference counting frees everything it drops. The prior state is restored.

    On the way out, the objects the run made are moved to the oldest generation (a freeze and
    an unfreeze: two list splices), else the first allocation after re-enabling would scan
    them all as the youngest generation, to find nothing (~2% of the conversation benchmark's
    run). Not when the caller keeps objects frozen (gc.freeze: the unfreeze would thaw them)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def simulate(deployment: DeploymentConfig, requests: Sequence[Request], *, seed: int = 0,
             profile: CostProfile | None = None, slo: SLO | None = None, skip_ahead: bool = True,
             progress: Callable[[float], None] | None = None, label: str | None = None,
             meta: dict[str, Any] | None = None, kv_block_coarsening: int | str = 1,
             until_s: float | None = None) -> SimResult:
    """Run one simulation (see `Simulation`); `until_s` stops the clock early."""
    return Simulation(deployment, requests, seed=seed, profile=profile, slo=slo, skip_ahead=skip_ahead,
                      progress=progress, label=label, meta=meta,
                      kv_block_coarsening=kv_block_coarsening).run(until_s=until_s)


__all__ = ["Simulation", "delay_until", "kv_block_coarsening_for", "simulate"]
