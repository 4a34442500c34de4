"""Host time of one decode step on the CPU: scheduler.schedule() and runner.prepare() (and
the scheduler update after the step), with N running decodes at contexts of 1-4K tokens.

    PYTHONPATH=. python benchmarks/engine/bench_host_prep.py [--batch 32 128 256]
        [--steps 200] [--repeats 5] [--compare-ref GIT_REV] [--out FILE.json [--force]]

A real `Scheduler` drives a `ModelRunner` built on the CPU around the tiny model (prepare never
runs the model, so the model's size does not matter). Each step is timed in three parts, as
the engine's synchronous step pays them: `schedule` = scheduler.schedule(); `prepare` =
reading the batch (`out.columns()`, as the engine does), the token-id dict it passes, and runner.prepare()
less its host-to-device copies (on the CPU those are memcpys a GPU's copy engine does
instead; on a GPU their host cost is 7 launches of an asynchronous copy);
`update` = scheduler.update_from_output() with one sampled token per request. Figures are the
median per step of the least-disturbed repeat (a shared 2-core box), in microseconds.

Each row also counts the torch ops one decode step's prepare() runs (a TorchDispatchMode over
an extra step): `copies` = copy_ calls (on a GPU each an asynchronous copy the host launches),
`ops` = every op but views (on a GPU, launches or copies; the number transfers to the GPU
host where the per-op cost is 2-3x this box's). `--profile` prints cProfile's top functions
of prepare() at the first batch size.

`--compare-ref REV` measures the same table for the code at git revision REV (its engine/
package, extracted with `git archive` into a temporary directory; this script is the same),
in the same run and right after this tree's, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import cProfile
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

from engine.core.model_spec import get_model
from engine.core.outputs import OutputPathError, check_output_file
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.model import LlamaModel
from engine.op_counter import VIEW_OPS, OpCounter
from engine.runner import ModelRunner

BLOCK_SIZE = 16
MAX_MODEL_LEN = 8192


@dataclass(slots=True)
class Row:
    batch: int
    schedule_us: float
    prepare_us: float
    update_us: float
    copies: int = -1  # copy_ calls of one step's prepare (-1: not counted)
    ops: int = -1  # torch ops of one step's prepare, views excluded

    @property
    def host_us(self) -> float:
        return self.schedule_us + self.prepare_us


def _setup(batch: int, seed: int) -> tuple[Scheduler, ModelRunner, dict[int, list[int]]]:
    """A scheduler with `batch` requests past their prefill (contexts uniform in 1-4K tokens,
    long outputs) and a CPU runner sized for them."""
    rng = np.random.default_rng(seed)
    cfg = SchedulerConfig(max_num_batched_tokens=1 << 22, max_num_seqs=batch, max_model_len=MAX_MODEL_LEN,
                          block_size=BLOCK_SIZE, num_gpu_blocks=batch * (MAX_MODEL_LEN // BLOCK_SIZE) + 16,
                          enable_prefix_caching=False)
    sched = Scheduler(cfg)
    tokens: dict[int, list[int]] = {}
    for rid, ctx in enumerate(rng.integers(1024, 4097, size=batch).tolist()):
        tokens[rid] = rng.integers(0, 250, size=ctx).tolist()
        sched.add_request(Request(rid, 0.0, ctx, MAX_MODEL_LEN - ctx - 1, (rid,), hash_block_size=ctx),
                          prompt_token_ids=list(tokens[rid]))
    model = LlamaModel(get_model("tiny"), max_positions=MAX_MODEL_LEN, seed=0)
    runner = ModelRunner(model, block_size=BLOCK_SIZE, max_num_seqs=batch,
                         max_num_batched_tokens=8192, max_model_len=MAX_MODEL_LEN)
    while any(not r.sampled_since_admission for r in sched.running) or sched.num_waiting:
        out = sched.schedule()  # the prompts (not timed, and larger than the runner's token buffers)
        sampled = {s.request_id: [7] for s in out.scheduled if s.samples}
        for rid in sampled:
            tokens[rid].append(7)
        sched.update_from_output(out, sampled)
    return sched, runner, tokens


def _batch_of(out) -> tuple[object, list[int]]:
    """The batch as the engine hands it to prepare(): the output's columns (code before
    SchedulerOutput.columns, for --compare-ref: its entries), and the request ids."""
    if hasattr(out, "columns"):
        cols = out.columns()
        return cols, cols.request_ids
    return out.scheduled, [s.request_id for s in out.scheduled]


def _step(sched: Scheduler, runner: ModelRunner, tokens: dict[int, list[int]], counter=None) -> None:
    """One untimed decode step, its prepare() under `counter` (a context manager) if given."""
    out = sched.schedule()
    cols, rids = _batch_of(out)
    ids = {r: tokens[r] for r in rids}
    if counter is None:
        inp = runner.prepare(cols, ids)
    else:
        with counter:
            inp = runner.prepare(cols, ids)
    for rid in inp.sample_request_ids:
        tokens[rid].append(7)
    sched.update_from_output(out, {rid: [7] for rid in inp.sample_request_ids})


def count_ops(batch: int, seed: int = 0) -> tuple[int, int]:
    """(copy_ calls, non-view torch ops) of one steady decode step's prepare()."""
    sched, runner, tokens = _setup(batch, seed)
    for _ in range(3):  # both staging sets used once before
        _step(sched, runner, tokens)
    counter = OpCounter()
    _step(sched, runner, tokens, counter)
    ops = sum(n for name, n in counter.counts.items() if name not in VIEW_OPS)
    return counter.counts.get("copy_", 0), ops


def profile_prepare(batch: int, steps: int, seed: int = 0, top: int = 15) -> None:
    """Print cProfile's top functions (by own time) over `steps` decode steps."""
    sched, runner, tokens = _setup(batch, seed)
    prof = cProfile.Profile()
    for _ in range(steps):
        _step(sched, runner, tokens, prof)
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def _timed_copies(runner: ModelRunner) -> list[float]:
    """Time the runner's host-to-device copies apart: on the CPU they are memcpys of the
    whole staged step, on a GPU asynchronous copies whose host cost is their launch."""
    spent = [0.0]
    copy = runner._copy_to_device

    def timed(*a, **kw):
        t0 = time.perf_counter()
        copy(*a, **kw)
        spent[0] += time.perf_counter() - t0
    runner._copy_to_device = timed
    return spent


def _time_steps(batch: int, steps: int, seed: int) -> tuple[list[float], list[float], list[float]]:
    sched, runner, tokens = _setup(batch, seed)
    copies = _timed_copies(runner)
    clock = time.perf_counter
    sch, prep, upd = [], [], []
    for _ in range(steps):
        copies[0] = 0.0
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        cols, rids = _batch_of(out)
        inp = runner.prepare(cols, {r: tokens[r] for r in rids})
        t2 = clock()
        sampled = {rid: [7] for rid in inp.sample_request_ids}
        for rid in inp.sample_request_ids:
            tokens[rid].append(7)  # what the engine's request records hold (they share the list)
        t3 = clock()
        sched.update_from_output(out, sampled)
        t4 = clock()
        sch.append(t1 - t0)
        prep.append(t2 - t1 - copies[0])
        upd.append(t4 - t3)
    return sch, prep, upd


def measure(batch: int, steps: int, repeats: int, seed: int = 0) -> Row:
    """Median per step of each part, from the repeat with the smallest median total."""
    best: Row | None = None
    for _ in range(repeats):
        sch, prep, upd = _time_steps(batch, steps, seed)
        row = Row(batch, statistics.median(sch) * 1e6, statistics.median(prep) * 1e6,
                  statistics.median(upd) * 1e6)
        if best is None or row.host_us + row.update_us < best.host_us + best.update_us:
            best = row
    assert best is not None
    best.copies, best.ops = count_ops(batch, seed)
    return best


def _table(rows: list[Row], title: str) -> str:
    lines = [title, f"{'batch':>6} {'schedule us':>12} {'prepare us':>11} {'sched+prep us':>14} {'update us':>10} {'copies':>7} {'ops':>5}"]
    lines += [f"{r.batch:>6} {r.schedule_us:>12.1f} {r.prepare_us:>11.1f} {r.host_us:>14.1f} {r.update_us:>10.1f} {r.copies:>7} {r.ops:>5}"
              for r in rows]
    return "\n".join(lines)


def _measure_ref(rev: str, args: argparse.Namespace) -> list[dict]:
    """This script's table for the engine package at git revision `rev` (a subprocess)."""
    repo = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "engine"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = Path(tmp) / "ref.json"
        cmd = [sys.executable, __file__, "--steps", str(args.steps), "--repeats", str(args.repeats),
               "--out", str(out), "--batch", *map(str, args.batch)]
        subprocess.run(cmd, check=True, env=os.environ | {"PYTHONPATH": tmp}, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())["rows"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[32, 128, 256])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--compare-ref", default=None, help="git revision to measure in the same run")
    p.add_argument("--out", type=Path, default=None, help="JSON file of the figures")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    p.add_argument("--profile", action="store_true", help="print cProfile's top functions of prepare()")
    args = p.parse_args()
    torch.set_num_threads(1)  # the copies are timed apart; keep the box's other jobs' cores free
    if args.out:
        try:
            check_output_file(args.out, flag="--out", force=args.force)
        except OutputPathError as exc:
            sys.exit(f"error: {exc}")
    if args.profile:
        profile_prepare(args.batch[0], args.steps)
    rows = [measure(b, args.steps, args.repeats) for b in args.batch]
    print(_table(rows, "this tree (median us per decode step)"))
    result = {"machine": platform.platform(), "python": platform.python_version(),
              "block_size": BLOCK_SIZE, "contexts_tokens": [1024, 4096], "steps": args.steps,
              "repeats": args.repeats,
              "rows": [asdict(r) | {"host_us": r.host_us} for r in rows]}
    if args.compare_ref:
        ref = _measure_ref(args.compare_ref, args)
        ref_rows = [Row(r["batch"], r["schedule_us"], r["prepare_us"], r["update_us"], r.get("copies", -1),
                        r.get("ops", -1)) for r in ref]
        print(_table(ref_rows, f"\nref {args.compare_ref} (median us per decode step)"))
        result["compare_ref"] = {"rev": args.compare_ref, "rows": ref}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
