#!/usr/bin/env python3
"""Decode GEMMs against the weight-read bound: cuBLAS (default and cuBLASLt) vs kernels.skinny_gemm.

For the Llama-3.1-8B and Llama-3.2-1B projections (qkv, o, gate_up, down, LM head) at decode
batches M = 1..256, each GEMM is timed as a CUDA-graph replay. L2 is defeated by rotation, not a
flush: one graph holds calls over enough distinct copies of the weight that the copies together
exceed 256 MB (> 5x the H200's 50 MB L2), so every call streams its weight from HBM; the time
is the replay's divided by the calls. Per (shape, M): (a) F.linear with the default BLAS, (b)
with ``preferred_blas_library("cublaslt")``, (c) the best of a sweep of skinny_gemm launch
configs, checked against (a). Writes gemm.json (every row), gemm.md (tables) and
skinny_gemm_configs.json (the best config per (M bucket, N, K), and ``max_m``: the largest M
up to which the Triton kernel wins on every model's step, in the form kernels/skinny_gemm.py
reads; copy it there to use it).

    python3 benchmarks/kernels/bench_gemm.py --out DIR --budget-s 480     # H200
    python3 benchmarks/kernels/bench_gemm.py --dry-run --out DIR           # CPU interpreter, tiny
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if "--dry-run" in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.kernels.graph_timing import time_calls_us
from kernels import skinny_gemm as sg

ROTATE_BYTES = 256 * 2**20
MAX_COPIES = 64
M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BLOCKS_NK = ((32, 128), (64, 64), (64, 128), (64, 256), (128, 64), (128, 128))
SPLITS = (1, 2, 4, 8, 16)
REL_TOL = 2e-2  # bf16 output: a few ulps of the largest value


@dataclass(frozen=True, slots=True)
class Shape:
    model: str
    proj: str
    k: int
    n: int
    per_step: int  # calls per decode step: the layers for a projection, 1 for the LM head


def shapes(dry: bool) -> list[Shape]:
    if dry:
        return [Shape("tiny", "qkv", 512, 48, 2), Shape("tiny", "lm_head", 256, 80, 1)]
    out = []
    for model, layers, dims in (
        ("llama-3.1-8b", 32, ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 128256))),
        ("llama-3.2-1b", 16, ((2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048), (2048, 128256))),
    ):
        for proj, (k, n) in zip(("qkv", "o", "gate_up", "down", "lm_head"), dims):
            out.append(Shape(model, proj, k, n, 1 if proj == "lm_head" else layers))
    return out


PROJECTIONS_PER_MODEL = {"tiny": 2, "llama-3.1-8b": 5, "llama-3.2-1b": 5}


def candidate_configs(m: int, n: int, k: int, quick: bool) -> list[sg.GemmConfig]:
    """The table's default first, then tile/split variants that give each split >= 2 K tiles
    and launch at most ~8 waves of 132 programs."""
    block_m = min(max(1 << (m - 1).bit_length(), 16), 64)
    found = [sg.default_config(m, n, k)]
    blocks = BLOCKS_NK[2:4] if quick else BLOCKS_NK
    for bn, bk in blocks:
        tiles = math.ceil(n / bn) * math.ceil(m / block_m)
        for split in SPLITS:
            if math.ceil(k / bk) < 2 * split or tiles * split > 8 * sg.NUM_SMS_DEFAULT:
                continue
            for warps in ((4,) if quick else (4, 8)):
                cfg = sg.GemmConfig(block_m, bn, bk, split, num_warps=warps)
                if cfg not in found:
                    found.append(cfg)
    return found




class Operands:
    """x [M, K] and enough weight copies [N, K] to exceed the L2 together (one on the CPU)."""

    def __init__(self, shape: Shape, device: str, dtype: torch.dtype, dry: bool) -> None:
        gen = torch.Generator(device="cpu").manual_seed(shape.n * 7 + shape.k)
        w = (torch.randn(shape.n, shape.k, generator=gen) * 0.02).to(device, dtype)
        self.weight_bytes = w.numel() * w.element_size()
        copies = 1 if dry else min(MAX_COPIES, math.ceil(ROTATE_BYTES / self.weight_bytes))
        self.weights = [w] + [w.clone() for _ in range(copies - 1)]
        self.device, self.dtype = device, dtype

    def x(self, m: int, k: int) -> torch.Tensor:
        gen = torch.Generator(device="cpu").manual_seed(m)
        return torch.randn(m, k, generator=gen).to(self.device, self.dtype)


def time_blas(x: torch.Tensor, ops: Operands, dry: bool, lib: str | None) -> float:
    outs = [torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype) for w in ops.weights]
    calls = [lambda w=w, o=o: torch.mm(x, w.t(), out=o) for w, o in zip(ops.weights, outs)]
    if lib is None or dry:  # the CPU build has no cuBLASLt to choose
        return time_calls_us(calls, dry)
    saved = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(lib)
    try:
        return time_calls_us(calls, dry)
    finally:
        torch.backends.cuda.preferred_blas_library(saved)


def time_config(x: torch.Tensor, ops: Operands, ref: torch.Tensor, cfg: sg.GemmConfig,
                dry: bool) -> tuple[float, float]:
    """(us per call, max error relative to the largest |ref|) of one launch config."""
    m, n = x.shape[0], ops.weights[0].shape[0]
    scale = float(ref.float().abs().max()) or 1.0
    err = float((sg.skinny_gemm(x, ops.weights[0], config=cfg).float() - ref.float()).abs().max()) / scale
    outs = [torch.empty(m, n, device=x.device, dtype=x.dtype) for _ in ops.weights]
    calls = [lambda w=w, o=o: sg.skinny_gemm(x, w, out=o, config=cfg) for w, o in zip(ops.weights, outs)]
    return time_calls_us(calls, dry), err


def sweep_triton(x: torch.Tensor, ops: Operands, ref: torch.Tensor, dry: bool, quick: bool,
                 deadline: float) -> tuple[float, sg.GemmConfig, float] | None:
    """(us, config, relative error) of the fastest config timed before `deadline`."""
    m, k = x.shape
    n = ops.weights[0].shape[0]
    best = None
    for cfg in candidate_configs(m, n, k, quick or dry):
        if time.time() > deadline and best is not None:
            break
        try:  # a config can exceed the SM's shared memory or registers: skip it, say so
            timed = time_config(x, ops, ref, cfg, dry)
        except Exception as exc:  # noqa: BLE001 -- triton raises several types for this
            print(f"  skipped {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        if best is None or timed[0] < best[0]:
            best = (timed[0], cfg, timed[1])
    return best


def measure_shape(shape: Shape, ms: tuple[int, ...], args, deadline: float) -> list[dict]:
    device = "cpu" if args.dry_run else "cuda"
    ops = Operands(shape, device, torch.bfloat16, args.dry_run)
    rows = []
    for m in ms:
        if time.time() > deadline:
            print(f"budget spent: {shape.model} {shape.proj} M={m} and later not timed", flush=True)
            break
        x = ops.x(m, shape.k)
        ref = F.linear(x, ops.weights[0])
        default_us = time_blas(x, ops, args.dry_run, None)
        lt_us = time_blas(x, ops, args.dry_run, "cublaslt")
        tri = sweep_triton(x, ops, ref, args.dry_run, args.quick, deadline)
        row = {**asdict(shape), "m": m, "weight_bytes": ops.weight_bytes,
               "copies": len(ops.weights), "default_us": default_us, "cublaslt_us": lt_us,
               "triton_us": tri[0], "triton_config": asdict(tri[1]), "triton_rel_err": tri[2],
               "triton_ok": tri[2] <= REL_TOL}
        rows.append(row)
        gbs = ops.weight_bytes / default_us / 1e3
        print(f"{shape.model} {shape.proj:8s} M={m:3d} default {default_us:8.1f} us ({gbs:6.0f} GB/s) "
              f"lt {lt_us:8.1f} triton {tri[0]:8.1f} ({default_us / tri[0]:4.2f}x) err {tri[2]:.1e}",
              flush=True)
        del x, ref
    del ops
    if not args.dry_run:
        torch.cuda.empty_cache()
    return rows


def step_wins(rows: list[dict]) -> dict[tuple[str, int], bool]:
    """(model, M) -> whether the Triton kernel's best configs beat default cuBLAS over a decode
    step's GEMMs (each projection once per layer, the LM head once); only complete sets count."""
    by: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        by.setdefault((r["model"], r["m"]), []).append(r)
    wins = {}
    for key, rs in by.items():
        if len(rs) < PROJECTIONS_PER_MODEL[key[0]]:  # the budget cut this M short
            continue
        tri = sum(r["triton_us"] * r["per_step"] for r in rs)
        blas = sum(r["default_us"] * r["per_step"] for r in rs)
        wins[key] = all(r["triton_ok"] for r in rs) and tri < blas
    return wins


def config_table(rows: list[dict]) -> sg.ConfigTable:
    """Best measured config per (M bucket, N, K); max_m: the largest M such that the kernel wins
    the step at every measured M up to it, on every model (0: never use it)."""
    wins = step_wins(rows)
    max_m = 0
    for m in M_VALUES:
        at_m = [w for (_, mm), w in wins.items() if mm == m]
        if not at_m or not all(at_m):
            break
        max_m = m
    configs = {sg.config_key(r["m"], r["n"], r["k"]): sg.GemmConfig(**r["triton_config"]) for r in rows}
    return sg.ConfigTable(max_m, configs)


def markdown(rows: list[dict], table: sg.ConfigTable, meta: dict) -> str:
    lines = [f"# Decode GEMMs: cuBLAS vs skinny_gemm ({meta['gpu']}, {meta['date']})", "",
             (f"`{meta['command']}`. CUDA-graph replays; L2 defeated by rotating >= 256 MB of weight "
             "copies per graph. GB/s = weight bytes / time. Ratio = default / other (> 1: faster)."),
             f"Resulting table: max_m = {table.max_m}.", "",
             ("| model | proj | M | default us | GB/s | cuBLASLt us | ratio | triton us | GB/s | ratio "
             "| config (bm,bn,bk,split,warps,stages) | rel err |"),
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|"]
    for r in rows:
        gb = r["weight_bytes"] / 1e3
        c = r["triton_config"]
        cfg = f"{c['block_m']},{c['block_n']},{c['block_k']},{c['split_k']},{c['num_warps']},{c['num_stages']}"
        lines.append(
            f"| {r['model']} | {r['proj']} | {r['m']} | {r['default_us']:.1f} | {gb / r['default_us']:.0f} "
            f"| {r['cublaslt_us']:.1f} | {r['default_us'] / r['cublaslt_us']:.2f} | {r['triton_us']:.1f} "
            f"| {gb / r['triton_us']:.0f} | {r['default_us'] / r['triton_us']:.2f} | {cfg} "
            f"| {r['triton_rel_err']:.1e}{'' if r['triton_ok'] else ' FAIL'} |")
    lines += ["", "Decode-step GEMM time (projections x layers + LM head), us:", "",
              "| model | M | default | cuBLASLt | triton |", "|---|--:|--:|--:|--:|"]
    for (model, m) in step_wins(rows):
        rs = [r for r in rows if r["model"] == model and r["m"] == m]
        tot = {k: sum(r[k] * r["per_step"] for r in rs) for k in ("default_us", "cublaslt_us", "triton_us")}
        lines.append(f"| {model} | {m} | {tot['default_us']:.0f} | {tot['cublaslt_us']:.0f} | {tot['triton_us']:.0f} |")
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no measurement after this")
    ap.add_argument("--quick", action="store_true", help="fewer Triton configs per shape")
    ap.add_argument("--models", default="", help="comma list (llama-3.1-8b,llama-3.2-1b); all if empty")
    ap.add_argument("--m", default="", help="comma list of M; all of 1..256 if empty")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    t0 = time.time()
    deadline = t0 + args.budget_s
    if args.dry_run:  # the interpreter needs the same patches as the tests
        from kernels import _interpreter_compat

        _interpreter_compat.apply()
    ms = tuple(int(v) for v in args.m.split(",") if v) or ((1, 3, 17) if args.dry_run else M_VALUES)
    wanted = {v for v in args.models.split(",") if v}
    rows = []
    for shape in shapes(args.dry_run):
        if wanted and shape.model not in wanted:
            continue
        rows += measure_shape(shape, ms, args, deadline)
    table = config_table(rows)
    meta = {"gpu": torch.cuda.get_device_name() if not args.dry_run else "cpu (interpreter)",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(sys.argv), "wall_s": round(time.time() - t0, 1),
            "l2": f"rotation over >= {ROTATE_BYTES >> 20} MB of weight copies (max {MAX_COPIES})"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemm.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "gemm.md").write_text(markdown(rows, table, meta))
    (args.out / "skinny_gemm_configs.json").write_text(json.dumps(table.to_json(), indent=1))
    print(f"max_m = {table.max_m}; wrote {args.out}/gemm.json, gemm.md, skinny_gemm_configs.json")


if __name__ == "__main__":
    main()
