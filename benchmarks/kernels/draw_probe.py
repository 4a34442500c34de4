#!/usr/bin/env python3
"""Which part of a routing draw sets the fused MoE's prefill time (MOE.md run 19).

Runs 15-16 found that at T = 4096 the engine's plan takes ~664 us on one routing draw (the focus bench's
seeds) and ~700 us on most others, with the same weights and clocks. A draw is (x, router) per weight copy,
so it changes three things at once: the values the tensor cores multiply, how many pairs each expert gets
(so the blocks and their order), and which tokens sit in which block. This script times the engine's plan,
each of its launches alone, on several draws and on draws taken apart:

    python3 benchmarks/kernels/draw_probe.py --out DIR [--tokens 4096] [--draws 10] [--dry-run]

- `draw d`: draw d as `repeat_engine_plans.py` makes it (d = its round); its routing statistics beside;
- `x f / route s` and `x s / route f`: the fastest draw's x with the slowest's routing, and the reverse
  (values or routing?);
- `route f, experts relabelled r`: the fastest routing with the expert ids permuted (same block sizes, the
  blocks now meet other experts' weights in another order);
- `route f, tokens shuffled`: its tokens (x rows with their routes) permuted (same experts, other rows in
  each block);
- `route f, copies rotated`: each routing meets another weight copy;
- `draw f again`, `draw s again`: the two ends re-timed last (did the GPU drift during the call?).

Writes DIR/draws.json and DIR/draws.md. (Run 19's call, data/moe_run19, also timed run 18's evict-first down
rows on every variant, `run18_total_us`: they lost and were removed, last at aab9576.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.kernels.repeat_engine_plans import (
    COPIES,
    DRY,
    Route,
    dense_gemm_tflops,
    expert_blocks,
    layer_of,
    make_draw,
    roofline,
)

RELABELS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=int, nargs="+", default=[4096])
    p.add_argument("--draws", type=int, default=10)
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(argv)


def route_stats(routes: list[Route], e: int, block_m: int) -> dict:
    """Per draw (means over the copies): used blocks, padding rows, the largest and smallest expert's pairs,
    and how many experts hold 1, 2, 3 and 4+ blocks."""
    used, pad, big, small, hist = [], [], [], [], [[], [], [], []]
    for r in routes:
        pairs, blocks = expert_blocks(r.ids, e, block_m)
        used.append(int(blocks.sum()))
        pad.append(int(blocks.sum()) * block_m - int(pairs.sum()))
        big.append(int(pairs.max()))
        small.append(int(pairs.min()))
        for j in range(4):
            hist[j].append(int((blocks == j + 1).sum()) if j < 3 else int((blocks >= 4).sum()))
    mean = statistics.mean
    return {"used_blocks": mean(used), "padding_rows": mean(pad), "max_expert_pairs": mean(big),
            "min_expert_pairs": mean(small), "experts_with_1_2_3_4plus_blocks": [mean(c) for c in hist]}


def relabelled(routes: list[Route], e: int, seed: int) -> list[Route]:
    """The routes with expert ids mapped through one random permutation of the E experts."""
    import torch

    perm = torch.randperm(e, generator=torch.Generator().manual_seed(seed)).to(routes[0].ids.device)
    return [r._replace(ids=perm[r.ids.long()].to(r.ids.dtype)) for r in routes]


def shuffled(routes: list[Route], seed: int) -> list[Route]:
    """The routes with their tokens (x rows with their weights and ids) in a random order."""
    import torch

    out = []
    for r in routes:
        perm = torch.randperm(r.x.shape[0], generator=torch.Generator().manual_seed(seed)).to(r.x.device)
        out.append(Route(r.x[perm].contiguous(), r.w[perm].contiguous(), r.ids[perm].contiguous()))
    return out


def phase_us(weights: list, routes: list[Route], tiles, e: int, k: int, reps: int, dry: bool) -> dict:
    """us per call of the whole plan and of each of its launches alone (grouping, gate+up, down, k-sum)."""
    from benchmarks.kernels.graph_timing import time_calls_us
    from kernels.fused_moe import down_grouped, fused_moe, gate_up_grouped, moe_sum
    from kernels.moe_align import align_by_expert

    groups = [align_by_expert(r.ids, e, tiles.block_m, method=tiles.align) for r in routes]
    acts = [gate_up_grouped(r.x, wt[0], *gr, k, tiles) for wt, r, gr in zip(weights, routes, groups)]
    ys = [down_grouped(a, wt[1], *gr, r.w, tiles) for wt, r, gr, a in zip(weights, routes, groups, acts)]

    def timed(calls):
        return time_calls_us(calls * reps, dry, reps=1)

    return {
        "total_us": timed([lambda wt=wt, r=r: fused_moe(r.x, wt[0], wt[1], r.w, r.ids, tiles)
                           for wt, r in zip(weights, routes)]),
        "align_us": timed([lambda r=r: align_by_expert(r.ids, e, tiles.block_m, method=tiles.align) for r in routes]),
        "gate_up_us": timed([lambda wt=wt, r=r, gr=gr: gate_up_grouped(r.x, wt[0], *gr, k, tiles)
                             for wt, r, gr in zip(weights, routes, groups)]),
        "down_us": timed([lambda wt=wt, r=r, gr=gr, a=a: down_grouped(a, wt[1], *gr, r.w, tiles)
                          for wt, r, gr, a in zip(weights, routes, groups, acts)]),
        "ksum_us": timed([lambda y=y: moe_sum(y, k) for y in ys]),
    }


def probe_t(t: int, weights: list, shape: tuple, args, device: str, dtype) -> list[dict]:
    """Every variant at T = t: the draws, then the fastest and slowest taken apart."""
    from kernels.moe_plans import engine_tiles

    h, n, e, k = shape
    plan = engine_tiles(t, k, e)
    reps = 1 if args.dry_run else max(1, min(10, -(-2000 // int(roofline(e, t, h, n, k)["roofline_us"] * COPIES))))
    rows = []

    def run(name: str, routes: list[Route], stats_of: list[Route] | None = None) -> dict:
        row = {"T": t, "variant": name, **route_stats(stats_of or routes, e, getattr(plan, "block_m", 16)),
               **phase_us(weights, routes, plan, e, k, reps, args.dry_run),
               "dense_gemm_tflops": dense_gemm_tflops(args.dry_run)}
        rows.append(row)
        print(json.dumps({key: v for key, v in row.items() if key != "experts_with_1_2_3_4plus_blocks"}), flush=True)
        return row

    draws = {d: make_draw(t, h, e, k, d, COPIES, device, dtype) for d in range(args.draws)}
    timed = {d: run(f"draw {d}", rs)["total_us"] for d, rs in draws.items()}
    f, s = min(timed, key=timed.get), max(timed, key=timed.get)
    run(f"x {f} / route {s}", [r._replace(x=q.x) for r, q in zip(draws[s], draws[f])])
    run(f"x {s} / route {f}", [r._replace(x=q.x) for r, q in zip(draws[f], draws[s])])
    for j in range(RELABELS):
        run(f"route {f}, experts relabelled {j}", relabelled(draws[f], e, j))
    run(f"route {s}, experts relabelled 0", relabelled(draws[s], e, 0))
    run(f"route {f}, tokens shuffled", shuffled(draws[f], 0))
    run(f"route {f}, copies rotated", draws[f][1:] + draws[f][:1])
    run(f"draw {f} again", draws[f])
    run(f"draw {s} again", draws[s])
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    head = ["T", "variant", "total us", "grouping", "gate+up", "down", "k-sum", "used blocks",
            "padding rows", "largest / smallest expert", "experts of 1/2/3/4+ blocks", "dense GEMM TFLOP/s"]
    out = [f"# Draw probe ({meta['gpu']}, {meta['date']})", "", f"`{meta['command']}`", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        out.append(" | ".join([
            f"| {r['T']}", r["variant"], f"{r['total_us']:.1f}",
            f"{r['align_us']:.1f}", f"{r['gate_up_us']:.1f}", f"{r['down_us']:.1f}", f"{r['ksum_us']:.1f}",
            f"{r['used_blocks']:.1f}", f"{r['padding_rows']:.0f}",
            f"{r['max_expert_pairs']:.0f} / {r['min_expert_pairs']:.0f}",
            "/".join(f"{c:.1f}" for c in r["experts_with_1_2_3_4plus_blocks"]),
            f"{r['dense_gemm_tflops']:.0f} |"]))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    import triton

    from kernels import _interpreter_compat

    _interpreter_compat.apply()
    device, dtype = ("cpu", torch.float32) if args.dry_run else ("cuda", torch.bfloat16)
    shape = DRY if args.dry_run else layer_of("qwen3-30b-a3b")
    h, n, e, _ = shape
    if args.dry_run:
        args.draws, args.tokens = min(args.draws, 2), [min(t, 16) for t in args.tokens]
    g = torch.Generator(device=device).manual_seed(1)  # repeat_engine_plans.py's weights
    weights = [((torch.randn(e, 2 * n, h, generator=g, device=device) / h**0.5).to(dtype),
                (torch.randn(e, h, n, generator=g, device=device) / n**0.5).to(dtype)) for _ in range(COPIES)]
    rows = [row for t in args.tokens for row in probe_t(t, weights, shape, args, device, dtype)]
    meta = {"gpu": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
            "triton": triton.__version__, "layer": dict(zip("HNEk", shape)),
            "command": "python3 benchmarks/kernels/draw_probe.py " + " ".join(argv or sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "draws.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "draws.md").write_text(markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
