"""A stand-in for Vidur's A100 / Llama-3-8B attention profile, for `vidur_side_by_side.py`.

Vidur (github microsoft/vidur, commit 7d47513) keeps its measured attention times in
`data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/attention.csv` (9.2 MB). The repository
snapshot reachable from the development machine has every `attention.csv` blob left out (the MLP
profiles, 1.2 MB, are there), and the file cannot be downloaded here. What could be read is a few
stretches of a stored copy of that file (a fork with the same 9,155,341-byte file); the rows below
are those measured values, median ms per layer, TP1, FLASHINFER backend, block size 16.

`write_standin` fits four small closed forms to them (least squares) and writes a CSV with the
columns and row layout Vidur's predictor reads, on a grid like the real file's. Vidur then trains
its own models on it exactly as on the real file. What this changes: Vidur's predicted attention
times (and so TTFT/TPOT and its number of batches) follow these fits instead of every measured
row; Vidur's simulation loop itself is untouched, as its predictor turns everything into lookup
tables before the loop starts.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

# Decode rows (kv_cache_size 768 or 800): (batch_size, kv_cache_size, attn_decode median ms).
DECODE_ROWS = [
    (1, 800, 0.024), (4, 800, 0.026), (7, 800, 0.034), (10, 800, 0.038), (15, 800, 0.051),
    (120, 768, 0.236), (128, 768, 0.258), (160, 768, 0.305), (200, 768, 0.378),
    (256, 768, 0.476), (320, 768, 0.592), (400, 768, 0.737), (512, 768, 0.929),
]
# Prefill rows, batch 1, kv_cache_size 0: (prefill_chunk_size, attn_prefill ms, kv_cache_save ms).
PREFILL_ROWS = [
    (2176, 0.344, 1.181), (2560, 0.445, 1.416), (3072, 0.602, 1.700), (4096, 0.961, 2.314),
    (5120, 1.423, 2.834), (6144, 2.008, 3.387), (8192, 3.398, 4.635), (10240, 5.133, 5.419),
    (12288, 7.219, 6.692),
]
# Prefill rows, batch 1, chunk 64 (from a stored 17.2 MB copy of a later revision, same layout):
# attn_prefill 0.011 ms at kv 0 and kv_cache_save 0.019 ms at every kv: the small-chunk floors.
PREFILL_FLOOR_MS = 0.011
KV_SAVE_SMALL_MS = 0.019
# Decode rows' kv_cache_save: 0.002-0.003 ms up to batch 15, 0.003-0.005 ms from batch 118 to 512.
DECODE_KV_SAVE_MS = (0.0025, 0.004)

HEADER_GROUPS = ("attn_input_reshape", "attn_kv_cache_save", "attn_prefill", "attn_decode",
                 "attn_output_reshape")
STATS = ("min", "max", "mean", "median", "std")
SHAPE_COLS = ("n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers",
              "max_model_len", "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
              "attention_backend")
LLAMA3_8B_SHAPE = (4096, 32, 8, 16, 1, 16384)


def fit_decode() -> tuple[float, float]:
    """attn_decode = a + b * batch * kv (memory bound: every KV byte read once)."""
    b, kv, t = (np.array(c, dtype=float) for c in zip(*DECODE_ROWS, strict=True))
    coef, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(t), b * kv]), t, rcond=None)
    return float(coef[0]), float(coef[1])


def fit_prefill() -> tuple[float, float, float]:
    """attn_prefill(kv 0) = c0 + c1 * chunk + c2 * chunk^2 (causal attention over the chunk)."""
    c, t, _ = (np.array(x, dtype=float) for x in zip(*PREFILL_ROWS, strict=True))
    coef, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(t), c, c * c]), t, rcond=None)
    return float(coef[0]), float(coef[1]), float(coef[2])


def fit_kv_save() -> float:
    """kv_cache_save of a prefill chunk: ms per token through the origin (large chunks)."""
    c, _, s = (np.array(x, dtype=float) for x in zip(*PREFILL_ROWS, strict=True))
    return float((c @ s) / (c @ c))


def _row(batch: int, chunk: int, kv: int, kv_save: float, prefill: float, decode: float) -> list:
    vals = {"attn_kv_cache_save": kv_save, "attn_prefill": prefill, "attn_decode": decode}
    stats = [v for g in HEADER_GROUPS for v in [round(vals.get(g, 0.0), 6)] * 4 + [0.0]]
    return stats + [*LLAMA3_8B_SHAPE, batch, chunk, kv, chunk > 0, "AttentionBackend.FLASHINFER"]


def standin_rows() -> list[list]:
    """The grid: decode batch x kv, prefill chunk (kv 0) and chunked prefill chunk x kv."""
    a, b = fit_decode()
    c0, c1, c2 = fit_prefill()
    # A chunk after kv cached tokens: each (chunk token, earlier token) pair costs what a pair
    # inside the causal square costs (2 * c2: chunk^2 / 2 pairs there).
    per_tok, pair = fit_kv_save(), 2 * c2
    decode_floor = min(t for *_, t in DECODE_ROWS)
    rows = []
    for batch in [*range(1, 16), *range(16, 513, 8)]:
        save = DECODE_KV_SAVE_MS[0] if batch < 64 else DECODE_KV_SAVE_MS[1]
        for kv in (16, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384):
            rows.append(_row(batch, 0, kv, save, 0.0, max(decode_floor, a + b * batch * kv)))
    for chunk in range(64, 16385, 64):
        base = max(PREFILL_FLOOR_MS, c0 + c1 * chunk + c2 * chunk * chunk)
        save = max(KV_SAVE_SMALL_MS, per_tok * chunk)
        rows.append(_row(1, chunk, 0, save, base, 0.0))
        if chunk in (64, 128, 256, 512, 1024, 2048, 4096):
            for kv in range(512, 16385, 512):
                rows.append(_row(1, chunk, kv, save, base + pair * chunk * kv, 0.0))
    return rows


def write_standin(path: Path) -> dict:
    """Write the stand-in CSV; return the fitted constants (for the results JSON)."""
    header = [f"time_stats.{g}.{s}" for g in HEADER_GROUPS for s in STATS] + list(SHAPE_COLS)
    rows = standin_rows()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    a, b = fit_decode()
    c0, c1, c2 = fit_prefill()
    return {"rows": len(rows), "decode_ms": {"a": a, "b_per_batch_x_kv": b},
            "prefill_ms_kv0": {"c0": c0, "c1": c1, "c2": c2},
            "kv_cache_save_ms_per_token": fit_kv_save(),
            "chunked_prefill_ms_per_chunk_x_kv": 2 * c2}
