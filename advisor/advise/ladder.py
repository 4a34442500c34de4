"""The ladder from vLLM's defaults to the recommendation, one optimization at a time, each with
its gain's interval (a change inside the error bars keeps vLLM's default), and the optimizations
left out with the measured reason."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from advisor.advise.assumptions import InputRange, flip_point, input_ranges
from advisor.advise.evaluate import Evaluator, Outcome, SimTask
from advisor.advise.records import KeptDefault, LadderStep, Metrics, Rejected
from advisor.advise.search import SLO_MET, Context, Scored, SearchResult, primary, score
from advisor.advise.space import Candidate, baseline, sim_config, vllm_flags
from advisor.advise.uncertainty import DEFAULT_MIN_GAIN_PCT, Sample, gain_interval
from sim.cost_model import CostProfile
from sim.profile_files import load_profile
from sim.workload_spec import WorkloadSpec


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


def flags_of(ctx: Context, cand: Candidate) -> dict:
    cfg = sim_config(cand, ctx.dims, model=ctx.model, gpu=ctx.gpu, num_gpus=ctx.num_gpus, slo=ctx.slo,
                     seed=ctx.seed, profile=ctx.profile)
    return vllm_flags(cfg.engine, cand.layout(ctx.dims, ctx.num_gpus))


@dataclass(slots=True)
class LadderResult:
    steps: list[LadderStep]  # the changes recommended, in order, each with its gain interval
    kept: list[KeptDefault]  # the search's changes whose interval does not clear the bar
    final: Scored  # the recommendation: the defaults plus `steps`
    kept_dims: frozenset[int] = frozenset()  # the dimensions of `kept`
    flips: dict[str, str] = field(default_factory=dict)  # unmeasured input -> where the advice flips


@dataclass(frozen=True, slots=True)
class Realizations:
    """Other realizations of the user's traffic, for the traffic part of a gain's interval."""

    spec: WorkloadSpec | None  # the traffic's spec (fitted for a trace); None: no realizations
    count: int
    num_requests: int

    def tasks(self, ctx: Context, cand: Candidate) -> list[SimTask]:
        if self.spec is None or self.count < 2:
            return []
        return [ctx.task(cand, variant=self.spec.with_overrides(seed=ctx.seed + 1 + i, num_requests=self.num_requests))
                for i in range(self.count)]


def figure(ctx: Context, o: Outcome, cand: Candidate) -> Sample:
    """What a gain is measured on, with its band from the simulator's error: goodput, or goodput
    per GPU when the objective weighs GPUs (cost, min-gpus)."""
    gpus = cand.layout(ctx.dims, ctx.num_gpus).num_gpus
    per = 1 / gpus if ctx.objective in ("cost", "min-gpus") else 1.0
    g = o.metrics.goodput_rps
    return Sample(g, o.extras.get("goodput_low_rps", g), o.extras.get("goodput_high_rps", g)).scaled(per)


def _range_tasks(ctx: Context, cur: Candidate, nxt: Candidate, profile: CostProfile
                 ) -> list[tuple[InputRange, SimTask, SimTask]]:
    """`nxt` simulated at both ends of each unmeasured input it brings in (`cur` does not use it)."""
    base = ctx.task(nxt)
    out = []
    for r in input_ranges(ctx.task(cur).config.engine, base.config.engine, profile):
        ends = []
        for config, engine in ((r.config_low, r.engine_low), (r.config_high, r.engine_high)):
            t = ctx.task(nxt, engine=dict(engine) or None)
            ends.append(dataclasses.replace(t, config=t.config.model_copy(update=dict(config))))
        out.append((r, *ends))
    return out


def ladder(ev: Evaluator, ctx: Context, found: SearchResult, realizations: Realizations,
           min_gain_pct: float = DEFAULT_MIN_GAIN_PCT, profile: CostProfile | None = None) -> LadderResult:
    """Add the search's changes to the defaults in the order of their effect alone (screening),
    each rung simulated with all changes kept so far; a change is kept only when the low end of
    its gain's 90% interval is above `min_gain_pct`, else vLLM's default stays."""
    best, base = found.best.cand, baseline(ctx.dims)
    alone = {_changed_dim(s.cand): s.key for s in found.screen[1:]
             if s.cand.picks[_changed_dim(s.cand)] == best.picks[_changed_dim(s.cand)]}
    changed = sorted((d for d, p in enumerate(best.picks) if p), key=lambda d: alone.get(d, ()), reverse=True)
    profile = profile or load_profile(ctx.profile, ctx.model, ctx.gpu)
    flips: dict[str, str] = {}
    cur, cur_out = base, found.baseline.outcome
    cur_real = [figure(ctx, o, base).value for o in ev.map(realizations.tasks(ctx, base))]
    steps: list[LadderStep] = []
    kept: list[KeptDefault] = []
    kept_dims: set[int] = set()
    prev_flags = flags_of(ctx, base)
    for d in changed:
        nxt = cur.with_pick(d, best.picks[d])
        ranges = _range_tasks(ctx, cur, nxt, profile)
        real_tasks = realizations.tasks(ctx, nxt)
        outs = ev.map([ctx.task(nxt), *real_tasks, *(t for _, lo, hi in ranges for t in (lo, hi))])
        out, rest = outs[0], outs[1:]
        nxt_real = [figure(ctx, o, nxt).value for o in rest[:len(real_tasks)]]
        ends = rest[len(real_tasks):]
        extremes = {r.name: (figure(ctx, ends[2 * i], nxt), figure(ctx, ends[2 * i + 1], nxt))
                    for i, (r, _, _) in enumerate(ranges)}
        gain = gain_interval(figure(ctx, cur_out, cur), figure(ctx, out, nxt), cur_real, nxt_real, extremes)
        for r, _, _ in ranges:
            flip = flip_point(r.name, r.low, r.high, *gain.inputs[r.name], min_gain_pct)
            if flip:
                flips[r.name] = flip
        flags = flags_of(ctx, nxt)
        added = {k: v for k, v in flags.items() if prev_flags.get(k) != v}
        opt = ctx.dims[d].options[best.picks[d]]
        what = f"{ctx.dims[d].name}: {opt.name}"
        if not gain.clears(min_gain_pct):
            kept_dims.add(d)
            kept.append(KeptDefault(
                optimization=what, flags=added, gain=gain,
                reason=f"keep vLLM's default for {ctx.dims[d].name}: {gain.text()} predicted "
                       f"(a change needs more than {min_gain_pct:+g}% at the low end of its interval)"))
            continue
        m, prev = out.metrics, cur_out.metrics
        steps.append(LadderStep(
            optimization=what, flags_added=added, metrics=m,
            delta_goodput_pct=pct(m.goodput_rps, prev.goodput_rps), delta_ttft_p99_pct=pct(m.ttft_p99_ms, prev.ttft_p99_ms),
            delta_tpot_p99_pct=pct(m.tpot_p99_ms, prev.tpot_p99_ms),
            gpus_needed=gpus_needed(m, nxt.layout(ctx.dims, ctx.num_gpus).num_gpus), gain=gain))
        cur, cur_out, cur_real, prev_flags = nxt, out, nxt_real, flags
    final = found.best if cur == best else Scored(cur, cur_out, score(cur_out, cur, ctx))
    return LadderResult(steps, kept, final, frozenset(kept_dims), flips)


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


def rejected(ctx: Context, found: SearchResult, kept_dims: frozenset[int] = frozenset()) -> list[Rejected]:
    """Every option the recommendation does not use, measured as a single move away from the
    search's winner; the dimensions whose change stayed at vLLM's default (`kept_dims`, reported
    with their interval) are left out."""
    near: list[Scored] = found.neighbours
    best_o = near[0].outcome
    ref = primary(best_o, ctx.objective, near[0].cand.layout(ctx.dims, ctx.num_gpus).num_gpus)
    out = []
    for s in near[1:]:
        d = next(i for i, (a, b) in enumerate(zip(s.cand.picks, near[0].cand.picks, strict=True)) if a != b)
        if d in kept_dims:
            continue
        opt = ctx.dims[d].options[s.cand.picks[d]]
        gpus = s.cand.layout(ctx.dims, ctx.num_gpus).num_gpus
        delta = pct(primary(s.outcome, ctx.objective, gpus), ref)
        what = "goodput per GPU" if ctx.objective == "cost" else "goodput"
        verb = "no gain" if abs(delta) < 1 else f"{delta:+.0f}% {what}"
        out.append(Rejected(optimization=f"{ctx.dims[d].name}: {opt.name}", flags=flags_of(ctx, s.cand),
                            reason=f"{ctx.dims[d].name} {opt.name}: {verb} against the recommendation; "
                                   + _figure(ctx.dims[d].name, s.outcome, best_o),
                            delta_goodput_pct=delta))
    return sorted(out, key=lambda r: r.delta_goodput_pct if math.isfinite(r.delta_goodput_pct) else -1e9)
