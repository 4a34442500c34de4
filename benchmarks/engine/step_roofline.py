"""Measured GPU time of each engine step against its naive roofline, by kind of step.

The naive roofline of a step is every byte it must move at the copy bandwidth plus every FLOP it
must do at the bf16 matmul rate, added (no overlap credited):

    (weight bytes + KV bytes read + KV bytes written) / bandwidth + (GEMM + attention FLOPs) / rate

with the terms of `sim.cost_model.Roofline` (weights read once, KV bytes per token, matmul FLOPs per
token and per sampled row, attention FLOPs per (query, key) pair), priced at the measured rates of
the H200 machines (4.2 TB/s copy, 790 TFLOP/s bf16 matmul; flags override). Decode batches count
their real sequences, not the CUDA graph's padding: the padding is part of what the ratio measures.

Reads engine run folders (steps.jsonl[.gz] + run.json, as benchmarks/calibration/gpu_sweep.py
writes them) and prints and writes the ratio gpu_s / roofline by step kind: decode-only by batch,
mixed prefill+decode by the step's prefill-chunk tokens, prefill-only; median, p90 and counts.

    python3 benchmarks/engine/step_roofline.py runs/h200/llama-3.1-8b/sweep/* \
        --out benchmarks/engine/results/step_roofline_before_8b
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.core.model_spec import get_model
from engine.core.outputs import OutputPathError, check_output_file, staged_file
from sim.calibrate import WARMUP_STEPS, CalibrationInputError, load_run
from sim.config import EngineConfig
from sim.cost_model import Roofline
from sim.hardware import GPUSpec, get_gpu

COPY_TB_PER_S = 4.2  # device-to-device copy measured on the H200 machines (RESULTS.md runs 4-7)
MATMUL_TFLOPS = 790.0  # bf16 GEMM measured there
DECODE_BATCH_EDGES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # bin i: [edge_i, edge_i+1)
CHUNK_EDGES = (0, 64, 128, 256, 512, 1024, 2048)  # prefill-chunk tokens of a mixed step
KINDS = ("decode", "mixed", "prefill")


@dataclass(frozen=True, slots=True)
class RatioRow:
    """The ratio gpu_s / roofline of one bin of steps."""

    kind: str  # decode | mixed | prefill
    bin: str  # batch range (decode), prefill-chunk tokens (mixed, prefill)
    count: int
    median: float
    p90: float
    weighted: float  # sum of gpu_s / sum of rooflines: the ratio of the bin's total time
    roofline_ms_median: float
    gpu_ms_median: float


def rates(model: str, copy_tb_per_s: float, matmul_tflops: float, gpu: str = "h200") -> Roofline:
    """`Roofline` terms of `model` at the given copy bandwidth and matmul rate."""
    spec: GPUSpec = get_gpu(gpu).model_copy(update={"hbm_gb_per_s": copy_tb_per_s * 1000,
                                                    "bf16_tflops": matmul_tflops, "fp8_tflops": None})
    return Roofline.of(get_model(model), spec, EngineConfig())


def roofline_s(steps: dict[str, np.ndarray], r: Roofline) -> np.ndarray:
    """Each step's naive roofline in seconds (bytes / bandwidth + FLOPs / rate)."""
    g = steps
    tokens = g["num_prefill_tokens"] + g["num_decode_tokens"]
    rows = g["num_prefill_seqs"] + g["num_decode_tokens"]  # rows through the LM head
    q_per_seq = np.where(g["num_decode_seqs"] > 0, g["num_decode_tokens"] / np.maximum(g["num_decode_seqs"], 1), 0.0)
    pairs = g["prefill_attn_pairs"] + q_per_seq * g["sum_decode_context"]
    kv_tokens = g["sum_prefill_context"] + g["sum_decode_context"] + tokens  # read + written
    memory_s = r.weights_s + r.kv_s_per_token * kv_tokens
    compute_s = r.gemm_s_per_token * tokens + r.gemm_s_per_row * rows + r.attn_s_per_pair * pairs
    return memory_s + compute_s


def step_kind(steps: dict[str, np.ndarray]) -> np.ndarray:
    """'decode' (no prefill tokens), 'prefill' (no decodes), 'mixed' (both); '' for empty steps."""
    pre, dec = steps["num_prefill_tokens"] > 0, steps["num_decode_seqs"] > 0
    return np.where(pre & dec, "mixed", np.where(pre, "prefill", np.where(dec, "decode", "")))


def _bin_labels(edges: tuple[int, ...]) -> list[str]:
    labels = [f"{lo}-{hi - 1}" if hi - 1 > lo else f"{lo}" for lo, hi in itertools.pairwise(edges)]
    return [*labels, f">={edges[-1]}"]


def _bin_of(x: np.ndarray, edges: tuple[int, ...]) -> np.ndarray:
    return np.searchsorted(np.asarray(edges), x, side="right") - 1


def ratio_table(kind: np.ndarray, batch: np.ndarray, chunk: np.ndarray, gpu_s: np.ndarray,
                roof_s: np.ndarray) -> list[RatioRow]:
    """Median / p90 of gpu_s / roofline per kind and bin (bins with no step are left out)."""
    ratio = gpu_s / roof_s
    ok = np.isfinite(ratio)
    out: list[RatioRow] = []
    for k in KINDS:
        edges = DECODE_BATCH_EDGES if k == "decode" else CHUNK_EDGES
        bins = _bin_of(batch if k == "decode" else chunk, edges)
        for i, label in enumerate(_bin_labels(edges)):
            if (m := (kind == k) & (bins == i) & ok).any():
                out.append(_row(k, label, ratio[m], gpu_s[m], roof_s[m]))
        if (m := (kind == k) & ok).any():
            out.append(_row(k, "all", ratio[m], gpu_s[m], roof_s[m]))
    return out


def _row(kind: str, label: str, ratio: np.ndarray, gpu_s: np.ndarray, roof_s: np.ndarray) -> RatioRow:
    return RatioRow(kind=kind, bin=label, count=int(ratio.size), median=float(np.median(ratio)),
                    p90=float(np.percentile(ratio, 90)), weighted=float(gpu_s.sum() / roof_s.sum()),
                    roofline_ms_median=float(np.median(roof_s) * 1e3), gpu_ms_median=float(np.median(gpu_s) * 1e3))


@dataclass(slots=True)
class Steps:
    """The steps of every run read, concatenated (warm-up steps of each run dropped)."""

    kind: np.ndarray
    batch: np.ndarray  # decoding sequences
    chunk: np.ndarray  # prefill tokens
    gpu_s: np.ndarray
    roof_s: np.ndarray
    runs: list[str]
    model: str


def read_runs(folders: list[Path], model: str | None, r_args: tuple[float, float], warmup: int) -> Steps:
    """Every folder's steps with their roofline; the model comes from run.json unless given."""
    parts: list[tuple[np.ndarray, ...]] = []
    names: list[str] = []
    models: set[str] = set()
    for folder in folders:
        run = load_run(folder)
        m = model or (run.run_info or {}).get("model")
        if not m:
            raise CalibrationInputError(f"{folder}: run.json names no model; pass --model")
        models.add(m)
        s = {c: v[warmup:] for c, v in run.steps.items()}
        parts.append((step_kind(s), s["num_decode_seqs"], s["num_prefill_tokens"], s["gpu_s"],
                      roofline_s(s, rates(m, *r_args))))
        names.append(run.name)
    if len(models) > 1:
        raise CalibrationInputError(f"runs of several models ({', '.join(sorted(models))}): pass one model's runs")
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    return Steps(*cols, runs=names, model=models.pop())


def markdown(rows: list[RatioRow], title: str) -> str:
    lines = [f"## {title}", "", "| kind | bin | steps | median | p90 | total time ratio | roofline ms (median) | gpu ms (median) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        label = r.bin if r.bin == "all" else f"batch {r.bin}" if r.kind == "decode" else f"chunk {r.bin}"
        lines.append(f"| {r.kind} | {label} | {r.count} | {r.median:.2f} | {r.p90:.2f} | {r.weighted:.2f} | "
                     f"{r.roofline_ms_median:.3f} | {r.gpu_ms_median:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="engine run folders (steps.jsonl[.gz] + run.json)")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    ap.add_argument("--model", help="model preset (default: run.json's)")
    ap.add_argument("--copy-tb-per-s", type=float, default=COPY_TB_PER_S)
    ap.add_argument("--matmul-tflops", type=float, default=MATMUL_TFLOPS)
    ap.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS, help="steps dropped at each run's start")
    ap.add_argument("--force", action="store_true", help="overwrite existing OUT.json / OUT.md")
    a = ap.parse_args(argv)
    folders = [p for p in a.runs if p.is_dir() or p.is_file()]
    try:
        steps = read_runs(folders, a.model, (a.copy_tb_per_s, a.matmul_tflops), a.warmup_steps)
    except CalibrationInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = ratio_table(steps.kind, steps.batch, steps.chunk, steps.gpu_s, steps.roof_s)
    title = (f"{steps.model}: measured gpu_s / naive roofline ({a.copy_tb_per_s} TB/s, {a.matmul_tflops} TFLOP/s; "
             f"{len(steps.runs)} runs)")
    md = markdown(rows, title)
    print(md)
    if a.out:
        return write(a.out, rows, steps, a, md)
    return 0


def write(out: Path, rows: list[RatioRow], steps: Steps, a: argparse.Namespace, md: str) -> int:
    """OUT.json and OUT.md; an existing file is refused unless --force."""
    doc = {"model": steps.model, "copy_tb_per_s": a.copy_tb_per_s, "matmul_tflops": a.matmul_tflops,
           "warmup_steps_dropped_per_run": a.warmup_steps, "runs": steps.runs, "rows": [asdict(r) for r in rows]}
    texts = {out.with_name(out.name + ".json"): json.dumps(doc, indent=1) + "\n", out.with_name(out.name + ".md"): md}
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        paths = [check_output_file(p, flag="--out", force=a.force, inputs=a.runs) for p in texts]
    except OutputPathError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path, text in zip(paths, texts.values(), strict=True):
        with staged_file(path) as tmp:
            tmp.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
