#!/usr/bin/env python3
"""The fused MoE and a dense GEMM timed cold and under sustained load, with the SM clock and board power
sampled beside (MOE.md run 20).

Run 19 (`draw_probe.py`) found that one routing draw re-timed in the same call moved from 647 to 716 us at
T = 4096, while `nvidia-smi` showed the H200 at 650-700 W and its SM clock at 1,425-1,890 MHz during the
timed bursts (1,980 at rest). So a timing is a power state as much as a kernel. This script times each
workload in two regimes:

- cold: the GPU idle for `--idle-s`, then one replay of the workload's CUDA graph (a few ms), `--cold-reps`
  times; the median. The clock stays at its boost through so short a burst (where the H200's 790 TFLOP/s
  dense rate was measured);
- sustained: the graph replayed back to back for `--load-s`; the median of the replays in the last half
  (the power limiter has settled: what a busy serving engine runs at).

    python3 benchmarks/kernels/power_probe.py --out DIR [--tokens 4096 8192 1024] [--dry-run]

Workloads: a dense bf16 GEMM of 8192 cubed (cuBLAS), the engine's plan (`kernels.moe_plans.engine_tiles`)
at each T, and at the first T run 12's plan (`run12_engine_tiles`, the down launch one program a SM), which
may spend less energy a step. A
thread samples NVML (SM clock, power, clock-event reasons) every 20 ms; each timing carries the mean clock
and power over its own window. Writes DIR/power.json and DIR/power.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.kernels.repeat_engine_plans import (
    COPIES,
    DRY,
    PEAK_SIZE,
    layer_of,
    make_draw,
    roofline,
)

SAMPLE_S = 0.02


class Sample(NamedTuple):
    t: float  # time.monotonic()
    sm_mhz: float
    watts: float
    reasons: int  # NVML clock-event reasons bit mask


class Sampler:
    """NVML samples on a thread (none without NVML: a dry run, or no pynvml)."""

    def __init__(self):
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self._h) / 1e3
        except Exception:  # noqa: BLE001 - no NVML: timings without clocks
            self._nvml, self.limit_w = None, None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = self._nvml
        while not self._stop.is_set():
            self.samples.append(Sample(time.monotonic(), n.nvmlDeviceGetClockInfo(self._h, n.NVML_CLOCK_SM),
                                       n.nvmlDeviceGetPowerUsage(self._h) / 1e3,
                                       n.nvmlDeviceGetCurrentClocksEventReasons(self._h)))
            time.sleep(SAMPLE_S)

    def __enter__(self):
        if self._nvml:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._nvml:
            self._thread.join()

    def over(self, t0: float, t1: float) -> dict:
        """Mean SM clock and power, and the clock-event reasons seen, over [t0, t1]."""
        win = [s for s in self.samples if t0 <= s.t <= t1]
        if not win:
            return {}
        reasons = 0
        for s in win:
            reasons |= s.reasons
        return {"sm_mhz": statistics.mean(s.sm_mhz for s in win), "min_sm_mhz": min(s.sm_mhz for s in win),
                "watts": statistics.mean(s.watts for s in win), "reasons_mask": reasons, "samples": len(win)}


def capture(calls: list, dry: bool):
    """The calls as one CUDA graph's replay (graph_timing.capture_graph); in a dry run the calls themselves."""
    from benchmarks.kernels.graph_timing import capture_graph

    if dry:
        return lambda: [c() for c in calls]
    return capture_graph(calls).replay


def replay_us(replay, dry: bool) -> float:
    """us of one replay, by CUDA events (wall clock in a dry run)."""
    import torch

    if dry:
        t0 = time.perf_counter()
        replay()
        return (time.perf_counter() - t0) * 1e6
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def cold_us(replay, n_calls: int, reps: int, idle_s: float, dry: bool, sampler: Sampler) -> dict:
    """Median us per call of single replays, each after idle_s of an idle GPU."""
    times, windows = [], []
    for _ in range(reps):
        time.sleep(idle_s)
        t0 = time.monotonic()
        times.append(replay_us(replay, dry) / n_calls)
        windows.append(sampler.over(t0, time.monotonic() + SAMPLE_S))
    clocks = [w["sm_mhz"] for w in windows if w]
    return {"us": times, "median_us": statistics.median(times),
            "sm_mhz": statistics.mean(clocks) if clocks else None}


def sustained_us(replay, n_calls: int, load_s: float, dry: bool, sampler: Sampler) -> dict:
    """Median us per call of the replays in the last half of load_s of back-to-back replays, with the
    clock and power over that half."""
    import torch

    t_start = time.monotonic()
    timed: list[tuple[float, float]] = []
    while not timed or time.monotonic() - t_start < load_s:
        timed.append((time.monotonic(), replay_us(replay, dry) / n_calls))
    if not dry:
        torch.cuda.synchronize()
    half = t_start + load_s / 2
    late = [us for t, us in timed if t >= half] or [us for _, us in timed]
    return {"median_us": statistics.median(late), "replays": len(late),
            **sampler.over(half, time.monotonic())}


def workloads(tokens: list[int], shape: tuple, dry: bool) -> list[tuple[str, int, float, list]]:
    """(name, T, FLOPs a call, calls) of every workload: the dense GEMM, then the MoE plans."""
    import torch

    from kernels.fused_moe import fused_moe
    from kernels.moe_plans import engine_tiles, run12_engine_tiles

    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    size = 64 if dry else PEAK_SIZE
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    c = torch.empty(size, size, device=device, dtype=dtype)
    out = [("dense GEMM", 0, 2.0 * size**3, [lambda: torch.mm(a, b, out=c)] * 3)]
    h, n, e, k = shape
    g = torch.Generator(device=device).manual_seed(1)  # repeat_engine_plans.py's weights
    weights = [((torch.randn(e, 2 * n, h, generator=g, device=device) / h**0.5).to(dtype),
                (torch.randn(e, h, n, generator=g, device=device) / n**0.5).to(dtype)) for _ in range(COPIES)]
    for t in tokens:
        routes = make_draw(t, h, e, k, 0, COPIES, device, dtype)
        reps = 1 if dry else max(1, min(10, -(-2000 // int(roofline(e, t, h, n, k)["roofline_us"] * COPIES))))
        plans = [("engine", engine_tiles(t, k, e))]
        if t == tokens[0]:
            plans.append(("run 12", run12_engine_tiles(t, k, e)))
        for name, plan in plans:
            out.append((name, t, roofline(e, t, h, n, k)["flops"],
                        [lambda wt=wt, r=r, p=plan: fused_moe(r.x, wt[0], wt[1], r.w, r.ids, p)
                         for wt, r in zip(weights, routes)] * reps))
    return out


def markdown(meta: dict, rows: list[dict]) -> str:
    head = ["workload", "T", "cold us", "cold TFLOP/s", "cold % of 790", "cold MHz", "sustained us",
            "sustained TFLOP/s", "sustained MHz", "sustained W", "sustained % of the sustained GEMM"]
    out = [f"# Power probe ({meta['gpu']}, {meta['date']}; power limit {meta['power_limit_w']} W)", "",
           f"`{meta['command']}`", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v, fmt=".0f"):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        c, s = r["cold"], r["sustained"]
        out.append(" | ".join([f"| {r['workload']}", str(r["T"] or ""), f(c["median_us"], ".1f"), f(r["cold_tflops"]),
                               f(r["cold_tflops"] / 7.9, ".1f"), f(c.get("sm_mhz")), f(s["median_us"], ".1f"),
                               f(r["sustained_tflops"]), f(s.get("sm_mhz")), f(s.get("watts")),
                               f(r.get("share_of_sustained_gemm", 0) * 100, ".1f") + " |"]))
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 1024])
    p.add_argument("--idle-s", type=float, default=1.5)
    p.add_argument("--cold-reps", type=int, default=7)
    p.add_argument("--load-s", type=float, default=3.0)
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.tokens, args.idle_s, args.cold_reps, args.load_s = [16], 0.0, 2, 0.0
    import torch
    import triton

    from kernels import _interpreter_compat

    _interpreter_compat.apply()
    rows = []
    with Sampler() as sampler:
        for name, t, flops, calls in workloads(args.tokens, DRY if args.dry_run else layer_of("qwen3-30b-a3b"), args.dry_run):
            replay = capture(calls, args.dry_run)
            cold = cold_us(replay, len(calls), args.cold_reps, args.idle_s, args.dry_run, sampler)
            sus = sustained_us(replay, len(calls), args.load_s, args.dry_run, sampler)
            rows.append({"workload": name, "T": t, "flops": flops, "cold": cold, "sustained": sus,
                         "cold_tflops": flops / cold["median_us"] / 1e6,
                         "sustained_tflops": flops / sus["median_us"] / 1e6})
            print(json.dumps(rows[-1]), flush=True)
            del replay
    gemm = rows[0]["sustained_tflops"]
    for r in rows[1:]:
        r["share_of_sustained_gemm"] = r["sustained_tflops"] / gemm
    meta = {"gpu": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
            "triton": triton.__version__, "power_limit_w": sampler.limit_w,
            "command": "python3 benchmarks/kernels/power_probe.py " + " ".join(argv or sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "power.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "power.md").write_text(markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
