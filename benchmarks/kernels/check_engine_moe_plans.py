"""GPU check of the plans the engine runs (kernels.moe_plans.engine_tiles) on qwen3-30b-a3b's layer
shape: at every step size where the rule changes plan (and between), the engine's fused MoE, eager and
replayed from a CUDA graph, against the float32 per-expert loop (kernels.moe_reference). One JSON line
per T; exit 1 if any error is over the bf16 tolerance. `--dry-run`: the Triton interpreter on the CPU
with a small layer of 32 experts (the rule needs 32 or more) and small T.

    python3 benchmarks/kernels/check_engine_moe_plans.py            # the H200, ~60-150 s (compiles each plan's kernels)
    TRITON_INTERPRET=1 python3 benchmarks/kernels/check_engine_moe_plans.py --dry-run
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels.moe_plans import engine_fused_moe, engine_tiles, plan_key
from kernels.moe_reference import fused_moe_ref, route_ref

GPU_TOKENS = (1, 2, 3, 4, 6, 8, 16, 64, 256, 448, 479, 512, 700, 1024, 2048, 4096, 8192)  # 479: run 22's switch; 8192: the mixed graphs reach the token budget
DRY_TOKENS = (1, 2, 5, 16, 300)
TOLERANCE = 2e-2  # relative to the output's largest entry: bf16 inputs, float32 accumulation


def layer(t: int, h: int, n: int, e: int, k: int, device: str, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * n, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, n, generator=g) / n**0.5
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=True)
    return [v.to(device) if v.dtype == torch.int64 else v.to(device, dtype) for v in (x, w13, w2, weights)] + [
        ids.to(device)]


def graph_call(args) -> torch.Tensor:
    """The engine's call captured into a CUDA graph (after one eager warm-up call), then replayed."""
    engine_fused_moe(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = engine_fused_moe(*args)
    graph.replay()
    torch.cuda.synchronize()
    return out


def check(t: int, dry: bool) -> dict:
    h, n, e, k = (64, 32, 32, 8) if dry else (2048, 768, 128, 8)
    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    args = layer(t, h, n, e, k, device, dtype, seed=t)
    ref = fused_moe_ref(*(a.float() if a.is_floating_point() else a for a in args))
    scale = ref.abs().max().item() or 1.0
    row = {"T": t, "plan": plan_key(engine_tiles(t, k, e)), "shape": [h, n, e, k], "dtype": str(dtype)}
    row["eager_err"] = (engine_fused_moe(*args).float() - ref).abs().max().item() / scale
    if not dry:
        row["graph_err"] = (graph_call(args).float() - ref).abs().max().item() / scale
    row["ok"] = all(row[key] <= TOLERANCE for key in ("eager_err", "graph_err") if key in row)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="the CPU interpreter, a small layer, small T")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON lines here")
    a = ap.parse_args()
    if a.dry_run:
        from kernels import _interpreter_compat

        _interpreter_compat.apply()  # a no-op unless TRITON_INTERPRET=1
    rows = []
    for t in DRY_TOKENS if a.dry_run else GPU_TOKENS:
        rows.append(check(t, a.dry_run))
        print(json.dumps(rows[-1]), flush=True)  # each row as it comes: a timeout keeps the ones done
        if a.out:
            a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
