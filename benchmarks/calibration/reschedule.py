"""Reconstruct `max_decode_context` for engine run folders recorded before the column existed.

Re-runs the shared scheduler on each run's requests (sim/calibrate.py `reschedule`), checks every
step's batch composition against the recorded row, and writes `steps_maxctx.jsonl` (step_id,
max_decode_context) into the folders it reproduces exactly; `costline calibrate` merges that file.

    python3 benchmarks/calibration/reschedule.py /work/gpudata/h200/*/sweep/* [--force]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sim.calibrate import RECONSTRUCTED_STEPS_FILE, reschedule


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--force", action="store_true", help="overwrite an existing steps_maxctx.jsonl")
    a = ap.parse_args()
    exact = 0
    for folder in a.folders:
        r = reschedule(folder)
        where = "exact" if r.exact else f"differs from step index {r.first_mismatch} ({r.mismatched_column})"
        print(f"{folder}: {r.num_recorded_steps} steps, {where}")
        if not r.exact:
            continue
        exact += 1
        out = folder / RECONSTRUCTED_STEPS_FILE
        if out.exists() and not a.force:
            print(f"  {out} exists; pass --force to overwrite")
            continue
        out.write_text("".join(json.dumps({"step_id": s["step_id"], "max_decode_context": s["max_decode_context"]})
                               + "\n" for s in r.steps))
    print(f"{exact} of {len(a.folders)} runs reproduced exactly")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
