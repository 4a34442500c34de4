"""The lab -> production gap: the recommendation's gain under a lab version of the user's traffic
and under the traffic itself, split into the factors that cause the difference by giving the
lab workload one production factor at a time."""

from __future__ import annotations

import math

from advisor.advise.evaluate import Evaluator, Outcome
from advisor.advise.records import Gap, GapFactor
from advisor.advise.search import Context
from advisor.advise.space import Candidate
from advisor.advise.variants import LAB_FACTORS, lab_spec
from sim.workload_spec import WorkloadSpec


def gain(base: Outcome, best: Outcome) -> float:
    """How many times faster the recommendation serves a request on average (mean E2E latency,
    defaults / recommended): defined at any load, unlike goodput, which saturates at the rate."""
    b, r = base.extras.get("mean_e2e_ms", math.nan), best.extras.get("mean_e2e_ms", math.nan)
    return b / r if r and math.isfinite(b) and math.isfinite(r) else math.nan


def lab_gap(ev: Evaluator, ctx: Context, spec: WorkloadSpec, base: Candidate, best: Candidate,
            production: float) -> Gap:
    lab = lab_spec(spec)
    variants = {"lab": lab}
    for factor in LAB_FACTORS:
        others = [edit for name, edit in LAB_FACTORS.items() if name != factor]
        v = spec
        for edit in others:
            v = edit(v)
        variants[factor] = v.model_copy(update={"sessions": spec.sessions})
    tasks = [ctx.task(c, variant=v) for v in variants.values() for c in (base, best)]
    outs = ev.map(tasks)
    gains = {name: gain(outs[2 * i], outs[2 * i + 1]) for i, name in enumerate(variants)}
    lab_gain = gains.pop("lab")
    losses = {f: lab_gain - g for f, g in gains.items()}
    total = sum(abs(x) for x in losses.values() if math.isfinite(x)) or 1.0
    factors = [GapFactor(factor=f, gain=gains[f], share_pct=(losses[f] / total * 100) if math.isfinite(losses[f]) else 0.0)
               for f in LAB_FACTORS]
    return Gap(lab_gain=lab_gain, production_gain=production, factors=factors)
