"""Regret of the advisor's search against exhaustive search, on the six scenarios of
advisor/advise/scenarios.py. Writes benchmarks/advisor/regret.json (the references the scenario
test reads) and prints a table.

    .venv/bin/python benchmarks/advisor/regret.py [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from advisor.advise.evaluate import Evaluator
from advisor.advise.scenarios import SCENARIOS
from advisor.advise.search import exhaustive, primary, search
from sim.generate import generate

OUT = Path(__file__).with_name("regret.json")


DECIDING_MARGIN = 0.01  # an option is as good as the best when within 1% of its goodput
# what the search must get right: a knob whose wrong option loses more than the search's regret
# allowance (tests/advisor/test_advise_scenarios.py, 5%). At 1% a single outlier configuration
# (bursty-agent: one budget x n-gram point 3.4% above the next) makes every one of its knobs
# "deciding", which no search within 5% regret can be held to
SEARCH_MARGIN = 0.05


def deciding(ctx, ranked, margin: float = DECIDING_MARGIN) -> dict[str, list[str]]:
    """The dimensions whose choice matters, each with its good options: those whose best
    configuration is within DECIDING_MARGIN of the top one. A dimension decides when some option
    is not good (choosing it loses >= 1% whatever the other knobs), e.g. FP8 where weights-only
    and KV + weights tie but bf16 loses."""
    top = ranked[0].outcome.metrics.goodput_rps
    out = {}
    for d, dim in enumerate(ctx.dims):
        best = {}
        for s in ranked:
            i = s.cand.picks[d]
            best[i] = max(best.get(i, 0.0), s.outcome.metrics.goodput_rps)
        good = [o.name for i, o in enumerate(dim.options) if best.get(i, 0.0) > top * (1 - margin)]
        if len(good) < len(dim.options):
            out[dim.name] = good
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    for sc in SCENARIOS:
        if args.only and sc.name != args.only:
            continue
        wl = generate(sc.workload_spec())
        ctx = sc.context(len(wl))
        t0 = time.perf_counter()
        with Evaluator(wl, workers=args.workers) as ev:
            ranked = exhaustive(ev, ctx, len(wl))
            t_ex = time.perf_counter() - t0
            found = search(ev, ctx)
            t_search = time.perf_counter() - t0 - t_ex
            n_search = ev.count - len(ranked)
        best = ranked[0]
        # the search's pick scored on the same full workload as the exhaustive ranking
        pick = next(s for s in ranked if s.cand == found.best.cand)
        ref, got = primary(best.outcome, "goodput", 1), primary(pick.outcome, "goodput", 1)
        results[sc.name] = {
            "exhaustive_best": best.cand.label(ctx.dims), "exhaustive_picks": list(best.cand.picks),
            "exhaustive_goodput_rps": ref, "exhaustive_simulations": len(ranked), "exhaustive_s": round(t_ex, 1),
            "search_best": found.best.cand.label(ctx.dims), "search_goodput_rps": got,
            "search_simulations": n_search, "search_s": round(t_search, 1),
            "regret_pct": round((ref - got) / ref * 100, 2) if ref > 0 else 0.0,
            "defaults_goodput_rps": primary(next(s for s in ranked if not any(s.cand.picks)).outcome, "goodput", 1),
            "top5": [[s.cand.label(ctx.dims), s.outcome.metrics.goodput_rps] for s in ranked[:5]],
            "deciding": deciding(ctx, ranked),
            "deciding_for_search": deciding(ctx, ranked, SEARCH_MARGIN),
        }
        print(json.dumps({sc.name: results[sc.name]}, indent=1), flush=True)
        OUT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
