"""The configuration search: screen every knob alone, then successive halving over the
combinations of the knobs that did not clearly hurt, on growing slices of the trace, then one
pass of single-knob moves around the winner.

The winner is then moved one knob at a time on the last slice (a hill-climb of at most
MAX_MOVE_PASSES passes); those moves are also the measured reasons for the options left out.

Why not brute force: the full product of the knobs is hundreds of configurations (x layouts);
most knobs act nearly independently, so a knob that costs > `SCREEN_DROP` of goodput alone is
not worth combining, and halving spends the long simulations on the few survivors.
`exhaustive` is the brute-force reference the regret figures compare with.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from advisor.advise.evaluate import Evaluator, Outcome, SimTask
from advisor.advise.records import Budget, Objective
from advisor.advise.space import Candidate, Dimension, baseline, sim_config
from sim.config import EngineConfig
from sim.workload_spec import WorkloadSpec

SCREEN_DROP = 0.05  # a knob alone losing more than this share of the primary metric is not combined
SLO_MET = 0.99  # a deployment "meets the SLOs" when this share of requests meets them
ETA = 3  # successive halving: keep 1/ETA of the candidates, grow the slice ETA x
MAX_MOVE_PASSES = 2


@dataclass(frozen=True, slots=True)
class BudgetPlan:
    first_slice: int  # requests in the first rung
    max_slice: int  # requests in the last rung and in the analyses (cost lines, gap, robustness)
    max_pool: int  # combinations entering successive halving


BUDGETS: dict[str, BudgetPlan] = {
    "quick": BudgetPlan(first_slice=150, max_slice=1000, max_pool=12),
    "full": BudgetPlan(first_slice=500, max_slice=20000, max_pool=64),
}


@dataclass(slots=True)
class Context:
    """The user's deployment and targets, shared by every stage."""

    model: str
    gpu: str
    num_gpus: int
    slo: str | None
    seed: int
    profile: str | None
    objective: Objective
    dims: tuple[Dimension, ...]
    num_requests: int  # in the user's workload
    budget: Budget = "quick"
    plan_override: BudgetPlan | None = None  # tests and benchmarks: smaller slices

    @property
    def plan(self) -> BudgetPlan:
        return self.plan_override or BUDGETS[self.budget]

    @property
    def eval_requests(self) -> int:
        return min(self.num_requests, self.plan.max_slice)

    def task(self, cand: Candidate, n: int | None = None, *, variant: WorkloadSpec | None = None,
             engine: dict | None = None) -> SimTask:
        cfg = sim_config(cand, self.dims, model=self.model, gpu=self.gpu, num_gpus=self.num_gpus, slo=self.slo,
                         seed=self.seed, profile=self.profile)
        if engine:
            cfg = cfg.model_copy(update={"engine": EngineConfig(**(cfg.engine.model_dump(exclude_unset=True) | engine))})
        return SimTask(cfg, n or (variant.num_requests if variant else self.eval_requests), variant)


def primary(o: Outcome, objective: Objective, num_gpus: int) -> float:
    """The figure regret is measured on: goodput, or goodput per GPU for the cost objective."""
    g = o.metrics.goodput_rps
    return g / num_gpus if objective == "cost" else g


def _bucket(x: float, width: float = 0.01) -> int:
    """x on a log scale in steps of `width` (1%): differences inside one step are noise."""
    return round(math.log(max(x, 1e-9)) / math.log1p(width))


def score(o: Outcome, cand: Candidate, ctx: Context) -> tuple:
    """Sort key, larger is better: the objective, then lower e2e p99, then fewer changes."""
    gpus = cand.layout(ctx.dims, ctx.num_gpus).num_gpus
    tail = -_bucket(o.metrics.e2e_p99_ms if math.isfinite(o.metrics.e2e_p99_ms) else 1e12, 0.02)
    main = _bucket(primary(o, ctx.objective, gpus))
    if ctx.objective == "min-gpus":
        return (o.metrics.slo_attainment >= SLO_MET, -gpus, main, tail, -cand.num_changes())
    return (main, tail, -cand.num_changes())


@dataclass(slots=True)
class Scored:
    cand: Candidate
    outcome: Outcome
    key: tuple


@dataclass(slots=True)
class SearchResult:
    best: Scored
    baseline: Scored
    screen: list[Scored]  # every single-knob change from the defaults, on the screening slice
    finalists: list[Scored]  # the last rung, best first (the robustness candidates)
    neighbours: list[Scored]  # the winner, then its single-knob moves, on the last slice


def _evaluate(ev: Evaluator, ctx: Context, cands: list[Candidate], n: int) -> list[Scored]:
    outs = ev.map([ctx.task(c, n) for c in cands])
    return [Scored(c, o, score(o, c, ctx)) for c, o in zip(cands, outs, strict=True)]


def _slices(ctx: Context) -> list[int]:
    n, plan = ctx.num_requests, ctx.plan
    top = min(n, plan.max_slice)
    sizes = [min(plan.first_slice, top)]
    while sizes[-1] < top:
        sizes.append(min(sizes[-1] * ETA, top))
    return sizes


def _pool(ctx: Context, screen: list[Scored]) -> list[Candidate]:
    """Combinations of the options that did not lose more than SCREEN_DROP alone; when there are
    too many, the alternatives that gained least alone are dropped first."""
    base = screen[0]
    floor = primary(base.outcome, ctx.objective, ctx.num_gpus) * (1 - SCREEN_DROP)
    kept: list[list[int]] = [[0] for _ in ctx.dims]
    gains: list[tuple[tuple, int, int]] = []
    for s in screen[1:]:
        d = next(i for i, p in enumerate(s.cand.picks) if p)
        gpus = s.cand.layout(ctx.dims, ctx.num_gpus).num_gpus
        if primary(s.outcome, ctx.objective, gpus) >= floor or ctx.objective == "min-gpus":
            kept[d].append(s.cand.picks[d])
            gains.append((s.key, d, s.cand.picks[d]))
    gains.sort()
    while math.prod(len(k) for k in kept) > ctx.plan.max_pool and gains:
        _, d, opt = gains.pop(0)
        kept[d].remove(opt)
    return [Candidate(p) for p in itertools.product(*kept)]


def _halving_runs(ctx: Context, pool: int) -> int:
    """Simulations successive halving runs from a pool of `pool` combinations."""
    runs, slices = 0, _slices(ctx)
    for i in range(len(slices)):
        runs += pool
        if i < len(slices) - 1:
            pool = max(2, math.ceil(pool / ETA))
    return runs


def expected_simulations(ctx: Context, pool: int | None = None) -> int:
    """What `search` will run (for progress): screening, halving from `pool` combinations (the
    budget's max_pool before screening tells), one pass of single-knob moves and the defaults."""
    singles = sum(len(d.options) - 1 for d in ctx.dims)
    return 1 + singles + _halving_runs(ctx, ctx.plan.max_pool if pool is None else pool) + singles + 1


def search(ev: Evaluator, ctx: Context, progress: Callable[[str], None] | None = None) -> SearchResult:
    say = progress or (lambda _msg: None)
    slices = _slices(ctx)
    base = baseline(ctx.dims)
    singles = [base.with_pick(d, o) for d, dim in enumerate(ctx.dims) for o in range(1, len(dim.options))]
    screen_n = min(slices[-1], 2 * slices[0])
    say(f"screening {len(singles)} single changes on {screen_n} requests")
    screen = _evaluate(ev, ctx, [base, *singles], screen_n)
    pool = _pool(ctx, screen)
    ev.expect(expected_simulations(ctx, len(pool)))
    rung: list[Scored] = []
    for i, n in enumerate(slices):
        say(f"successive halving: {len(pool)} configurations on {n} requests")
        rung = sorted(_evaluate(ev, ctx, pool, n), key=lambda s: s.key, reverse=True)
        if i < len(slices) - 1:
            pool = [s.cand for s in rung[: max(2, math.ceil(len(rung) / ETA))]]
    best = rung[0]
    near: list[Scored] = []
    for _ in range(MAX_MOVE_PASSES):  # hill-climb by single-knob moves, on the decision's slice
        say("checking single-knob moves around the winner")
        near = [best, *_evaluate(ev, ctx, _moves(ctx, best.cand), slices[-1])]
        top = max(near, key=lambda s: s.key)
        if top is best:
            break
        best = top
        rung.insert(0, best)
    base_eval = next((s for s in rung if s.cand == base), None) or _evaluate(ev, ctx, [base], slices[-1])[0]
    return SearchResult(best, base_eval, screen, rung[:4], near)


def _moves(ctx: Context, cand: Candidate) -> list[Candidate]:
    return [cand.with_pick(d, o) for d, dim in enumerate(ctx.dims) for o in range(len(dim.options))
            if o != cand.picks[d]]


def all_candidates(dims: tuple[Dimension, ...]) -> list[Candidate]:
    return [Candidate(p) for p in itertools.product(*(range(len(d.options)) for d in dims))]


def exhaustive(ev: Evaluator, ctx: Context, n: int | None = None) -> list[Scored]:
    """Every combination on `n` requests, best first: the reference for regret."""
    return sorted(_evaluate(ev, ctx, all_candidates(ctx.dims), n or ctx.eval_requests),
                  key=lambda s: s.key, reverse=True)
