"""Unpack the H200-pair serving runs (benchmarks/disagg, Llama-3.1-8B shape) as calibration run
folders: steps.jsonl and summary.json of each, plus the run.json `costline calibrate` reads the
engine's flags from (those of `bench_h200x2.Plan`: synchronous scheduling, CUDA graphs FULL up to
512 tokens, 8,192-token budget, 256 sequences). Their small mixed graphs (a decode batch beside a
one-token admission or a short chunk) are what the calibration sweep lacked.

    python benchmarks/calibration/disagg_runs_for_fit.py runs/h200/llama-3.1-8b/sweep
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.disagg.bench_h200x2 import Plan

RUNS = ROOT / "benchmarks/disagg/data/h200x2/runs.tar.xz"
# the two-GPU runs' engine, with the scheduling limits it resolved to (max_num_seqs and the token
# budget left unset: the engine's defaults, 256 and 8,192)
ENGINE = Plan(dry=False).engine.model_copy(update={"max_num_seqs": 256, "max_num_batched_tokens": 8192})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the model's sweep folder (run folders go in as disagg-*)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(RUNS) as tar:
            tar.extractall(tmp, filter="data")
        for run in sorted((Path(tmp) / "runs").iterdir()):
            dst = a.out / f"disagg-{run.name}"
            dst.mkdir(exist_ok=True)
            for name in ("steps.jsonl", "summary.json"):
                (dst / name).write_bytes((run / name).read_bytes())
            info = {"name": dst.name, "purpose": "sweep", "model": ENGINE.model, "gpu": "h200",
                    "engine_args": ENGINE.model_dump(), "description": f"benchmarks/disagg run {run.name}"}
            (dst / "run.json").write_text(json.dumps(info, indent=2) + "\n")
            print(dst)


if __name__ == "__main__":
    main()
