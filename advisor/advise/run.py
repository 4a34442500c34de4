"""The advisor's pipeline, stage after stage, over one pool of simulation workers."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from advisor.advise.assumptions import assumptions
from advisor.advise.cost_lines import cost_lines
from advisor.advise.cost_lines import expected_simulations as expected_lines
from advisor.advise.dollars import cost, gpu_option
from advisor.advise.evaluate import Evaluator, SimTask
from advisor.advise.gap import gain, lab_gap
from advisor.advise.ladder import Realizations, ladder, rejected
from advisor.advise.moe_notes import moe_notes
from advisor.advise.progress import Counted, ProgressCallback, ProgressEvent, Tracker
from advisor.advise.questions import metrics_to_watch, questions
from advisor.advise.records import (
    AdviseRequest,
    CostLine,
    Gap,
    ProfileInfo,
    Recommendation,
    Robustness,
    Verdict,
)
from advisor.advise.robustness import robustness, scored_config
from advisor.advise.search import Context, search
from advisor.advise.search import expected_simulations as expected_search
from advisor.advise.space import Candidate, dimensions, serve_command
from advisor.advise.variants import LAB_FACTORS, spec_for
from advisor.advise.verdict import checked, meets, quality_notes, verdict
from engine.core.request import Request
from sim.describe import describe_workload
from sim.profile_files import load_profile
from sim.run import LoadedWorkload
from sim.serve_line import ServeLine
from sim.workload import Workload
from sim.workload_source import SourceOptions, load_workload

POLL_S = 0.2  # how often the calling thread hands the side-by-side phases' progress on
ANALYSIS_REQUESTS = {"quick": 300, "full": 4000}  # requests per cost-line, gap and robustness run
REALIZATIONS = {"quick": 3, "full": 5}  # other realizations of the traffic per ladder rung (gain intervals)


def as_workload(workload: Any, seed: int, source: SourceOptions | None = None) -> Workload:
    """The user's traffic as a columnar `Workload` (preset, spec or trace name/path, Workload,
    LoadedWorkload or a list of Requests)."""
    if isinstance(workload, Workload):
        return workload
    if isinstance(workload, (str, Path)):
        opts = (source or SourceOptions()).model_copy(update={"seed": seed})
        return load_workload(str(workload), opts)
    if isinstance(workload, LoadedWorkload):
        return Workload.from_requests(workload.requests, workload.name)
    reqs = list(workload)
    if not reqs or not all(isinstance(r, Request) for r in reqs):
        raise ValueError("workload: give a preset or trace name, a spec or trace path, a Workload or a list of Requests")
    return Workload.from_requests(reqs, "requests")


def _workload_info(wl: Workload, ctx: Context, spec_name: str) -> dict[str, Any]:
    d = describe_workload(wl)
    return {"name": wl.name, "num_requests": len(wl), "rate_rps": d["mean_rate_rps"], "duration_s": d["duration_s"],
            "interarrival_cv": d["interarrival_cv"], "prompt_tokens": d["prompt_tokens"],
            "output_tokens": d["output_tokens"], "prefix_reuse": d["prefix_reuse"], "task_mix": d["task_mix"],
            "evaluated_requests": ctx.eval_requests, "variants_from_spec": spec_name}


def _profile(request: AdviseRequest, extras: dict[str, Any]) -> ProfileInfo:
    name = extras.get("profile") or request.profile or "default"
    status = extras.get("profile_status") or ("first-principles coefficients from datasheets, not calibrated"
                                              if name == "default" else "as given")
    return ProfileInfo(name=str(name), status=str(status))


CHECK_GPUS = 4  # GPU counts tried at once from the verdict's estimate up
MAX_CHECK_GPUS = 64


def gpus_to_meet(ev: Evaluator, ctx: Context, cand: Candidate, v: Verdict, slo: str) -> Verdict:
    """The recommended flags simulated on more GPUs (replicas of the same tensor-parallel size),
    from the estimate up, in one batch: the fewest that meet the SLO replace the estimate. P/D
    layouts keep the estimate."""
    cfg = ctx.task(cand).config
    if cfg.disaggregation is not None or v.gpus_needed is None:
        return v
    tp = cfg.engine.tensor_parallel_size
    start = max(v.gpus_needed, v.num_gpus + 1)
    start = -(-start // tp) * tp
    counts = [n for n in range(start, start + CHECK_GPUS * tp, tp) if n <= MAX_CHECK_GPUS]
    if not counts:
        return v
    outs = ev.map([SimTask(cfg.model_copy(update={"num_gpus": n}), ctx.eval_requests) for n in counts])
    hit = next(((n, o.metrics) for n, o in zip(counts, outs, strict=True) if meets(o.metrics, slo)), None)
    return checked(v, hit[0] if hit else None, hit[1] if hit else None, counts[-1])


def serve_notes(line: ServeLine) -> list[str]:
    if not line.draft_placeholder:
        return []
    return [(f"{line.draft_placeholder} in --speculative-config is a placeholder: no public draft head for this model "
            "and method is known to costline; put the Hugging Face id or path of one trained for this model in "
            "\"model\" (vLLM refuses the method without it)")]


def _await(futures: list[Future], tracker: Tracker) -> None:
    """Wait for the side-by-side phases, handing their progress to the callback on this thread."""
    while True:
        _, pending = wait(futures, timeout=POLL_S)
        tracker.flush()
        if not pending:
            return


def _in_phase(tracker: Tracker, name: str, expected: int, ev: Evaluator, fn: Callable[..., Any], *args: Any) -> Any:
    with tracker.phase(name, expected) as ph:
        return fn(Counted(ev, ph), *args)


def _ladder_expected(found: Any, realizations: int) -> int:
    changed = sum(1 for p in found.best.cand.picks if p)
    return realizations * (1 + changed) + changed  # + each change's unmeasured-input ends, as they come


def _analyses(tracker: Tracker, ev: Evaluator, ctx: Context, spec: Any, small: Any, found: Any,
              n_analysis: int) -> tuple[list[CostLine], Gap | None, Robustness]:
    """Cost lines, the lab -> production gap and robustness around the recommendation: independent,
    so they run side by side and the workers stay busy."""
    production = gain(found.baseline.outcome, found.best.outcome)
    with ThreadPoolExecutor(3 if ev.parallel else 1) as pool:
        lines_f = pool.submit(_in_phase, tracker, "cost lines", expected_lines(), ev, cost_lines, ctx, spec,
                              found.best.cand, n_analysis, ThreadPoolExecutor(6) if ev.parallel else None)
        gap_f = pool.submit(_in_phase, tracker, "lab -> production gap", 2 * (1 + len(LAB_FACTORS)), ev,
                            lab_gap, ctx, small, found.baseline.cand, found.best.cand, production) \
            if found.best.cand != found.baseline.cand else None
        rob_f = pool.submit(_in_phase, tracker, "robustness", 0, ev, robustness, ctx, small,
                            [found.best, *found.finalists[:2], found.baseline])
        _await([f for f in (lines_f, gap_f, rob_f) if f is not None], tracker)
        return lines_f.result(), gap_f.result() if gap_f else None, rob_f.result()


def advise(workload: Any, request: AdviseRequest, *, progress: ProgressCallback | None = None,
           source: SourceOptions | None = None, clock: Callable[[], float] = time.monotonic) -> Recommendation:
    """The recommendation for `workload` under `request` (same inputs and seed, same answer).
    `source` reshapes a named or file workload as everywhere else (--num-requests, --rate, ...).
    `progress` gets a `ProgressEvent` per phase as simulations finish, on the calling thread."""
    t0 = time.perf_counter()
    tracker = Tracker(progress, clock)
    wl = as_workload(workload, request.seed, source)
    spec = spec_for(workload, wl, source)
    # min-gpus and cost compare deployments on fewer GPUs than given too
    dims = dimensions(request.preset, request.num_gpus, min_gpus=None if request.objective == "goodput" else 1,
                      acceptance=request.acceptance, allow=request.allow, forbid=request.forbid)
    slo = request.parsed_slo()
    slo_text = " ".join(f"{k}:{v:g}" for k, v in slo.as_dict().items()) if slo else None
    ctx = Context(model=request.preset, gpu=request.gpu, num_gpus=request.num_gpus, slo=slo_text, seed=request.seed,
                  profile=request.profile, objective=request.objective, dims=dims, num_requests=len(wl),
                  budget=request.budget)
    n_analysis = min(len(wl), ANALYSIS_REQUESTS[request.budget])
    with Evaluator(wl, workers=request.workers, ray=request.ray) as ev:
        with tracker.phase("search", expected_search(ctx)) as ph:
            found = search(Counted(ev, ph), ctx, ph.note)
        small = spec.with_overrides(num_requests=n_analysis)
        profile = load_profile(ctx.profile, ctx.model, ctx.gpu)
        real = Realizations(small, REALIZATIONS[request.budget], n_analysis)
        steps = _in_phase(tracker, "ladder", _ladder_expected(found, REALIZATIONS[request.budget]), ev, ladder,
                          ctx, found, real, request.min_gain_pct, profile)
        # the recommendation: the defaults plus the changes that clear the bar
        found = dataclasses.replace(found, best=steps.final)
        lines, gap, rob = _analyses(tracker, ev, ctx, spec, small, found, n_analysis)
        best = scored_config(ctx, found.best)
        v = verdict(best.metrics, request.slo, best.num_gpus, request.gpu)
        if not v.meets:
            v = _in_phase(tracker, "GPUs to meet the SLO", CHECK_GPUS, ev, gpus_to_meet, ctx, found.best.cand, v,
                          request.slo)
        count = ev.count
    best_engine = ctx.task(found.best.cand).config.engine
    line = serve_command(request.model, best_engine, found.best.cand.layout(dims, request.num_gpus))
    return Recommendation(
        verdict=v, cost=cost(best.metrics, v, request.gpu, request.gpu_hour_usd), request=request,
        profile=_profile(request, found.best.outcome.extras),
        workload=_workload_info(wl, ctx, spec.name), baseline=scored_config(ctx, found.baseline),
        best=best, ladder=steps.steps, kept_defaults=steps.kept,
        rejected=rejected(ctx, found, steps.kept_dims), cost_lines=lines,
        assumptions=assumptions(best_engine, profile, request.gpu, steps.flips),
        gap=gap, robustness=rob,
        serve_command=line.command, serve_notes=serve_notes(line), quality_notes=quality_notes(best.flags),
        metrics_to_watch=metrics_to_watch(slo, found, lines), questions=questions(ctx, found, lines),
        model_notes=_model_notes(ctx, profile, best_engine),
        elapsed_s=round(time.perf_counter() - t0, 2), num_simulations=count,
        latency_cdfs={"baseline": found.baseline.outcome.cdf_ms, "best": found.best.outcome.cdf_ms})


def _model_notes(ctx: Context, profile: Any, engine: Any) -> list[str]:
    """The architecture's own effects (a mixture of experts), priced with the advice's profile."""
    from engine.core.model_spec import get_model
    from sim.hardware import get_gpu

    return moe_notes(get_model(ctx.model), get_gpu(ctx.gpu), profile, engine.max_num_seqs or 256)


def compare_gpus(workload: Any, request: AdviseRequest, gpus: list[str], *, progress: ProgressCallback | None = None,
                 source: SourceOptions | None = None) -> Recommendation:
    """The recommendation on `request.gpu`, with `gpu_comparison`: the same workload advised on
    each GPU type of `gpus` (the same number of GPUs, SLO and objective; the cost profile the
    simulator picks for each), side by side."""
    from sim.hardware import get_gpu

    names = list(dict.fromkeys([request.gpu, *(get_gpu(g).name for g in gpus)]))
    recs = []
    for i, gpu in enumerate(names):
        def part(ev: ProgressEvent, i: int = i, gpu: str = gpu) -> None:
            if progress is not None:
                progress(dataclasses.replace(ev, phase=f"{gpu} ({i + 1}/{len(names)}) {ev.phase}",
                                             fraction=(i + ev.fraction) / len(names)))

        # a --profile fitted for one GPU does not price another: the others use what the simulator picks
        other = {"gpu": gpu} | ({} if gpu == request.gpu else {"profile": None})
        recs.append(advise(workload, request.model_copy(update=other), progress=part, source=source))
    return recs[0].model_copy(update={"gpu_comparison": [gpu_option(r) for r in recs]})


__all__ = ["ANALYSIS_REQUESTS", "ProgressCallback", "ProgressEvent", "advise", "as_workload", "compare_gpus"]
