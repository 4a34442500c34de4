#!/usr/bin/env python3
"""Run 15's warp-specialised kernels, each in its own process under a time limit: the first GPU call's
check hung (a warp-specialised kernel that deadlocks never returns), so each case here either returns
its relative error against the float32 per-expert loop and its time, or is reported as hung.

    python3 benchmarks/kernels/check_run15.py --out DIR [--limit-s 45] [--tokens 4096]

Cases: a plain warp-specialised GEMM (the control: does the Hopper pass run at all here), the engine's
plan at T, and run 15's candidates (kernels.moe_plans.run15_candidates). Writes DIR/check_run15.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _case(name: str, t: int) -> dict:
    """One case in this process: relative error and us per call (median of 5 after a warm-up)."""
    import torch
    import triton
    import triton.language as tl

    if name == "control":
        from triton.tools.tensor_descriptor import TensorDescriptor

        @triton.jit
        def mm(a_desc, b_desc, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
            tiles_n = tl.cdiv(N, BN)
            for tile in tl.range(tl.program_id(0), tl.cdiv(M, BM) * tiles_n, tl.num_programs(0), warp_specialize=True):
                pm, pn = tile // tiles_n, tile % tiles_n
                acc = tl.zeros((BM, BN), dtype=tl.float32)
                for k in range(0, K, BK):
                    acc = tl.dot(a_desc.load([pm * BM, k]), tl.trans(b_desc.load([pn * BN, k])), acc)
                rm, rn = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN)
                tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))

        m = n = k = 4096
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        sms = torch.cuda.get_device_properties(0).multi_processor_count

        def run():
            mm[(sms,)](TensorDescriptor.from_tensor(a, [128, 64]), TensorDescriptor.from_tensor(b, [256, 64]), c, m, n, k,
                       BM=128, BN=256, BK=64, num_warps=4, num_stages=4)

        ref = a.float() @ b.float().t()
        flops = 2 * m * n * k
    else:
        from kernels.fused_moe import fused_moe
        from kernels.moe_plans import engine_tiles, run15_candidates
        from kernels.moe_reference import fused_moe_ref, route_ref

        h, nn, e, kk = 2048, 768, 128, 8
        g = torch.Generator(device="cuda").manual_seed(5)
        w13 = (torch.randn(e, 2 * nn, h, generator=g, device="cuda") / h**0.5).to(torch.bfloat16)
        w2 = (torch.randn(e, h, nn, generator=g, device="cuda") / nn**0.5).to(torch.bfloat16)
        x = torch.randn(t, h, generator=g, device="cuda").to(torch.bfloat16)
        w, ids = route_ref(torch.randn(t, e, generator=g, device="cuda"), kk, renormalize=True)
        plan = engine_tiles(t, kk, e) if name == "engine" else run15_candidates(t, kk, e)[int(name)]
        out = {}

        def run():
            out["c"] = fused_moe(x, w13, w2, w, ids, plan)

        ref = fused_moe_ref(x.float(), w13.float(), w2.float(), w, ids)
        flops = 2 * t * kk * 3 * h * nn
    run()
    torch.cuda.synchronize()
    got = c if name == "control" else out["c"]
    err = ((got.float() - ref).norm() / ref.norm()).item()
    times = []
    for _ in range(5):
        s, f = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        f.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(f) * 1e3)
    us = sorted(times)[2]
    return {"case": name, "T": t, "rel_err": err, "us": us, "tflops": flops / us / 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--limit-s", type=float, default=45)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # the child's one case
    args = p.parse_args()
    if args.case is not None:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(_case(args.case, args.tokens)), flush=True)
        return
    sys.path.insert(0, str(ROOT))
    from kernels.moe_plans import plan_key, run15_candidates

    names = ["control", "engine", *map(str, range(len(run15_candidates(args.tokens, 8, 128))))]
    rows = []
    for name in names:
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--tokens", str(args.tokens),
                                "--case", name], capture_output=True, text=True, timeout=args.limit_s, check=False)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"case": name, "error": r.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            row = {"case": name, "hung": True}
        if name.isdigit():
            row["plan"] = plan_key(run15_candidates(args.tokens, 8, 128)[int(name)])
        row["wall_s"] = round(time.time() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_run15.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
