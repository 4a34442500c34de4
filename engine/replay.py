"""Timed replay: feed a workload's requests to the engine at their arrival times, in wall time.

Each request enters the scheduler once the engine clock passes its `arrival_s` (times
`time_scale`); when nothing is running the loop sleeps until the next arrival. Records one
`RequestRecord` per request (TTFT, TPOT, end-to-end and queue time, all measured from the
intended arrival), one `StepRecord` per engine step, and every inter-token gap; the result has the
simulator's tables, summary keys and Prometheus metric set (engine/core/run_summary.py).

Python's cyclic garbage collector: a full (generation 2) collection scans every tracked object, and
an engine process holds hundreds of thousands of them from start-up (torch, the model's modules,
kernel caches), so such a pause landing in an eager forward stalls the kernel launches and shows up
as GPU time. vLLM freezes the start-up heap after its warm-up (`vllm/utils/gc_utils.py`
`freeze_gc_heap`: collect every generation, then `gc.freeze()`). A replay freezes the heap for its
duration (`freeze_gc=True`) and unfreezes afterwards, so objects of a discarded engine stay
collectable by the caller; the run's collections and pauses are recorded (`GcStats`).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np

from engine.core.outputs import check_output_dir, staged_dir
from engine.core.records import RequestRecord, StepRecord, to_columns
from engine.core.request import Request, materialize_prompt
from engine.core.run_counters import per_position_counters
from engine.core.run_summary import RunTables, jsonable
from engine.engine_loop import EngineCore, RequestState
from engine.metrics import EngineMetrics
from engine.sampling import SamplingParams

NAN = math.nan


def default_params(req: Request) -> SamplingParams:
    """A workload request generates exactly `output_len` tokens (greedy, ignore_eos), as simulated."""
    return SamplingParams(max_tokens=req.output_len, ignore_eos=True)


def request_record(st: RequestState) -> RequestRecord:
    """A finished or rejected request's row (seconds on the engine clock; latencies from arrival)."""
    r = st.request
    times = st.token_times_s
    first, last = (times[0], times[-1]) if times else (NAN, NAN)
    scheduled = NAN if st.first_scheduled_s is None else st.first_scheduled_s
    n_out = len(st.output_token_ids)
    done = st.status == "finished"
    return RequestRecord(
        request_id=r.request_id, category=r.category, replica=0, status=st.status,
        finish_reason=st.finish_reason or "", arrival_s=st.arrival_s, scheduled_s=scheduled,
        first_token_s=first, finish_s=last if done else NAN, prompt_len=st.num_prompt_tokens,
        output_len=r.output_len, num_output_tokens=n_out, num_cached_tokens=st.num_cached_tokens,
        num_preemptions=st.num_preemptions, queue_s=scheduled - st.arrival_s,
        ttft_s=first - st.arrival_s if done else NAN,
        tpot_s=(last - first) / (len(times) - 1) if done and len(times) > 1 else NAN,
        e2e_s=last - st.arrival_s if done else NAN, num_spec_drafts=st.num_spec_drafts,
        num_spec_draft_tokens=st.num_spec_draft_tokens, num_spec_accepted_tokens=st.num_spec_accepted_tokens)


@dataclass(frozen=True, slots=True)
class GcStats:
    """Python's cyclic GC during one run (gc.callbacks): collections and pause seconds per generation."""

    collections: tuple[int, int, int]
    pause_s: tuple[float, float, float]
    collected: int  # objects the collections freed
    frozen_objects: int  # objects in the permanent generation during the run (0: not frozen)
    tracked_objects_end: int  # objects the GC tracked when the run ended (frozen ones included)

    @property
    def pause_s_total(self) -> float:
        return sum(self.pause_s)

    def as_dict(self) -> dict[str, Any]:
        return {"collections": list(self.collections), "pause_s": list(self.pause_s),
                "pause_s_total": self.pause_s_total, "collected": self.collected,
                "frozen_objects": self.frozen_objects, "tracked_objects_end": self.tracked_objects_end}


class GcWatch:
    """Counts collections and their pauses while installed (a context manager)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pause_s = [0.0, 0.0, 0.0]
        self.collected = 0
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        g = info["generation"]
        self.collections[g] += 1
        self.pause_s[g] += time.perf_counter() - self._start
        self.collected += info["collected"]

    @property
    def pause_s_total(self) -> float:
        return sum(self.pause_s)

    def __enter__(self) -> Self:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def stats(self, frozen_objects: int) -> GcStats:
        return GcStats(collections=tuple(self.collections), pause_s=tuple(self.pause_s), collected=self.collected,
                       frozen_objects=frozen_objects, tracked_objects_end=len(gc.get_objects()) + gc.get_freeze_count())


@contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[int]:
    """Move every tracked object to the permanent generation for the block (vLLM's freeze after
    warm-up); yields the frozen count. The heap is unfrozen at the end, so what the caller drops
    afterwards (a whole engine and its device memory) is collectable again; for the same reason
    no collection runs first (vLLM's does, as its freeze is for good): garbage frozen with the
    heap waits for the first collection after the block."""
    if not enabled:
        yield 0
        return
    gc.freeze()
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()


@dataclass
class ReplayResult(RunTables):
    """An engine replay's tables, summary and exposition, in the simulator's schema (RunTables).
    `itl_gaps_s` holds every measured inter-token gap, so ITL comes from tokens, not steps."""

    scheduler_stats: dict = field(default_factory=dict)
    unfinished_ids: list[int] = field(default_factory=list)  # cut off by max_wall_s
    gc_stats: GcStats | None = None  # written to summary.json as "gc"
    startup: dict | None = None  # the engine's StartupLog, written to summary.json as "startup"
    # GC pause seconds inside each step of the step table (same rows), not a records.py column
    step_gc_pause_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_launch_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # StepResult.launch_s per row

    def itl_samples(self) -> tuple[np.ndarray, np.ndarray]:
        return self.itl_gaps_s, np.ones(self.itl_gaps_s.size)

    def request_rows(self) -> list[dict]:
        """The request table as JSON-ready dicts, one per request."""
        return _rows(self.requests)

    def step_rows(self) -> list[dict]:
        return _rows(self.steps)

    def write(self, out_dir: str | Path, *, force: bool = False) -> dict:
        """requests.jsonl, steps.jsonl, summary.json, metrics.prom, scheduler_stats.json; returns
        the summary written (strict JSON values: NaN as None). A folder already holding a run is
        refused unless `force`; the files are written aside and then take `out_dir`'s place
        (engine/core/outputs.py), so an interrupted write leaves the previous run whole."""
        out = check_output_dir(out_dir, flag="out_dir", force=force, force_hint="force=True")
        with staged_dir(out) as tmp:
            return self.write_files(tmp)

    def write_files(self, out: Path) -> dict:
        """`write`'s files straight into the folder `out` (no checks); returns the summary."""
        for name, rows in (("requests", self.request_rows()), ("steps", self.step_rows())):
            with open(out / f"{name}.jsonl", "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        summary = jsonable(self.summary().to_json_dict())
        if self.gc_stats is not None:  # not a summary() key: the simulator's summaries have no GC
            summary["gc"] = jsonable(self.gc_stats.as_dict())
        if self.startup is not None:  # the engine's start-up phases (ready_s is a summary key)
            summary["startup"] = jsonable(self.startup)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (out / "metrics.prom").write_text(self.prometheus_text())
        (out / "scheduler_stats.json").write_text(json.dumps(self.scheduler_stats, indent=2, default=float))
        return summary


def _rows(table: dict[str, np.ndarray]) -> list[dict]:
    cols = list(table)
    return [jsonable(dict(zip(cols, row))) for row in zip(*(table[c].tolist() for c in cols))]


_GAUGES = {"num_running", "num_waiting", "num_cached_blocks", "num_free_blocks", "num_gpu_blocks",
           "kv_usage", "fragmentation_slots"}


def _stats_dict(scheduler) -> dict:
    st = scheduler.stats
    return dict(st) if isinstance(st, dict) else dataclasses.asdict(st)


def _stats_delta(before: dict, after: dict) -> dict:
    """Counters accumulated during the replay only (an engine may have served warm-up requests)."""
    return {k: (v if k in _GAUGES else v - before.get(k, 0)) for k, v in after.items()}


def replay(core: EngineCore, requests: Sequence[Request], *,
           params_for: Callable[[Request], SamplingParams] = default_params,
           time_scale: float = 1.0, honor_arrivals: bool = True,
           metrics: EngineMetrics | None = None,
           trace_file: str | Path | None = None,
           max_wall_s: float | None = None, freeze_gc: bool = True) -> ReplayResult:
    """Run `requests` (sorted by arrival) through `core`; returns its tables and summary.

    `honor_arrivals=False` submits everything at t=0 (an offline throughput run).
    `trace_file`: the step table is also streamed there as JSONL while it runs.
    `max_wall_s`: stop after this long; requests not done are listed in `unfinished_ids` (and
    are "unfinished" rows of the request table).
    `freeze_gc`: freeze the heap for the run (see the module's note); GC statistics are recorded either way.
    """
    reqs = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    run = _Run(core, reqs, [r.arrival_s * time_scale if honor_arrivals else 0.0 for r in reqs],
               [params_for(r) for r in reqs], metrics)
    stats_before = _stats_dict(core.scheduler)
    pos_before = list(core.scheduler.num_spec_accepted_per_pos)
    sink = open(trace_file, "w") if trace_file else None  # noqa: SIM115 - closed in finally
    try:
        with frozen_heap(freeze_gc) as frozen, GcWatch() as run.gc_watch:
            run.loop(max_wall_s, sink)
            wall = core.now()
            gc_stats = run.gc_watch.stats(frozen)
    finally:
        if sink:
            sink.close()
    missing = [r.request_id for r in reqs if r.request_id not in run.records]
    if missing and max_wall_s is None:
        raise RuntimeError(f"requests {missing[:5]} neither finished nor were rejected")
    records = [run.records.get(r.request_id) or _unfinished(r, a) for r, a in zip(reqs, run.arrivals)]
    return ReplayResult(
        requests=to_columns(records, RequestRecord), steps=to_columns(run.steps, StepRecord),
        meta=_meta(core, run.arrivals), counters=_counters(stats_before, _stats_dict(core.scheduler), pos_before,
                                                             core.scheduler.num_spec_accepted_per_pos),
        wall_s=wall, itl_gaps_s=np.asarray(run.itl_gaps_s, dtype=np.float64),
        scheduler_stats=_stats_delta(stats_before, _stats_dict(core.scheduler)), unfinished_ids=missing,
        gc_stats=gc_stats, startup=core.startup.as_dict(),
        step_gc_pause_s=np.asarray(run.step_gc_pause_s, dtype=np.float64),
        step_launch_s=np.asarray(run.step_launch_s, dtype=np.float64))


class _Run:
    """The replay loop's state: what is due, and what came out."""

    def __init__(self, core: EngineCore, reqs: list[Request], arrivals: list[float],
                 params: list[SamplingParams], metrics: EngineMetrics | None) -> None:
        self.core, self.reqs, self.arrivals, self.params, self.metrics = core, reqs, arrivals, params, metrics
        vocab = core.spec.vocab_size
        self.prompts = [materialize_prompt(r, vocab) for r in reqs]  # before the clock starts
        self.steps: list[StepRecord] = []
        self.records: dict[int, RequestRecord] = {}
        self.itl_gaps_s: list[float] = []
        self.gc_watch = GcWatch()  # replaced by the installed one while the loop runs
        self.step_gc_pause_s: list[float] = []  # GC pauses since the previous step row
        self.step_launch_s: list[float] = []
        self._gc_pause_seen_s = 0.0

    def loop(self, max_wall_s: float | None, sink) -> None:
        core, reqs, arrivals = self.core, self.reqs, self.arrivals
        core.reset_clock()
        i, n = 0, len(reqs)
        while i < n or core.has_unfinished():
            now = core.now()
            if max_wall_s is not None and now > max_wall_s:
                break
            while i < n and arrivals[i] <= now:
                core.add_request(reqs[i], self.params[i], self.prompts[i], arrival_s=arrivals[i])
                i += 1
            if not core.has_unfinished():
                time.sleep(max(0.0, arrivals[i] - core.now()))
                continue
            self._collect(core.step(), sink)

    def _collect(self, res, sink) -> None:
        if res.trace is not None:
            self.steps.append(res.trace)
            paused = self.gc_watch.pause_s_total
            self.step_gc_pause_s.append(paused - self._gc_pause_seen_s)
            self._gc_pause_seen_s = paused
            self.step_launch_s.append(res.launch_s)
            if sink:
                sink.write(json.dumps(jsonable(dataclasses.asdict(res.trace))) + "\n")
            if self.metrics:
                self.metrics.observe_step(res.trace, self.core.scheduler)
        for st in res.finished:
            rec = request_record(st)
            self.records[rec.request_id] = rec
            gaps = np.diff(st.token_times_s).tolist() if st.status == "finished" else []
            self.itl_gaps_s.extend(gaps)
            if self.metrics:
                self.metrics.observe_request(rec, gaps)


def _unfinished(req: Request, arrival_s: float) -> RequestRecord:
    return RequestRecord(request_id=req.request_id, category=req.category, arrival_s=arrival_s,
                         prompt_len=req.prompt_len, output_len=req.output_len)


def _meta(core: EngineCore, arrivals: list[float]) -> dict[str, Any]:
    span = arrivals[-1] - arrivals[0] if arrivals else 0.0
    return {"endpoint_type": "engine", "backend": "costline-engine", "model": core.config.model,
            "gpu": str(core.device), "num_gpus": 1, "num_replicas": 1,
            "deployment": f"{core.config.model} on {core.device}",
            "request_rate": (len(arrivals) - 1) / span if span > 0 else "inf",
            "num_gpu_blocks": core.num_gpu_blocks, "max_model_len": core.max_model_len,
            # the engine's effective scheduling mode (speculative decoding runs synchronously)
            "async_scheduling": core.async_scheduling, "ready_s": core.ready_s,
            "speculative_config": sc.vllm_json() if (sc := core.config.speculative_config) else None}


def _counters(before: dict, after: dict, pos_before: list[int], pos_after: list[int]) -> dict[str, float]:
    """The run-wide counters the summary reads (engine/core/run_summary.COUNTER_KEYS), this replay only."""
    names = {"prefix_cache_queries_tokens": "prefix_cache_queries_tokens",
             "prefix_cache_hits_tokens": "prefix_cache_hits_tokens", "spec_num_drafts": "num_spec_drafts",
             "spec_draft_tokens": "num_spec_draft_tokens", "spec_accepted_tokens": "num_spec_accepted_tokens"}
    out = {key: after.get(stat, 0) - before.get(stat, 0) for key, stat in names.items()}
    return out | per_position_counters([a - (pos_before[i] if i < len(pos_before) else 0)
                                        for i, a in enumerate(pos_after)])
