#!/usr/bin/env python3
"""FP8 decode attention: the `words` conversion against the shipped `fp16` one, in a minute.

bench_h200.py's focused fp8 sweep spends most of a short budget on compilation before it times
a config; this probe times a handful of configs per variant (CUDA-graph replays, Llama-3.1-8B
layer, block 16) beside the bf16 cache's default, checks each fp8 output against the shipped
fp8 config's, and reports fp8/bf16 tokens/s.

    python3 benchmarks/kernels/bench_fp8_words.py --out DIR          # H200
    python3 benchmarks/kernels/bench_fp8_words.py --dry-run --out DIR  # CPU interpreter
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
from benchmarks.kernels.bench_split import D, make_batch, time_us

CONFIGS = [  # fp8_convert, tile_n, num_stages, num_warps; the first is the shipped default
    ("fp16", 128, 4, 4), ("words", 128, 3, 4), ("words", 256, 3, 4), ("words", 128, 3, 8),
    ("words", 256, 3, 8), ("words", 128, 2, 4), ("fp16", 256, 2, 4),
]


def fp8_batch(b: dict) -> dict:
    """The same batch with e4m3 caches (per-tensor scales amax / 448)."""
    out = dict(b)
    for name in ("k", "v"):
        scale = (b[name].abs().amax().float() / 448.0).reshape(1)
        out[name] = (b[name].float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        out[name + "_scale"] = scale
    return out


def call(b: dict, config: pa.AttentionConfig | None, out: torch.Tensor) -> torch.Tensor:
    kw = {"k_scale": b["k_scale"], "v_scale": b["v_scale"]} if "k_scale" in b else {}
    return pa.paged_attention(b["q"], b["k"], b["v"], b["bt"], b["seq_lens"], b["qsl"], D**-0.5, 1,
                              b["max_seq_len"], out=out, config=config, **kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--budget-s", type=float, default=100.0)
    args = ap.parse_args()
    t0 = time.time()
    if args.dry_run:
        from kernels import _interpreter_compat
        _interpreter_compat.apply()
    device = "cpu" if args.dry_run else "cuda"
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    shapes = {"2x64": [64, 64]} if args.dry_run else {"64x4096": [4096] * 64, "8x4096": [4096] * 8,
                                                      "32x32768": [32768] * 32}
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, lens in shapes.items():
        b16 = make_batch(lens, device, dtype)
        b8 = fp8_batch(b16)
        bf16_us = time_us(functools.partial(call, b16, None, torch.empty_like(b16["q"])), args.dry_run)
        ref = None
        for conv, tile, stages, warps in CONFIGS:
            if time.time() - t0 > args.budget_s:
                print(f"budget spent: {name} {conv} {tile} not timed", flush=True)
                break
            cfg = pa.AttentionConfig(16, tile, warps, stages, fp8_convert=conv)
            out = torch.empty_like(b8["q"])
            got = call(b8, cfg, out).float().clone()
            ref = got if ref is None else ref
            err = float((got - ref).abs().max())
            us = time_us(functools.partial(call, b8, cfg, out), args.dry_run)
            row = {"shape": name, "fp8_convert": conv, "tile_n": tile, "num_stages": stages,
                   "num_warps": warps, "us": us, "bf16_us": bf16_us, "fp8_over_bf16": bf16_us / us,
                   "max_abs_diff_vs_shipped": err}
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv)}
    (args.out / "fp8_words.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
