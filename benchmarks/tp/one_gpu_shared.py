"""TP=2 on ONE GPU (issue 31): both ranks on the same H200, the model's collectives over gloo,
eager (gloo is not capturable), to run the TP > 1 GPU path (sharded Triton attention, the staging
bytes and copy plan replayed by the worker, the in-flight token broadcast, the vocab gather)
before two GPUs are lent. Not a speed measurement: gloo moves every collective through host memory.

  fp32   llama-3.2-1b shape, fp32: greedy tokens at TP=2 equal TP=1 (both eager), sync and async
         scheduling; collectives per forward = 2 x layers + 1 all-reduces, 1 all-gather
  bf16   llama-3.1-8b shape, bf16, async: share of greedy tokens equal to TP=1 (bf16 partial sums
         add in another order, so some divergence is expected), and the pickled step message's
         size per step (what the control broadcast carries)

    python benchmarks/tp/one_gpu_shared.py --out DIR             # one H200, <= 2 min (--budget-s 100)
    python benchmarks/tp/one_gpu_shared.py --dry-run --out DIR   # CPU, tiny model
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.tp.common import (
    Results,
    elapsed_s,
    environment,
    generate,
    log,
    prompts,
    start_clock,
)
from engine.core.config import EngineArgs
from engine.engine_loop import EngineCore
from engine.tp_worker import SHARE_DEVICE_ENV


def engine(model: str, tp: int, dtype: str, device: str, async_scheduling: bool) -> EngineCore:
    cfg = EngineArgs(model=model, device=device, dtype=dtype, seed=0, tensor_parallel_size=tp, enforce_eager=True,
                     usage_context="offline", async_scheduling=async_scheduling, enable_prefix_caching=True,
                     max_num_seqs=16, max_num_batched_tokens=256, max_model_len=1024, num_gpu_blocks_override=512,
                     block_size=16)
    return EngineCore(cfg, progress=lambda line: None)


def run(model: str, tp: int, dtype: str, device: str, async_scheduling: bool, n: int, tokens: int) -> dict:
    """Greedy tokens of `n` prompts (40 to 300 tokens: chunked by the 256-token budget) at `tp`."""
    core = engine(model, tp, dtype, device, async_scheduling)
    sizes: list[int] = []
    if core.tp is not None:  # the step messages' pickled size (this script's own instrument)
        send = core.tp.send
        core.tp.send = lambda msg: (sizes.append(len(pickle.dumps(msg))), send(msg))[1]
    try:
        out = generate(core, prompts(n, core.spec.vocab_size, seed=3, min_len=40, max_len=300), tokens)
        forwards = core.runner.num_eager_forwards
        counts = dict(core.tp.counts) if core.tp is not None else {}
    finally:
        core.close()
    del core
    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()
    return {"tokens": out, "forwards": forwards, "counts": counts,
            "message_bytes_p50": statistics.median(sizes) if sizes else None,
            "message_bytes_max": max(sizes) if sizes else None}


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of token positions equal up to each sequence's first divergence."""
    same = total = 0
    for x, y in zip(a, b):
        k = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), len(x))
        same, total = same + k, total + len(x)
    return same / total if total else 1.0


def fp32_phase(model: str, device: str, layers: int, n: int, tokens: int) -> dict:
    out = {}
    for async_scheduling in (False, True):
        one = run(model, 1, "float32", device, async_scheduling, n, tokens)
        two = run(model, 2, "float32", device, async_scheduling, n, tokens)
        key = "async" if async_scheduling else "sync"
        out[key] = {"tokens_equal": one["tokens"] == two["tokens"], "forwards": two["forwards"],
                    "counts": two["counts"],
                    "all_reduces_per_forward": two["counts"]["all_reduce"] / max(1, two["forwards"]),
                    "expected_per_forward": 2 * layers + 1,
                    "message_bytes_p50": two["message_bytes_p50"], "message_bytes_max": two["message_bytes_max"]}
        log(f"fp32 {key}: tokens equal {out[key]['tokens_equal']}")
    return out


def bf16_phase(model: str, device: str, n: int, tokens: int) -> dict:
    one = run(model, 1, "bfloat16", device, True, n, tokens)
    two = run(model, 2, "bfloat16", device, True, n, tokens)
    return {"token_agreement": agreement(one["tokens"], two["tokens"]), "forwards": two["forwards"],
            "message_bytes_p50": two["message_bytes_p50"], "message_bytes_max": two["message_bytes_max"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model")
    ap.add_argument("--budget-s", type=float, default=100.0, help="phases past this are skipped")
    a = ap.parse_args(argv)
    start_clock()
    os.environ[SHARE_DEVICE_ENV] = "1"  # inherited by the spawned worker
    device = "cpu" if a.dry_run else "cuda"
    fp32_model, bf16_model = ("tiny", "tiny") if a.dry_run else ("llama-3.2-1b", "llama-3.1-8b")
    from engine.core.model_spec import get_model

    layers = get_model(fp32_model).num_layers
    n, tokens = (4, 6) if a.dry_run else (12, 24)
    res = Results(a.out, {"script": "benchmarks/tp/one_gpu_shared.py", "argv": sys.argv[1:], "env": environment()})
    res.phase("fp32", lambda: fp32_phase(fp32_model, device, layers, n, tokens), a.budget_s)
    res.phase("bf16", lambda: bf16_phase(bf16_model, device, n, tokens), a.budget_s, min_left_s=35)
    res.data["elapsed_s"] = round(elapsed_s(), 1)
    res.save()
    log(f"done: {str(res.data['phases'].get('fp32'))[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
