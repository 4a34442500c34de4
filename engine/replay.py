"""Timed replay: feed a workload's requests to the engine at their arrival times, in wall time.

Each request enters the scheduler once the engine clock passes its `arrival_s` (times
`time_scale`); when nothing is running the loop sleeps until the next arrival. Records, per
request, TTFT, TPOT, ITL, end-to-end and queue time (all measured from the intended arrival),
and one step-trace row per engine step (docs/interfaces.md, "Engine step trace").
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.core import EngineCore, RequestState
from engine.metrics import EngineMetrics
from engine.request import Request, materialize_prompt
from engine.sampling import SamplingParams


def default_params(req: Request) -> SamplingParams:
    """A workload request generates exactly `output_len` tokens (greedy, ignore_eos), as simulated."""
    return SamplingParams(max_tokens=req.output_len, ignore_eos=True)


def request_row(st: RequestState) -> dict:
    """Per-request metrics (seconds) of a finished or rejected request."""
    r = st.request
    times = st.token_times_s
    row = {
        "request_id": r.request_id, "status": st.status, "finish_reason": st.finish_reason,
        "arrival_s": st.arrival_s, "prompt_len": st.num_prompt_tokens,
        "num_output_tokens": len(st.output_token_ids), "num_cached_tokens": st.num_cached_tokens,
        "num_preemptions": st.num_preemptions,
        "queue_s": None if st.first_scheduled_s is None else st.first_scheduled_s - st.arrival_s,
        "ttft_s": times[0] - st.arrival_s if times else None,
        "e2e_s": None if st.finished_s is None or not times else times[-1] - st.arrival_s,
        "tpot_s": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
        "itl_s": list(np.diff(times)) if len(times) > 1 else [],
        "inference_s": (times[-1] - st.first_scheduled_s) if times and st.first_scheduled_s is not None else None,
        "prefill_s": (times[0] - st.first_scheduled_s) if times and st.first_scheduled_s is not None else None,
        "decode_s": times[-1] - times[0] if times else None,
    }
    return row


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class ReplayResult:
    requests: list[dict]
    steps: list[dict]
    wall_s: float
    scheduler_stats: dict = field(default_factory=dict)
    unfinished_ids: list[int] = field(default_factory=list)  # cut off by max_wall_s

    def summary(self) -> dict:
        done = [r for r in self.requests if r["status"] != "rejected"]
        out_tokens = sum(r["num_output_tokens"] for r in done)
        prompt_tokens = sum(r["prompt_len"] for r in done)
        s = {
            "num_requests": len(self.requests), "num_finished": len(done),
            "num_rejected": len(self.requests) - len(done),
            "num_unfinished_at_cutoff": len(self.unfinished_ids),
            "wall_s": self.wall_s, "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
            "output_tokens_per_s": out_tokens / self.wall_s if self.wall_s > 0 else None,
            "total_tokens_per_s": (out_tokens + prompt_tokens) / self.wall_s if self.wall_s > 0 else None,
            "num_steps": len(self.steps),
            "num_preemptions": sum(r["num_preemptions"] for r in self.requests),
        }
        for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
            vals = [r[key] for r in done if r[key] is not None]
            for q in (50, 90, 99):
                s[f"{key[:-2]}_p{q}_s"] = _pct(vals, q)
            s[f"{key[:-2]}_mean_s"] = float(np.mean(vals)) if vals else None
        itl = [g for r in done for g in r["itl_s"]]
        s["itl_p50_s"], s["itl_p99_s"] = _pct(itl, 50), _pct(itl, 99)
        st = self.scheduler_stats
        q, h = st.get("prefix_cache_queries_tokens"), st.get("prefix_cache_hits_tokens")
        s["prefix_cache_hit_rate"] = (h / q) if q else None
        s["scheduler_stats"] = st
        return s

    def write(self, out_dir: str | Path) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "requests.jsonl", "w") as f:
            f.writelines(json.dumps({k: v for k, v in r.items() if k != "itl_s"}) + "\n" for r in self.requests)
        with open(out / "steps.jsonl", "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in self.steps)
        (out / "summary.json").write_text(json.dumps(self.summary(), indent=2, default=float))


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
           max_wall_s: float | None = None) -> ReplayResult:
    """Run `requests` (sorted by arrival) through `core`; returns per-request rows and the trace.

    `honor_arrivals=False` submits everything at t=0 (an offline throughput run).
    `trace_file`: the step trace is also streamed there as JSONL while it runs.
    `max_wall_s`: stop after this long; requests not done are listed in `unfinished_ids`.
    """
    reqs = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    vocab = core.spec.vocab_size
    prompts = [materialize_prompt(r, vocab) for r in reqs]  # before the clock starts
    params = [params_for(r) for r in reqs]
    arrivals = [r.arrival_s * time_scale if honor_arrivals else 0.0 for r in reqs]
    steps: list[dict] = []
    rows: dict[int, dict] = {}
    sink = open(trace_file, "w") if trace_file else None  # noqa: SIM115 - closed in finally
    stats_before = _stats_dict(core.scheduler)
    core.reset_clock()
    i, n = 0, len(reqs)
    try:
        while i < n or core.has_unfinished():
            now = core.now()
            if max_wall_s is not None and now > max_wall_s:
                break
            while i < n and arrivals[i] <= now:
                core.add_request(reqs[i], params[i], prompts[i], arrival_s=arrivals[i])
                i += 1
            if not core.has_unfinished():
                time.sleep(max(0.0, arrivals[i] - core.now()))
                continue
            res = core.step()
            if res.trace is not None:
                steps.append(res.trace)
                if sink:
                    sink.write(json.dumps(res.trace) + "\n")
                if metrics:
                    metrics.observe_step(res.trace, core.scheduler)
            for st in res.finished:
                row = request_row(st)
                rows[st.request.request_id] = row
                if metrics:
                    metrics.observe_request(row)
    finally:
        if sink:
            sink.close()
    wall = core.now()
    missing = [r.request_id for r in reqs if r.request_id not in rows]
    if missing and max_wall_s is None:
        raise RuntimeError(f"requests {missing[:5]} neither finished nor were rejected")
    return ReplayResult(requests=[rows[r.request_id] for r in reqs if r.request_id in rows],
                        steps=steps, wall_s=wall, scheduler_stats=_stats_delta(stats_before, _stats_dict(core.scheduler)),
                        unfinished_ids=missing)
