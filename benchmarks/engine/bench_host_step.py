"""Host time of a steady decode step as the engine runs it, on the CPU: the real `EngineCore`
loop (async or synchronous scheduling) with the GPU's parts replaced by stand-ins that cost
nothing, so every figure is host work.

    PYTHONPATH=. python benchmarks/engine/bench_host_step.py [--batch 32 128 256] [--mode async sync]
        [--steps 200] [--repeats 5] [--context 1000 1300] [--compare-ref GIT_REV]
        [--out FILE.json [--force]] [--profile] [--functions]

An `EngineCore` on the CPU (the tiny model; its forward never runs) holds `--batch` requests
past their prefill, at contexts uniform in `--context` tokens (the H200's `diagnose.py host`
replays 1.0-1.3K), with outputs too long to finish during the run. Every decode bucket has a
stand-in CUDA graph whose replay does nothing (its logits buffer is read as the GPU graph's
would be; 16 columns wide, so the sampler's argmax costs what its launch would), the step's timing events are stand-ins (record/synchronize/elapsed_time, as
tests/engine/test_core_events.py), and so is the runner's staging event (`torch.cuda.Event`
and the stream calls, patched, with `runner.is_cuda` set). Everything else is the engine's
code: schedule(), the admissions' stamps, the batch's columns, the token-id view, runner.prepare()
with its host-to-device copy calls on CPU tensors and (async) the in-flight token gather,
the sampler, the token read-back, the collection of the previous step and update_from_output.

Per step (median of `--steps` steady decode steps, the least-disturbed of `--repeats`
repeats), microseconds: `schedule` and `prepare` are the engine's own step-table columns
(`prepare` = t1..t2 of the step: the stamps, the columns, the token ids and runner.prepare),
`launch` = the forward's launch (sync) or the forward's launch, the sampling and the token copy
(async; StepResult.launch_s), `update` = update_from_output, `rest` = the rest of step()
(async: collecting the previous step and the update; sync: sampling, read-back, update), `step` =
the whole step() call. `ops` counts the torch ops of one
steady step's runner.prepare() (a TorchDispatchMode: on a GPU each costs ~10-50 us of host
time; `views` = how many of them only make a view) and `step_ops` those of the whole step;
`events` the stand-in event calls of the step (records, synchronizes, creations).

`--compare-ref REV` measures the same table for the code at git revision REV (its engine/ and
kernels/ packages, extracted with `git archive`; this script is the same) in the same run: the
repeats alternate between this tree and REV, each in a fresh process, so both see the same
machine load. `--profile` prints cProfile's top functions over the steps of the first batch
and mode (this tree only). `--functions` also times each host function the code has (a wrapper
around each, after the unwrapped figures; the least of 3 rounds): us per step by function.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.op_counter import OpCounter

BLOCK_SIZE = 16
MAX_MODEL_LEN = 8192


@dataclass(slots=True)
class Row:
    batch: int
    mode: str
    schedule_us: float
    prepare_us: float
    launch_us: float
    update_us: float
    rest_us: float  # the rest of step(), update_from_output included
    step_us: float
    ops: int = -1  # torch ops of one steady step's runner.prepare()
    views: int = -1  # of which views
    step_ops: int = -1  # torch ops of the whole step() call
    events: int = -1  # stand-in event calls of one step
    op_names: dict | None = None  # runner.prepare()'s ops by name
    functions: dict | None = None  # --functions: us per step of each host function (wrapped)

    @property
    def host_us(self) -> float:
        return self.schedule_us + self.prepare_us


# ---------------------------------------------------------------------------- GPU stand-ins
class _Calls:
    n = 0


class _Event:
    """torch.cuda.Event's contract, doing nothing but counting its calls."""

    def __init__(self, *a, **k) -> None:
        _Calls.n += 1
        self.t = 0.0

    def record(self, stream=None) -> None:
        _Calls.n += 1
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        _Calls.n += 1

    def query(self) -> bool:
        _Calls.n += 1
        return True

    def elapsed_time(self, end: _Event) -> float:
        return (end.t - self.t) * 1e3


class _Stream:
    def wait_stream(self, other) -> None:
        pass

    def record_event(self, event=None):
        event = event or _Event()
        event.record(self)
        return event


_STREAM = _Stream()


def _patch_cuda() -> None:
    """The torch.cuda calls the engine's GPU-only host path makes, as cheap stand-ins."""
    torch.cuda.Event = _Event
    torch.cuda.current_stream = lambda device=None: _STREAM
    torch.cuda.default_stream = lambda device=None: _STREAM
    torch.cuda.Stream = lambda device=None, **k: _Stream()


class _NoGraph:
    """A captured CUDA graph whose replay costs the host nothing here."""

    def replay(self) -> None:
        pass


def _engine(batch: int, mode: str, context: tuple[int, int], seed: int = 0):
    """An engine on the CPU with `batch` requests decoding at contexts in `context` (prefill
    steps skip the model: their forward returns zero logits)."""
    from engine.core.config import EngineArgs
    from engine.core.model_spec import get_model
    from engine.core.request import Request
    from engine.engine_loop import EngineCore
    from engine.model import LlamaModel
    from engine.sampling import SamplingParams

    model = LlamaModel(get_model("tiny"), max_positions=MAX_MODEL_LEN, dtype=torch.float32, seed=0)
    ctx_max = context[1]
    blocks = batch * (-(-(ctx_max + 2048) // BLOCK_SIZE)) + 64
    args = EngineArgs(model="tiny", device="cpu", dtype="float32", seed=seed, max_num_seqs=batch,
                      max_num_batched_tokens=8192, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
                      num_gpu_blocks_override=blocks, async_scheduling=mode == "async")
    core = EngineCore(args, model=model, progress=lambda *a: None)
    runner = core.runner
    vocab = model.spec.vocab_size
    # the stand-in logits are 16 wide: the sampler's argmax is a launch on a GPU, not 512
    # columns of CPU work per row
    logits = torch.randn(max(batch, 8192), 16)
    for b in runner.decode_graph_sizes():
        runner.graphs[b] = _NoGraph()
        runner._graph_logits[b] = logits[:b]
    real_forward = runner.forward

    def forward(inp):  # prefill steps (eager here) skip the model
        return real_forward(inp) if inp.graph_kind else logits[: inp.num_logits]

    runner.forward = forward
    runner.is_cuda = True  # the staging event path, on the stand-ins
    core._use_events = True
    core._new_event = lambda: _Event(enable_timing=True)
    rng = np.random.default_rng(seed)
    for rid, n in enumerate(rng.integers(context[0], context[1] + 1, size=batch).tolist()):
        prompt = rng.integers(4, vocab, size=n).tolist()
        out_len = MAX_MODEL_LEN - n - 1
        core.add_request(Request(rid, 0.0, n, out_len, tuple(range(-(-n // BLOCK_SIZE)))),
                         SamplingParams(max_tokens=out_len, ignore_eos=True), prompt)
    while core.scheduler.num_waiting or not all(len(st.token_ids) > st.num_prompt_tokens
                                                for st in core.requests.values()):
        core.step()
    for _ in range(20):  # steady: both staging sets and every row written before
        core.step()
    return core


def _time_steps(core, steps: int) -> dict[str, list[float]]:
    """Per steady step (seconds): schedule, prepare (t1..t2), launch, update_from_output, the
    rest of step(), the whole step() call."""
    clock = time.perf_counter
    sched = core.scheduler
    real_update = sched.update_from_output
    upd_s: list[float] = []

    def update(*a, **k):
        t = clock()
        try:
            return real_update(*a, **k)
        finally:
            upd_s.append(clock() - t)

    sched.update_from_output = update
    walls, results = [], []
    try:
        for _ in range(steps + 1):
            t = clock()
            res = core.step()
            walls.append(clock() - t)
            results.append(res)
    finally:
        del sched.update_from_output
    sync = not core.async_scheduling
    # async: step() returns the previous step's record (call i's step comes back from call i + 1)
    recs = results[:-1] if sync else results[1:]
    walls, upd_s = walls[:-1], upd_s[:-1]
    sch = [r.trace.schedule_s for r in recs]
    launch = [r.launch_s for r in recs]
    # sync: the record's prepare_s also holds the update after the sampling (t4..t5)
    prep = [r.trace.prepare_s - (u if sync else 0.0) for r, u in zip(recs, upd_s)]
    rest = [w - s - p - la for w, s, p, la in zip(walls, sch, prep, launch)]
    return {"schedule": sch, "prepare": prep, "launch": launch, "update": upd_s, "rest": rest, "step": walls}


def _count(core) -> tuple[OpCounter, OpCounter, int]:
    """Ops of one steady step's runner.prepare() and of the whole step; event calls."""
    runner = core.runner
    prep_ops = OpCounter()
    real = runner.prepare

    def counted(*a, **k):
        with prep_ops:
            return real(*a, **k)

    runner.prepare = counted
    step_ops = OpCounter()
    _Calls.n = 0
    with step_ops:
        core.step()
    events = _Calls.n
    del runner.prepare
    return prep_ops, step_ops, events


# host functions timed by --functions, where the code has them (owner, name)
FUNCTIONS = (("scheduler", "schedule"), ("scheduler", "update_from_output"), ("output", "columns"),
             ("core", "_note_first_scheduled"), ("core", "_collect"), ("core", "sample_step"), ("sampler", "sample"),
             ("runner", "prepare"), ("runner", "_stage_block_tables"), ("runner", "_write_rows"),
             ("runner", "_layout"), ("runner", "_stage_host"), ("runner", "_stage_gather"),
             ("runner", "_stage_block_entries"), ("runner", "_copy_to_device"), ("runner", "_gather_inflight"),
             ("runner", "_next_stage"), ("runner", "_record_stage_done"), ("runner_module", "_input_tokens"))


def _time_functions(core, steps: int, rounds: int = 3) -> dict[str, float]:
    """Us per step of each host function (a timing wrapper around each; the least of `rounds`
    rounds of `steps` steps), measured after the unwrapped figures."""
    import engine.runner as runner_module
    from engine.core.scheduler_output import SchedulerOutput

    owners = {"scheduler": type(core.scheduler), "output": SchedulerOutput, "core": type(core),
              "sampler": type(core.sampler), "runner": type(core.runner), "runner_module": runner_module}
    acc: dict[str, float] = {}
    saved = []
    for owner_name, name in FUNCTIONS:
        owner = owners[owner_name]
        fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if fn is None:
            continue
        saved.append((owner, name, fn))

        def timed(*a, __fn=fn, __name=name, **k):
            t = time.perf_counter()
            try:
                return __fn(*a, **k)
            finally:
                acc[__name] = acc.get(__name, 0.0) + time.perf_counter() - t

        setattr(owner, name, timed)
    best: dict[str, float] = {}
    try:
        for _ in range(rounds):
            acc.clear()
            for _ in range(steps):
                core.step()
            for k, v in acc.items():
                best[k] = min(best.get(k, float("inf")), v / steps * 1e6)
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    return dict(sorted(best.items(), key=lambda kv: -kv[1]))


def measure_once(batch: int, mode: str, steps: int, context: tuple[int, int], functions: bool = False) -> Row:
    core = _engine(batch, mode, context)
    gc.collect()
    gc.freeze()
    try:
        t = _time_steps(core, steps)
        prep_ops, step_ops, events = _count(core)
        funcs = _time_functions(core, steps) if functions else None
    finally:
        gc.unfreeze()
    us = {k: statistics.median(v) * 1e6 for k, v in t.items()}
    return Row(batch, mode, us["schedule"], us["prepare"], us["launch"], us["update"], us["rest"], us["step"],
               prep_ops.total, prep_ops.views, step_ops.total, events, dict(sorted(prep_ops.counts.items())),
               funcs)


def profile(batch: int, mode: str, steps: int, context: tuple[int, int], top: int = 25) -> None:
    core = _engine(batch, mode, context)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        core.step()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def _table(rows: list[Row], title: str) -> str:
    head = (f"{'batch':>5} {'mode':>5} {'schedule':>8} {'prepare':>8} {'sch+prep':>8} {'launch':>7} "
            f"{'update':>6} {'rest':>6} {'step':>6} {'ops':>4} {'views':>5} {'step_ops':>8} {'events':>6}")
    lines = [title, head]
    lines += [f"{r.batch:>5} {r.mode:>5} {r.schedule_us:>8.1f} {r.prepare_us:>8.1f} {r.host_us:>8.1f} "
              f"{r.launch_us:>7.1f} {r.update_us:>6.1f} {r.rest_us:>6.1f} {r.step_us:>6.1f} {r.ops:>4} {r.views:>5} "
              f"{r.step_ops:>8} {r.events:>6}" for r in rows]
    return "\n".join(lines)


def _functions_table(rows: list[Row]) -> str:
    lines = ["us per step by function (wrapped; nested calls are inside their callers)"]
    for r in rows:
        top = ", ".join(f"{k} {v:.1f}" for k, v in (r.functions or {}).items())
        lines.append(f"{r.batch:>5} {r.mode:>5}: {top}")
    return "\n".join(lines)


def _run_child(pythonpath: str, args: argparse.Namespace, out: Path) -> list[Row]:
    """One repeat of every (batch, mode) in a fresh process, with the engine at `pythonpath`."""
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--out", str(out), "--force",
           "--context", *map(str, args.context), "--batch", *map(str, args.batch), "--mode", *args.mode]
    if args.functions:
        cmd.append("--functions")
    subprocess.run(cmd, check=True, env=os.environ | {"PYTHONPATH": pythonpath}, stdout=subprocess.DEVNULL)
    return [Row(**r) for r in json.loads(out.read_text())["rows"]]


def _best(repeats: list[list[Row]]) -> list[Row]:
    """Per (batch, mode), the repeat with the smallest median step."""
    best: dict[tuple[int, str], Row] = {}
    for rows in repeats:
        for r in rows:
            k = (r.batch, r.mode)
            if k not in best or r.step_us < best[k].step_us:
                best[k] = r
    return list(best.values())


def _machine() -> dict:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__}


def _git(*a: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *a], check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[32, 128, 256])
    p.add_argument("--mode", nargs="+", choices=("async", "sync"), default=["async", "sync"])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--context", type=int, nargs=2, default=[1000, 1300], help="context tokens, low high")
    p.add_argument("--compare-ref", default=None, help="git revision to measure in the same run")
    p.add_argument("--out", type=Path, default=None, help="JSON file of the figures")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    p.add_argument("--profile", action="store_true", help="cProfile's top functions (first batch and mode)")
    p.add_argument("--functions", action="store_true",
                   help="also time each host function (wrapped, after the unwrapped figures)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(1)
    _patch_cuda()
    context = (args.context[0], args.context[1])
    if args.child:
        rows = [measure_once(b, m, args.steps, context, args.functions) for b in args.batch for m in args.mode]
        args.out.write_text(json.dumps({"rows": [asdict(r) for r in rows]}) + "\n")
        return
    if args.out and args.out.exists() and not args.force:
        sys.exit(f"error: --out {args.out} exists; pass --force to overwrite it")
    if args.profile:
        profile(args.batch[0], args.mode[0], args.steps, context)
    with tempfile.TemporaryDirectory() as tmp:
        tree: list[list[Row]] = []
        ref: list[list[Row]] = []
        ref_path = None
        if args.compare_ref:
            ref_path = Path(tmp) / "ref"
            ref_path.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.compare_ref, "engine", "kernels"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(ref_path)], input=archive, check=True)
        for i in range(args.repeats):
            tree.append(_run_child(str(ROOT), args, Path(tmp) / f"tree{i}.json"))
            if ref_path is not None:
                ref.append(_run_child(str(ref_path), args, Path(tmp) / f"ref{i}.json"))
    rows = _best(tree)
    print(_table(rows, "this tree (median us per steady decode step)"))
    if args.functions:
        print(_functions_table(rows))
    result = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": _machine(),
              "commit": _git("rev-parse", "--short", "HEAD"), "dirty": bool(_git("status", "--porcelain")),
              "block_size": BLOCK_SIZE, "context_tokens": list(context), "steps": args.steps,
              "repeats": args.repeats, "rows": [asdict(r) | {"host_us": r.host_us} for r in rows]}
    if args.compare_ref:
        ref_rows = _best(ref)
        print(_table(ref_rows, f"\nref {args.compare_ref} (median us per steady decode step)"))
        if args.functions:
            print(_functions_table(ref_rows))
        speed = {f"{r.batch}-{r.mode}": {"host_x": round(q.host_us / r.host_us, 2),
                                         "step_x": round(q.step_us / r.step_us, 2)}
                 for r, q in zip(rows, ref_rows)}
        print("\nspeed-up (ref / this tree): " + ", ".join(f"{k} host {v['host_x']}x step {v['step_x']}x"
                                                           for k, v in speed.items()))
        result["compare_ref"] = {"rev": args.compare_ref, "commit": _git("rev-parse", "--short", args.compare_ref),
                                 "rows": [asdict(r) | {"host_us": r.host_us} for r in ref_rows],
                                 "speed_up": speed}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
