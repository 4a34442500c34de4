"""The ladder from vLLM's defaults to the recommendation, one optimization at a time, and the
optimizations left out with the measured reason."""

from __future__ import annotations

import math

from advisor.advise.evaluate import Evaluator, Outcome
from advisor.advise.records import LadderStep, Metrics, Rejected
from advisor.advise.search import SLO_MET, Context, Scored, SearchResult, primary
from advisor.advise.space import Candidate, baseline, sim_config, vllm_flags


def pct(new: float, old: float) -> float:
    """Relative change in percent; 0 when both are zero, nan when undefined."""
    if not (math.isfinite(new) and math.isfinite(old)):
        return math.nan
    if old == 0:
        return 0.0 if new == 0 else math.inf
    return (new - old) / abs(old) * 100


def gpus_needed(m: Metrics, num_gpus: int) -> int | None:
    """GPUs meeting the SLOs at this rung, assuming goodput grows with replicas: the GPUs given if
    they meet them, else the replicas' worth needed to serve the missing share (None if nothing
    was served within the SLOs)."""
    if m.slo_attainment >= SLO_MET:
        return num_gpus
    if m.slo_attainment <= 0:
        return None
    return math.ceil(num_gpus * SLO_MET / m.slo_attainment)


def _changed_dim(cand: Candidate) -> int:
    """The one dimension a screening candidate changes from the defaults."""
    return next(i for i, p in enumerate(cand.picks) if p)


def _flags_of(ctx: Context, cand: Candidate) -> dict:
    cfg = sim_config(cand, ctx.dims, model=ctx.model, gpu=ctx.gpu, num_gpus=ctx.num_gpus, slo=ctx.slo,
                     seed=ctx.seed, profile=ctx.profile)
    return vllm_flags(cfg.engine, cand.layout(ctx.dims, ctx.num_gpus))


def ladder(ev: Evaluator, ctx: Context, found: SearchResult) -> list[LadderStep]:
    """Add the recommendation's changes to the defaults in the order of their effect alone
    (screening), each rung simulated with all changes so far."""
    best, base = found.best.cand, baseline(ctx.dims)
    alone = {_changed_dim(s.cand): s.key for s in found.screen[1:]
             if s.cand.picks[_changed_dim(s.cand)] == best.picks[_changed_dim(s.cand)]}
    changed = sorted((d for d, p in enumerate(best.picks) if p), key=lambda d: alone.get(d, ()), reverse=True)
    rungs, cur = [], base
    for d in changed:
        cur = cur.with_pick(d, best.picks[d])
        rungs.append((d, cur))
    outs = ev.map([ctx.task(c) for _, c in rungs])
    steps, prev, prev_flags = [], found.baseline.outcome.metrics, _flags_of(ctx, base)
    for (d, cand), out in zip(rungs, outs, strict=True):
        m = out.metrics
        flags = _flags_of(ctx, cand)
        added = {k: v for k, v in flags.items() if prev_flags.get(k) != v}
        opt = ctx.dims[d].options[best.picks[d]]
        steps.append(LadderStep(
            optimization=f"{ctx.dims[d].name}: {opt.name}", flags_added=added, metrics=m,
            delta_goodput_pct=pct(m.goodput_rps, prev.goodput_rps), delta_ttft_p99_pct=pct(m.ttft_p99_ms, prev.ttft_p99_ms),
            delta_tpot_p99_pct=pct(m.tpot_p99_ms, prev.tpot_p99_ms),
            gpus_needed=gpus_needed(m, cand.layout(ctx.dims, ctx.num_gpus).num_gpus)))
        prev, prev_flags = m, flags
    return steps


def _figure(dim: str, o: Outcome, best: Outcome) -> str:
    """The measured figure that explains a knob's effect."""
    x, b = o.extras, best.extras
    if o.error:
        return f"vLLM would refuse it: {o.error}"
    if dim == "speculative decoding" and math.isfinite(x.get("acceptance_rate", math.nan)):
        return (f"acceptance {x['acceptance_rate']:.2f} on this task mix at a mean concurrency of "
                f"{x['concurrency']:.0f}; TPOT p99 {o.metrics.tpot_p99_ms:.1f} ms")
    if dim == "prefix caching":
        return f"prefix-cache hit rate {b.get('prefix_hit_rate', 0):.0%} with caching on"
    if dim == "token budget":
        return f"TTFT p99 {o.metrics.ttft_p99_ms:,.0f} ms, TPOT p99 {o.metrics.tpot_p99_ms:.1f} ms"
    if dim in ("FP8", "gpu memory utilization", "max-num-seqs", "block size"):
        return f"KV usage peak {x.get('kv_usage_max', 0):.0%}, {o.metrics.preemptions} preemptions"
    return f"TTFT p99 {o.metrics.ttft_p99_ms:,.0f} ms, TPOT p99 {o.metrics.tpot_p99_ms:.1f} ms"


def rejected(ctx: Context, found: SearchResult) -> list[Rejected]:
    """Every option the recommendation does not use, measured as a single move away from it."""
    near: list[Scored] = found.neighbours
    best_o = near[0].outcome
    ref = primary(best_o, ctx.objective, near[0].cand.layout(ctx.dims, ctx.num_gpus).num_gpus)
    out = []
    for s in near[1:]:
        d = next(i for i, (a, b) in enumerate(zip(s.cand.picks, near[0].cand.picks, strict=True)) if a != b)
        opt = ctx.dims[d].options[s.cand.picks[d]]
        gpus = s.cand.layout(ctx.dims, ctx.num_gpus).num_gpus
        delta = pct(primary(s.outcome, ctx.objective, gpus), ref)
        what = "goodput per GPU" if ctx.objective == "cost" else "goodput"
        verb = "no gain" if abs(delta) < 1 else f"{delta:+.0f}% {what}"
        out.append(Rejected(optimization=f"{ctx.dims[d].name}: {opt.name}", flags=_flags_of(ctx, s.cand),
                            reason=f"{ctx.dims[d].name} {opt.name}: {verb} against the recommendation; "
                                   + _figure(ctx.dims[d].name, s.outcome, best_o),
                            delta_goodput_pct=delta))
    return sorted(out, key=lambda r: r.delta_goodput_pct if math.isfinite(r.delta_goodput_pct) else -1e9)
