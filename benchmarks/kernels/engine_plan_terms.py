#!/usr/bin/env python3
"""The cost model's MoE kernel factors for the plans the engine runs, from focus-mode bench results.

    python3 benchmarks/kernels/engine_plan_terms.py data/moe_run6/moe.json data/moe_engine_plans/moe.json ...
    python3 benchmarks/kernels/engine_plan_terms.py ... --into benchmarks/calibration/data/moe/start/h200-qwen3-30b-a3b.json --force

A repeat_engine_plans.py result (repeat.json) counts as a focus run of its T: each plan's median over its rounds.

Each focus run (`bench_moe_h200.py --focus`) times several plans per step size T; the engine runs one of
them, `kernels.moe_plans.engine_tiles(T, k, E)`. This takes that plan's time at every T the files hold
(a T timed twice: the later file wins), fits `MoeTerms` (sim/moe_fit.py: measured / roofline side per T,
interpolated between the knots; the FLOPs side counts the rows the plans compute, each expert's pairs
rounded up to the plan's row block, whose sizes by T it records) and prints the table. `--into` replaces
the `moe` terms of a profile file, keeping its `layer_fixed_s` (fitted on whole engine steps, not on one
layer) and every other field; the profile the MoE calibration starts from (moe_validate.py
--base-profile) is one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kernels.moe_plans import engine_tiles, plan_key
from sim.cost_model import CostProfile
from sim.hardware import get_gpu
from sim.moe_fit import fit_moe_terms

REPEAT_PRESET = "qwen3-30b-a3b"  # the layer of a repeat_engine_plans.py result that names none (before --preset)


def repeat_speed_rows(res: dict) -> list[dict]:
    """A repeat_engine_plans.py result (repeat.json) as bench speed rows: per T the median us of the plan then
    the engine's and of each candidate (`--candidates`: the same rounds and draws) or challenger."""
    layer = res["meta"]["layer"]
    out = []
    for r in res["rows"]:
        times = {r["plan"]: r["median_us"]}
        for c in [*r.get("candidates", []), *([r["challenger"]] if r.get("challenger") else [])]:
            if "median_us" in c:
                times[c["plan"]] = c["median_us"]
        out.append({"preset": res["meta"].get("preset", REPEAT_PRESET), "T": r["T"], **layer, "touched_experts": r["touched_experts"],
                    "fused_by_tiles": times})
    return out


def engine_rows(paths: list[Path], preset: str) -> tuple[list[dict], list[str]]:
    """One row per T: the bench row with `fused_us` set to the engine plan's time; and the files'
    dates. Files: focus-mode moe.json, or repeat_engine_plans.py's repeat.json (medians over its rounds). A T
    whose engine plan no file timed is an error naming the plan."""
    by_t, dates = {}, []
    for path in paths:
        res = json.loads(path.read_text())
        dates.append(f"{path}: {res['meta'].get('gpu')} {res['meta'].get('date')}")
        for row in res["speed"] if "speed" in res else repeat_speed_rows(res):
            if row["preset"] == preset:
                by_t[row["T"]] = row
    rows = []
    for t, row in sorted(by_t.items()):
        key = plan_key(engine_tiles(t, row["k"], row["E"]))
        times = row.get("fused_by_tiles") or {}
        if key not in times:
            raise SystemExit(f"T={t}: the engine's plan {key!r} is not among the timed plans of the files; "
                             "time it with bench_moe_h200.py --focus at that T")
        rows.append({**row, "fused_us": times[key], "fused_tiles": key})
    return rows, dates


def block_rows_knots(top_k: int, num_experts: int, max_tokens: int) -> tuple[tuple[int, int], ...]:
    """Where the engine's plan changes its rows per expert block, T = 1..max_tokens: (T, rows) at each
    change (a direct plan, one launch over the pairs, pads nothing: 1)."""
    knots: list[tuple[int, int]] = []
    for t in range(1, max_tokens + 1):
        rows = getattr(engine_tiles(t, top_k, num_experts), "block_m", 1)
        if not knots or knots[-1][1] != rows:
            knots.append((t, rows))
    return tuple(knots)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, nargs="+",
                   help="moe.json files of bench_moe_h200.py --focus runs, or repeat.json of repeat_engine_plans.py")
    p.add_argument("--preset", default="qwen3-30b-a3b")
    p.add_argument("--gpu", default="h200")
    p.add_argument("--into", type=Path, help="a profile file whose moe terms to replace")
    p.add_argument("--force", action="store_true", help="with --into: replace them (the file is rewritten)")
    p.add_argument("--max-tokens", type=int, default=16384, help="the largest step the block knots cover")
    a = p.parse_args()
    rows, dates = engine_rows(a.results, a.preset)
    base = CostProfile.load(a.into) if a.into else CostProfile.load("default")
    source = (f"measured: the engine's fused-MoE plans (kernels.moe_plans.engine_tiles) timed by "
              f"benchmarks/kernels/bench_moe_h200.py --focus or repeat_engine_plans.py ({'; '.join(dates)}), one {a.preset} MoE layer, "
              f"random bf16 weights and router, T = {rows[0]['T']}..{rows[-1]['T']}; routing skew 0 = uniform prior")
    blocks = block_rows_knots(rows[0]["k"], rows[0]["E"], max(a.max_tokens, rows[-1]["T"]))
    source += f"; FLOPs per computed row, each expert's pairs in the plans' blocks ({blocks})"
    terms, table = fit_moe_terms(rows, get_gpu(a.gpu), base, source=source, block_rows_by_tokens=blocks)
    if base.moe is not None:
        terms = terms.model_copy(update={"layer_fixed_s": base.moe.layer_fixed_s,
                                         "routing_skew": base.moe.routing_skew})
    print("| T | engine plan | measured us | roofline side us | bound | factor |\n|---:|---|---:|---:|---|---:|")
    for r, t in zip(rows, table):
        side = t["compute_us"] if t["bound"] == "compute" else t["memory_us"]
        print(f"| {t['T']} | {r['fused_tiles']} | {t['measured_us']:.1f} | {side:.1f} | {t['bound']} | "
              f"{t['measured_us'] / side:.3f} |")
    print(f"\nbytes factors {terms.bytes_factor_by_tokens}\nflops factors {terms.flops_factor_by_tokens}"
          f"\nblock rows {terms.block_rows_by_tokens}")
    if a.into:
        if not a.force:
            sys.exit(f"{a.into} exists; pass --force to replace its moe terms")
        prov = {**(base.provenance or {}), "moe": {"bench": "benchmarks/kernels/bench_moe_h200.py --focus, repeat_engine_plans.py",
                                                   "plans": "kernels.moe_plans.engine_tiles", "files": dates}}
        base.model_copy(update={"moe": terms, "provenance": prov}).save(a.into)
        print(f"wrote the moe terms of {a.into}")


if __name__ == "__main__":
    main()
