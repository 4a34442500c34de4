"""A step table with one row per engine step, for tests that compare the simulator's skip-ahead
rows with single steps."""

from __future__ import annotations

import math

import numpy as np

NAN = math.nan


def expand_step_rows(steps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One row per engine step: a row of n_steps equal decode steps becomes n rows with that
    composition (sum_decode_context growing by num_decode_seqs per step, max_decode_context by 1), per-step durations
    (linear from first_dt_s to last_dt_s; starts accumulate them) and num_output_tokens (each step of such a row emits one
    token per sequence). What a row only knows as a total stays unsplit: block counts stay on its
    first step (zero on the others), and the GPU/CPU split of its steps is NaN."""
    n = steps["n_steps"].astype(np.int64)
    idx = np.repeat(np.arange(n.size), n)
    i = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)  # position within the row
    k = n[idx]
    out = {c: v[idx] for c, v in steps.items()}
    out["n_steps"] = np.ones(idx.size, dtype=np.int64)
    out["step_id"] = out["step_id"] + i
    out["sum_decode_context"] = out["sum_decode_context"] + i * out["num_decode_seqs"]
    out["max_decode_context"] = out["max_decode_context"] + i * (out["num_decode_seqs"] > 0)
    dt = out["first_dt_s"] + (out["last_dt_s"] - out["first_dt_s"]) * i / np.maximum(k - 1, 1)
    out["total_s"], out["first_dt_s"], out["last_dt_s"] = dt, dt.copy(), dt.copy()
    before = np.cumsum(dt) - dt  # durations of the earlier steps, then of the earlier rows too
    out["t_start_s"] = out["t_start_s"] + before - np.repeat(before[np.cumsum(n) - n], n)
    out["num_output_tokens"] = out["num_output_tokens"] // k
    for c in ("gpu_s", "cpu_s", "propose_s"):
        out[c] = np.where(k > 1, NAN, out[c])
    for c in ("num_blocks_allocated", "num_blocks_hashed", "drafted", "accepted", "num_spec_accepted_tokens"):
        out[c] = np.where(i == 0, out[c], 0)
    return out
