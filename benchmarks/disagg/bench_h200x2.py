"""Disaggregated prefill on two H200s (issue 15): the KV transfer tax, and 1P1D vs two replicas.

ONE call, <= 9 minutes (--budget-s 510 skips workloads past it), results under --out (at most 4 files: results.json, sweep.jsonl,
link_fit.json, runs.tar.xz with every run folder, and nothing else), each phase in try/except
and results.json rewritten after each phase:

  env       torch, GPUs, peer access
  sweep     transfer time vs bytes (1 MiB .. the largest KV one request can have), NCCL vs CUDA
            IPC, block size 16 vs 64, whole vs layer by layer, descriptor count at fixed bytes
            -> sweep.jsonl, link_fit.json (sim/link_fit.py per transport, DisaggConfig fields)
  pd        1P1D (engine/disagg Deployment, NCCL, whole) on the serving workloads: short prompts
            at low load, then rising prompt lengths at one high prompt-token load
  agg       two aggregated replicas (one per GPU) on the same workloads
  compare   TTFT/TPOT p50/p99 and throughput side by side, the crossover prompt length, the
            decode-side hand-over (p50/p99) against the transfer itself

    python benchmarks/disagg/bench_h200x2.py --out DIR            # two GPUs
    python benchmarks/disagg/bench_h200x2.py --dry-run --out DIR  # CPU, gloo, tiny model: every phase
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tarfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.disagg.transfer_sweep import Item, Layout, run_sweep
from engine.core.config import EngineArgs
from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.disagg.router import Deployment
from sim.link_fit import fit_link, overlap_with_compute

MIB = 2**20


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


class Plan:
    """What a full run (two H200s, Llama-3.1-8B shape, random bf16 weights) or a dry run does."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry
        self.model = "tiny" if dry else "llama-3.1-8b"
        spec = get_model(self.model)
        self.layout = Layout(spec.num_layers, spec.num_kv_heads, spec.head_dim, "float32" if dry else "bfloat16")
        self.devices = ["cpu", "cpu"] if dry else ["cuda:0", "cuda:1"]
        self.transports = ["gloo", "ipc"] if dry else ["nccl", "ipc"]
        self.block_sizes = [16, 64]
        # the largest KV one request can have: the model's whole context
        max_tokens = 2048 if dry else spec.max_position_embeddings
        self.max_bytes = max_tokens * self.layout.block_bytes(1)
        self.reps = 2 if dry else 3
        self.engine = (EngineArgs(model="tiny", device="cpu", max_model_len=512, block_size=16,
                                  num_gpu_blocks_override=256, max_num_seqs=16, max_num_batched_tokens=256)
                       if dry else EngineArgs(model="llama-3.1-8b", dtype="bfloat16", device="cuda",
                                              max_model_len=20480, gpu_memory_utilization=0.80, seed=0))
        # (name, prompt tokens, output tokens, requests/s): short prompts at low load, then one
        # high prompt-token load (tokens/s) over rising prompt lengths (the crossover)
        if dry:
            self.workloads = [("short-low", 16, 8, 4.0), ("p64-high", 64, 8, 20.0), ("p256-high", 256, 8, 5.0)]
            self.arrivals_s, self.max_wall_s = 1.0, 30.0
        else:
            load = 16000.0
            self.workloads = [("short-low", 256, 128, 1.0)] + [
                (f"p{n}-high", n, 256, load / n) for n in (1024, 4096, 8192, 16384)]
            self.arrivals_s, self.max_wall_s = 20.0, 35.0

    def sweep_items(self) -> list[Item]:
        items = []
        for transport in self.transports:
            for bs in self.block_sizes:
                bb = self.layout.block_bytes(bs)
                size = MIB // 16 if self.dry else MIB
                while size <= self.max_bytes:
                    n = max(1, size // bb)
                    for mode, k in (("whole", 1), ("layer", self.layout.num_layers)):
                        items += [Item(transport, bs, n, k, mode, r) for r in range(self.reps)]
                    size *= 4 if self.dry else 2
            # per-descriptor cost: fixed bytes, ever finer messages
            n = max(1, (4 * MIB if self.dry else 64 * MIB) // self.layout.block_bytes(16))
            for k in (1, 8, 64, 512):
                items += [Item(transport, 16, n, k, "split", r) for r in range(self.reps)]
        return items

    def requests(self, prompt: int, output: int, rate: float, seed: int) -> list[Request]:
        rng = np.random.default_rng(seed)
        n = max(2, int(rate * self.arrivals_s))
        t = np.cumsum(rng.exponential(1.0 / rate, n))
        t -= t[0]  # the first request at the clock's start (a negative arrival counted pre-start time)
        nb = -(-prompt // 16)
        return [Request(i, float(t[i]), prompt, output, tuple(range(seed * 10**7 + i * nb, seed * 10**7 + (i + 1) * nb)))
                for i in range(n)]


class Results:
    def __init__(self, out: Path) -> None:
        self.out, self.data = out, {"phases": {}}

    def save(self, phase: str, value) -> None:
        self.data["phases"][phase] = value
        (self.out / "results.json").write_text(json.dumps(self.data, indent=2, default=_jsonable) + "\n")


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


def phase_env(plan: Plan) -> dict:
    env = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "dry_run": plan.dry}
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.device_count() >= 2:
            env["peer_access_0_1"] = torch.cuda.can_device_access_peer(0, 1)
    return env


def phase_sweep(plan: Plan, out: Path) -> dict:
    items = plan.sweep_items()
    log(f"sweep: {len(items)} transfers, up to {plan.max_bytes / 2**30:.2f} GiB")
    rows = run_sweep(plan.layout, items, plan.devices, timeout_s=180)
    with open(out / "sweep.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    fits = {}
    for transport in plan.transports:
        recs = [dict(r, status="done") for r in rows if r["transport"] == transport]
        fit = fit_link(recs)
        fits[transport] = {"bandwidth_gb_per_s": fit.bandwidth_gb_per_s, "latency_s": fit.latency_s,
                           "per_block_s": fit.per_block_s, "per_descriptor_s": fit.per_descriptor_s,
                           "median_abs_error_s": fit.median_abs_error_s, "num_records": fit.num_records,
                           "unidentified": fit.unidentified,
                           "disagg_fields": {f"block_size_{bs}": fit.disagg_fields(plan.layout.block_bytes(bs))
                                             for bs in plan.block_sizes}}
    (out / "link_fit.json").write_text(json.dumps(fits, indent=2, default=_jsonable) + "\n")
    return {"num_transfers": len(rows), "fits": fits, "achieved_gb_per_s": _achieved(rows)}


def _achieved(rows: list[dict]) -> dict:
    """Median achieved GB/s per (transport, block size, mode) at each size: the table of the sweep."""
    table: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["mode"] == "split":
            continue
        key = f"{r['transport']}/bs{r['block_size']}/{r['mode']}"
        table.setdefault(key, {}).setdefault(r["bytes"], []).append(r["bytes"] / r["transfer_s"] / 1e9)
    return {k: {str(b): float(np.median(v)) for b, v in sorted(d.items())} for k, d in table.items()}


def phase_serving(plan: Plan, out: Path, kind: str, deadline: float) -> dict:
    """One deployment (1P1D or two aggregated replicas), every workload in turn while the
    time budget (`deadline`, perf_counter) leaves room for one more."""
    split, n = ("1:1", 1) if kind == "pd" else (None, 2)
    res = {}
    with Deployment(plan.engine, split=split, num_replicas=n, warm_up=not plan.dry, timeout_s=300,
                    transfer_timeout_s=30) as dep:
        for i, (name, prompt, output, rate) in enumerate(plan.workloads):
            if time.perf_counter() + plan.max_wall_s > deadline:
                res[name] = {"error": "skipped: out of the time budget (--budget-s)"}
                continue
            try:
                run = dep.replay(plan.requests(prompt, output, rate, seed=i), max_wall_s=plan.max_wall_s)
                folder = out / "runs" / f"{kind}-{name}"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                summary = run.write_files(folder)
                res[name] = _serving_row(run, summary)
                log(kind, name, {k: res[name][k] for k in ("ttft_p99_ms", "tpot_p99_ms", "output_tok_per_s")})
            except Exception:  # noqa: BLE001 - the next workload still runs
                res[name] = {"error": traceback.format_exc()}
                log(kind, name, "failed")
    return res


def _serving_row(run, summary: dict) -> dict:
    r = run.requests
    done = r["status"] == "finished"
    pct = {f"{m}_p{q}_ms": float(np.percentile(r[f"{m}_s"][done], q) * 1e3) if done.any() else None
           for m in ("ttft", "tpot") for q in (50, 99)}
    row = {**pct, "num_finished": int(done.sum()), "num_requests": len(done),
           "output_tok_per_s": summary.get("output_throughput"), "wall_s": run.wall_s,
           "kernels_compiled": sum(p.kernels_compiled for p in run.pools.values()),
           "pools_intact": all(p.intact for p in run.pools.values())}
    tr = [t for t in run.transfers if t.status == "done"]
    if tr:
        ho = np.array([t.handover_s for t in tr]) * 1e3
        xs = np.array([t.transfer_s for t in tr]) * 1e3
        row.update(handover_p50_ms=float(np.nanmedian(ho)), handover_p99_ms=float(np.nanpercentile(ho, 99)),
                   transfer_p50_ms=float(np.median(xs)), transfer_p99_ms=float(np.percentile(xs, 99)),
                   transfer_gb_per_s_p50=float(np.median([t.bytes / t.transfer_s / 1e9 for t in tr])),
                   overlap_with_compute=overlap_with_compute(tr, run.steps))
    return row


def phase_compare(plan: Plan, pd: dict, agg: dict) -> dict:
    rows, crossover = {}, None
    for name, prompt, _, _ in plan.workloads:
        a, b = pd.get(name, {}), agg.get(name, {})
        if "ttft_p99_ms" not in a or "ttft_p99_ms" not in b:
            continue
        wins = all(a[k] is not None and b[k] is not None and a[k] < b[k] for k in ("ttft_p99_ms", "tpot_p99_ms"))
        rows[name] = {"prompt_tokens": prompt, "pd_wins_p99": wins,
                      **{f"{k}_pd_over_agg": (a[k] / b[k] if a[k] and b[k] else None)
                         for k in ("ttft_p99_ms", "tpot_p99_ms", "ttft_p50_ms", "tpot_p50_ms", "output_tok_per_s")}}
        if wins and crossover is None and name.endswith("-high"):
            crossover = prompt
    return {"workloads": rows, "crossover_prompt_tokens": crossover}


def pack(out: Path) -> None:
    runs = out / "runs"
    if runs.exists():
        with tarfile.open(out / "runs.tar.xz", "w:xz") as tar:
            tar.add(runs, arcname="runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny model: every phase in seconds")
    ap.add_argument("--phases", default="env,sweep,pd,agg,compare")
    ap.add_argument("--previous", type=Path, nargs="*", default=[],
                    help="results.json of earlier calls whose pd/agg phases `compare` may use (a run split over calls)")
    ap.add_argument("--budget-s", type=float, default=510.0,
                    help="stop starting workloads past this; each serving phase gets half of what is left")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    plan, res = Plan(args.dry_run), Results(args.out)
    if not plan.dry and torch.cuda.device_count() < 2 and args.phases != "compare":
        sys.exit("error: two GPUs needed (or --dry-run)")
    t0 = time.perf_counter()
    served = {}
    for prev in args.previous:  # phases measured by an earlier call of the same plan
        phases = json.loads(prev.read_text())["phases"]
        served.update({k: phases[k] for k in ("pd", "agg") if isinstance(phases.get(k), dict) and "error" not in phases[k]})
    for phase in args.phases.split(","):
        log("phase", phase)
        try:
            if phase == "env":
                value = phase_env(plan)
            elif phase == "sweep":
                value = phase_sweep(plan, args.out)
            elif phase in ("pd", "agg"):
                left = args.budget_s - (time.perf_counter() - t0)
                share = left / 2 if phase == "pd" and "agg" in args.phases else left
                value = served[phase] = phase_serving(plan, args.out, phase, time.perf_counter() + share)
                pack(args.out)
            elif phase == "compare":
                value = phase_compare(plan, served.get("pd", {}), served.get("agg", {}))
            else:
                raise ValueError(f"unknown phase {phase!r}")
        except Exception:  # noqa: BLE001 - later phases still run; the error is in the results
            value = {"error": traceback.format_exc()}
            log(phase, "failed:", value["error"].splitlines()[-1])
        res.save(phase, value)
        log(f"phase {phase} done at {time.perf_counter() - t0:.0f} s")
    shutil.rmtree(args.out / "runs", ignore_errors=True)  # packed in runs.tar.xz


if __name__ == "__main__":
    main()
