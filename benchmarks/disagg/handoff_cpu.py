"""Hand-off latency of a 1:1 deployment on the CPU (gloo, tiny model): how long after a prompt's
first token the decode side posts its receive, how long the transfer then takes, and the
decode side's hand-over; requests spaced out so both instances are mostly idle (the low-load
case where a spinning instance loop starved its own queue feeder thread on the H200 pair).

    python benchmarks/disagg/handoff_cpu.py [--requests 40] [--gap-s 0.05] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.disagg.router import replay_disagg

ARGS = EngineArgs(model="tiny", device="cpu", max_model_len=256, block_size=4, num_gpu_blocks_override=64,
                  max_num_seqs=8, max_num_batched_tokens=64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--gap-s", type=float, default=0.05)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    reqs = [Request(i, a.gap_s * i, 40, 4, (10**6 + 3 * i, 10**6 + 3 * i + 1, 10**6 + 3 * i + 2))
            for i in range(a.requests)]
    res = replay_disagg(ARGS, reqs, split="1:1", warm_up=False, timeout_s=60, transfer_timeout_s=20)
    done = [t for t in res.transfers if t.status == "done"]
    parts = {"recv_posted_after_first_token_ms": [t.recv_start_s - t.ready_s for t in done],
             "transfer_ms": [t.transfer_s for t in done], "handover_ms": [t.handover_s for t in done]}
    out = {"requests": a.requests, "gap_s": a.gap_s, "transfers_done": len(done)}
    for name, xs in parts.items():
        ms = np.asarray(xs) * 1e3
        out[name] = {"p50": float(np.median(ms)), "p99": float(np.percentile(ms, 99)), "max": float(ms.max())}
        print(f"{name:34s} p50 {out[name]['p50']:6.2f}  p99 {out[name]['p99']:6.2f}  max {out[name]['max']:6.2f}")
    if a.out:
        a.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
