"""Robustness of the recommendation: re-scored under perturbed traffic, the regret of keeping it,
and a fallback that is safe under every perturbation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from advisor.advise.evaluate import Evaluator
from advisor.advise.ladder import flags_of
from advisor.advise.records import Robustness, RobustnessRow, ScoredConfig
from advisor.advise.search import Context, Scored, primary
from advisor.advise.space import Candidate
from advisor.advise.variants import burstier, heavier_tail, less_reuse, with_rate
from sim.config import SpeculativeConfig
from sim.speculative import scaled_acceptance
from sim.workload_spec import WorkloadSpec

ACCEPTANCE_DROP = 0.30


def _tails(s: WorkloadSpec) -> WorkloadSpec:
    return s.model_copy(update={"prompt_tokens": heavier_tail(s.prompt_tokens),
                                "output_tokens": heavier_tail(s.output_tokens)})


PERTURBATIONS: dict[str, Callable[[WorkloadSpec], WorkloadSpec]] = {
    "as given": lambda s: s,
    "rate +25%": lambda s: with_rate(s, 1.25),
    "rate -25%": lambda s: with_rate(s, 0.75),
    "burstiness x2": lambda s: burstier(s, 2.0),
    "heavier length tail": _tails,
    "prefix reuse halved": lambda s: less_reuse(s, 0.5),
    "acceptance -30%": lambda s: s,  # the engine's acceptance model changes, not the traffic
}


def lower_acceptance(spec: SpeculativeConfig, drop: float = ACCEPTANCE_DROP) -> dict[str, Any]:
    """The speculative config with every task's mean acceptance x (1 - drop), same spread."""
    return scaled_acceptance(spec, 1 - drop)


def scored_config(ctx: Context, s: Scored) -> ScoredConfig:
    return ScoredConfig(label=s.cand.label(ctx.dims), flags=flags_of(ctx, s.cand),
                        num_gpus=s.cand.layout(ctx.dims, ctx.num_gpus).num_gpus, metrics=s.outcome.metrics)


def robustness(ev: Evaluator, ctx: Context, spec: WorkloadSpec, cands: list[Scored]) -> Robustness:
    """`cands[0]` is the recommendation; the others (finalists, defaults) compete under each
    perturbation, and the one with the smallest worst-case regret is the fallback."""
    uniq: list[Candidate] = []
    for s in cands:
        if s.cand not in uniq:
            uniq.append(s.cand)
    tasks, keys = [], []
    for name, edit in PERTURBATIONS.items():
        variant = edit(spec)
        for c in uniq:
            engine = None
            if name.startswith("acceptance"):
                sc = ctx.task(c).config.engine.speculative_config
                engine = {"speculative_config": lower_acceptance(sc)} if sc else None
            tasks.append(ctx.task(c, variant=variant, engine=engine))
            keys.append((name, c))
    outs = dict(zip(keys, ev.map(tasks), strict=True))
    rows, worst = [], dict.fromkeys(uniq, 0.0)
    for name in PERTURBATIONS:
        vals = {c: primary(outs[(name, c)], ctx.objective, c.layout(ctx.dims, ctx.num_gpus).num_gpus) for c in uniq}
        top = max(vals.values())
        regret = {c: (top - v) / top * 100 if top > 0 else 0.0 for c, v in vals.items()}
        for c in uniq:
            worst[c] = max(worst[c], regret[c])
        rows.append(RobustnessRow(perturbation=name, best_goodput_rps=top, kept_goodput_rps=vals[uniq[0]],
                                  regret_pct=regret[uniq[0]]))
    safe = min(uniq, key=lambda c: (round(worst[c], 1), uniq.index(c)))
    safe_scored = next(s for s in cands if s.cand == safe)
    return Robustness(rows=rows, fallback=scored_config(ctx, safe_scored), fallback_max_regret_pct=worst[safe])
