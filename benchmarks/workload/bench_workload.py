"""Workload speed: generate 1,000,000 synthetic requests (target < 5 s), parse the 12,031-row
Mooncake trace (target well under 1 s), and the other workload paths users hit.

Run from the repository root:
    PYTHONPATH=. python benchmarks/workload/bench_workload.py
Writes results.json and results.md next to this file. Each figure is the median of `REPEATS` runs.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pydantic

from sim.describe import describe_workload
from sim.generate import generate
from sim.traces import export_mooncake, load_trace
from sim.workload_presets import get_preset, preset_names

HERE = Path(__file__).resolve().parent
TRACES = Path(os.environ.get("COSTLINE_TRACES", HERE.parents[2] / "shared" / "traces"))
REPEATS = 5


def timed(fn, repeats: int = REPEATS) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    load_at_start = os.getloadavg()[0]  # the machine is shared: a busy one slows every figure
    rows: list[dict] = []
    for name in preset_names():
        spec = get_preset(name).with_overrides(num_requests=1_000_000)
        s, wl = timed(lambda spec=spec: generate(spec), repeats=3)
        rows.append({"case": f"generate 1,000,000 requests: {name}", "seconds": s, "target_s": 5.0,
                     "hash_ids": int(wl.run_len.sum()), "hash_id_runs": int(wl.run_len.size)})
    big = generate(get_preset("chat-production").with_overrides(num_requests=1_000_000))
    s, _ = timed(lambda: describe_workload(big), repeats=3)
    rows.append({"case": "describe 1,000,000 generated requests: chat-production (prefix reuse over "
                         f"{big.run_len.sum() / 1e6:.0f}M block references)", "seconds": s})
    spec = get_preset("chat-production").with_overrides(num_requests=100_000)
    wl = generate(spec)
    s, _ = timed(lambda: wl.take(np.arange(len(wl))).requests, repeats=3)
    rows.append({"case": f"build 100,000 Request objects (chat-production, {wl.run_len.sum() / len(wl):.0f} "
                         "hash ids each on average)", "seconds": s,
                 "us_per_request": s / 1e5 * 1e6})
    # short prompts (4 hash ids each) so that a million objects fit in memory: the per-object floor
    spec = get_preset("lab-random").with_overrides(
        num_requests=1_000_000, prompt_tokens={"kind": "fixed", "tokens": 64})
    wl = generate(spec)
    s, _ = timed(lambda: wl.take(np.arange(len(wl))).requests, repeats=1)
    rows.append({"case": "build 1,000,000 Request objects (64-token prompts, 4 hash ids each)", "seconds": s,
                 "us_per_request": s / 1e6 * 1e6})
    if TRACES.is_dir():
        moon = TRACES / "mooncake_conversation_trace.jsonl"
        azure = TRACES / "AzureLLMInferenceTrace_code.csv"
        s, mwl = timed(lambda: load_trace(moon))
        rows.append({"case": "parse Mooncake trace (12,031 rows, 3.0 MB)", "seconds": s, "target_s": 1.0})
        s, _ = timed(lambda: load_trace(azure))
        rows.append({"case": "parse Azure code trace (8,819 rows)", "seconds": s})
        s, _ = timed(lambda: describe_workload(mwl))
        rows.append({"case": "describe Mooncake trace (incl. prefix reuse over 288,500 blocks)", "seconds": s})
        with tempfile.TemporaryDirectory() as tmp:
            s, _ = timed(lambda: export_mooncake(mwl, Path(tmp) / "m.jsonl"))
        rows.append({"case": "export Mooncake trace to JSONL", "seconds": s})
    result = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "command": "PYTHONPATH=. python benchmarks/workload/bench_workload.py",
        "machine": {"cpu": cpu_name(), "logical_cores": os.cpu_count(),
                    "platform": platform.platform(),
                    "load_average_1min_at_start_and_end": [load_at_start, os.getloadavg()[0]]},
        "versions": {"python": sys.version.split()[0], "numpy": np.__version__, "pydantic": pydantic.VERSION},
        "repeats": "median of 5 (3 for generation, 1 for the 1M-object build)",
        "results": rows,
    }
    (HERE / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# Workload benchmarks", "",
        f"Command: `{result['command']}` (from the repository root). Date: {result['date_utc']} UTC.",
        (f"Machine: {result['machine']['cpu']}, {result['machine']['logical_cores']} logical cores, "
         f"{result['machine']['platform']}, load average "
         f"{result['machine']['load_average_1min_at_start_and_end'][0]:.1f} -> "
         f"{result['machine']['load_average_1min_at_start_and_end'][1]:.1f}. Python {result['versions']['python']}, numpy "
         f"{result['versions']['numpy']}, pydantic {result['versions']['pydantic']}. {result['repeats']}."), "",
        "| case | seconds | target | note |", "|---|---:|---:|---|",
    ]
    for r in rows:
        note = ", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v:,}"
                         for k, v in r.items() if k not in ("case", "seconds", "target_s"))
        target = f"< {r['target_s']:g} s" if "target_s" in r else ""
        md.append(f"| {r['case']} | {r['seconds']:.3f} | {target} | {note} |")
    md += ["", "Generation is columnar (numpy); `Request` objects are built on demand (`wl[i]`, `iter(wl)`,",
           "`wl.requests`), which costs the per-request time above, so a simulator should iterate rather",
           "than hold a million of them."]
    (HERE / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
