"""Where an engine's time goes, on a GPU: start-up at vLLM's defaults, eager-step drift over
replays in one process, and the host's share of a decode step.

    python3 benchmarks/engine/diagnose.py all --out DIR          # each part in its own process, with a deadline
    python3 benchmarks/engine/diagnose.py startup --model llama-3.2-1b --out DIR
    python3 benchmarks/engine/diagnose.py drift --out DIR
    python3 benchmarks/engine/diagnose.py host --out DIR
    python3 benchmarks/engine/diagnose.py all --tiny --out DIR   # CPU smoke test (tests/engine/test_diagnose.py)

`startup`: `EngineCore(EngineArgs(model=M, device="cuda"))` at vLLM's defaults (1,024 sequences,
max_model_len = the model's positions, utilization 0.92), each start-up phase timed as it ends
(engine/startup.py), then a timed replay of chat traffic: `ready_s`, and each step kind's
GPU and host time. A part that overruns its deadline has its Python stacks dumped (faulthandler)
before it is killed, so a hang says where it was.

`drift`: one engine (n-gram speculative decoding, as the drift was first seen) replays the same
requests (all at t=0: the very same steps each time) `--replays` times; per replay, the median
GPU and launch time of its eager and graph steps, host time, the allocator's and the GC's state,
and the functions whose own time grew most between the first and the last replay (cProfile).

`host`: a decode batch of 128 under async and synchronous scheduling, each host function of the
step loop timed (schedule, the batch's columns, each staging step of prepare, the launches, the
collect, the update), so the host time per step is split by function; and the torch ops of one
steady decode step's runner.prepare at that batch (`prepare_ops`: a TorchDispatchMode over that
one call; on the GPU host each costs ~10-50 us).
"""

from __future__ import annotations

import argparse
import cProfile
import faulthandler
import gc
import json
import pstats
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch

from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.core.run_summary import jsonable
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerOutput
from engine.engine_loop import EngineCore
from engine.replay import replay
from engine.runner import ModelRunner

# deadlines of the parts run by `all` (seconds; one device call is 600 s)
DEADLINES_S = {"startup-llama-3.2-1b": 210, "startup-llama-3.1-8b": 150, "drift": 120, "host": 80}
T0 = time.perf_counter()


def log(*a: Any) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def requests(n: int, prompt: tuple[int, int], output: tuple[int, int], rate_rps: float | None,
             seed: int, block: int = 16) -> list[Request]:
    """n requests, uniform lengths, Poisson arrivals at rate_rps (None: all at t=0), nothing shared."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate_rps, n)) if rate_rps else np.zeros(n)
    out = []
    for i in range(n):
        p = int(rng.integers(*prompt))
        blocks = -(-p // block)
        out.append(Request(request_id=i, arrival_s=float(t[i]), prompt_len=p, output_len=int(rng.integers(*output)),
                           hash_ids=tuple(range((i + 1) << 20, ((i + 1) << 20) + blocks))))
    return out


def step_kinds(core: EngineCore, steps: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Median GPU and host (schedule + prepare) ms and counts of decode-only and other steps."""
    dec = (steps["num_prefill_tokens"] == 0) & (steps["num_decode_tokens"] == steps["num_decode_seqs"])
    out = {}
    for name, m in (("decode", dec), ("mixed", ~dec)):
        if m.any():
            out[name] = {"steps": int(m.sum()), "gpu_ms_p50": float(1e3 * np.median(steps["gpu_s"][m])),
                         "gpu_ms_max": float(1e3 * steps["gpu_s"][m].max()),
                         "host_ms_p50": float(1e3 * np.median((steps["schedule_s"] + steps["prepare_s"])[m])),
                         "period_ms_p50": float(1e3 * np.median(steps["total_s"][m]))}
    return out


# ---------------------------------------------------------------------------- startup
def startup(model: str, out: Path, tiny: bool) -> dict:
    args = EngineArgs(model=model, device="cuda" if not tiny else "cpu",
                      **({"max_model_len": 512, "dtype": "float32"} if tiny else {}))
    core = EngineCore(args, progress=log)
    cfg = core.config
    log(f"config: max_num_seqs {cfg.max_num_seqs}, max_model_len {cfg.max_model_len}, "
        f"budget {cfg.max_num_batched_tokens}, {core.num_gpu_blocks:,} KV blocks")
    warm = core.warm_up()
    log(f"warm-up {warm.seconds:.1f} s, {warm.kernels_compiled} kernel variants")
    # tiny: 40 requests at 80/s (the replay honours arrivals: at 20/s it waited ~2 s of a CPU smoke test)
    n, rate = (40, 80.0) if tiny else (300, 12.0 if "8b" in model else 30.0)
    reqs = requests(n, (64, 2048 if not tiny else 200), (16, 256 if not tiny else 17), rate, seed=1)
    t = time.perf_counter()
    res = replay(core, reqs, honor_arrivals=True, max_wall_s=60.0)
    s = res.summary().to_json_dict()
    row = {"model": model, "ready_s": core.ready_s, "startup": core.startup.as_dict(),
           "config": {k: getattr(cfg, k) for k in ("max_num_seqs", "max_model_len", "max_num_batched_tokens",
                                                    "gpu_memory_utilization", "max_cudagraph_capture_size")},
           "num_gpu_blocks": core.num_gpu_blocks, "replay_wall_s": time.perf_counter() - t,
           "unfinished": len(res.unfinished_ids), "steps": step_kinds(core, res.steps),
           "summary": {k: s.get(k) for k in ("request_throughput", "output_throughput", "median_ttft_ms",
                                              "median_tpot_ms", "p99_itl_ms", "num_engine_steps")}}
    log(json.dumps(jsonable(row)))
    return row


# ---------------------------------------------------------------------------- drift
def _top_own_time(prof: cProfile.Profile, n: int = 40) -> dict[str, float]:
    st = pstats.Stats(prof)
    rows = {f"{Path(f).name}:{line}({fn})": tt for (f, line, fn), (_, _, tt, _, _) in st.stats.items()}
    return dict(sorted(rows.items(), key=lambda kv: -kv[1])[:n])


def drift(out: Path, tiny: bool, replays: int) -> dict:
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    args = EngineArgs(model="tiny" if tiny else "llama-3.2-1b", device="cpu" if tiny else "cuda", seed=0,
                      max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096 if not tiny else 512,
                      gpu_memory_utilization=0.5, speculative_config=spec,
                      **({"dtype": "float32"} if tiny else {}))
    core = EngineCore(args, progress=log)
    core.warm_up()
    reqs = requests(32 if tiny else 256, (16, 200) if tiny else (64, 1024), (8, 32) if tiny else (32, 256), None,
                    seed=2)
    rows, profiles = [], []
    for k in range(replays):
        core.start_over()
        prof = cProfile.Profile() if k in (0, replays - 1) else None
        t = time.perf_counter()
        if prof:
            prof.enable()
        res = replay(core, reqs, honor_arrivals=False)
        if prof:
            prof.disable()
            profiles.append(_top_own_time(prof))
        s = res.steps
        graph_before = core.runner.num_graph_replays
        mem = torch.cuda.memory_stats() if core.runner.is_cuda else {}
        row = {"replay": k, "wall_s": time.perf_counter() - t, "steps": int(s["gpu_s"].size),
               "gpu_ms_p50": float(1e3 * np.median(s["gpu_s"])), "launch_ms_p50": float(1e3 * np.median(res.step_launch_s)),
               "host_ms_p50": float(1e3 * np.median(s["schedule_s"] + s["prepare_s"])),
               "kinds": step_kinds(core, s), "gc_tracked": len(gc.get_objects()),
               "graph_replays_total": graph_before, "eager_forwards_total": core.runner.num_eager_forwards,
               "alloc_retries": mem.get("num_alloc_retries"), "segments": mem.get("segment.all.current"),
               "allocated_mb": mem.get("allocated_bytes.all.current", 0) / 2**20,
               "reserved_mb": mem.get("reserved_bytes.all.current", 0) / 2**20,
               "requests_tracked": len(core.requests), "sampler_generators": len(core.sampler._generators)}
        rows.append(row)
        log(json.dumps(jsonable(row)))
    grew = {}
    if len(profiles) == 2:
        first, last = profiles
        grew = dict(sorted(((f, last[f] - first.get(f, 0.0)) for f in last), key=lambda kv: -kv[1])[:20])
    return {"replays": rows, "own_time_grew_s": grew}


# ---------------------------------------------------------------------------- host
class _Timers:
    """Accumulated seconds per wrapped callable."""

    def __init__(self) -> None:
        self.s: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, name: str, label: str | None = None) -> None:
        fn = getattr(owner, name)
        label = label or name
        timers = self

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timers.s[label] += time.perf_counter() - t
                timers.calls[label] += 1

        setattr(owner, name, timed)


HOST_PARTS: dict[type, tuple[str, ...]] = {
    Scheduler: ("schedule", "update_from_output"),
    SchedulerOutput: ("columns",),
    ModelRunner: ("prepare", "_next_stage", "_stage_block_tables", "_write_rows", "_layout", "_stage_host",
                  "_stage_work", "_stage_gather", "_stage_block_entries", "_copy_to_device", "_gather_inflight",
                  "_record_stage_done", "forward"),
    EngineCore: ("_collect", "_note_first_scheduled", "_end_stopped"),
}


def _count_prepare_ops(runner: ModelRunner, batch: int, nth: int = 40) -> dict[str, int]:
    """Wrap runner.prepare (the instance) so that the `nth` call on a batch of `batch` one-token
    requests runs under an op counter; returns the counts (filled once that call ran)."""
    from engine.op_counter import OpCounter

    real, counts, seen = runner.prepare, {}, [0]

    def prepare(cols, *a, **k):
        if len(cols) == batch and sum(cols.num_new_tokens) == batch:
            seen[0] += 1
            if seen[0] == nth:
                with OpCounter() as ops:
                    inp = real(cols, *a, **k)
                counts.update(ops.counts)
                return inp
        return real(cols, *a, **k)

    runner.prepare = prepare
    return counts


def host(out: Path, tiny: bool) -> dict:
    import engine.runner as runner_module

    args = EngineArgs(model="tiny" if tiny else "llama-3.2-1b", device="cpu" if tiny else "cuda", seed=0,
                      max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=4096 if not tiny else 1024,
                      gpu_memory_utilization=0.5, **({"dtype": "float32"} if tiny else {}))
    core = EngineCore(args, progress=log)
    core.warm_up()
    batch = 16 if tiny else 128
    reqs = requests(batch, (1000, 1024) if not tiny else (100, 101), (300, 301) if not tiny else (40, 41), None,
                    seed=3)
    result = {}
    for mode in ("async", "sync"):
        core.start_over(async_scheduling=mode == "async")
        timers = _Timers()
        saved = [(cls, n, cls.__dict__[n]) for cls, names in HOST_PARTS.items() for n in names]
        saved.append((runner_module, "_input_tokens", runner_module._input_tokens))
        for cls, names in HOST_PARTS.items():
            for n in names:
                timers.wrap(cls, n)
        timers.wrap(runner_module, "_input_tokens")
        timers.wrap(core.sampler, "sample")
        ops = _count_prepare_ops(core.runner, batch, nth=5 if tiny else 40)
        try:
            t = time.perf_counter()
            res = replay(core, reqs, honor_arrivals=False)
            wall = time.perf_counter() - t
        finally:
            for owner, n, fn in saved:
                setattr(owner, n, fn)
            del core.sampler.sample
            del core.runner.prepare
        s = res.steps
        dec = (s["num_prefill_tokens"] == 0) & (s["num_decode_seqs"] == batch)
        steps = int(s["step_id"].size)
        result[mode] = {"wall_s": wall, "steps": steps, "decode_steps_at_batch": int(dec.sum()),
                        "per_step_us": {k: 1e6 * v / steps for k, v in sorted(timers.s.items(), key=lambda kv: -kv[1])},
                        "decode_step_ms_p50": {c: float(1e3 * np.median(s[c][dec])) if dec.any() else None
                                               for c in ("schedule_s", "prepare_s", "sample_s", "gpu_s", "total_s")},
                        "launch_ms_p50": float(1e3 * np.median(res.step_launch_s[dec])) if dec.any() else None,
                        "prepare_ops": dict(sorted(ops.items())), "prepare_ops_total": sum(ops.values())}
        log(mode, json.dumps(jsonable(result[mode])))
    return result


# ---------------------------------------------------------------------------- all
def run_all(out: Path, tiny: bool, python: str) -> dict:
    """Each part in its own process (a fresh CUDA context and heap) under its deadline."""
    parts = {"startup-llama-3.2-1b": ["startup", "--model", "llama-3.2-1b"],
             "startup-llama-3.1-8b": ["startup", "--model", "llama-3.1-8b"], "drift": ["drift"], "host": ["host"]}
    if tiny:
        parts = {"startup-tiny": ["startup", "--model", "tiny"], "drift": ["drift", "--replays", "2"], "host": ["host"]}
    summary = {}
    for name, argv in parts.items():
        deadline = 120 if tiny else DEADLINES_S[name]
        cmd = [python, __file__, *argv, "--out", str(out), "--dump-after-s", str(deadline - 15)]
        if tiny:
            cmd.append("--tiny")
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, timeout=deadline, capture_output=True, text=True, check=False)
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as exc:
            rc, text = "timeout", (exc.stdout or b"").decode() + (exc.stderr or b"").decode()
        (out / f"{name}.log").write_text(text)
        summary[name] = {"rc": rc, "seconds": round(time.perf_counter() - t, 1)}
        log(name, summary[name])
        print(text[-3000:], flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("all", "startup", "drift", "host"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--replays", type=int, default=4)
    ap.add_argument("--tiny", action="store_true", help="tiny model on the CPU (smoke test)")
    ap.add_argument("--dump-after-s", type=float, default=None, help="dump every thread's stack after this long")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.dump_after_s:
        faulthandler.dump_traceback_later(a.dump_after_s, exit=False)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "command": " ".join(sys.argv)}
    if a.part == "all":
        res = run_all(a.out, a.tiny, sys.executable)
        name = "all"
    elif a.part == "startup":
        res, name = startup(a.model, a.out, a.tiny), f"startup-{a.model}"
    elif a.part == "drift":
        res, name = drift(a.out, a.tiny, a.replays), "drift"
    else:
        res, name = host(a.out, a.tiny), "host"
    (a.out / f"{name}.json").write_text(json.dumps(jsonable({"meta": meta, **({"parts": res} if a.part == "all" else res)}),
                                                   indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
