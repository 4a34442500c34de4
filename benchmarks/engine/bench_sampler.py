"""Random sampling of one step: the sampler's batched draw (one counter-based number per row,
its CDF inverted: every random row in a few kernels) against the per-row draw it replaced (a
torch.Generator per request, ~5 kernels per row), same logits, in one run; prints the median ms
of each and their ratio as JSON. CPU, 2 cores, vocab 151,936 (2026-12-03): 64 rows 152 vs 940 ms
(6.2x), 8 rows 44 vs 123 ms (2.8x). H200 (torch 2.11, 2026-12-03, `--device cuda --repeat 50`): with the
numbers hashed on the device, 8 rows 0.65 vs 0.54 ms (0.82x: ~40 small launches and host copies cost more
than 8 rows of draws) and 64 rows 0.82 vs 3.99 ms (4.9x); with them hashed on the host and sent up with the
temperatures in one copy (the sampler now), 8 rows 0.49 vs 0.80 ms (1.6x), 64 rows 0.88 vs 6.65 ms (7.6x)
(per-row times vary 15-45% between machines of the same kind: compare the ratios).

    python benchmarks/engine/bench_sampler.py --rows 64 --vocab 151936 [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from engine.sampling import Sampler, SamplingParams


def per_row_draw(logits: torch.Tensor, generators: list[torch.Generator], temperature: float) -> torch.Tensor:
    """The previous sampler's loop: one row at a time, each with its own generator."""
    tokens = logits.argmax(dim=-1)
    for i, g in enumerate(generators):
        probs = (logits[i].float() / temperature).softmax(-1)
        noise = torch.empty_like(probs).exponential_(generator=g)
        tokens[i] = (probs / noise).argmax()
    return tokens


def timed_ms(fn, device: torch.device, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    device = torch.device(a.device)
    torch.manual_seed(0)
    logits = torch.randn(a.rows, a.vocab, device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(a.rows)]
    sampler = Sampler(device)
    for i, p in enumerate(params):
        sampler.add_request(i, p)
    ids = list(range(a.rows))
    gens = [torch.Generator(device=device).manual_seed(i) for i in range(a.rows)]
    batched = timed_ms(lambda: sampler.sample(logits, ids, params), device, a.repeat)
    per_row = timed_ms(lambda: per_row_draw(logits, gens, 1.0), device, a.repeat)
    print(json.dumps({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                      "torch": torch.__version__, "rows": a.rows, "vocab": a.vocab,
                      "batched_ms": round(batched, 3), "per_row_ms": round(per_row, 3),
                      "per_row_over_batched": round(per_row / batched, 2),
                      "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}))


if __name__ == "__main__":
    main()
