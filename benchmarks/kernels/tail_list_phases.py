#!/usr/bin/env python3
"""Where run 8's tail-list gate+up loses its time (H200, qwen3-30b-a3b's layer): each of its launches timed
alone beside run 6's persistent gate+up, and a control that isolates the list's indirection.

    python3 benchmarks/kernels/tail_list_phases.py --out DIR [--tokens 2048 4096] [--dry-run]

Run 8's focus bench (data/moe_run8) measured the tail-list plans' gate+up phase slower than run 6's
(T = 4096: 448 against 405 us; T = 2048: 322 against 262) although they compute fewer rows. Per T, on the
focus bench's routing (seed 1000 T + copy, 3 weight copies cycled in one CUDA graph), this times:

- `run6`: run 6's persistent joint gate+up over every used block (the engine's);
- `block_lists`: the list-building launch alone;
- `full` / `half`: the full list's launch (128-row tiles) and the half list's (64-row tiles) alone;
- `both`: the two list launches (lists given);
- `identity`: the full list's kernel over a list holding every used block in order (0, 1, ..., used - 1;
  no half list), i.e. run 6's tiles in run 6's order with one extra load a tile: its excess over `run6`
  is the cost of the indirection alone.

Writes DIR/phases.json and DIR/phases.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
QWEN3 = (2048, 768, 128, 8)
DRY = (64, 32, 32, 4)
COPIES = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096])
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(argv)


def identity_lists(block_expert, lists_like):
    """A block list of every used block in order (no half list): run 6's tiles through the list kernel."""
    import torch

    used = int((block_expert >= 0).sum())
    out = torch.zeros_like(lists_like)
    out[0] = used
    out[2:2 + used] = torch.arange(used, dtype=out.dtype, device=out.device)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import dataclasses

    import torch
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    from benchmarks.kernels.graph_timing import time_calls_us
    from kernels import _interpreter_compat
    from kernels import fused_moe as fm
    from kernels.moe_align import align_by_expert, block_lists
    from kernels.moe_plans import RUN6_BEST
    from kernels.moe_reference import route_ref

    _interpreter_compat.apply()
    device, dtype = ("cpu", torch.float32) if args.dry_run else ("cuda", torch.bfloat16)
    h, n, e, k = DRY if args.dry_run else QWEN3
    base = RUN6_BEST[4096]
    if args.dry_run:
        base = dataclasses.replace(base, block_m=32, block_n=16, block_k=16, num_stages=1)
    plan = dataclasses.replace(base, tail_list="up")
    g = torch.Generator(device=device).manual_seed(1)
    copies = 1 if args.dry_run else COPIES
    weights = [(torch.randn(e, 2 * n, h, generator=g, device=device) / h**0.5).to(dtype) for _ in range(copies)]
    rows = []
    for t in [min(x, 64) for x in args.tokens] if args.dry_run else args.tokens:
        cases = []
        for i, w13 in enumerate(weights):
            gr = torch.Generator(device=device).manual_seed(1000 * t + i)
            x = torch.randn(t, h, generator=gr, device=device).to(dtype)
            router = (torch.randn(e, h, generator=gr, device=device) / h**0.5).to(dtype)
            _w, ids = route_ref(x @ router.t(), k, renormalize=True)
            sorted_ids, bexp = align_by_expert(ids, e, plan.block_m, method=plan.align)
            lists = block_lists(sorted_ids, bexp, t * k, plan.block_m)
            desc = TensorDescriptor.from_tensor(w13.view(e, 2, n, h), [1, 2, plan.block_n, plan.block_k])
            act = torch.empty(sorted_ids.numel(), n, dtype=dtype, device=device)
            cases.append((x, w13, sorted_ids, bexp, lists, identity_lists(bexp, lists), desc, act))

        def run(fn, cases=cases):
            return time_calls_us([lambda c=c: fn(*c) for c in cases] * (1 if args.dry_run else 3), args.dry_run, reps=1)

        row = {"T": t, "n_full": int(cases[0][4][0]), "n_half": int(cases[0][4][1]),
               "used": int((cases[0][3] >= 0).sum())}
        row["run6_us"] = run(lambda x, w, s, b, L, I, d, a: fm.gate_up_grouped(x, w, s, b, k, base))
        row["block_lists_us"] = run(lambda x, w, s, b, L, I, d, a, pairs=t * k: block_lists(s, b, pairs, plan.block_m))
        for name, which, lists_of in (("full", (False,), 4), ("half", (True,), 4), ("both", (False, True), 4),
                                      ("identity", (False,), 5)):
            row[f"{name}_us"] = run(lambda x, w, s, b, L, I, d, a, wh=which, li=lists_of:
                                    fm._gate_up_lists(x, d, a, s, b, (L, I)[li - 4], k, e, plan, wh))
        rows.append(row)
        print(row, flush=True)
    meta = {"gpu": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python3 benchmarks/kernels/tail_list_phases.py " + " ".join(argv or sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "phases.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Tail-list gate+up phases ({meta['gpu']}, {meta['date']})", "", f"`{meta['command']}`", "",
             "| T | used / full / half blocks | run 6 gate+up us | block_lists | full list | half list | both | identity list |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['T']} | {r['used']} / {r['n_full']} / {r['n_half']} | {r['run6_us']:.1f} | {r['block_lists_us']:.1f} | "
              f"{r['full_us']:.1f} | {r['half_us']:.1f} | {r['both_us']:.1f} | {r['identity_us']:.1f} |" for r in rows]
    (args.out / "phases.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
