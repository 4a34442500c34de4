"""Running many simulations: local processes by default, a Ray cluster on request.

The base workload travels once per worker (a process pool's initializer, or one Ray object);
a task names a slice of it (`num_requests` from the start) or a `WorkloadSpec` variant to
generate (perturbations, the lab workload), and a `SimConfig`. Results come back in task order,
so the same seed gives the same recommendation whatever the parallelism.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from advisor.advise.records import Metrics
from advisor.advise.uncertainty import goodput_band, latency_error
from engine.core.model_spec import get_model
from engine.core.summary_record import RunSummary
from sim.generate import generate
from sim.hardware import get_gpu
from sim.run import LoadedWorkload, SimConfig, run
from sim.workload import Workload
from sim.workload_spec import WorkloadSpec


@dataclass(frozen=True, slots=True)
class SimTask:
    config: SimConfig
    num_requests: int  # of the base workload (from its start), or of the spec variant
    variant: WorkloadSpec | None = None  # None = the user's workload


@dataclass(slots=True)
class Outcome:
    """What the advisor keeps of one simulation: its metrics and the figures reasons quote."""

    metrics: Metrics
    extras: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # the configuration cannot start (vLLM's start-up checks)
    cdf_ms: dict[str, list[float]] = field(default_factory=dict)  # TTFT, TPOT and E2E at CDF_PERCENTS


CDF_PERCENTS = tuple(range(1, 100))


def latency_cdf_ms(requests: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """TTFT, TPOT and E2E percentiles 1..99 of the finished requests, in ms (the report's CDF chart)."""
    done = requests["status"] == "finished"
    out = {}
    for key, col in (("ttft_ms", "ttft_s"), ("tpot_ms", "tpot_s"), ("e2e_ms", "e2e_s")):
        v = requests[col][done]
        v = v[~np.isnan(v)]  # TPOT: a one-token request has none (the summary's p99 leaves it out too)
        out[key] = [round(float(x) * 1e3, 3) for x in np.percentile(v, CDF_PERCENTS)] if v.size else []
    return out


NAN = float("nan")
INFEASIBLE = Metrics(goodput_rps=0.0, throughput_tok_s=0.0, ttft_p50_ms=NAN, ttft_p99_ms=NAN, tpot_p50_ms=NAN,
                     tpot_p99_ms=NAN, itl_p99_ms=NAN, e2e_p99_ms=NAN, slo_attainment=0.0, preemptions=0)


def _f(x: float | None, default: float = math.nan) -> float:
    return default if x is None else float(x)


def outcome_of(s: RunSummary) -> Outcome:
    """The advisor's metrics and the figures its reasons quote, read from a run's summary."""
    n = max(s.num_prompts, 1)
    good = _f(s.request_goodput, s.request_throughput)
    dur = s.duration_s or 1.0
    m = Metrics(goodput_rps=good, throughput_tok_s=s.output_throughput,
                ttft_p50_ms=s.ttft.median_ms, ttft_p99_ms=s.ttft.p99_ms,
                tpot_p50_ms=_f(s.tpot.median_ms), tpot_p99_ms=_f(s.tpot.p99_ms),
                itl_p99_ms=_f(s.itl.p99_ms), e2e_p99_ms=s.e2el.p99_ms,
                slo_attainment=s.slo_attainment, preemptions=s.num_preemptions)
    computed = s.prefill_tokens_computed
    needed = s.total_input_tokens - s.prefix_cache_hits_tokens
    extras: dict[str, Any] = {
        "mean_e2e_ms": _f(s.e2el.mean_ms), "mean_ttft_ms": _f(s.ttft.mean_ms),
        "rate_rps": n / dur, "duration_s": dur,
        "concurrency": s.request_throughput * _f(s.e2el.mean_ms, 0.0) / 1e3,
        "prefix_hit_rate": s.prefix_cache_hit_rate,
        "acceptance_rate": _f(s.spec_decode_acceptance_rate),
        "acceptance_length": _f(s.spec_decode_acceptance_length),
        "cpu_share": s.cpu_share_of_step_time, "gpu_busy_share": s.gpu_busy_share,
        "kv_usage_max": s.kv_cache_usage_max, "kv_transfer_ms": _f(s.mean_kv_transfer_ms),
        "recompute_share": max(computed - needed, 0) / computed if computed else 0.0,
        "rejected": s.rejected + s.unfinished,
        "mean_prompt_tokens": s.total_input_tokens / n,
    }
    # the cost profile the run used (the reasons name it and how far to trust it)
    if s.profile is not None:
        extras["profile"] = s.profile
    if s.profile_status is not None:
        extras["profile_status"] = s.profile_status
    return Outcome(m, extras)


SLICE_WINDOWS = 4  # a slice is this many windows spread over the trace, so it sees the whole hour


def spread_slice(wl: Workload, n: int) -> Workload:
    """`n` requests of `wl` as SLICE_WINDOWS runs of consecutive requests taken evenly across it,
    laid back to back (each window keeps its own arrival gaps, one mean gap between windows):
    a slice of a one-hour trace sees its busy and quiet parts, not only its first minutes."""
    if n >= len(wl):
        return wl
    k = max(1, min(SLICE_WINDOWS, n // 50))
    per = n // k
    sizes = [per] * (k - 1) + [n - per * (k - 1)]
    starts = np.linspace(0, len(wl) - sizes[-1], k).astype(np.int64)
    idx = np.concatenate([np.arange(s, s + m) for s, m in zip(starts, sizes, strict=True)])
    out = wl.take(idx)
    gap = wl.duration_s / max(len(wl) - 1, 1)
    arrival, offset = out.arrival_s.copy(), 0.0
    for w in range(k):
        seg = slice(w * per, w * per + sizes[w])
        arrival[seg] = arrival[seg] - arrival[seg][0] + offset
        offset = arrival[seg][-1] + gap
    out.arrival_s = arrival
    return out


class _Workloads:
    """A worker's workloads: the base one, its slices and generated variants, each built once."""

    def __init__(self, base: Workload) -> None:
        self.base = base
        self.cache: dict[Any, LoadedWorkload] = {}

    def get(self, task: SimTask) -> LoadedWorkload:
        key = (task.num_requests, variant_key(task))
        if key not in self.cache:
            if task.variant is None:
                wl = spread_slice(self.base, task.num_requests)
            else:
                wl = generate(task.variant.with_overrides(num_requests=task.num_requests))
            self.cache[key] = LoadedWorkload(list(wl.requests), self.base.name)
        return self.cache[key]


def simulate_task(workloads: _Workloads, task: SimTask) -> Outcome:
    """One simulation; a configuration vLLM would refuse at start-up (the model does not fit,
    heads not divisible...) scores zero and keeps the refusal as its reason."""
    try:
        result = run(workloads.get(task), task.config)
    except ValueError as exc:
        return Outcome(INFEASIBLE, {}, str(exc).splitlines()[0])
    summary = result.summary()
    out = outcome_of(summary)
    out.cdf_ms = latency_cdf_ms(result.requests)
    # goodput if the engine's latencies were off from these by the profile's validation error
    error = latency_error(summary.profile_validation, summary.profile_status or "")
    out.extras["goodput_low_rps"], out.extras["goodput_high_rps"] = goodput_band(
        result.requests, task.config.slo, float(summary.duration_s or 0.0), error)
    return out


_WORKER: _Workloads | None = None


def _init_worker(base: Workload) -> None:
    global _WORKER
    _WORKER = _Workloads(base)


def _run_in_worker(task: SimTask) -> Outcome:
    assert _WORKER is not None
    return simulate_task(_WORKER, task)


def task_key(task: SimTask) -> tuple[str, int, str | None]:
    """What a simulation's outcome depends on: the configuration with its engine flags resolved
    for the GPU and model (an option spelling out vLLM's default simulates the defaults), the
    sample of requests and the variant. Not the label: it names the run, it does not change it."""
    cfg = task.config
    try:
        engine = cfg.engine.resolved_for(get_gpu(cfg.gpu), get_model(cfg.model))
    except ValueError:  # vLLM would refuse it at start-up: the run says why; key it as given
        engine = cfg.engine
    key = cfg.model_copy(update={"engine": engine, "label": None}).model_dump_json()
    return key, task.num_requests, variant_key(task)


def variant_key(task: SimTask) -> str | None:
    """The generated variant as it is simulated: its spec at the task's request count, without its
    name (a label: the cost lines' sweep of the traffic at `num_requests` and robustness' "as given"
    of the spec cut to that count are one workload)."""
    if task.variant is None:
        return None
    return task.variant.model_copy(update={"num_requests": task.num_requests, "name": ""}).model_dump_json()


def task_weight(task: SimTask) -> float:
    """A simulation's relative cost, to start the long ones first: requests, x SPEC_COST when
    speculative steps are simulated one by one (no decode skip-ahead), x REPLICA_COST per replica
    past the first (each steps on its own, with smaller batches)."""
    cfg = task.config
    spec = SPEC_COST if cfg.engine.speculative_config is not None else 1.0
    return task.num_requests * spec * (1 + REPLICA_COST * (max(cfg.num_replicas, 1) - 1))


# measured on the 4-GPU latency run (benchmarks/advisor/results.md, --tasks): on 1,000 requests a
# speculative configuration's simulation takes ~8x the CPU of the same one without (1.6-2.0 vs
# 0.2-0.25 CPU s on TP4 x1), and 4 replicas ~2x one (3.0-3.2 CPU s TP1 x4 vs 1.6 TP4 x1)
SPEC_COST = 8.0
REPLICA_COST = 0.3


class Evaluator:
    """Runs batches of `SimTask`s in order-preserving parallel; counts the simulations.

    Each distinct simulation runs once per evaluator (`task_key`): the search's stages and the
    analyses ask for some configurations again (the winner's neighbours, the ladder's last rung),
    and two stages submitting the same one at once share it. Within a batch the costly ones are
    submitted first, so the workers do not wait on one long simulation at the batch's end; the
    outcomes come back in task order whatever the order they ran in."""

    def __init__(self, base: Workload, *, workers: int = 1, ray: str | None = None) -> None:
        self.base = base
        self.count = 0
        self._lock = threading.Lock()
        self._local = _Workloads(base)
        self._pool: ProcessPoolExecutor | None = None
        self._ray_map: Callable[[Sequence[SimTask]], list[Outcome]] | None = None
        self._runs: dict[tuple, Future] = {}  # task_key -> its (running or finished) simulation
        if ray is not None:
            self._ray_map = _ray_mapper(base, ray)
        elif workers > 1:
            self._pool = ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(base,))

    @property
    def parallel(self) -> bool:
        return self._pool is not None or self._ray_map is not None

    def map(self, tasks: Sequence[SimTask], on_done: Callable[[int], None] | None = None,
            on_submit: Callable[[int], None] | None = None) -> list[Outcome]:
        """The outcomes in task order; `on_submit(k)` with the k simulations this batch adds (those
        not run or running already), `on_done(k)` as k of them finish (progress)."""
        done = on_done or (lambda _k: None)
        keys = [task_key(t) for t in tasks]
        new: dict[tuple, SimTask] = {}
        with self._lock:  # stages may submit from several threads
            for k, t in zip(keys, tasks, strict=True):
                if k not in self._runs and k not in new:
                    new[k] = t
            for k in new:
                self._runs[k] = Future()
            self.count += len(new)
        if on_submit is not None:
            on_submit(len(new))
        order = sorted(new, key=lambda k: -task_weight(new[k]))
        try:
            outs = self._run([new[k] for k in order], done)
        except BaseException as exc:  # whoever waits on these (another stage's thread) gets it too
            for k in order:
                self._runs[k].set_exception(exc)
            raise
        for k, out in zip(order, outs, strict=True):
            self._runs[k].set_result(out)
        return [self._runs[k].result() for k in keys]

    def _run(self, tasks: list[SimTask], done: Callable[[int], None]) -> list[Outcome]:
        if self._ray_map is not None and len(tasks) > 1:
            outs = self._ray_map(tasks)
            done(len(tasks))
            return outs
        if self._pool is not None and len(tasks) > 1:
            futures = [self._pool.submit(_run_in_worker, t) for t in tasks]
            for _ in as_completed(futures):  # counted as they finish, returned in task order
                done(1)
            return [f.result() for f in futures]
        outs = []
        for t in tasks:
            outs.append(simulate_task(self._local, t))
            done(1)
        return outs

    def expect(self, total: int) -> None:
        """A stage's estimate of its simulations: only a counted evaluator (progress.Counted) uses it."""

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ray_mapper(base: Workload, address: str) -> Callable[[Sequence[SimTask]], list[Outcome]]:
    """Tasks as Ray remote calls; the base workload is put in the object store once. Ray is
    imported here only: `costline --help` and local runs never load it."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError("--ray needs Ray: pip install 'ray>=2.30' (or drop --ray to use local processes)") from exc
    if not ray.is_initialized():
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        except ConnectionError as exc:
            raise ValueError(f"--ray {address}: no Ray cluster answered ({exc}); start one with `ray start --head`, "
                             "give its address, or drop --ray to use local processes") from None
    base_ref = ray.put(base)
    remote = ray.remote(_ray_task)

    def run_all(tasks: Sequence[SimTask]) -> list[Outcome]:
        return ray.get([remote.remote(base_ref, t) for t in tasks])

    return run_all


_RAY_WORKLOADS: dict[int, _Workloads] = {}


def _ray_task(base: Workload, task: SimTask) -> Outcome:
    key = hash((base.name, len(base), float(base.arrival_s[-1]), int(base.prompt_len.sum())))
    if key not in _RAY_WORKLOADS:
        _RAY_WORKLOADS.clear()
        _RAY_WORKLOADS[key] = _Workloads(base)
    return simulate_task(_RAY_WORKLOADS[key], task)
