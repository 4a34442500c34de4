"""What the advisor's search picks on the six regret scenarios (advisor/advise/scenarios.py), with
the figures it decided on: run on two versions of the code (PYTHONPATH=<checkout>) and compare the
JSON files, to show that a faster search picks the same configurations (or why not, with numbers).

    PYTHONPATH=. .venv/bin/python benchmarks/advisor/search_equality.py --out new.json
    PYTHONPATH=<old checkout> .venv/bin/python benchmarks/advisor/search_equality.py --out old.json
    .venv/bin/python benchmarks/advisor/search_equality.py --compare old.json new.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from advisor.advise.evaluate import Evaluator
from advisor.advise.scenarios import SCENARIOS
from advisor.advise.search import search
from sim.generate import generate


def picks(workers: int, only: str | None) -> dict[str, dict]:
    out = {}
    for sc in SCENARIOS:
        if only and sc.name != only:
            continue
        wl = generate(sc.workload_spec())
        ctx = sc.context(len(wl))
        t0 = time.perf_counter()
        with Evaluator(wl, workers=workers) as ev:
            found = search(ev, ctx)
            n = ev.count
        out[sc.name] = {"best": found.best.cand.label(ctx.dims), "picks": list(found.best.cand.picks),
                        "best_goodput_rps": found.best.outcome.metrics.goodput_rps,
                        "best_e2e_p99_ms": found.best.outcome.metrics.e2e_p99_ms,
                        "finalists": [[s.cand.label(ctx.dims), s.outcome.metrics.goodput_rps] for s in found.finalists],
                        "simulations": n, "search_s": round(time.perf_counter() - t0, 1)}
        print(sc.name, json.dumps(out[sc.name]), flush=True)
    return out


def compare(old: dict[str, dict], new: dict[str, dict]) -> bool:
    same = True
    for name, o in old.items():
        n = new.get(name)
        if n is None:
            continue
        ok = o["picks"] == n["picks"]
        same &= ok
        print(f"{name}: {'same' if ok else 'DIFFERENT'} pick {n['best']!r} ({n['best_goodput_rps']:.3f} req/s, "
              f"{n['simulations']} simulations, was {o['simulations']})"
              + ("" if ok else f"; before {o['best']!r} ({o['best_goodput_rps']:.3f} req/s)"))
    return same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--only", default=None)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path)
    args = ap.parse_args()
    if args.compare:
        old, new = (json.loads(p.read_text()) for p in args.compare)
        raise SystemExit(0 if compare(old, new) else 1)
    result = picks(args.workers, args.only)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
