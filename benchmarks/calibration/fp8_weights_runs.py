#!/usr/bin/env python3
"""FP8 weights on the engine (llama-3.1-8b shape, one H200): steps to fit their price, and the same
traffic with bf16 and FP8 weights to check the advisor's predicted gain against the measured one.

One engine per precision (CUDA graphs, Triton kernels, vLLM's default scheduling flags), warmed up
once; the bf16 engine runs first and measures each workload's capacity, which sets both engines'
loaded rate. Run folders are engine run folders (`costline validate` reads them):

  fp8/sweep/...        FP8 only, for the fit (sim/fp8_weights_fit.py): decode batches 1-256 at 1K
                       context, prompts of 256-8K tokens alone and after a cached prefix
  {bf16,fp8}/check/burst-<w>   the workload's requests all at t=0 (throughput at saturation)
  {bf16,fp8}/check/load-<w>    the same mix at 80% of bf16's capacity, arrivals honoured

    python3 benchmarks/calibration/fp8_weights_runs.py --out DIR --deadline-s 470      # H200, ~7 min
    python3 benchmarks/calibration/fp8_weights_runs.py --out DIR --tiny --device cpu   # smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.calibration import gpu_sweep as gs
from engine.core.config import EngineArgs
from engine.engine_loop import EngineCore

WORKLOADS = ("chat-production", "rag-long-prompt", "code-bursty")
LOAD = 0.8
SWEEP = dataclasses.replace(gs.LARGE, decode_batches=(1, 4, 8, 16, 32, 64, 128, 256), decode_contexts=(1024,),
                            decode_max_tokens=300_000, decode_steps=30, prefill_lens=(256, 1024, 4096, 8192), cached_prefixes=(2048,),
                            cached_news=(512,))
TINY_SWEEP = dataclasses.replace(gs.TINY, decode_contexts=(64,))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=470.0)
    ap.add_argument("--burst-tokens", type=int, default=250_000, help="prompt tokens per burst run")
    ap.add_argument("--load-s", type=float, default=12.0, help="seconds of arrivals per loaded run")
    a = ap.parse_args()
    plan = TINY_SWEEP if a.tiny else SWEEP
    capacity: dict[str, float] = {}
    index: dict[str, list] = {}
    for weights in ("bf16", "fp8"):
        kw = {"max_model_len": 1024, "dtype": "float32"} if a.tiny else {}
        args = EngineArgs(model=a.model, device=a.device, seed=0, quantization="fp8" if weights == "fp8" else None, **kw)
        core = EngineCore(args)
        warm = core.warm_up()
        gs.log(f"{weights}: {core.num_gpu_blocks} KV blocks; warm-up {warm}")
        gpu = torch.cuda.get_device_name() if core.runner.is_cuda else "cpu"
        meta = {"gpu": "h200" if "H200" in gpu else gpu, "engine_commit": gs._commit(),
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "versions": {"torch": torch.__version__, "python": platform.python_version(),
                             "triton": gs._version("triton"), "cuda": torch.version.cuda},
                "warm_up": dataclasses.asdict(warm)}
        # bf16 gets a share of the time: the FP8 half (sweep and checks) is the point of the call
        r = gs.Runner(core, a.out / weights, a.model, meta, a.deadline_s * (0.42 if weights == "bf16" else 1.0))
        ids = gs.Ids()
        if weights == "fp8":  # the fit's steps first: the check runs are worth less without a price
            gs.decode_grid(r, plan, ids)
            gs.prefill_sweep(r, plan, ids)
        for w in WORKLOADS:
            reqs = gs.workload_requests(w, 40 if a.tiny else 400, None, plan.max_prompt_len, other_slice=True)
            cum = 0
            for i, q in enumerate(reqs):
                cum += q.prompt_len
                if cum > a.burst_tokens:
                    reqs = reqs[: max(20, i)]
                    break
            s = r.run("check", f"burst-{w}", reqs, honor_arrivals=False, async_scheduling=True,
                      description=f"first {len(reqs)} requests of {w} (another slice), all at t=0")
            if s is not None and weights == "bf16":
                capacity[w] = float(s["request_throughput"])
            if w not in capacity:
                continue
            rate = LOAD * capacity[w]
            n = max(8 if a.tiny else 40, int(rate * a.load_s))
            reqs = gs.workload_requests(w, n, rate, plan.max_prompt_len)
            r.run("check", f"load-{w}", reqs, honor_arrivals=True, async_scheduling=True, max_wall_s=a.load_s * 4,
                  description=f"first {n} requests of {w} at {rate:.2f} req/s ({LOAD:.0%} of bf16's "
                              f"capacity {capacity[w]:.2f} req/s)")
        index[weights] = r.index
        del core, r
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    (a.out / "index.json").write_text(json.dumps({"capacity_rps": capacity, "runs": index}, indent=2) + "\n")
    gs.log("done")


if __name__ == "__main__":
    main()
