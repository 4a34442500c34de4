#!/usr/bin/env python3
"""Split-KV for skewed decode batches: a few long sequences among many short ones.

The decode kernel splits a sequence's KV over several programs only while (Q blocks x KV heads)
programs cannot fill the SMs; from batch ~16 up (Llama-3.1-8B layer: 8 KV heads) it never
splits, so one program reads the longest sequence alone and the step waits for it (the
calibration fit's `decode_max_kv` term: ~20x one sequence's KV at full bandwidth). This probe
times decode attention as CUDA-graph replays for skewed and uniform batches under split plans
(grid split count, minimum context tokens per segment) against today's heuristic, with the
output of every plan checked against the unsplit launch.

    python3 benchmarks/kernels/bench_split.py --out DIR          # H200, ~1 min
    python3 benchmarks/kernels/bench_split.py --dry-run --out DIR  # CPU interpreter, tiny
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import kernels.paged_attention as pa
from benchmarks.kernels.graph_timing import time_calls_us

HQ, HKV, D, BLOCK = 32, 8, 128, 16


def make_batch(lens: list[int], device: str, dtype: torch.dtype, seed: int = 0) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)
    blocks = [-(-n // BLOCK) for n in lens]
    total = sum(blocks) + 1
    k = torch.randn(total, BLOCK, HKV, D, generator=g).to(device, dtype)
    v = torch.randn(total, BLOCK, HKV, D, generator=g).to(device, dtype)
    perm = torch.randperm(total - 1, generator=g) + 1
    width = max(blocks)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    at = 0
    for i, nb in enumerate(blocks):
        bt[i, :nb] = perm[at: at + nb].to(torch.int32)
        at += nb
    return {
        "q": torch.randn(len(lens), HQ, D, generator=g).to(device, dtype),
        "k": k, "v": v, "bt": bt.to(device),
        "seq_lens": torch.tensor(lens, dtype=torch.int32, device=device),
        "qsl": torch.arange(len(lens) + 1, dtype=torch.int32, device=device),
        "max_seq_len": max(lens),
    }


GRAPH_MAX_SEQ_LEN = 131072  # a decode CUDA graph is captured at max_model_len (Llama 3)


def call(b: dict, splits: int | None, min_tokens: int | None, out: torch.Tensor,
         max_seq_len: int | None = None) -> torch.Tensor:
    """One decode launch; `splits`/`min_tokens` None = today's heuristic; `max_seq_len` as a
    graph captures it (None: the batch's own)."""
    saved = pa.choose_num_splits, pa.SPLIT_MIN_TOKENS, pa.SPLIT_LONG_MIN_TOKENS
    try:
        if splits is not None:
            pa.choose_num_splits = lambda *a, **k: splits
        if min_tokens is not None:
            pa.SPLIT_MIN_TOKENS = pa.SPLIT_LONG_MIN_TOKENS = min_tokens
        return pa.paged_attention(b["q"], b["k"], b["v"], b["bt"], b["seq_lens"], b["qsl"],
                                  D**-0.5, 1, max_seq_len or b["max_seq_len"], out=out)
    finally:
        pa.choose_num_splits, pa.SPLIT_MIN_TOKENS, pa.SPLIT_LONG_MIN_TOKENS = saved


def time_us(fn, dry: bool, reps: int = 50) -> float:
    """Median us of one call, replayed as a CUDA graph (wall time once on the CPU)."""
    return time_calls_us([fn], dry, reps)


def batches(dry: bool) -> dict[str, list[int]]:
    if dry:
        return {"skew-4x1l": [64] * 3 + [512], "uniform-4x256": [256] * 4}
    out = {}
    for b in (16, 32, 64, 128):
        out[f"skew-b{b}-1x32k"] = [1024] * (b - 1) + [32768]
        out[f"skew-b{b}-2x16k"] = [1024] * (b - 2) + [16384] * 2
    for b, n in ((16, 2048), (64, 4096), (128, 2048), (256, 1024)):
        out[f"uniform-b{b}-{n}"] = [n] * b
    return out


PLANS = [  # (name, grid split count, minimum tokens per segment); None = the shipped heuristic
    ("unsplit", 1, None), ("heuristic", None, None), ("heuristic-as-graph", None, None),
    ("s16-min1024", 16, 1024), ("s16-min2048", 16, 2048), ("s16-min4096", 16, 4096),
    ("s64-min2048", 64, 2048), ("s8-min4096", 8, 4096),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--budget-s", type=float, default=90.0)
    args = ap.parse_args()
    t0 = time.time()
    if args.dry_run:  # the interpreter needs the same patches as the tests
        from kernels import _interpreter_compat
        _interpreter_compat.apply()
    device = "cpu" if args.dry_run else "cuda"
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, lens in batches(args.dry_run).items():
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: {name} not timed", flush=True)
            break
        b = make_batch(lens, device, dtype)
        kv_bytes = 2 * sum(lens) * HKV * D * b["k"].element_size()
        ref = call(b, 1, None, torch.empty_like(b["q"])).float().clone()  # unsplit
        for plan, splits, min_tokens in PLANS:
            out = torch.empty_like(b["q"])
            got = call(b, splits, min_tokens, out)
            err = float((got.float() - ref).abs().max())
            max_len = GRAPH_MAX_SEQ_LEN if plan.endswith("as-graph") else None
            got = call(b, splits, min_tokens, out, max_len)
            err = max(err, float((got.float() - ref).abs().max()))
            us = time_us(functools.partial(call, b, splits, min_tokens, out, max_len), args.dry_run)
            rows.append({"batch": name, "plan": plan, "us": us, "max_abs_err": err,
                         "tb_per_s": kv_bytes / us / 1e6})
            print(f"{name:20s} {plan:12s} {us:9.1f} us {kv_bytes / us / 1e6:6.2f} TB/s err {err:.1e}",
                  flush=True)
    meta = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(sys.argv)}
    (args.out / "split.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
