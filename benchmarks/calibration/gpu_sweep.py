"""Engine runs to calibrate the simulator from (`sweep`) and to validate it on (`validation`), one GPU call.

Every run is written as an engine run folder (the format `costline calibrate` and `costline
validate` read): requests.jsonl, steps.jsonl, summary.json, metrics.prom, scheduler_stats.json (the
replay's tables), workload.jsonl (the exact requests, Mooncake JSONL: the engine replays them as
reloaded from this file, so the simulator sees the same requests) and run.json (model, GPU, every
engine flag, the KV memory terms, engine commit, versions).

One engine per model (random weights of the preset's shape, CUDA graphs, Triton kernels), warmed up
once; between runs it starts over with a fresh scheduler (`EngineCore.start_over`), with the
scheduling flags each run asks for. Parts:

* sweep (fitting only): decode-only batches on a batch x context grid (sync and async); prefill
  chunks from 16 to 32K tokens alone, and after a cached prefix; mixed traffic at two loads and two
  token budgets; a saturated offline burst of each validation workload's request mix (this also
  measures its capacity); a tight KV pool with preemption.
* validation (never fitted on): chat-production at 0.3 / 0.7 / 0.9 / 1.15 of its measured
  capacity (async), rag-long-prompt (prompts beyond the token budget, sync), the Mooncake
  conversation trace (high prefix reuse, sync), chat-production with a KV pool small enough to
  preempt (sync), code-bursty (async).

    python3 benchmarks/calibration/gpu_sweep.py --model llama-3.2-1b --out DIR     # one H200, ~6 min
    python3 benchmarks/calibration/gpu_sweep.py --model tiny --device cpu --tiny --out DIR   # smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.replay import replay
from engine.sampling import SamplingParams
from kernels import compiled_kernel_keys
from sim.builtin_traces import BUILTIN_TRACES
from sim.workload_source import SourceOptions, load_workload

T0 = time.perf_counter()


def log(*a) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


@dataclasses.dataclass
class Plan:
    """Sizes of the sweep: the full one on an H200, a tiny one for the CPU smoke test."""

    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    decode_contexts: tuple[int, ...] = (256, 2048, 8192)
    decode_max_tokens: int = 320_000  # batch x context above this is skipped (prefill time)
    decode_steps: int = 40
    # skewed decode batches: B-1 short sequences beside one long one (a batch waiting on its
    # longest sequence, and split-KV cutting only that one): the uniform grid cannot tell the
    # longest-sequence term from the sum-of-contexts term
    skew_batches: tuple[int, ...] = (2, 8, 16, 32, 64, 128, 256)
    skew_short: int = 512
    skew_long: tuple[int, ...] = (8192, 32768)
    prefill_lens: tuple[int, ...] = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    cached_prefixes: tuple[int, ...] = (1024, 8192)
    cached_news: tuple[int, ...] = (64, 512, 2048)
    mixed_s: float = 14.0
    probe_requests: int = 300
    probe_tokens: int = 1_200_000  # a probe stops adding requests past this many prompt tokens
    validation_s: float = 20.0
    min_validation_requests: int = 60
    max_prompt_len: int = 16384
    tight_sequences: float = 24.0  # the tight runs' KV pool holds this many average requests


# the 8B shape computes ~5x longer per token: shorter runs so both parts fit one 10-minute call
LARGE = Plan(decode_max_tokens=200_000, mixed_s=10.0, probe_tokens=300_000, validation_s=14.0)
TINY = Plan(decode_batches=(1, 4), decode_contexts=(16, 64), decode_max_tokens=10_000, decode_steps=4,
            skew_batches=(2, 8), skew_short=16, skew_long=(200,),
            prefill_lens=(16, 100), cached_prefixes=(32,), cached_news=(16,), mixed_s=0.5, probe_requests=12,
            validation_s=0.5, min_validation_requests=8, max_prompt_len=200, tight_sequences=3.0)


# ---------------------------------------------------------------------- requests
class Ids:
    """Fresh request ids and hash ids, so synthetic prompts share nothing unless asked to."""

    def __init__(self) -> None:
        self.req, self.hash = 0, 10**9

    def request(self, arrival_s: float, prompt_len: int, output_len: int, prefix: tuple[int, ...] = (),
                hash_block_size: int = 16) -> Request:
        n = -(-prompt_len // hash_block_size) - len(prefix)
        own = tuple(range(self.hash, self.hash + n))
        self.hash += n
        self.req += 1
        return Request(self.req - 1, arrival_s, prompt_len, output_len, prefix + own, hash_block_size=hash_block_size)


def write_requests(reqs: list[Request], path: Path) -> None:
    """Mooncake JSONL (timestamps in integer ms from the first arrival), as sim.traces.export_mooncake."""
    t0 = reqs[0].arrival_s
    with path.open("w") as f:
        for r in reqs:
            f.write(json.dumps({"timestamp": round((r.arrival_s - t0) * 1000), "input_length": r.prompt_len,
                                "output_length": r.output_len, "hash_ids": list(r.hash_ids)}) + "\n")


def reload(path: Path, hash_block_size: int) -> list[Request]:
    wl = load_workload(str(path), SourceOptions(trace_format="mooncake", hash_block_size=hash_block_size))
    return list(wl)


def truncate(reqs: list[Request], max_prompt_len: int) -> list[Request]:
    out = []
    for r in reqs:
        if r.prompt_len > max_prompt_len:
            r = dataclasses.replace(r, prompt_len=max_prompt_len,
                                    hash_ids=r.hash_ids[: -(-max_prompt_len // r.hash_block_size)],
                                    prompt_token_ids=None)
        out.append(r)
    return out


def workload_requests(name: str, n: int, rate_rps: float | None, max_prompt_len: int, *,
                      other_slice: bool = False, seed: int | None = None) -> list[Request]:
    """`n` requests of a preset (generated: `other_slice` draws them with another seed, 1, or
    `seed` if given) or of a built-in trace (its first n, or with `other_slice` its last n), at
    `rate_rps` if given."""
    if name in BUILTIN_TRACES:
        hb = 512  # the Mooncake trace's hash block size
        reqs = list(load_workload(name, SourceOptions(hash_block_size=hb)))
        reqs = reqs[-n:] if other_slice else reqs[:n]
        if rate_rps is not None:
            span = reqs[-1].arrival_s - reqs[0].arrival_s
            scale = (len(reqs) - 1) / rate_rps / span if span > 0 else 1.0
            reqs = [dataclasses.replace(r, arrival_s=(r.arrival_s - reqs[0].arrival_s) * scale) for r in reqs]
    else:
        draw = seed if seed is not None else 1 if other_slice else None
        reqs = list(load_workload(name, SourceOptions(num_requests=n, rate_rps=rate_rps, seed=draw)))
    return truncate(reqs, max_prompt_len)


# ---------------------------------------------------------------------- runs
class Runner:
    def __init__(self, core: EngineCore, out: Path, model: str, meta: dict, deadline_s: float,
                 temperature: float = 0.0) -> None:
        self.core, self.out, self.model, self.meta, self.deadline_s = core, out, model, meta, deadline_s
        self.index: list[dict] = []
        # > 0: every request samples at this temperature (seeded by its id) instead of decoding greedily
        self.temperature = temperature

    def params_for(self, req: Request) -> SamplingParams:
        return SamplingParams(max_tokens=req.output_len, ignore_eos=True, temperature=self.temperature,
                              seed=req.request_id if self.temperature else None)

    def time_left(self) -> float:
        return self.deadline_s - (time.perf_counter() - T0)

    def run(self, purpose: str, name: str, reqs: list[Request], *, honor_arrivals: bool, description: str,
            max_wall_s: float | None = None, **flags) -> dict | None:
        """Replay `reqs` (as reloaded from their workload.jsonl) with scheduling `flags`; write the folder."""
        if self.time_left() < 20:
            log(f"SKIP {purpose}/{name}: {self.time_left():.0f} s left")
            return None
        folder = self.out / self.model / purpose / name
        folder.mkdir(parents=True, exist_ok=True)
        hb = reqs[0].hash_block_size
        write_requests(reqs, folder / "workload.jsonl")
        reqs = reload(folder / "workload.jsonl", hb)
        self.core.start_over(**flags)
        compiled0 = compiled_kernel_keys()
        t = time.perf_counter()
        cap = min(max_wall_s or 1e9, max(5.0, self.time_left() - 15))
        res = replay(self.core, reqs, params_for=self.params_for, honor_arrivals=honor_arrivals, max_wall_s=cap)
        wall = time.perf_counter() - t
        summary = res.write_files(folder)
        args = self.core.config.model_dump(mode="json")
        run = {"schema": "costline-engine-run/1", "name": name, "purpose": purpose, "model": self.model,
               "gpu": self.meta["gpu"], "engine_args": args, "hash_block_size": hb,
               "honor_arrivals": honor_arrivals, "num_gpu_blocks": self.core.num_gpu_blocks,
               "memory": self.core.runner.memory_report, "description": description,
               "kernels_compiled_during_run": len(compiled_kernel_keys() - compiled0),
               "kernel_variants_compiled_during_run": sorted(map(list, compiled_kernel_keys() - compiled0)),
               "unfinished_ids": len(res.unfinished_ids), "wall_s": wall,
               "sampling": {"temperature": self.temperature, "seed": "request id" if self.temperature else None},
               **self.meta}
        (folder / "run.json").write_text(json.dumps(run, indent=2) + "\n")
        row = {"purpose": purpose, "name": name, "requests": len(reqs), "steps": len(res.steps["step_id"]),
               "wall_s": round(wall, 1), "req_per_s": summary.get("request_throughput"),
               "out_tok_per_s": summary.get("output_throughput"), "ttft_p99_ms": summary.get("p99_ttft_ms"),
               "tpot_p50_ms": summary.get("median_tpot_ms"), "preempt": summary.get("num_preemptions"),
               "unfinished": len(res.unfinished_ids), "compiled": run["kernels_compiled_during_run"]}
        self.index.append(row)
        log(json.dumps(row))
        return summary


def decode_grid(r: Runner, plan: Plan, ids: Ids) -> None:
    """B requests of one context length, all at t=0: after their prefill, decode-only steps at
    batch B and context ~ctx (outputs of `decode_steps` tokens)."""
    for async_ in (False, True):
        for ctx in plan.decode_contexts:
            for b in plan.decode_batches:
                if b * ctx > plan.decode_max_tokens or (async_ and b not in (1, 8, 64, 256, plan.decode_batches[-1])):
                    continue
                reqs = [ids.request(0.0, ctx, plan.decode_steps) for _ in range(b)]
                r.run("sweep", f"decode-b{b}-c{ctx}-{'async' if async_ else 'sync'}", reqs, honor_arrivals=False,
                      description=f"{b} x {ctx}-token prompts at t=0, {plan.decode_steps} output tokens each",
                      async_scheduling=async_)


def decode_skew(r: Runner, plan: Plan, ids: Ids) -> None:
    """B-1 requests of `skew_short` tokens and one of a long context, all at t=0 (sync and async
    at a few batches): decode-only steps whose longest context is far above the mean."""
    for async_ in (False, True):
        for long in plan.skew_long:
            for b in plan.skew_batches:
                if async_ and b not in (8, 64, 256):
                    continue
                reqs = [ids.request(0.0, long, plan.decode_steps)] + [
                    ids.request(0.0, plan.skew_short, plan.decode_steps) for _ in range(b - 1)]
                r.run("sweep", f"decode-skew-b{b}-l{long}-{'async' if async_ else 'sync'}", reqs, honor_arrivals=False,
                      description=f"one {long}-token and {b - 1} x {plan.skew_short}-token prompts at t=0, "
                                  f"{plan.decode_steps} output tokens each", async_scheduling=async_)


def prefill_sweep(r: Runner, plan: Plan, ids: Ids) -> None:
    """One prompt at a time (arrivals 1 s apart would waste time: each waits for the previous)."""
    for async_ in (False, True):
        tag = "async" if async_ else "sync"
        reqs, t = [], 0.0
        for p in plan.prefill_lens:
            reqs.append(ids.request(t, p, 2))
            t += 0.05 + p / 2e5
        r.run("sweep", f"prefill-alone-{tag}", reqs, honor_arrivals=True,
              description="single prompts of 16..32K tokens, 2 output tokens, one at a time",
              async_scheduling=async_)
        reqs, t = [], 0.0
        for c in plan.cached_prefixes:
            for new in plan.cached_news:
                first = ids.request(t, c, 2)
                prefix = first.hash_ids[: c // 16]
                reqs += [first, ids.request(t + 0.1 + c / 2e5, c + new, 2, prefix=prefix)]
                t += 0.2 + 2 * c / 2e5
        r.run("sweep", f"prefill-cached-{tag}", reqs, honor_arrivals=True,
              description="a prompt, then the same prefix plus 64..2048 new tokens (a prefix-cache hit)",
              async_scheduling=async_)


def mixed_sweep(r: Runner, plan: Plan, capacity_rps: float, ids: Ids) -> None:
    """Uniform lengths under Poisson arrivals: mixed prefill + decode steps of every size."""
    rng = np.random.default_rng(7)
    # a 512-token budget first: its steps (a chunk beside running decodes) replay mixed CUDA
    # graphs, the step kind the default budget's large chunks rarely produce
    for load, budget, async_ in ((0.7, 512, True), (0.5, None, False), (0.9, None, True), (0.8, 2048, False),
                                 (1.0, 2048, True)):
        rate = load * capacity_rps
        n = max(20, int(rate * plan.mixed_s))
        arr = np.cumsum(rng.exponential(1 / rate, n))
        reqs = [ids.request(float(a), int(p), int(o)) for a, p, o in
                zip(arr, rng.integers(16, 4096, n), rng.integers(16, 512, n))]
        flags = {"async_scheduling": async_}
        if budget:
            flags["max_num_batched_tokens"] = min(budget, r.core.runner.max_num_batched_tokens)
        r.run("sweep", f"mixed-load{int(load * 100)}-budget{budget or 'default'}-{'async' if async_ else 'sync'}",
              reqs, honor_arrivals=True, description=f"Poisson {rate:.1f} req/s, prompts U[16,4096), outputs "
              f"U[16,512)", max_wall_s=plan.mixed_s * 1.5, **flags)


VALIDATION = (  # name, source, load (fraction of capacity), async, extra flags
    ("chat-low", "chat-production", 0.3, True, {}),
    ("chat-mid", "chat-production", 0.7, True, {}),
    ("chat-high", "chat-production", 0.9, True, {}),
    ("chat-overload", "chat-production", 1.15, True, {}),
    ("rag-long-prompt", "rag-long-prompt", 0.6, False, {}),
    ("mooncake-prefix-reuse", "mooncake-conversation", 0.7, False, {}),
    ("chat-tight-kv", "chat-production", 0.6, False, {"tight": True}),
    ("code-bursty", "code-bursty", 0.7, True, {}),
)


def tight_pool_blocks(reqs: list[Request], block_size: int, plan: Plan) -> int:
    """A KV pool of `tight_sequences` average requests (prompt + output), and never less than the
    largest request plus a little: at the loads used, more than that many run, so the scheduler preempts."""
    need = [-(-(r.prompt_len + r.output_len) // block_size) for r in reqs]
    return max(int(plan.tight_sequences * float(np.mean(need))), max(need) + 16)


def probe_capacity(r: Runner, plan: Plan, source: str) -> float:
    """Requests per second the engine sustains on `source`'s mix, everything submitted at t=0
    (the probe's steps are fitting data: saturated batches of the real length mix)."""
    # another slice than the validation runs use: no validation request is ever fitted on
    reqs = workload_requests(source, plan.probe_requests, None, plan.max_prompt_len, other_slice=True)
    cum = np.cumsum([q.prompt_len for q in reqs])
    reqs = reqs[: max(20, int(np.searchsorted(cum, plan.probe_tokens)))]
    summary = r.run("sweep", f"probe-{source}", reqs, honor_arrivals=False,
                    description=f"first {len(reqs)} requests of {source}, all at t=0 (capacity probe)",
                    async_scheduling=True)
    if summary is None:
        raise RuntimeError("no time left for the capacity probe")
    return float(summary["request_throughput"])


def validation_runs(r: Runner, plan: Plan, capacity: dict[str, float], only: set[str] | None = None) -> None:
    for name, source, load, async_, extra in VALIDATION:
        if only is not None and name not in only:
            continue
        rate = load * capacity[source]
        n = max(plan.min_validation_requests, int(rate * plan.validation_s))
        reqs = workload_requests(source, n, rate, plan.max_prompt_len)
        flags = {"async_scheduling": async_}
        if extra.get("tight"):
            flags["num_gpu_blocks_override"] = tight_pool_blocks(reqs, r.core.config.block_size, plan)
        r.run("validation", name, reqs, honor_arrivals=True, max_wall_s=plan.validation_s * 4,
              description=f"{source}: first {n} requests at {rate:.2f} req/s ({load:.0%} of the measured "
              f"capacity {capacity[source]:.2f} req/s)", **flags)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke test on any device")
    ap.add_argument("--parts", default="sweep,validation",
                    help="sweep,validation; or decode (the grid only), skew (the skewed decode batches only), "
                         "or decode,skew; or mixed (the mixed-load runs only, with --capacity)")
    ap.add_argument("--capacity", type=json.loads, default=None,
                    help='--parts mixed: the measured capacities instead of probing them, JSON '
                         '{"chat-production": 10.3, ...}')
    ap.add_argument("--validation-only", default="",
                    help="--parts mixed: also these validation runs (comma list of names)")
    ap.add_argument("--deadline-s", type=float, default=500.0, help="start no run after this")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    a = ap.parse_args()
    plan = TINY if a.tiny else LARGE if "8b" in a.model else Plan()
    parts = set(a.parts.split(","))
    args = EngineArgs(model=a.model, device=a.device, max_num_seqs=a.max_num_seqs,
                      max_num_batched_tokens=a.max_num_batched_tokens, seed=0,
                      **({"max_model_len": 1024, "dtype": "float32"} if a.tiny else {}))
    core = EngineCore(args)
    log(f"engine: {core.num_gpu_blocks} KV blocks, graphs captured in {core.graph_capture_s:.1f} s")
    warm = core.warm_up()
    log(f"warm-up: {warm}")
    gpu = torch.cuda.get_device_name() if core.runner.is_cuda else "cpu"
    meta = {"gpu": "h200" if "H200" in gpu else gpu,
            "engine_commit": _commit(), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "versions": {"torch": torch.__version__, "python": platform.python_version(),
                         "triton": _version("triton"), "cuda": torch.version.cuda},
            "warm_up": dataclasses.asdict(warm)}
    r = Runner(core, a.out, a.model, meta, a.deadline_s)
    ids = Ids()
    if parts <= {"decode", "skew"}:  # decode runs alone (re-measured after a decode-kernel change)
        if "skew" in parts:
            decode_skew(r, plan, ids)
        if "decode" in parts:
            decode_grid(r, plan, ids)
        (a.out / a.model / "index.json").write_text(json.dumps({"runs": r.index, **meta}, indent=2) + "\n")
        return
    if parts == {"mixed"}:  # the mixed-load runs (and named validation runs) a shortened call skipped
        if not a.capacity:
            ap.error("--parts mixed needs --capacity (the probes' req/s from the earlier call)")
        mixed_sweep(r, plan, a.capacity["chat-production"], ids)
        if a.validation_only:
            validation_runs(r, plan, a.capacity, set(a.validation_only.split(",")))
        (a.out / a.model / "index.json").write_text(json.dumps({"capacity_rps": a.capacity, "runs": r.index,
                                                                **meta}, indent=2) + "\n")
        log("done")
        return
    capacity = {}
    for source in dict.fromkeys(v[1] for v in VALIDATION):
        capacity[source] = probe_capacity(r, plan, source)
    log(f"capacity (req/s): {capacity}")
    if "sweep" in parts:  # validation runs come in between, so a call that runs out of time has some of both
        decode_grid(r, plan, ids)
        decode_skew(r, plan, ids)
        prefill_sweep(r, plan, ids)
    if "validation" in parts:
        validation_runs(r, plan, capacity)
    if "sweep" in parts:
        mixed_sweep(r, plan, capacity["chat-production"], ids)
        rate = 0.6 * capacity["chat-production"]
        # another seed than the validation runs: the same traffic law, other requests
        reqs = workload_requests("chat-production", max(40, int(rate * plan.mixed_s)), rate, plan.max_prompt_len,
                                 other_slice=True)
        r.run("sweep", "chat-tight-kv-other-seed", reqs, honor_arrivals=True, max_wall_s=plan.mixed_s * 3,
              description="chat-production (seed 1), tight KV pool (preemptions)",
              num_gpu_blocks_override=tight_pool_blocks(reqs, core.config.block_size, plan))
    (a.out / a.model / "index.json").write_text(json.dumps({"capacity_rps": capacity, "runs": r.index,
                                                            **meta}, indent=2) + "\n")
    log("done")


def _commit() -> str:
    """The commit of the engine code that ran: $COSTLINE_COMMIT when the caller set it (a device
    machine gets a copy of the tree without .git), else HEAD, marked "-dirty" when the engine or
    kernels differ from it (a stale HEAD would otherwise be recorded for code that is not in it)."""
    sent = os.environ.get("COSTLINE_COMMIT")
    if sent:
        return sent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "engine", "kernels"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _version(name: str) -> str:
    try:
        import importlib.metadata as md

        return md.version(name)
    except Exception:  # noqa: BLE001 - a missing package is reported as such
        return "absent"


if __name__ == "__main__":
    main()
