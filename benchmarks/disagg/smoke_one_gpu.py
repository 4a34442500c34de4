"""Disaggregated prefill's GPU paths on ONE GPU: both instances on cuda:0, KV over CUDA IPC.

The two-GPU machine was not lent when this was written; this checks what one GPU can: the
instances' CUDA engines (graphs, warm-up) in their own processes, the KV gather on the prefill
side, the IPC hand-off and the scatter into the decode side's blocks, hold/release of the
prefill's blocks, and greedy tokens equal to an aggregated instance on the same GPU. The copy
is device-local (HBM to HBM), so its GB/s say nothing about NVLink or a NIC; the per-transfer
fixed cost and the decode side's hand-over time are the part that carries over.

    python benchmarks/disagg/smoke_one_gpu.py --out DIR            # one GPU, ~2-3 minutes
    python benchmarks/disagg/smoke_one_gpu.py --out DIR --dry-run  # CPU, tiny model, gloo
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.disagg.router import Deployment


def requests(prompt_lens: list[int], output_len: int, rate: float, seed: int = 0) -> list[Request]:
    """Poisson arrivals, prompts of the given lengths in turn, distinct contents (no prefix hits)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, len(prompt_lens)))
    out = []
    for i, n in enumerate(prompt_lens):
        nb = -(-n // 16)
        out.append(Request(i, float(t[i]), n, output_len, tuple(range(10**7 + i * 10**4, 10**7 + i * 10**4 + nb))))
    return out


def transfer_stats(run) -> dict:
    done = [t for t in run.transfers if t.status == "done"]
    if not done:
        return {"num_done": 0, "statuses": sorted({t.status for t in run.transfers})}
    xs = np.array([t.transfer_s for t in done])
    ho = np.array([t.handover_s for t in done], dtype=float)
    gb = np.array([t.bytes for t in done]) / 1e9
    return {"num_done": len(done), "num_transfers": len(run.transfers),
            "bytes_p50": float(np.median(gb) * 1e9), "bytes_max": float(gb.max() * 1e9),
            "transfer_ms_p50": float(np.median(xs) * 1e3), "transfer_ms_p99": float(np.percentile(xs, 99) * 1e3),
            "gb_per_s_p50": float(np.median(gb / xs)),
            "handover_ms_p50": float(np.nanmedian(ho) * 1e3), "handover_ms_p99": float(np.nanpercentile(ho, 99) * 1e3),
            "rows": [t.row() for t in done[:64]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--dtype", default="bfloat16", help="model dtype on the GPU (float32: no bf16 near-ties)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.dry_run:
        engine = EngineArgs(model="tiny", device="cpu", max_model_len=512, block_size=16, num_gpu_blocks_override=256,
                            max_num_seqs=16, max_num_batched_tokens=256)
        devices, lens, out_len, rate = ["cpu", "cpu"], [16, 64, 200] * 3, 8, 20.0
    else:
        engine = EngineArgs(model="llama-3.2-1b", dtype=a.dtype, device="cuda", max_model_len=8192,
                            gpu_memory_utilization=0.40, max_num_seqs=64, seed=0)
        devices, lens, out_len, rate = ["cuda:0", "cuda:0"], [512, 2048, 6000, 1024] * 12, 32, 8.0
    reqs = requests(lens, out_len, rate)
    result: dict = {"engine": engine.model_dump(mode="json"), "devices": devices, "num_requests": len(reqs),
                    "prompt_lens": sorted(set(lens)), "output_len": out_len}
    runs = {}
    for name, split, devs in (("aggregated", None, devices[:1]), ("1p1d-ipc", "1:1", devices)):
        t0 = time.perf_counter()
        with Deployment(engine, split=split, num_replicas=1, transport="ipc" if split else "auto",
                        warm_up=not a.dry_run, timeout_s=300, transfer_timeout_s=30, devices=devs) as dep:
            start_s = time.perf_counter() - t0
            run = dep.replay(reqs, max_wall_s=120)
        runs[name] = run
        summary = run.summary().to_json_dict()
        result[name] = {"start_s": start_s, "wall_s": run.wall_s, "errors": run.errors, "pools": run.pools,
                        "num_finished": int((run.requests["status"] == "finished").sum()),
                        **{k: summary.get(k) for k in ("output_throughput", "median_ttft_ms", "p99_ttft_ms",
                                                       "median_tpot_ms", "p99_tpot_ms")}}
        if split:
            result[name]["transfers"] = transfer_stats(run)
        print(name, json.dumps({k: v for k, v in result[name].items() if k not in ("pools", "transfers")}), flush=True)
    ref, got = runs["aggregated"].output_token_ids, runs["1p1d-ipc"].output_token_ids
    same = [rid for rid in ref if got.get(rid) == ref[rid]]
    # where each differing request first differs (0 = the prefill side's own first token)
    first_diff = {rid: next((i for i, (x, y) in enumerate(zip(ref[rid], got.get(rid, []))) if x != y), None)
                  for rid in ref if rid not in same}
    result["tokens_identical"] = {"requests": len(ref), "identical": len(same), "first_difference_at": first_diff}
    print("tokens identical", len(same), "of", len(ref), flush=True)
    print("transfers", json.dumps({k: v for k, v in result["1p1d-ipc"].get("transfers", {}).items() if k != "rows"}))
    (a.out / f"smoke_one_gpu_{engine.dtype}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
