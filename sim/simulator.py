"""The SimPy model of a vLLM-style deployment serving a workload.

One process feeds arrivals (in trace order) to a router; the router picks a replica
(round-robin, least-loaded, or prefix-aware); each replica is one process that loops

    out = scheduler.schedule()                  # engine/scheduler.py, the same object the engine drives
    dt  = cost_model.step_time_s(composition)   # sim/cost_model.py
    yield env.timeout(dt)
    scheduler.update_from_output(out, counts)   # token counts, no token ids in the simulator

and records when each request gets its first token and finishes.

Skip-ahead: when the scheduler says the next n steps are pure decode of an unchanged
running set (`uniform_decode_steps`), the replica sleeps through all n at once (their
durations have a closed form, `DecodeRun`) and applies them with `advance_decode`. An
arrival routed to a sleeping replica wakes it: it then applies only the steps that
started before the arrival, exactly as stepping would (a request that arrives mid-step
is scheduled at the next step boundary). Speculative decoding draws random accepted
counts per step, so it always steps.

Disaggregated prefill: prefill replicas run each request with output_len = 1 and hold its
blocks when it finishes (`hold_blocks_on_finish`); its KV (whole blocks x KV bytes per
token, each TP rank its shard over its own link) then queues for the prefill replica's
link (a SimPy Resource: bandwidth + latency, one transfer at a time), whose end releases
the held blocks (`release_held`). The decode pool admits the request with
`num_external_computed_tokens = prompt_len - 1`: blocks for the whole prompt are taken,
and its first step computes only the last prompt token, to get the logits of the first
output token, which is what vLLM's KV connectors do (the scheduler's
`_update_waiting_for_remote_kv` backs one token off a fully transferred prompt).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import simpy

from engine.config import scheduler_config
from engine.decode_skip import advance_decode, uniform_decode_steps
from engine.model_spec import blocks_for_tokens
from engine.request import Request
from engine.scheduler import Scheduler
from sim.config import DeploymentConfig, EngineConfig
from sim.cost_model import CostModel, CostProfile, StepBatch
from sim.memory import MemoryPlan, draft_spec, plan_memory
from sim.metrics import SLO, STEP_COLUMNS, SimResult
from sim.speculative import AcceptanceModel

NAN = math.nan
# The prefix-aware router only considers replicas whose load score (4 x waiting + running) is
# within this of the least loaded one, so cache affinity never piles a queue onto one replica
# (8 = two waiting requests more than the least loaded replica).
PREFIX_ROUTER_LOAD_SLACK = 8


class _Replica:
    """One vLLM instance: a scheduler, a cost model and the SimPy process driving them."""

    def __init__(self, sim: Simulation, idx: int, role: str, engine: EngineConfig, plan: MemoryPlan,
                 cost: CostModel, coarsen: int = 1) -> None:
        self.sim, self.idx, self.role, self.engine, self.plan, self.cost = sim, idx, role, engine, plan, cost
        # KV block coarsening (a speed option): the scheduler tracks blocks of `coarsen` engine
        # blocks; CPU costs are charged per engine block (counts x coarsen).
        self.coarsen = coarsen
        self.sched = Scheduler(scheduler_config(
            engine, num_gpu_blocks=max(plan.num_gpu_blocks // coarsen, 1),
            block_size=engine.block_size * coarsen, num_speculative_tokens=engine.num_speculative_tokens))
        self.wake: simpy.Event | None = None
        self.skipping = False
        self.pending: list[tuple[Request, int]] = []  # (request, external tokens) while skipping
        self.stalled: dict[int, float] = {}  # preempted request -> time of its last token
        self.link = simpy.Resource(sim.env, capacity=1) if role == "prefill" else None
        self.proc = sim.env.process(self.run())

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
        self.sched.add_request(req, num_external_computed_tokens=external_tokens,
                               hold_blocks_on_finish=self.role == "prefill")

    def kick(self) -> None:
        """Wake the step loop if it sleeps waiting for work (or for free blocks)."""
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def release(self, request_id: int) -> None:
        """The KV transfer of a finished prompt is done: its held blocks return to the pool."""
        self.sched.release_held(request_id)
        self.kick()

    @property
    def load(self) -> int:
        """vLLM's data-parallel balancing score: 4 x waiting + running."""
        return 4 * (self.sched.num_waiting + len(self.pending)) + self.sched.num_running

    # --- the step loop --------------------------------------------------------------
    def run(self):
        env, sim, sched, cost = self.sim.env, self.sim, self.sched, self.cost
        skip = sim.skip_ahead and not cost.k
        while True:
            if not sched.has_unfinished():
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            if skip:
                n = uniform_decode_steps(sched, through_finishes=False)
                if n >= 2:
                    yield from self._skip(n)
                    continue
            t0 = env.now
            out = sched.schedule()
            for rid, reason in out.rejected:
                sim._reject(rid, reason, t0)
            if not out.num_batched_tokens:
                # nothing runnable (e.g. only rejections this step); wait for new work
                res = sched.update_from_output(out, None)
                self._finish(res, t0)
                if sched.num_running:  # would spin forever at one instant: a scheduler bug
                    raise RuntimeError(f"replica {self.idx}: scheduler returned an empty step with "
                                       f"{sched.num_running} running requests at t={t0:.6f} s")
                if sched.num_waiting:
                    self.wake = env.event()
                    yield self.wake
                    self.wake = None
                continue
            if out.num_prefill_seqs or cost.k:
                batch, samplers = self._compose(out, t0)
            else:  # pure decode: the totals say it all, no per-request records needed
                f = self.coarsen
                batch, samplers = StepBatch(0, 0, 0.0, 0, out.num_decode_seqs, out.num_decode_tokens,
                                            out.sum_decode_context, out.num_blocks_allocated * f,
                                            out.num_blocks_hashed * f), None
            gpu_s, cpu_s = cost.gpu_time_s(batch), cost.cpu_time_s(batch)
            dt = cost.combine(gpu_s, cpu_s)
            yield env.timeout(dt)
            t1 = env.now
            counts = None
            drafted = accepted = 0
            if cost.k and samplers:
                counts, drafted, accepted = sim._spec_counts(out, samplers, t1)
            res = sched.update_from_output(out, counts)
            if samplers is None:
                n_out = out.num_decode_seqs
            else:
                n_out = sum(counts.values()) if counts is not None else len(samplers)
            if samplers and self.role != "prefill":
                ft, stalled = sim.first_token_s, self.stalled
                for sr in samplers:
                    rid = sr.request_id
                    i = sim.idx(rid)
                    if ft[i] != ft[i]:  # NaN: this is the request's first token
                        ft[i] = t1
                    elif stalled and rid in stalled:  # resumed after a preemption: one long gap
                        sim.stall_itl_s.append(t1 - stalled.pop(rid))
            for rid in out.preempted_ids:
                # its last token came at the end of the previous step; the gap until its next
                # token is an inter-token latency the step-weighted ITL does not see
                if rid not in self.stalled and sim.first_token_s[sim.idx(rid)] == sim.first_token_s[sim.idx(rid)]:
                    self.stalled[rid] = t0
            self._finish(res, t1)
            sim.steps.append((self.idx, t0, dt, 1, dt, dt, gpu_s, cpu_s, batch.num_prefill_tokens,
                              batch.num_prefill_seqs, batch.num_decode_seqs, n_out, batch.sum_decode_context,
                              out.num_batched_tokens, out.num_blocks_allocated, out.num_blocks_hashed,
                              len(out.preempted_ids), sched.num_running, sched.num_waiting,
                              self._kv_usage(), drafted, accepted))

    def _compose(self, out, t0: float) -> tuple[StepBatch, list]:
        """The cost model's view of a step, and the scheduled entries that emit tokens."""
        sim = self.sim
        npt = nps = nds = dq = sctx = pkv = 0
        pairs = 0.0
        samplers = []
        scheduled_s = sim.scheduled_s
        for sr in out.scheduled:
            rid, q, c = sr.request_id, sr.num_new_tokens, sr.num_computed_tokens
            if sr.samples:
                samplers.append(sr)
            if sr.is_prefill:
                i = sim.idx(rid)
                if scheduled_s[i] != scheduled_s[i]:  # NaN: first time scheduled
                    # SimPy timeouts are relative: `now + (arrival - now)` can land one ulp before
                    # the arrival, so a step starting "at" the arrival may read as earlier.
                    scheduled_s[i] = max(t0, sim.requests[i].arrival_s)
                npt += q
                nps += 1
                pairs += q * c + q * (q + 1) / 2
                pkv += c + q
            else:
                nds += 1
                dq += q
                sctx += c + q
        f = self.coarsen
        return StepBatch(npt, nps, pairs, pkv, nds, dq, sctx, out.num_blocks_allocated * f,
                         out.num_blocks_hashed * f), samplers

    def _skip(self, n: int):
        """Sleep through up to n pure-decode steps; stop early at a wake-up (new work)."""
        env, sim, sched, cost = self.sim.env, self.sim, self.sched, self.cost
        B = sched.num_running
        ctx = np.asarray(sched.running_context_lens(), dtype=np.int64)  # KV tokens before the skip
        run = cost.decode_run(B, int(ctx.sum()) + B, n)
        block_s = None if cost.async_scheduling else self._block_cpu_fn(ctx)
        t0 = env.now
        self.wake = env.event()
        self.skipping = True
        yield env.timeout(run.elapsed_s(n) + (block_s(n) if block_s else 0.0)) | self.wake
        woke = self.wake.triggered
        self.wake = None
        m = n
        if woke:
            m = run.steps_started_before(env.now - t0, block_s)
            if m:
                end = t0 + run.elapsed_s(m) + (block_s(m) if block_s else 0.0)
                yield env.timeout(max(end - env.now, 0.0))
        self.skipping = False
        adv = advance_decode(sched, m) if m else None
        for req, ext in self.pending:
            self._admit(req, ext)
        self.pending.clear()
        if adv is None:
            return
        f = self.coarsen
        extra = 0.0 if block_s is None else cost.block_cpu_s(adv.num_blocks_allocated * f,
                                                             adv.num_blocks_hashed * f)
        t1 = env.now
        self._finish(adv.finished, t1)
        dt = t1 - t0
        gpu_s = run.elapsed_s(m) - (0.0 if cost.async_scheduling else m * run.cpu)
        cpu_s = m * run.cpu + extra
        sim.steps.append((self.idx, t0, dt, m, run.dt(0), run.dt(m - 1), gpu_s, cpu_s, 0, 0, B, m * B,
                          adv.sum_decode_context_first_step, adv.num_batched_tokens, adv.num_blocks_allocated,
                          adv.num_blocks_hashed, 0, sched.num_running, sched.num_waiting, self._kv_usage(), 0, 0))

    def _block_cpu_fn(self, ctx: np.ndarray) -> Callable[[int], float]:
        """CPU seconds of the blocks allocated and hashed in the first m decode steps.

        Sequence j (ctx[j] tokens in KV) needs a new block at every step i where position
        ctx[j] + i starts a block, and completes (hashes) one where ctx[j] + i + 1 ends one.
        """
        bs = self.engine.block_size * self.coarsen  # the scheduler's block
        first_alloc = (-ctx) % bs
        first_hash = (bs - 1 - ctx) % bs if self.engine.enable_prefix_caching else None
        blk_s, hash_s = self.cost.block_cpu_s(self.coarsen, 0), self.cost.block_cpu_s(0, self.coarsen)

        def block_s(m: int) -> float:
            if m <= 0:
                return 0.0
            t = blk_s * float(np.maximum((m - 1 - first_alloc) // bs + 1, 0).sum())
            if first_hash is not None:
                t += hash_s * float(np.maximum((m - 1 - first_hash) // bs + 1, 0).sum())
            return t

        return block_s

    def _finish(self, results, t: float) -> None:
        for r in results:
            self.sim._done(self, r, t)

    def _kv_usage(self) -> float:
        return self.sched.kv_usage


class Simulation:
    """A deployment serving a list of requests; `run()` returns a `SimResult`."""

    def __init__(self, deployment: DeploymentConfig, requests: Sequence[Request], *, seed: int = 0,
                 profile: CostProfile | None = None, slo: SLO | None = None, skip_ahead: bool = True,
                 progress: Callable[[float], None] | None = None, label: str | None = None,
                 meta: dict[str, Any] | None = None, kv_block_coarsening: int | str = 1) -> None:
        if not requests:
            raise ValueError("the workload has no requests")
        self.dep = deployment
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        ids = [r.request_id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request_id values must be unique within a workload")
        n = len(self.requests)
        self._pos = {rid: i for i, rid in enumerate(ids)}
        self.idx = self._pos.__getitem__
        self.seed, self.slo, self.skip_ahead, self.progress = seed, slo, skip_ahead, progress
        self.label, self.extra_meta = label, meta or {}
        self.env = simpy.Environment()
        self.profile = profile or CostProfile.load("default")
        self.coarsen = self._coarsening(kv_block_coarsening)
        # per-request outcome arrays
        self.scheduled_s = np.full(n, NAN)
        self.first_token_s = np.full(n, NAN)
        self.finish_s = np.full(n, NAN)
        self.replica_of = np.full(n, -1, dtype=np.int64)
        self.num_generated = np.zeros(n, dtype=np.int64)
        self.num_cached = np.zeros(n, dtype=np.int64)
        self.num_preempt = np.zeros(n, dtype=np.int64)
        self.status = np.full(n, "unfinished", dtype=object)
        self.reason = np.full(n, "", dtype=object)
        self.kv_transfer_s = np.full(n, NAN)
        self.steps: list[tuple] = []
        self.stall_itl_s: list[float] = []  # token gaps of requests resumed after preemption
        self.spec_counters = {"spec_num_drafts": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0}
        self._build_replicas()
        self._rr = 0
        self._prefix_index: dict[int, set[int]] = {}

    # --- construction -------------------------------------------------------------------
    def _coarsening(self, want: int | str) -> int:
        """Engine blocks per scheduler block. "auto": as many as fit in the workload's hash
        block (its prefix structure is no finer than that), at most 64.

        Coarse blocks make the simulation faster (the scheduler's work is per block) at the
        price of fragmentation: a request's last block wastes up to coarsen x block_size - 1
        slots instead of block_size - 1, and prefix hits end on coarse-block boundaries.
        """
        if want == "auto":
            bs = self.dep.engine.block_size
            hbs = min(r.hash_block_size for r in self.requests)
            f = 1
            while f < 64 and hbs % (bs * f * 2) == 0:
                f *= 2
            return f
        if not isinstance(want, int) or want < 1:
            raise ValueError(f"kv_block_coarsening must be a positive integer or 'auto', got {want!r}")
        return want

    def _build_replicas(self) -> None:
        dep = self.dep
        base = dep.engine.resolved_for(dep.gpu, dep.model)
        draft = draft_spec(dep.model, base.speculative_config)
        self.acceptance = (AcceptanceModel(base.speculative_config, self.seed)
                           if base.speculative_config else None)
        self._alpha: dict[int, float] = {}
        self.replicas: list[_Replica] = []
        self.prefill_pool: list[_Replica] = []
        self.decode_pool: list[_Replica] = []
        if dep.disaggregation is None:
            plan = plan_memory(dep.model, dep.gpu, base)
            cost = CostModel(dep.model, dep.gpu, base, self.profile, draft)
            for i in range(dep.num_replicas):
                self.replicas.append(_Replica(self, i, "mixed", base, plan, cost, self.coarsen))
            self.front = self.replicas
        else:
            d = dep.disaggregation
            pe = base.model_copy(update={"max_num_batched_tokens": d.prefill_max_num_batched_tokens
                                         or base.max_num_batched_tokens, "speculative_config": None})
            de = base.model_copy(update={"max_num_batched_tokens": d.decode_max_num_batched_tokens
                                         or base.max_num_batched_tokens})
            pplan, dplan = plan_memory(dep.model, dep.gpu, pe), plan_memory(dep.model, dep.gpu, de)
            pcost = CostModel(dep.model, dep.gpu, pe, self.profile)
            dcost = CostModel(dep.model, dep.gpu, de, self.profile, draft)
            for i in range(d.num_prefill_replicas):
                self.prefill_pool.append(_Replica(self, i, "prefill", pe, pplan, pcost, self.coarsen))
            for j in range(d.num_decode_replicas):
                self.decode_pool.append(_Replica(self, d.num_prefill_replicas + j, "decode", de, dplan, dcost,
                                                 self.coarsen))
            self.replicas = self.prefill_pool + self.decode_pool
            self.front = self.prefill_pool
            self.link_bytes_per_s = d.link_bandwidth_gbps(dep.gpu) * 1e9
            self.link_latency_s = d.link_latency_s
        self.env.process(self._arrivals())

    # --- arrivals and routing -------------------------------------------------------------
    def _arrivals(self):
        env, reqs = self.env, self.requests
        n = len(reqs)
        every = max(n // 100, 1)
        disagg = self.dep.disaggregation is not None
        for i, req in enumerate(reqs):
            if req.arrival_s > env.now:
                yield env.timeout(req.arrival_s - env.now)
            rep = self._route(req, self.front)
            self.replica_of[i] = rep.idx
            rep.add(dataclasses.replace(req, output_len=1) if disagg else req)
            if self.progress is not None and i % every == 0:
                self.progress(i / n)

    def _route(self, req: Request, pool: list[_Replica]) -> _Replica:
        policy = self.dep.router
        if len(pool) == 1:
            return pool[0]
        if policy == "round_robin":
            self._rr = (self._rr + 1) % len(pool)
            return pool[self._rr - 1]
        if policy == "least_loaded":
            return min(pool, key=lambda r: r.load)
        return self._route_prefix(req, pool)

    def _route_prefix(self, req: Request, pool: list[_Replica]) -> _Replica:
        """Longest known prefix among replicas whose load is near the minimum.

        The router keeps an approximate index (prefix-hash chain -> replicas that were sent
        it), like llm-d's approximate prefix-cache scorer: it does not see evictions.
        """
        loads = [r.load for r in pool]
        lo = min(loads)
        ok = {r.idx for r, ld in zip(pool, loads) if ld <= lo + PREFIX_ROUTER_LOAD_SLACK}
        idx = self._prefix_index
        keys, key = [], 0
        cand: set[int] | None = ok  # replicas holding every block matched so far
        for h in req.hash_ids:
            key = hash((key, h))
            keys.append(key)
            if cand is None:
                continue
            inter = cand & idx.get(key, set())
            if inter:
                cand = inter
            else:
                best_set = cand
                cand = None
        if cand is not None:
            best_set = cand
        best = min((r for r in pool if r.idx in best_set), key=lambda r: r.load)
        for k in keys:
            idx.setdefault(k, set()).add(best.idx)
        return best

    # --- outcomes --------------------------------------------------------------------------
    def _reject(self, rid: int, reason: str, t: float) -> None:
        i = self.idx(rid)
        self.status[i], self.reason[i] = "rejected", reason

    def _done(self, rep: _Replica, res, t: float) -> None:
        i = self.idx(res.request_id)
        if res.status != "finished":
            self.status[i], self.reason[i] = res.status, res.reason
            return
        if rep.role == "prefill":
            self.num_cached[i] = res.num_cached_tokens
            self.num_preempt[i] += res.num_preemptions
            self.env.process(self._transfer(rep, self.requests[i], t))
            return
        self.finish_s[i] = t
        self.num_generated[i] = res.num_generated
        self.num_preempt[i] += res.num_preemptions
        if rep.role == "mixed":
            self.num_cached[i] = res.num_cached_tokens
        self.status[i], self.reason[i] = "finished", res.reason

    def _transfer(self, src: _Replica, req: Request, t_ready: float):
        """Move the prompt's KV (whole blocks; each TP rank its shard) over src's link."""
        tp = src.engine.tensor_parallel_size
        nbytes = blocks_for_tokens(req.prompt_len, src.engine.block_size) * src.engine.block_size \
            * src.plan.kv_bytes_per_token / tp
        with src.link.request() as slot:
            yield slot
            yield self.env.timeout(nbytes / self.link_bytes_per_s + self.link_latency_s)
        src.release(req.request_id)
        i = self.idx(req.request_id)
        self.kv_transfer_s[i] = self.env.now - t_ready
        dst = self._route(req, self.decode_pool)
        self.replica_of[i] = dst.idx
        # the last prompt token is recomputed on the decode side to produce logits
        dst.add(req, external_tokens=req.prompt_len - 1)

    def _spec_counts(self, out, samplers, now: float) -> tuple[dict[int, int], int, int]:
        """Tokens per sampling request this step (1 + accepted drafts for verified decodes)."""
        acc, reqs = self.acceptance, self.requests
        counts: dict[int, int] = {}
        spec_rows, alphas = [], []
        for sr in samplers:
            if sr.num_spec_tokens:
                rid = sr.request_id
                spec_rows.append(sr)
                a = self._alpha.get(rid)
                if a is None:
                    a = self._alpha[rid] = acc.alpha(rid, reqs[self.idx(rid)].category)
                alphas.append(a)
            else:
                counts[sr.request_id] = 1
        drafted = accepted = 0
        if spec_rows:
            toks = acc.tokens_per_step(np.asarray(alphas), now)
            for sr, t in zip(spec_rows, toks.tolist()):
                t = min(t, sr.num_spec_tokens + 1)
                counts[sr.request_id] = t
                drafted += sr.num_spec_tokens
                accepted += t - 1
            c = self.spec_counters
            c["spec_num_drafts"] += len(spec_rows)
            c["spec_draft_tokens"] += drafted
            c["spec_accepted_tokens"] += accepted
        return counts, drafted, accepted

    # --- run ---------------------------------------------------------------------------------
    def run(self, until_s: float | None = None) -> SimResult:
        t_wall = time.perf_counter()
        self.env.run(until=until_s)
        wall = time.perf_counter() - t_wall
        return self._result(wall)

    def _vllm_args(self) -> str:
        """The `vllm serve` flags of this run (the decode side's, plus the connector, for P/D)."""
        dep = self.dep
        eng = (self.decode_pool or self.replicas)[0].engine
        args = " ".join(eng.to_vllm_args(EngineConfig().resolved_for(dep.gpu, dep.model)))
        if dep.disaggregation is not None:
            args = (args + " " + _kv_transfer_arg(dep.disaggregation.kv_connector)).strip()
        return args

    def _result(self, wall_s: float) -> SimResult:
        reqs = self.requests
        arrival = np.array([r.arrival_s for r in reqs])
        prompt = np.array([r.prompt_len for r in reqs], dtype=np.int64)
        output = np.array([r.output_len for r in reqs], dtype=np.int64)
        done = self.status == "finished"
        ttft = self.first_token_s - arrival
        e2e = self.finish_s - arrival
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(self.num_generated > 1, (self.finish_s - self.first_token_s)
                            / (self.num_generated - 1), NAN)
        requests = {
            "request_id": np.array([r.request_id for r in reqs], dtype=np.int64),
            "category": np.array([r.category for r in reqs], dtype=object),
            "replica": self.replica_of, "arrival_s": arrival, "scheduled_s": self.scheduled_s,
            "first_token_s": self.first_token_s, "finish_s": self.finish_s,
            "prompt_len": prompt, "output_len": output, "num_generated": self.num_generated,
            "num_cached_tokens": self.num_cached, "num_preemptions": self.num_preempt,
            "status": self.status.astype(str), "reason": self.reason.astype(str),
            "kv_transfer_s": self.kv_transfer_s, "ttft_s": np.where(done, ttft, NAN),
            "tpot_s": np.where(done, tpot, NAN), "e2e_s": np.where(done, e2e, NAN),
            "queue_s": self.scheduled_s - arrival,
        }
        cols = list(zip(*self.steps)) if self.steps else [[] for _ in STEP_COLUMNS]
        steps = {name: np.asarray(col, dtype=np.float64 if name in {"t_start_s", "dt_s", "first_dt_s",
                                                                     "last_dt_s", "gpu_s", "cpu_s", "kv_usage"}
                                  else np.int64) for name, col in zip(STEP_COLUMNS, cols)}
        counters: dict[str, float] = dict(self.spec_counters)
        q = h = 0
        for rep in self.replicas:
            st = rep.sched.stats
            if rep.role != "decode":  # transferred prompts are not cache lookups
                q += st.prefix_cache_queries_tokens
                h += st.prefix_cache_hits_tokens
        counters["prefix_cache_queries_tokens"], counters["prefix_cache_hits_tokens"] = q, h
        dep = self.dep
        rate = (len(reqs) - 1) / (arrival[-1] - arrival[0]) if len(reqs) > 1 and arrival[-1] > arrival[0] else "inf"
        meta = {"model": dep.model.name, "gpu": dep.gpu.name, "num_gpus": dep.num_gpus,
                "num_replicas": len(self.replicas), "deployment": dep.describe(), "seed": self.seed,
                "label": self.label, "request_rate": rate, "slo": self.slo,
                "num_gpu_blocks": self.replicas[0].plan.num_gpu_blocks, "kv_block_coarsening": self.coarsen,
                "vllm_args": self._vllm_args()} | self.extra_meta
        return SimResult(requests=requests, steps=steps, meta=meta, counters=counters, wall_s=wall_s,
                         stall_itl_s=np.asarray(self.stall_itl_s, dtype=np.float64))


def _kv_transfer_arg(connector: str) -> str:
    return f"""--kv-transfer-config '{{"kv_connector":"{connector}","kv_role":"kv_both"}}'"""


def simulate(deployment: DeploymentConfig, requests: Sequence[Request], **kw: Any) -> SimResult:
    """Run one simulation (see `Simulation`)."""
    until = kw.pop("until_s", None)
    return Simulation(deployment, requests, **kw).run(until_s=until)


__all__ = ["Simulation", "simulate"]
