#!/usr/bin/env python3
"""The engine's fused-MoE plan (kernels.moe_plans.engine_tiles) timed again and again on qwen3-30b-a3b's
layer: how far one focus run's figure moves between rounds and routing draws, so a target met or missed
by a point is not read from one draw.

    python3 benchmarks/kernels/repeat_engine_plans.py --out DIR [--tokens 4096 1 1024 8192] [--rounds 7]
        [--compare OLD_FUSED_MOE.py]

Each round times each T on a fresh routing draw (round 0: the focus bench's own seeds, 1000 T + copy)
the way `bench_moe_h200.py --focus` times a plan: one CUDA graph of calls cycling over 3 copies of the
layer's weights (their bytes defeat the L2), the median of 5 replays. Writes DIR/repeat.json and
DIR/repeat.md: per T every round's us, the median and range, the median's TFLOP/s and share of the
790 TFLOP/s bf16 rate, and the median over the touched experts' roofline (4.2 TB/s, 790 TFLOP/s:
issue 29's rates). `--compare FILE`: an earlier kernels/fused_moe.py (say `git show
91ae320:kernels/fused_moe.py`) whose grouped plan of the same fields is timed in the same rounds, right
after this tree's, so a kernel refactor's effect on the engine's step times is measured on one GPU.
`--challengers MOE_JSON`: a focus bench's moe.json; at each T its fastest plan (kernels.moe_plans.
propose_rule), where that is not the engine's, is timed in the same rounds on the same draws (first in
odd rounds, second in even ones), so a plan is adopted on 7 draws rather than one.
`--candidates ROUND`: a round of kernels.moe_plans (`run11`: run11_candidates, `run12`: run12_candidates) whose plans at each T are each
checked against the float32 per-expert loop, then timed beside the engine's plan in every round on the same
draws (the order rotated a place each round, so none always runs first); in round 0 each direct plan's down
launch is also timed alone (on its own gate+up's activations).
`--peak`: each round also times a dense bf16 GEMM (cuBLAS through torch.mm, 8192 cubed) right before each T's
plans, the same way, so every plan's TFLOP/s is also read as a share of the dense-GEMM rate this GPU gave in
that round (the project's 790 TFLOP/s is the H200's measured range 780-800; one call's GPU can sit below it).
`--pool REPEAT_JSON...`: no timing; the engine plan's rounds of several earlier calls (each file's rows
of the plan the engine runs at T in that file) pooled per T and plan: DIR/pooled.json and DIR/pooled.md.
`--dry-run`: the Triton interpreter on the CPU, a small layer, two rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

HBM_BYTES_PER_S = 4.2e12
BF16_FLOPS_PER_S = 790e12
DRY = (64, 32, 32, 4)
COPIES = 3
CANDIDATE_ROUNDS = {"run11": "run11_candidates", "run12": "run12_candidates", "run16": "run16_candidates",
                    "run16b": "run16b_candidates", "run22": "run22_candidates"}  # --candidates: the kernels.moe_plans function of the round
ENGINE = "engine"  # the engine plan's key beside the candidates' plan keys (times, launches alone)
CHECK_TOL = 1e-2  # relative error of a bf16 plan against the float32 loop (the focus bench's bar)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 1, 1024, 8192])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--compare", type=Path, default=None, help="an earlier kernels/fused_moe.py to time beside")
    p.add_argument("--challengers", type=Path, default=None,
                   help="a focus bench's moe.json: its fastest plan at each T timed beside the engine's")
    p.add_argument("--candidates", choices=sorted(CANDIDATE_ROUNDS), default=None,
                   help="a round of kernels.moe_plans whose plans at each T are timed beside the engine's")
    p.add_argument("--fixed-draw", action="store_true",
                   help="every round on round 0's routing draw (is a round's time its draw or its place in the call?)")
    p.add_argument("--peak", action="store_true", help="time a dense bf16 GEMM beside each T in every round")
    p.add_argument("--pool", type=Path, nargs="+", default=None, help="earlier repeat.json files to pool (no timing)")
    p.add_argument("--preset", default="qwen3-30b-a3b",
                   help="the model whose MoE layer is timed (its H, N, E, k from engine.core.model_spec)")
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(argv)


def layer_of(preset: str) -> tuple[int, int, int, int]:
    """(H, N, E, k) of a preset's MoE layer; a preset without experts is an error naming --preset."""
    from engine.core.model_spec import get_model

    m = get_model(preset)
    if not m.num_experts:
        raise SystemExit(f"--preset {preset}: not a mixture of experts (no experts in its model spec)")
    return m.hidden_size, m.moe_intermediate_size, m.num_experts, m.experts_per_token


class Route(NamedTuple):
    """One weight copy's step of a routing draw."""

    x: Any  # [T, H] activations
    w: Any  # [T, k] routing weights
    ids: Any  # [T, k] expert ids


def make_draw(t: int, h: int, e: int, k: int, d: int, copies: int, device: str, dtype) -> list[Route]:
    """Routing draw d at T = t (round d's; round 0 is the focus bench's seeds): per weight copy i, x and a
    router from seed 1000 t + i + 7919 d, routed top-k with renormalised weights."""
    import torch

    from kernels.moe_reference import route_ref

    out = []
    for i in range(copies):
        g = torch.Generator(device=device).manual_seed(1000 * t + i + 7919 * d)
        x = torch.randn(t, h, generator=g, device=device).to(dtype)
        router = (torch.randn(e, h, generator=g, device=device) / h**0.5).to(dtype)
        w, ids = route_ref(x @ router.t(), k, renormalize=True)
        out.append(Route(x, w, ids))
    return out


def roofline(touched: float, t: int, h: int, n: int, k: int) -> dict:
    """The touched experts' weight bytes plus activations at HBM rate against the FLOPs at the bf16
    rate, as bench_moe_h200.roofline_us counts them."""
    weight_bytes = touched * 3 * h * n * 2
    act_bytes = t * h * 2 * 2 + t * k * (n + h) * 2 * 2
    flops = 2 * t * k * 3 * h * n
    mem_us = (weight_bytes + act_bytes) / HBM_BYTES_PER_S * 1e6
    return {"flops": flops, "roofline_us": max(mem_us, flops / BF16_FLOPS_PER_S * 1e6)}


def summary(t: int, times: list[float], roof: dict) -> dict:
    med = statistics.median(times)
    tflops = roof["flops"] / med / 1e6
    return {"T": t, "us": times, "median_us": med, "min_us": min(times), "max_us": max(times),
            "median_tflops": tflops, "median_share_of_790": tflops / 790, "median_x_roofline": med / roof["roofline_us"],
            "roofline_us": roof["roofline_us"]}


PEAK_SIZE = 8192  # the dense GEMM of --peak: M = N = K


def dense_gemm_tflops(dry: bool) -> float:
    """TFLOP/s of one bf16 GEMM of PEAK_SIZE cubed (64 and float32 in a dry run), timed as the plans are."""
    import torch

    from benchmarks.kernels.graph_timing import time_calls_us

    size, dtype, device = (64, torch.float32, "cpu") if dry else (PEAK_SIZE, torch.bfloat16, "cuda")
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    c = torch.empty(size, size, device=device, dtype=dtype)
    us = time_calls_us([lambda: torch.mm(a, b, out=c)] * 3, dry, reps=1)
    return 2 * size**3 / us / 1e6


def used_blocks(ids: list, num_experts: int, block_m: int) -> float:
    """The grouped path's blocks of `block_m` rows that hold pairs (sum over experts of ceil(pairs / block_m)),
    the mean over the weight copies' routings; 0 for a direct plan (block_m 0). At T = 4096 of qwen3 an average
    expert gets exactly two 128-row blocks, so this moves the step's computed rows from draw to draw."""
    if not block_m:
        return 0.0
    per = [int(expert_blocks(i, num_experts, block_m)[1].sum()) for i in ids]
    return sum(per) / len(per)


def expert_blocks(ids, num_experts: int, block_m: int):
    """(pairs, blocks) per expert of one routing: its pairs and the `block_m`-row blocks they fill."""
    import torch

    pairs = torch.bincount(ids.reshape(-1), minlength=num_experts)
    return pairs, (pairs + block_m - 1) // block_m


def peak_fields(times: list[float], peaks: list[float], flops: float) -> dict:
    """The same-round dense GEMM's rates and the plan's share of them (median of per-round shares)."""
    shares = [flops / us / 1e6 / p for us, p in zip(times, peaks)]
    return {"peak_tflops": peaks, "median_peak_tflops": statistics.median(peaks),
            "median_share_of_peak": statistics.median(shares)}


def load_compare(path: Path):
    """The module of an earlier fused_moe.py (its own `kernels.*` imports resolve to this tree's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fused_moe_compare", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def compare_plan(mod, plan):
    """The earlier module's MoeTiles with `plan`'s values of the fields it has; None for a direct plan
    (kernels.moe_direct is not compared) or a plan using a field the earlier module lacks."""
    import dataclasses

    if not hasattr(plan, "block_m"):
        return None
    names = {f.name for f in dataclasses.fields(mod.MoeTiles)}
    extra = {f.name for f in dataclasses.fields(plan) if f.name not in names and getattr(plan, f.name) != f.default}
    return None if extra else mod.MoeTiles(**{f: getattr(plan, f) for f in names})


def challenger_plans(path: Path, tokens: list[int], k: int, e: int) -> dict:
    """T -> the bench's fastest plan at T, for each T where it is not the engine's plan. Plan keys this tree
    does not name (the plans removed after measurement: benchmarks/kernels/MOE.md) are skipped, and said so."""
    from kernels.moe_plans import engine_tiles, known_plans, plan_key, propose_rule

    speed = json.loads(path.read_text())["speed"]
    rows = [r for r in speed if r.get("preset", "qwen3-30b-a3b") == "qwen3-30b-a3b"]
    known = known_plans()
    skipped = sorted({key for r in rows for key in r.get("fused_by_tiles", {}) if key not in known})
    if skipped:
        print(f"--challengers: {len(skipped)} plan key(s) of {path} are no plan this tree names (removed after "
              "measurement, benchmarks/kernels/MOE.md); not challengers: " + "; ".join(skipped), file=sys.stderr)
    fastest = propose_rule(rows)
    return {t: fastest[t] for t in tokens if t in fastest and plan_key(fastest[t]) != plan_key(engine_tiles(t, k, e))}


def challenger_summary(t: int, mine: list[float], theirs: list[float], plan_name: str, roof: dict) -> dict:
    """The challenger's rounds beside the engine plan's: its own summary and the median of per-round ratios."""
    return {**summary(t, theirs, roof), "plan": plan_name,
            "ratio_to_engine_median": statistics.median(a / b for a, b in zip(theirs, mine))}


class LaunchesAlone(NamedTuple):
    """A direct plan's two launches each timed by itself (us per call)."""

    down_us: float
    gate_up_us: float


def alone_fields(t: LaunchesAlone | None) -> dict:
    """A row's launches-alone columns (None where the plan is not a direct one, or not timed alone)."""
    return {"down_alone_us": t.down_us if t else None, "up_alone_us": t.gate_up_us if t else None}


def candidate_plans(round_name: str, tokens: list[int], k: int, e: int) -> dict[int, list]:
    """T -> the round's plans at T (kernels.moe_plans.<round>_candidates)."""
    import kernels.moe_plans as mp

    fn = getattr(mp, CANDIDATE_ROUNDS[round_name])
    return {t: fn(t, k, e) for t in tokens}


def rotated(items: list, by: int) -> list:
    """`items` turned `by` places (round r times the plans in this order, so none always runs first)."""
    if not items:
        return []
    by %= len(items)
    return items[by:] + items[:by]


def candidate_rows(times: dict[str, list[float]], roof: dict, t: int, alone: dict[str, LaunchesAlone],
                   failed: dict) -> list[dict]:
    """Each candidate's rounds beside the engine plan's (the median of per-round ratios), fastest first; a plan
    whose check failed: its error, no times."""
    rows = [{**challenger_summary(t, times[ENGINE], us, key, roof), **alone_fields(alone.get(key))}
            for key, us in times.items() if key != ENGINE and us]
    rows.sort(key=lambda r: r["ratio_to_engine_median"])
    return rows + [{"plan": key, "check_failed": err} for key, err in failed.items()]


def pooled_rows(paths: list[Path]) -> list[dict]:
    """Per (T, plan): every round of the files that timed that plan as the engine's, pooled; each row's
    summary as `summary` gives it over the pooled rounds (the roofline: the files' mean), and its calls."""
    groups: dict[tuple, dict] = {}
    for path in paths:
        res = json.loads(path.read_text())
        for r in res["rows"]:
            g = groups.setdefault((r["T"], r["plan"]), {"us": [], "roofline_us": [], "flops": None, "calls": []})
            g["us"] += r["us"]
            g["roofline_us"].append(r["roofline_us"])
            g["flops"] = r["median_tflops"] * r["median_us"] * 1e6  # the layer's FLOPs (fixed by T)
            g["calls"].append({"file": str(path), "date": res["meta"]["date"], "median_us": r["median_us"]})
    out = []
    for (t, plan), g in sorted(groups.items()):
        roof = {"flops": g["flops"], "roofline_us": statistics.mean(g["roofline_us"])}
        out.append({**summary(t, g["us"], roof), "plan": plan, "calls": g["calls"]})
    return out


def pooled_markdown(rows: list[dict]) -> str:
    lines = ["# The engine's fused-MoE plans: rounds of several calls pooled", "",
             "| T | plan | calls (median us each) | rounds | median us | range | x roofline | of 790 |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        calls = "; ".join(f"{c['date']} {c['median_us']:.1f}" for c in r["calls"])
        lines.append(f"| {r['T']} | {r['plan']} | {calls} | {len(r['us'])} | {r['median_us']:.1f} | "
                     f"{r['min_us']:.1f}-{r['max_us']:.1f} | {r['median_x_roofline']:.3f} | "
                     f"{r['median_share_of_790']:.2%} |")
    return "\n".join(lines) + "\n"


def _side_table(rows: list[dict], key: str, title: str, header: list[str], cells, plan: bool = False) -> list[str]:
    """A second table of the rows holding `key` (an earlier module's or a challenger's rounds): T, [its plan,]
    its us per round, then `cells` of it; nothing when no row holds it."""
    held = [r for r in rows if r.get(key)]
    if not held:
        return []
    lines = ["", title, "", "| " + " | ".join(header) + " |", "|" + "|".join("---" if h == "plan" else "---:"
                                                                          for h in header) + "|"]
    for r in held:
        c = r[key]
        lines.append("| " + " | ".join([str(r["T"]), *([c["plan"]] if plan else []),
                                        ", ".join(f"{u:.1f}" for u in c["us"]), *cells(c)]) + " |")
    return lines


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# The engine's fused-MoE plans timed {meta['rounds']} rounds ({meta['gpu']}, {meta['date']})", "",
             (f"`{meta['command']}`; torch {meta['torch']}, triton {meta['triton']}. Round 0: the focus bench's "
              "routing seeds; later rounds: fresh draws."), "",
             "| T | plan | us per round | median us | range | x roofline (median) | TFLOP/s (median) | of 790 |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['T']} | {r['plan']} | {', '.join(f'{u:.1f}' for u in r['us'])} | {r['median_us']:.1f} | "
                     f"{r['min_us']:.1f}-{r['max_us']:.1f} | {r['median_x_roofline']:.2f} | {r['median_tflops']:.0f} | "
                     f"{r['median_share_of_790']:.1%} |")
    held = [r for r in rows if r.get("used_blocks")]
    if held:
        lines += ["", "Blocks that hold pairs (the grouped path's computed rows / block_m), per round:", "",
                  "| T | used blocks per round |", "|---:|---|"]
        lines += [f"| {r['T']} | {', '.join(f'{b:.0f}' for b in r['used_blocks'])} |" for r in held]
    held = [r for r in rows if r.get("peak_tflops")]
    if held:
        size = 64 if meta["gpu"].startswith("cpu") else PEAK_SIZE
        lines += ["", f"Beside each T in every round, a dense GEMM ({size} cubed, cuBLAS through torch.mm):", "",
                  "| T | GEMM TFLOP/s per round | median | the plan's share of the same round's GEMM rate (median) |",
                  "|---:|---|---:|---:|"]
        lines += [f"| {r['T']} | {', '.join(f'{p:.0f}' for p in r['peak_tflops'])} | {r['median_peak_tflops']:.0f} | "
                  f"{r['median_share_of_peak']:.1%} |" for r in held]
    lines += _side_table(rows, "compare", f"Beside it, the same plan in `{meta['compare']}` (timed right after, same draws):",
                         ["T", "us per round", "median us", "this tree / earlier (median of per-round ratios)"],
                         lambda c: [f"{c['median_us']:.1f}", f"{c['ratio_median']:.3f}"])
    lines += _side_table(rows, "challenger",
                         f"Challengers (the fastest plan at T in `{meta['challengers']}`), same rounds and draws:",
                         ["T", "plan", "us per round", "median us", "range", "x roofline", "of 790",
                          "/ engine (median of ratios)"],
                         lambda c: [f"{c['median_us']:.1f}", f"{c['min_us']:.1f}-{c['max_us']:.1f}",
                                    f"{c['median_x_roofline']:.2f}", f"{c['median_share_of_790']:.1%}",
                                    f"{c['ratio_to_engine_median']:.3f}"], plan=True)
    held = [r for r in rows if r.get("candidates")]
    if held:
        lines += ["", (f"Candidates ({meta.get('candidates')}), the same rounds and draws, the order rotated each round; "
                       "down / gate+up alone: round 0, the plan's launch by itself (the engine plan's in the T row's first line):"), "",
                  "| T | plan | us per round | median us | x roofline | / engine (median of ratios) | down alone us | gate+up alone us |",
                  "|---:|---|---|---:|---:|---:|---:|---:|"]
        for r in held:
            lines.append(f"| {r['T']} | engine: {r['plan']} | | {r['median_us']:.1f} | {r['median_x_roofline']:.3f} | 1 | "
                         f"{_f(r.get('down_alone_us'))} | {_f(r.get('up_alone_us'))} |")
            for c in r["candidates"]:
                if "check_failed" in c:
                    lines.append(f"| {r['T']} | {c['plan']} | check failed: {c['check_failed']} | | | | | |")
                    continue
                lines.append(f"| {r['T']} | {c['plan']} | {', '.join(f'{u:.1f}' for u in c['us'])} | {c['median_us']:.1f} | "
                             f"{c['median_x_roofline']:.3f} | {c['ratio_to_engine_median']:.3f} | {_f(c['down_alone_us'])} | "
                             f"{_f(c.get('up_alone_us'))} |")
    return "\n".join(lines) + "\n"


def _f(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def check_candidates(by_t: dict[int, list], layer, h: int, e: int, k: int, device: str, dtype) -> tuple[dict, dict]:
    """Each plan at T against the float32 per-expert loop on one draw of T tokens: (T -> the plans within
    CHECK_TOL, T -> {key: why not} of the others). A failing plan is reported, not timed."""
    import torch

    from kernels.fused_moe import fused_moe
    from kernels.moe_plans import plan_key
    from kernels.moe_reference import fused_moe_ref, route_ref

    good, failed = {}, {}
    for t, plans in by_t.items():
        gr = torch.Generator(device=device).manual_seed(17 + t)
        x = torch.randn(t, h, generator=gr, device=device).to(dtype)
        w, ids = route_ref(torch.randn(t, e, generator=gr, device=device), k, renormalize=True)
        ref = fused_moe_ref(x.float(), layer[0].float(), layer[1].float(), w, ids)
        for p in plans:
            try:
                err = ((fused_moe(x, layer[0], layer[1], w, ids, p).float() - ref).norm() / ref.norm()).item()
            except Exception as exc:  # noqa: BLE001 - reported beside the timed plans
                failed.setdefault(t, {})[plan_key(p)] = repr(exc)[:300]
                continue
            if err <= CHECK_TOL:
                good.setdefault(t, []).append(p)
            else:
                failed.setdefault(t, {})[plan_key(p)] = f"relative error {err:.2e}"
    return good, failed


def launches_alone_us(plan, weights: list, routes: list, reps: int, dry: bool) -> LaunchesAlone:
    """us per call of a direct plan's down launch alone (on its gate+up's activations), and of its gate+up
    launch alone."""
    from benchmarks.kernels.graph_timing import time_calls_us
    from kernels.moe_direct import down_direct, gate_up_direct

    acts = [gate_up_direct(r[0], wt[0], r[2], plan) for wt, r in zip(weights, routes)]
    down = time_calls_us([lambda a=a, wt=wt, r=r: down_direct(a, wt[1], r[1], r[2], plan)
                          for a, wt, r in zip(acts, weights, routes)] * reps, dry, reps=1)
    up = time_calls_us([lambda wt=wt, r=r: gate_up_direct(r[0], wt[0], r[2], plan)
                        for wt, r in zip(weights, routes)] * reps, dry, reps=1)
    return LaunchesAlone(down, up)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.pool:
        rows = pooled_rows(args.pool)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pooled.json").write_text(json.dumps(rows, indent=1))
        (args.out / "pooled.md").write_text(pooled_markdown(rows))
        print(pooled_markdown(rows))
        return
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    import triton

    from benchmarks.kernels.graph_timing import time_calls_us
    from kernels import _interpreter_compat
    from kernels.fused_moe import fused_moe
    from kernels.moe_direct import DirectTiles
    from kernels.moe_plans import engine_fused_moe, engine_tiles, plan_key

    _interpreter_compat.apply()
    device, dtype = ("cpu", torch.float32) if args.dry_run else ("cuda", torch.bfloat16)
    h, n, e, k = DRY if args.dry_run else layer_of(args.preset)
    tokens = [min(t, 16) for t in args.tokens] if args.dry_run else args.tokens
    rounds = min(args.rounds, 2) if args.dry_run else args.rounds
    g = torch.Generator(device=device).manual_seed(1)
    weights = [((torch.randn(e, 2 * n, h, generator=g, device=device) / h**0.5).to(dtype),
                (torch.randn(e, h, n, generator=g, device=device) / n**0.5).to(dtype))
               for _ in range(1 if args.dry_run else COPIES)]
    old = load_compare(args.compare) if args.compare else None
    challengers = challenger_plans(args.challengers, tokens, k, e) if args.challengers else {}
    chal_times: dict[int, list[float]] = {t: [] for t in tokens}
    times: dict[int, list[float]] = {t: [] for t in tokens}
    old_times: dict[int, list[float]] = {t: [] for t in tokens}
    touched: dict[int, list[float]] = {t: [] for t in tokens}
    cand_times: dict[int, dict[str, list[float]]] = {t: {} for t in tokens}
    alone: dict[int, dict[str, LaunchesAlone]] = {}
    peaks: dict[int, list[float]] = {t: [] for t in tokens}
    blocks: dict[int, list[float]] = {t: [] for t in tokens}
    good, failed = check_candidates(candidate_plans(args.candidates, tokens, k, e) if args.candidates else {},
                                    weights[0], h, e, k, device, dtype)
    for rnd in range(rounds):
        for t in tokens:
            routes = make_draw(t, h, e, k, 0 if args.fixed_draw else rnd, len(weights), device, dtype)
            touched[t].append(sum(len(torch.unique(r[2])) for r in routes) / len(routes))
            blocks[t].append(used_blocks([r[2] for r in routes], e, getattr(engine_tiles(t, k, e), "block_m", 0)))
            reps = 1 if args.dry_run else max(1, min(10, -(-2000 // int(roofline(touched[t][-1], t, h, n, k)
                                                                              ["roofline_us"] * len(weights)))))
            if args.peak:
                peaks[t].append(dense_gemm_tflops(args.dry_run))
            calls = [lambda wt=wt, r=r: engine_fused_moe(r[0], wt[0], wt[1], r[1], r[2])
                     for wt, r in zip(weights, routes)] * reps
            chal = challengers.get(t)
            chal_calls = [lambda wt=wt, r=r, p=chal: fused_moe(r[0], wt[0], wt[1], r[1], r[2], p)
                          for wt, r in zip(weights, routes)] * reps if chal else None
            if chal and rnd % 2:  # odd rounds: the challenger first
                chal_times[t].append(time_calls_us(chal_calls, args.dry_run, reps=1))
            named = [(plan_key(p), [lambda wt=wt, r=r, p=p: fused_moe(r[0], wt[0], wt[1], r[1], r[2], p)
                                    for wt, r in zip(weights, routes)] * reps) for p in good.get(t, [])]
            for key, c in rotated([(ENGINE, calls), *named], rnd):
                us = time_calls_us(c, args.dry_run, reps=1)
                (times[t] if key == ENGINE else cand_times[t].setdefault(key, [])).append(us)
            if chal and not rnd % 2:
                chal_times[t].append(time_calls_us(chal_calls, args.dry_run, reps=1))
            if rnd == 0 and good.get(t):
                alone[t] = {key: launches_alone_us(p, weights, routes, reps, args.dry_run)
                            for key, p in ((ENGINE, engine_tiles(t, k, e)), *((plan_key(p), p) for p in good[t]))
                            if isinstance(p, DirectTiles)}
            print(f"round {rnd} T={t}: {times[t][-1]:.1f} us" + (f", challenger {chal_times[t][-1]:.1f} us" if chal else "")
                  + "".join(f", {key} {us[-1]:.1f}" for key, us in cand_times[t].items()), flush=True)
            plan = compare_plan(old, engine_tiles(t, k, e)) if old else None
            if plan is not None:
                calls = [lambda wt=wt, r=r, p=plan: old.fused_moe(r[0], wt[0], wt[1], r[1], r[2], p)
                         for wt, r in zip(weights, routes)] * reps
                old_times[t].append(time_calls_us(calls, args.dry_run, reps=1))
                print(f"round {rnd} T={t}: earlier {old_times[t][-1]:.1f} us", flush=True)
    rows = [{**summary(t, times[t], roofline(statistics.mean(touched[t]), t, h, n, k)),
             "plan": plan_key(engine_tiles(t, k, e)), "touched_experts": statistics.mean(touched[t])} for t in tokens]
    for r in rows:
        if any(blocks[r["T"]]):
            r["used_blocks"] = blocks[r["T"]]
        if peaks[r["T"]]:
            r.update(peak_fields(r["us"], peaks[r["T"]], roofline(r["touched_experts"], r["T"], h, n, k)["flops"]))
        if chal_times[r["T"]]:
            r["challenger"] = challenger_summary(r["T"], r["us"], chal_times[r["T"]], plan_key(challengers[r["T"]]),
                                                 roofline(r["touched_experts"], r["T"], h, n, k))
        if cand_times[r["T"]] or failed.get(r["T"]):
            at_t = alone.get(r["T"], {})
            r.update(alone_fields(at_t.get(ENGINE)))
            r["candidates"] = candidate_rows({ENGINE: r["us"], **cand_times[r["T"]]},
                                             roofline(r["touched_experts"], r["T"], h, n, k), r["T"], at_t,
                                             failed.get(r["T"], {}))
        before = old_times[r["T"]]
        if before:
            r["compare"] = {"us": before, "median_us": statistics.median(before),
                            "ratio_median": statistics.median(a / b for a, b in zip(r["us"], before))}
    meta = {"gpu": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
            "triton": triton.__version__, "rounds": rounds, "compare": str(args.compare) if old else None,
            "challengers": str(args.challengers) if args.challengers else None, "candidates": args.candidates,
            "peak": args.peak, "fixed_draw": args.fixed_draw,
            "layer": {"H": h, "N": n, "E": e, "k": k}, "preset": "tiny" if args.dry_run else args.preset,
            "command": "python3 benchmarks/kernels/repeat_engine_plans.py " + " ".join(argv or sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "repeat.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "repeat.md").write_text(markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
