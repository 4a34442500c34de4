"""Soak: one engine process serving production-like traffic for >= 20 minutes, checked every minute.

    python3 benchmarks/engine/soak.py --out DIR [--minutes 20] [--deadline-s 1180]
        [--models llama-3.1-8b llama-3.2-1b]
    python3 benchmarks/engine/soak.py --tiny --out DIR     # CPU smoke test (tests/engine/test_soak.py)

One process builds one engine per model (random bf16 weights, Triton kernels, CUDA graphs, 256
sequences; both engines live side by side, their KV pools fixed so they fit one GPU together),
warms each up once, then works through a queue of engine runs, each written as an engine run
folder (`costline calibrate` / `costline validate` read them; benchmarks/calibration/gpu_sweep.py's
format and parts):

1. per model, a capacity probe of each workload, then held-out runs (never fitted on): the
   calibration validation set (chat at 0.3-1.15 of capacity, long prompts past the budget, Mooncake
   prefix reuse, a tight KV pool with preemptions, bursty code) and, on the first model, chat near
   saturation, chunked prefill off, n-gram speculative decoding, and the RANKING set: one chat
   workload under six configurations (defaults, budgets 2,048 and 16,384, 64 sequences, chunked
   prefill off, synchronous scheduling), whose goodput order the simulator must reproduce;
2. per model, the calibration sweep (decode grid and skewed batches, prefill alone and over a
   cached prefix, mixed loads, a tight pool);
3. more production-like traffic (chat, code bursts, Mooncake) until `--minutes` have passed.

Between any two runs, once a minute, the PROBES: identical crafted steps through each engine's runner,
timed with CUDA events (median of 15): a decode batch of 64 at 2K context (its CUDA graph), a
512-token chunk beside 32 decodes (its mixed graph), a 4,096-token prefill (eager: host launches
included); the host's prepare of a 128-decode batch (CPU time); a pure-Python canary loop (the
host CPU's own speed, to tell a slower engine from a slower host); and the process's RSS, the
objects the GC tracks, the torch allocator's allocated / reserved bytes and segments, and the
engines' request tables. `DIR/soak.json` holds every probe and each probe's ratio to the first
minute; `DIR/<model>/index.json` the runs. Nothing lost: every run reports its unfinished requests.

Engines are built with max_model_len 40,960 and a 40,960-token runner (chunked prefill off raises
the budget to max_model_len, as vLLM does); every other run starts over at a budget of 8,192.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "calibration"))

import gpu_sweep as gs

from engine.core.config import EngineArgs
from engine.core.run_summary import jsonable
from engine.engine_loop import EngineCore
from engine.replay import replay

T0 = time.perf_counter()
BUDGET = 8192  # every run's token budget unless it asks otherwise
RANKING = (  # name, scheduling flags (the ranking workload: chat at RANKING_LOAD of capacity)
    ("defaults", {}),
    ("budget-2048", {"max_num_batched_tokens": 2048}),
    ("budget-16384", {"max_num_batched_tokens": 16384}),
    ("seqs-64", {"max_num_seqs": 64}),
    ("no-chunking", {"enable_chunked_prefill": False}),
    ("sync", {"async_scheduling": False}),
)
RANKING_LOAD = 0.9


def log(*a: Any) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


@dataclasses.dataclass
class Sizes:
    """Per-model engine sizes and the probes' shapes."""

    # room for the sweep's 32K-token skew prompts and their outputs (the 2026-12-02 soak ran at
    # 32,768 and refused them)
    max_model_len: int = 40960
    runner_budget: int = 40960
    blocks: dict = dataclasses.field(default_factory=lambda: {"llama-3.1-8b": 30000, "llama-3.2-1b": 70000})
    probe_decode: tuple[int, int] = (64, 2048)  # batch, context
    probe_mixed: tuple[int, int, int] = (512, 32, 2048)  # chunk, decodes, their context
    probe_eager: int = 4096  # prompt tokens
    probe_host_batch: int = 128
    probe_reps: int = 15
    canary_n: int = 300_000
    ranking_requests: int = 240
    saturated_requests: int = 500


TINY_SIZES = Sizes(max_model_len=512, runner_budget=512, blocks={"tiny": 2000}, probe_decode=(4, 64),
                   probe_mixed=(40, 3, 64), probe_eager=200, probe_host_batch=8, probe_reps=3, canary_n=20_000,
                   ranking_requests=12, saturated_requests=12)


# ------------------------------------------------------------------------------------ probes
def _crafted(runner, seqs: list[tuple[int, int]]):
    """The runner's inputs for one step of `seqs` ((new tokens, cached tokens) each), own blocks."""
    sched, toks, nxt = [], {}, 0
    for i, (q, c) in enumerate(seqs):
        nb = -(-(c + q) // runner.block_size)
        sched.append(SimpleNamespace(request_id=i, num_new_tokens=q, num_computed_tokens=c,
                                     block_ids=list(range(nxt, nxt + nb)), samples=True, num_spec_tokens=0))
        toks[i] = [17 + (j % 200) for j in range(c + q)]
        nxt += nb
    return sched, toks


def _device_ms(runner, seqs: list[tuple[int, int]], reps: int) -> float:
    """Median forward time of one crafted step (CUDA events; wall time on the CPU)."""
    sched, toks = _crafted(runner, seqs)
    inp = runner.prepare(sched, toks)
    cuda = runner.is_cuda
    times = []
    for k in range(reps + 2):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            runner.forward(inp)
            b.record()
            b.synchronize()
            ms = a.elapsed_time(b)
        else:
            t = time.perf_counter()
            runner.forward(inp)
            ms = 1e3 * (time.perf_counter() - t)
        if k >= 2:
            times.append(ms)
    return statistics.median(times)


def _host_prepare_ms(runner, batch: int, context: int, reps: int) -> float:
    """Median host time of preparing a decode batch (CPU side of a step, copies launched)."""
    sched, toks = _crafted(runner, [(1, context)] * batch)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        runner.prepare(sched, toks)
        times.append(1e3 * (time.perf_counter() - t))
    if runner.is_cuda:
        torch.cuda.synchronize()
    return statistics.median(times)


def canary_ms(n: int) -> float:
    """A fixed pure-Python loop: the host CPU's speed, independent of the engine (median of 5)."""
    times = []
    for _ in range(5):
        t = time.perf_counter()
        acc = 0
        for i in range(n):
            acc += i * i % 7
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def _rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def token_check(core: EngineCore, n: int, max_prompt: int) -> dict:
    """The same greedy requests under async and synchronous scheduling give the same tokens: the
    in-flight gather inside the CUDA graphs and the block-table entries against the synchronous
    path (the same graphs and kernels, so bit for bit)."""
    rng = np.random.default_rng(5)
    ids = gs.Ids()
    reqs = [ids.request(0.0, int(p), 24) for p in rng.integers(16, max_prompt, n)]
    outs = {}
    for mode in (True, False):
        core.start_over(async_scheduling=mode, max_num_batched_tokens=min(BUDGET, core.runner.max_num_batched_tokens))
        replay(core, reqs, honor_arrivals=False)
        outs[mode] = {r.request_id: core.requests[r.request_id].output_token_ids for r in reqs}
    same = sum(outs[True][i] == outs[False][i] for i in outs[True])
    return {"requests": n, "equal": same, "passed": same == n}


def probe(cores: dict[str, EngineCore], sizes: Sizes) -> dict:
    """One round of probes on every engine, and the process's memory."""
    row: dict[str, Any] = {"t_s": round(time.perf_counter() - T0, 1), "canary_ms": canary_ms(sizes.canary_n),
                           "rss_mb": _rss_mb(), "gc_tracked": len(gc.get_objects())}
    if torch.cuda.is_available():
        m = torch.cuda.memory_stats()
        row |= {"allocated_mb": m.get("allocated_bytes.all.current", 0) / 2**20,
                "reserved_mb": m.get("reserved_bytes.all.current", 0) / 2**20,
                "segments": m.get("segment.all.current"), "alloc_retries": m.get("num_alloc_retries")}
    b, c = sizes.probe_decode
    q, n, cd = sizes.probe_mixed
    for name, core in cores.items():
        r, reps = core.runner, sizes.probe_reps
        row[name] = {"decode_graph_ms": _device_ms(r, [(1, c)] * b, reps),
                     "mixed_graph_ms": _device_ms(r, [(q, 0)] + [(1, cd)] * n, reps),
                     "eager_prefill_ms": _device_ms(r, [(sizes.probe_eager, 0)], reps),
                     "host_prepare_ms": _host_prepare_ms(r, sizes.probe_host_batch, c, 4 * reps),
                     "requests_tracked": len(core.requests), "graph_replays": r.num_graph_replays}
    return row


def drift_table(rows: list[dict]) -> dict:
    """Each probe's ratio to the first round, and the worst; eager and host probes also divided by
    the canary's ratio (a host that got slower slows them for a reason that is not the engine's)."""
    first, out = rows[0], {}
    canary = [r["canary_ms"] / first["canary_ms"] for r in rows]
    for model in [k for k, v in first.items() if isinstance(v, dict)]:
        for key in ("decode_graph_ms", "mixed_graph_ms", "eager_prefill_ms", "host_prepare_ms"):
            ratios = [r[model][key] / first[model][key] for r in rows if model in r]
            out[f"{model}/{key}"] = {"ratios": [round(x, 4) for x in ratios],
                                     "max_abs_drift": max(abs(x - 1) for x in ratios)}
            if key in ("eager_prefill_ms", "host_prepare_ms"):
                norm = [x / cr for x, cr in zip(ratios, canary)]
                out[f"{model}/{key}/canary"] = {"ratios": [round(x, 4) for x in norm],
                                                "max_abs_drift": max(abs(x - 1) for x in norm)}
    for key in ("rss_mb", "gc_tracked", "allocated_mb"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            out[key] = {"first": vals[0], "last": vals[-1], "max": max(vals)}
    out["canary_ratios"] = [round(x, 4) for x in canary]
    return out


# ------------------------------------------------------------------------------------ runs
class SoakRunner(gs.Runner):
    """gpu_sweep's Runner, every run at BUDGET tokens unless it asks for another budget; once
    `filling`, runs go on past the queue's deadline (production traffic, each run short)."""

    filling = False
    before_run: Callable[[], None] | None = None  # the soak's probes, between any two runs

    def time_left(self) -> float:
        return 1e9 if self.filling else super().time_left()

    def run(self, purpose: str, name: str, reqs, *, honor_arrivals: bool, description: str,
            max_wall_s: float | None = None, **flags) -> dict | None:
        if self.before_run is not None:
            self.before_run()
        flags.setdefault("max_num_batched_tokens", min(BUDGET, self.core.runner.max_num_batched_tokens))
        if flags.get("enable_chunked_prefill") is False:
            flags.pop("max_num_batched_tokens")  # raised to max_model_len, as vLLM does
        return super().run(purpose, name, reqs, honor_arrivals=honor_arrivals, description=description,
                           max_wall_s=max_wall_s, **flags)


def held_out_runs(r: SoakRunner, plan: gs.Plan, sizes: Sizes, capacity: dict[str, float]) -> None:
    """Runs beyond the calibration's validation set: near saturation, chunking off, n-gram
    speculative decoding, and the ranking set (one workload, six configurations)."""
    cap = capacity["chat-production"]
    reqs = gs.workload_requests("chat-production", sizes.saturated_requests, 0.98 * cap, plan.max_prompt_len)
    r.run("validation", "chat-saturated-async", reqs, honor_arrivals=True, max_wall_s=240,
          description=f"chat-production: first {len(reqs)} requests at {0.98 * cap:.2f} req/s (98% of capacity)",
          async_scheduling=True)
    rate = RANKING_LOAD * cap
    reqs = gs.workload_requests("chat-production", sizes.ranking_requests, rate, plan.max_prompt_len,
                                other_slice=True)
    cap_tokens = r.core.runner.max_num_batched_tokens
    for name, flags in RANKING:
        if "max_num_batched_tokens" in flags:  # (the tiny smoke test's runner is smaller)
            flags = flags | {"max_num_batched_tokens": min(flags["max_num_batched_tokens"], cap_tokens)}
        r.run("validation", f"rank-{name}", reqs, honor_arrivals=True, max_wall_s=120,
              description=f"ranking set: chat-production (seed 1), {len(reqs)} requests at {rate:.2f} req/s "
                          f"({RANKING_LOAD:.0%} of capacity), {name}", **{"async_scheduling": True, **flags})
    reqs = gs.workload_requests("chat-production", max(plan.min_validation_requests, int(0.6 * cap * 20)),
                                0.6 * cap, plan.max_prompt_len)
    r.run("validation", "chat-ngram-k4", reqs, honor_arrivals=True, max_wall_s=120,
          description="chat-production at 60% of capacity, n-gram speculative decoding k=4 (synchronous)",
          speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                              "prompt_lookup_max": 4})


def overload_run(r: SoakRunner, plan: gs.Plan) -> None:
    """Mooncake conversation at 11x its recorded pace (the first requests arrive within ~10 s;
    prompts average ~13K tokens): far past capacity, decode steps over millions of KV tokens.
    Cut at 60 s; the question is where the time goes (each step against the cost model)."""
    reqs = gs.workload_requests("mooncake-conversation", 300, None, plan.max_prompt_len)
    reqs = [dataclasses.replace(q, arrival_s=q.arrival_s / 11.0) for q in reqs]
    r.run("validation", "mooncake-overload", reqs, honor_arrivals=True, max_wall_s=60,
          description="mooncake-conversation: first 300 requests at 11x their recorded pace (overload), cut at 60 s",
          async_scheduling=True)


def production_filler(r: SoakRunner, plan: gs.Plan, capacity: dict[str, float], k: int, max_wall_s: float) -> None:
    """More production-like traffic (another slice each time), at most `max_wall_s`."""
    source = ("chat-production", "code-bursty", "mooncake-conversation")[k % 3]
    rate = 0.8 * capacity[source]
    reqs = gs.workload_requests(source, max(plan.min_validation_requests, int(rate * max_wall_s * 0.7)), rate,
                                plan.max_prompt_len, other_slice=bool(k % 2))
    r.filling = True
    r.run("soak", f"filler-{k}-{source}", reqs, honor_arrivals=True, max_wall_s=max_wall_s,
          description=f"soak traffic: {source} at 80% of capacity", async_scheduling=k % 2 == 0)


# ------------------------------------------------------------------------------------ main
def build(model: str, sizes: Sizes, device: str, tiny: bool) -> EngineCore:
    args = EngineArgs(model=model, device=device, max_num_seqs=256, max_num_batched_tokens=sizes.runner_budget,
                      max_model_len=sizes.max_model_len, num_gpu_blocks_override=sizes.blocks[model], seed=0,
                      **({"dtype": "float32"} if tiny else {}))
    core = EngineCore(args, progress=log)
    warm = core.warm_up()
    log(f"{model}: warm-up {warm.seconds:.1f} s, {warm.kernels_compiled} kernel variants")
    return core


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=["llama-3.1-8b", "llama-3.2-1b"])
    ap.add_argument("--minutes", type=float, default=20.0, help="keep serving at least this long")
    ap.add_argument("--deadline-s", type=float, default=1180.0,
                    help="start no sweep or validation part after this (production traffic fills up to --minutes)")
    ap.add_argument("--probe-every-s", type=float, default=60.0)
    ap.add_argument("--tiny", action="store_true", help="tiny model on the CPU: a smoke test")
    a = ap.parse_args(argv)
    sizes = TINY_SIZES if a.tiny else Sizes()
    models = ["tiny"] if a.tiny else a.models
    device = "cpu" if a.tiny else "cuda"
    a.out.mkdir(parents=True, exist_ok=True)
    gs.T0 = T0  # one clock for both scripts' deadlines and logs
    cores = {m: build(m, sizes, device, a.tiny) for m in models}
    meta = {"gpu": "h200" if torch.cuda.is_available() and "H200" in torch.cuda.get_device_name() else device,
            "engine_commit": gs._commit(), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "versions": {"torch": torch.__version__, "python": platform.python_version(),
                         "triton": gs._version("triton"), "cuda": torch.version.cuda},
            "soak": True, "startup": {m: c.startup.as_dict() for m, c in cores.items()}}
    runners = {m: SoakRunner(c, a.out, m, meta, a.deadline_s) for m, c in cores.items()}
    plans = {m: gs.TINY if a.tiny else gs.LARGE if "8b" in m else gs.Plan() for m in models}
    probes: list[dict] = []
    errors: list[dict] = []
    capacity: dict[str, dict[str, float]] = {}
    extra: dict[str, Any] = {}  # one-time measurements (the FP8 GEMMs)
    last_probe = [-1e9]

    def save() -> None:
        doc = {"meta": meta, "probes": probes, "drift": drift_table(probes) if probes else {}, "errors": errors,
               "capacity": capacity, "elapsed_s": time.perf_counter() - T0, **extra}
        (a.out / "soak.json").write_text(json.dumps(jsonable(doc), indent=1) + "\n")
        for m, r in runners.items():
            (a.out / m).mkdir(parents=True, exist_ok=True)
            (a.out / m / "index.json").write_text(json.dumps(jsonable(
                {"capacity_rps": capacity.get(m, {}), "runs": r.index, **meta}), indent=2) + "\n")

    def maybe_probe(force: bool = False) -> None:
        if force or time.perf_counter() - last_probe[0] >= a.probe_every_s:
            last_probe[0] = time.perf_counter()
            probes.append(probe(cores, sizes))
            log("probe", json.dumps(jsonable(probes[-1])))
            save()

    def item(name: str, fn: Callable[[], None]) -> None:
        maybe_probe()
        if time.perf_counter() - T0 > a.deadline_s:
            log(f"SKIP {name}: past the deadline")
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the soak goes on; the error is reported
            errors.append({"item": name, "error": repr(exc), "trace": traceback.format_exc()[-3000:]})
            log(f"ERROR {name}: {exc!r}")
        save()

    meta["token_check"] = {m: token_check(c, 8 if a.tiny else 24, 200 if a.tiny else 1500) for m, c in cores.items()}
    log(f"async vs sync greedy tokens: {meta['token_check']}")
    for r in runners.values():  # a minute's probes may fall due inside a long item too
        r.before_run = maybe_probe
    probe(cores, sizes)  # once unrecorded: the probes' own first-use costs (kernel variants, buffers)
    maybe_probe(force=True)
    for m in models:
        r, plan, ids = runners[m], plans[m], gs.Ids()

        def probes_of(m=m, r=r, plan=plan) -> None:
            capacity[m] = {s: gs.probe_capacity(r, plan, s) for s in dict.fromkeys(v[1] for v in gs.VALIDATION)}
            log(f"{m} capacity: {capacity[m]}")

        item(f"{m} capacity", probes_of)
        if m not in capacity:
            continue
        item(f"{m} validation", lambda r=r, plan=plan, m=m: gs.validation_runs(r, plan, capacity[m]))
        if m == models[0]:
            item(f"{m} held-out", lambda r=r, plan=plan, m=m: held_out_runs(r, plan, sizes, capacity[m]))
        else:
            item(f"{m} overload", lambda r=r, plan=plan: overload_run(r, plan))
    for m in models:
        r, plan, ids = runners[m], plans[m], gs.Ids()
        if m not in capacity:
            continue
        for part, fn in (("decode grid", gs.decode_grid), ("skewed decode", gs.decode_skew),
                         ("prefill", gs.prefill_sweep)):
            item(f"{m} {part}", lambda fn=fn, r=r, plan=plan, ids=ids: fn(r, plan, ids))
        item(f"{m} mixed", lambda r=r, plan=plan, ids=ids, m=m: gs.mixed_sweep(r, plan, capacity[m]["chat-production"],
                                                                                ids))
    k = 0  # production traffic until the soak has lasted --minutes (past --deadline-s too: it is short)
    while time.perf_counter() - T0 < 60 * a.minutes and any(m in capacity for m in models):
        m = models[k % len(models)]
        if m in capacity:
            left = 60 * a.minutes - (time.perf_counter() - T0)
            maybe_probe()
            try:
                production_filler(runners[m], plans[m], capacity[m], k, max(10.0, min(60.0, left + 5)))
            except Exception as exc:  # noqa: BLE001 - reported, the soak goes on
                errors.append({"item": f"filler {k}", "error": repr(exc), "trace": traceback.format_exc()[-3000:]})
            save()
        k += 1
        if a.tiny and k >= 2:
            break
    maybe_probe(force=True)
    log(f"done: {len(probes)} probe rounds, {sum(len(r.index) for r in runners.values())} runs, {len(errors)} errors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
