"""Latency of a full recommendation (search + ladder + cost lines + gap + robustness) on a
one-hour, ~20,000-request trace, on this machine. Writes results.json and results.md here.

    .venv/bin/python benchmarks/advisor/latency.py [--workers 2] [--budget quick]

The trace: the chat-production preset (Gamma-bursty, long-tailed lengths, Zipf system prompts,
30% dynamic prefix, task mix) at 20,000 requests over one hour (5.56 req/s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from advisor.advise import AdviseRequest, advise
from sim.generate import generate
from sim.workload_presets import get_preset

HERE = Path(__file__).parent
NUM_REQUESTS, HOUR_S = 20_000, 3600.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--budget", default="quick")
    args = ap.parse_args()
    spec = get_preset("chat-production")
    spec = spec.with_overrides(num_requests=NUM_REQUESTS, arrival=spec.arrival.model_copy(
        update={"rate_rps": NUM_REQUESTS / HOUR_S}).model_dump())
    t0 = time.perf_counter()
    wl = generate(spec)
    t_gen = time.perf_counter() - t0
    stages: list[tuple[float, str]] = []
    start = time.perf_counter()
    rec = advise(wl, AdviseRequest(workers=args.workers, budget=args.budget),
                 progress=lambda ev: ev.finished and stages.append((round(time.perf_counter() - start, 2), ev.text())))
    result = {
        "command": f"python benchmarks/advisor/latency.py --workers {args.workers} --budget {args.budget}",
        "num_requests": len(wl), "trace_span_s": round(wl.duration_s, 1), "generate_s": round(t_gen, 2),
        "advise_s": rec.elapsed_s, "num_simulations": rec.num_simulations, "workers": args.workers,
        "cpus": os.cpu_count(), "load_average_after": os.getloadavg(), "python": platform.python_version(),
        "stages": stages, "best": rec.best.label, "baseline_goodput_rps": rec.baseline.metrics.goodput_rps,
        "best_goodput_rps": rec.best.metrics.goodput_rps,
    }
    (HERE / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
