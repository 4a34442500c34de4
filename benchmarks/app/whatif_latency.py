"""Latency of one what-if run of the dashboard (the default scenario: 2,000 requests) and of its
cached rerun, on this machine. The dashboard's aim: a run answers within 2 s, a rerun at once.
Speed lives here, not in the tests (tests/app/test_pages.py checks what the run and the cache hold).

    .venv/bin/python benchmarks/app/whatif_latency.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from app.compute import RunCache, simulate
from app.scenario import Scenario

TARGET_S = 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs (the median is reported)")
    a = ap.parse_args()
    s = Scenario()
    runs = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        out = simulate(s, None)
        runs.append(time.perf_counter() - t0)
    cache = RunCache()
    cache.put(s, None, out)
    t0 = time.perf_counter()
    cache.get(s, None)
    cached_s = time.perf_counter() - t0
    med = statistics.median(runs)
    print(json.dumps({"machine": platform.processor() or platform.machine(), "requests": out.summary.num_prompts,
                      "run_s_median": round(med, 3), "run_s_all": [round(x, 3) for x in runs],
                      "cached_rerun_s": cached_s, "target_s": TARGET_S, "meets_target": med <= TARGET_S}))


if __name__ == "__main__":
    main()
