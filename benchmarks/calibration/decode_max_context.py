"""Evidence for the largest residual of `costline validate`: decode steps cost what their LONGEST
sequence costs, not what their summed context costs.

The step trace records each step's batch and summed context, not its longest sequence; this script
rebuilds the longest context of every decode-only step from the request table (a request decodes
from its first token to its finish; its context grows from its prompt to prompt + outputs) and
compares how well each explains the step's GPU time (CUDA events).

    python3 benchmarks/calibration/decode_max_context.py /work/gpudata/h200/*/validation/chat-*
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sim.validate import read_steps

MIN_BATCH = 17  # well past 9, from which the decode kernel no longer splits the KV (docs/validation.md)
BINS_TOKENS = ((0, 4096), (4096, 8192), (8192, 12288), (12288, 1 << 20))


@dataclass(frozen=True, slots=True)
class DecodeSteps:
    batch: np.ndarray
    sum_context: np.ndarray
    max_context: np.ndarray
    gpu_ms: np.ndarray


def _column(rows: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if r[key] is None else r[key] for r in rows], dtype=np.float64)


def decode_steps(run_dir: Path) -> DecodeSteps:
    """Decode-only steps of batch >= MIN_BATCH with their rebuilt longest context."""
    s = read_steps(run_dir / "steps.jsonl")
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
    first, finish = _column(rows, "first_token_s"), _column(rows, "finish_s")
    prompt, outputs = _column(rows, "prompt_len"), _column(rows, "num_output_tokens")
    sel = (s["num_prefill_tokens"] == 0) & (s["num_decode_seqs"] >= MIN_BATCH)
    t = s["t_start_s"][sel]
    running = (first[None, :] <= t[:, None]) & (t[:, None] < finish[None, :])
    done = np.clip((t[:, None] - first[None, :]) / np.maximum(finish - first, 1e-9)[None, :], 0, 1)
    longest = np.where(running, prompt[None, :] + done * outputs[None, :], 0).max(axis=1)
    ok = np.abs(running.sum(axis=1) - s["num_decode_seqs"][sel]) <= 2  # the rebuilt batch is the step's
    return DecodeSteps(s["num_decode_seqs"][sel][ok], s["sum_decode_context"][sel][ok], longest[ok],
                       s["gpu_s"][sel][ok] * 1e3)


def report(run_dir: Path) -> list[str]:
    d = decode_steps(run_dir)
    if d.batch.size < 10:
        return [f"{run_dir}: fewer than 10 decode-only steps of batch >= {MIN_BATCH}"]
    corr = {name: float(np.corrcoef(d.gpu_ms, x)[0, 1]) for name, x in
            (("longest context", d.max_context), ("summed context", d.sum_context), ("batch", d.batch))}
    lines = [f"{run_dir.parent.parent.name}/{run_dir.name}: {d.batch.size} decode-only steps of batch >= "
             f"{MIN_BATCH}; correlation of GPU time with " + ", ".join(f"{k} {v:.2f}" for k, v in corr.items())]
    for lo, hi in BINS_TOKENS:
        m = (d.max_context >= lo) & (d.max_context < hi)
        if m.sum() >= 5:
            lines.append(f"  longest {lo // 1024}-{min(hi, 20480) // 1024}K: {m.sum():5d} steps, batch p50 "
                         f"{np.median(d.batch[m]):.0f}, mean context p50 {np.median(d.sum_context[m] / d.batch[m]):,.0f}, "
                         f"GPU p50 {np.median(d.gpu_ms[m]):.2f} ms")
    return lines


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print("\n".join(report(Path(arg))))
