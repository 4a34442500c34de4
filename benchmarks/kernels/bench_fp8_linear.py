#!/usr/bin/env python3
"""FP8 weights (`--quantization fp8`) on the H200: the GEMM and the whole linear by M, and accuracy.

Part 1, speed (Llama-3.1-8B's four projections, M = 1 .. 8192 tokens; CUDA-graph replays of 20
calls each, so small-M launch costs count as they do inside the engine's graphs):
  bf16           F.linear (cuBLAS)
  gemm_row       torch._scaled_mm alone, per-token activation scales x per-tensor weight scale
  gemm_row_fast  the same with use_fast_accum (Hopper's FP8 accumulation without fp32 promotion)
  gemm_tensor(_fast)  per-tensor activation scale (vLLM's default dynamic scheme)
  quant          kernels.fp8_linear.quantize_fp8_tensor alone (two Triton kernels and a memset)
  path_ref       kernels.reference.linear_fp8_ref: per-tensor quantization in torch ops, gemm_tensor
  path           kernels.fp8_linear.linear_fp8, the engine's (Triton quantization, gemm_tensor_fast)
  path_exact     the same without fast accumulation
Each FP8 output is checked against the float64 product of its own quantized operands.
(Run 9 of benchmarks/kernels/NOTES.md timed an earlier version: per-token Triton quantization +
gemm_row as `path`/`path_fast`; its data keeps those names.)

Part 2, accuracy: the byte-level target (byte-lm-100m) trained here for --train-s seconds, then
its logits with bf16 weights against the same model with FP8 weights (engine/quant.py) on
held-out windows of each task: relative logits error, top-1 agreement (teacher forced), and
bits per byte of both.

    python3 benchmarks/kernels/bench_fp8_linear.py --out DIR            # H200, ~3 min
    python3 benchmarks/kernels/bench_fp8_linear.py --out DIR --dry-run  # CPU interpreter, tiny
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
GRAPH_CALLS = 20


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--train-s", type=float, default=60.0)
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--no-accuracy", action="store_true", help="skip the training and accuracy part")
    return p.parse_args()


ARGS = parse_args()
if ARGS.dry_run:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

from kernels import _interpreter_compat
from kernels.fp8_linear import linear_fp8, quantize_fp8_tensor
from kernels.reference import FP8_MAX, linear_fp8_ref, quantize_fp8_rows

_interpreter_compat.apply()
DEVICE = "cpu" if ARGS.dry_run else "cuda"
T0 = time.time()
RESULTS: dict = {"meta": {}, "gemm": [], "accuracy": {}, "errors": []}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save() -> None:
    ARGS.out.mkdir(parents=True, exist_ok=True)
    (ARGS.out / "fp8_linear.json").write_text(json.dumps(RESULTS, indent=1) + "\n")


def time_us(fn) -> float:
    """Median microseconds per call: CUDA-graph replays of GRAPH_CALLS calls (CPU: one call)."""
    if DEVICE == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / GRAPH_CALLS)
    del g
    return sorted(times)[len(times) // 2]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _variants(x, w, wq, ws_row, ws_t, xq, xs, xq_t, xs_t) -> dict:
    """The timed calls of one (shape, M), by name."""
    dtype = x.dtype
    return {
        "bf16": lambda: F.linear(x, w),
        "gemm_row": lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws_row, out_dtype=dtype),
        "gemm_row_fast": lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws_row, out_dtype=dtype,
                                                  use_fast_accum=True),
        "gemm_tensor": lambda: torch._scaled_mm(xq_t, wq.t(), scale_a=xs_t, scale_b=ws_t, out_dtype=dtype),
        "gemm_tensor_fast": lambda: torch._scaled_mm(xq_t, wq.t(), scale_a=xs_t, scale_b=ws_t,
                                                     out_dtype=dtype, use_fast_accum=True),
        "quant": lambda: quantize_fp8_tensor(x),
        "path_ref": lambda: linear_fp8_ref(x, wq, ws_t),
        "path": lambda: linear_fp8(x, wq, ws_t, fast_accum=True),
        "path_exact": lambda: linear_fp8(x, wq, ws_t, fast_accum=False),
    }


def bench_shape(name: str, k: int, n: int, ms) -> None:
    g = torch.Generator(device=DEVICE).manual_seed(hash(name) % 1000)
    dtype = torch.bfloat16
    w = (torch.randn(n, k, device=DEVICE, generator=g) * 0.02).to(dtype)
    w_scale = w.abs().amax().float() / FP8_MAX
    wq = (w.float() / w_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    ws_row = w_scale.reshape(1, 1).expand(1, n).contiguous()  # the row-wise form of the same scale
    ws_t = w_scale.reshape(())
    w_deq = wq.double() * w_scale.double()
    for m in ms:
        if time.time() - T0 > ARGS.budget_s:
            RESULTS["errors"].append(f"budget spent before {name} M={m}")
            return
        x = torch.randn(m, k, device=DEVICE, generator=g).to(dtype)
        xq, xs = quantize_fp8_rows(x)
        xq_t, xs_t = quantize_fp8_tensor(x)
        row: dict = {"proj": name, "K": k, "N": n, "M": m}
        variants = _variants(x, w, wq, ws_row, ws_t, xq, xs, xq_t, xs_t)
        exact_row = (xq.double() * xs.double()) @ w_deq.t()
        exact_t = (xq_t.double() * xs_t.double()) @ w_deq.t()
        for v, fn in variants.items():
            try:
                out = fn()
                if v.startswith("gemm_row"):
                    row[f"{v}_rel_err"] = rel(out, exact_row)
                elif v.startswith(("gemm_tensor", "path")):
                    row[f"{v}_rel_err"] = rel(out, exact_t)
                row[f"{v}_us"] = time_us(fn)
            except Exception as exc:  # noqa: BLE001
                RESULTS["errors"].append(f"{name} M={m} {v}: {exc!r}"[:400])
        for v in variants:
            if v != "bf16" and f"{v}_us" in row and "bf16_us" in row:
                row[f"{v}_speedup"] = row["bf16_us"] / row[f"{v}_us"]
        RESULTS["gemm"].append(row)
        log(f"{name} M={m}: bf16 {row.get('bf16_us', math.nan):.1f} us; gemm row x{row.get('gemm_row_speedup', math.nan):.2f}"
            f" fast x{row.get('gemm_row_fast_speedup', math.nan):.2f} tensor x{row.get('gemm_tensor_speedup', math.nan):.2f}"
            f" tfast x{row.get('gemm_tensor_fast_speedup', math.nan):.2f}; path ref x{row.get('path_ref_speedup', math.nan):.2f}"
            f" path x{row.get('path_speedup', math.nan):.2f} exact x{row.get('path_exact_speedup', math.nan):.2f}")
        save()


def one_sequence(model, n: int):
    from engine.attention import AttentionMetadata

    s = model.spec
    blocks = -(-n // 16)
    kv = torch.zeros(s.num_layers, 2, blocks, 16, s.num_kv_heads, s.head_dim, device=DEVICE, dtype=model.dtype)
    meta = AttentionMetadata(slot_mapping=torch.arange(n, device=DEVICE),
                             block_tables=torch.arange(blocks, device=DEVICE).reshape(1, blocks).int(),
                             seq_lens=torch.tensor([n], dtype=torch.int32, device=DEVICE),
                             query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=DEVICE),
                             max_query_len=n, max_seq_len=n)
    return kv, meta


@torch.inference_mode()
def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    n = ids.numel()
    kv, meta = one_sequence(model, n)
    h = model(ids, torch.arange(n, device=DEVICE), kv, meta)
    return model.compute_logits(h).float()


def accuracy() -> None:
    """Train the byte-level target briefly, then bf16 weights against FP8 weights on held-out text."""
    from benchmarks.spec_decode import corpora, train_pair
    from engine.core.model_spec import get_model
    from engine.loader import load_model
    from engine.quant import quantize_fp8

    dev = torch.device(DEVICE)
    spec = train_pair.TINY_TARGET if ARGS.dry_run else get_model("byte-lm-100m")
    cfg = train_pair.TINY_TRAIN if ARGS.dry_run else train_pair.TrainConfig()
    model, report = train_pair.train(spec, cfg, ARGS.train_s, dev, max_steps=3 if ARGS.dry_run else None, log=log)
    folder = Path("/tmp/fp8_accuracy_target")
    train_pair.export(model, folder)
    del model
    backend = "torch" if ARGS.dry_run else "triton"
    dtype = torch.float32 if ARGS.dry_run else torch.bfloat16
    ref = load_model(folder, device=dev, dtype=dtype, attention_backend=backend)
    fp8 = load_model(folder, device=dev, dtype=dtype, attention_backend=backend)
    quantize_fp8(fp8)
    data = train_pair.Batches(dev, 128 if ARGS.dry_run else 1024, 1, seed=99, held_out=True)
    out: dict = {"train": {"steps": report.steps, "train_s": report.train_s,
                           "held_out_bits_per_byte": report.held_out_bits_per_byte}}
    windows = 2 if ARGS.dry_run else 8
    for task in corpora.TASKS:
        errs, agree, total, bits = [], 0, 0, {"bf16": 0.0, "fp8": 0.0}
        for w in data.windows(task, windows):
            ids, nxt = w[:-1], w[1:]
            a, b = logits_of(ref, ids), logits_of(fp8, ids)
            errs.append(rel(b, a))
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += ids.numel()
            for key, lg in (("bf16", a), ("fp8", b)):
                bits[key] += float(F.cross_entropy(lg, nxt, reduction="sum")) / math.log(2)
        out[task] = {"logits_rel_err_mean": sum(errs) / len(errs), "logits_rel_err_max": max(errs),
                     "top1_agreement": agree / total, "bits_per_byte_bf16": bits["bf16"] / total,
                     "bits_per_byte_fp8": bits["fp8"] / total, "positions": total}
        log(f"accuracy {task}: {json.dumps(out[task])}")
    RESULTS["accuracy"] = out
    save()


def main() -> None:
    RESULTS["meta"] = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
                       "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "command": " ".join(["python3", *sys.argv]), "graph_calls": GRAPH_CALLS}
    try:
        import triton
        RESULTS["meta"]["triton"] = triton.__version__
    except ImportError:
        pass
    shapes = {"tiny": (64, 32)} if ARGS.dry_run else SHAPES
    ms = (1, 16) if ARGS.dry_run else MS
    for name, (k, n) in shapes.items():
        bench_shape(name, k, n, ms)
    try:
        if not ARGS.no_accuracy:
            accuracy()
    except Exception as exc:  # noqa: BLE001
        RESULTS["errors"].append(f"accuracy: {exc!r}"[:600])
        log(f"accuracy failed: {exc!r}")
    save()
    log(f"done; errors: {RESULTS['errors']}")


if __name__ == "__main__":
    main()
