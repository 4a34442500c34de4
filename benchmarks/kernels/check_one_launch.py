"""GPU check of run 13's one-launch prefill plan (MoeTiles.one_launch, kernels/moe_persistent.py) on
qwen3-30b-a3b's layer, every way of synchronising but "nosync" (kernels.moe_persistent.SYNC_MODES): its
output must equal the two launches' bit for bit (the same tiles in the same K order; only the launch
boundary became counts), on every call of a soak, eager and replayed from a CUDA graph, on near-uniform
and on skewed routing; and be within the bf16 tolerance of the float32 per-expert loop. The engine's
T = 4096 plan at every T, so small T (fewer blocks than SMs: down tiles dealt right after their gate+up
tiles, so the waits spin) are checked too. A missed count or a stale TMA read of the activations shows
as a mismatch (a lost count as a hang: run it under `timeout`). One JSON line per (T, routing, mode);
exit 1 on any mismatch.

    timeout 300 python3 benchmarks/kernels/check_one_launch.py [--soak 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels.fused_moe import fused_moe
from kernels.moe_persistent import SYNC_MODES
from kernels.moe_plans import engine_tiles, plan_key
from kernels.moe_reference import fused_moe_ref, route_ref

H, N, E, K = 2048, 768, 128, 8
TOKENS = (4096, 8192, 2048, 1024, 600, 256, 64, 8, 1)
TOLERANCE = 2e-2  # relative to the output's largest entry (check_engine_moe_plans.py's bar)


def routing(t: int, skewed: bool, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, ids) [T, k]: a random router's top k (near uniform), or k distinct experts a token drawn
    with probability ~ 1 / rank^1.2 (a few experts crowded, their blocks many)."""
    if not skewed:
        return route_ref(torch.randn(t, E, generator=g, device="cuda"), K, renormalize=True)
    p = 1.0 / torch.arange(1, E + 1, device="cuda", dtype=torch.float32) ** 1.2
    ids = torch.multinomial(p.expand(t, E), K, replacement=False, generator=g)
    w = torch.rand(t, K, generator=g, device="cuda")
    return w / w.sum(1, keepdim=True), ids


def check(t: int, skewed: bool, mode: str, soak: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(t + 7 * skewed)
    x = torch.randn(t, H, generator=g, device="cuda").to(torch.bfloat16)
    w13 = (torch.randn(E, 2 * N, H, generator=g, device="cuda") / H**0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, N, generator=g, device="cuda") / N**0.5).to(torch.bfloat16)
    w, ids = routing(t, skewed, g)
    two_plan = engine_tiles(4096, K, E)
    one_plan = dataclasses.replace(two_plan, one_launch=mode)
    row = {"T": t, "routing": "skewed" if skewed else "router", "plan": plan_key(one_plan),
           "touched_experts": len(torch.unique(ids))}
    two = fused_moe(x, w13, w2, w, ids, two_plan)
    one = fused_moe(x, w13, w2, w, ids, one_plan)
    ref = fused_moe_ref(x.float(), w13.float(), w2.float(), w, ids)
    row["err"] = (one.float() - ref).abs().max().item() / (ref.abs().max().item() or 1.0)
    row["equal_first"] = torch.equal(one, two)
    row["eager_mismatches"] = sum(not torch.equal(fused_moe(x, w13, w2, w, ids, one_plan), two) for _ in range(soak))
    fused_moe(x, w13, w2, w, ids, one_plan)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, w, ids, one_plan)
    mismatches = 0
    for _ in range(soak):
        graph.replay()
        mismatches += not torch.equal(out, two)
    row["graph_mismatches"] = mismatches
    row["soak"] = soak
    row["ok"] = row["err"] <= TOLERANCE and row["equal_first"] and not row["eager_mismatches"] and not mismatches
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--soak", type=int, default=50, help="calls compared, eager and graph-replayed, per row")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON lines here")
    a = ap.parse_args()
    rows = []
    for t in TOKENS:
        for skewed in (False, True):
            for mode in (m for m in SYNC_MODES if m != "nosync"):
                rows.append(check(t, skewed, mode, a.soak))
            print(json.dumps(rows[-1]), flush=True)
            if a.out:
                a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
