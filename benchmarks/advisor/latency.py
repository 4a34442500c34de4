"""Latency of a full recommendation (search + ladder + cost lines + gap + robustness) on a
one-hour, ~20,000-request trace, on this machine. Writes results.json and results.md here.

    PYTHONPATH=. .venv/bin/python benchmarks/advisor/latency.py [--workers 2] [--budget quick] [--gpus 4]

(PYTHONPATH=.: a script's own folder heads sys.path, so without it the packages come from wherever
the venv's editable install points, not necessarily this checkout.) `--gpus 4` advises on four
GPUs: TP sizes, replica counts and P:D splits join the search (results_gpus4.json); `--cprofile DIR`
profiles the parent and each worker, `--tasks FILE` logs every simulation's configuration and time.

The trace: the chat-production preset (Gamma-bursty, long-tailed lengths, Zipf system prompts,
30% dynamic prefix, task mix) at 20,000 requests over one hour (5.56 req/s).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import platform
import resource
import subprocess
import threading
import time
from pathlib import Path

from advisor.advise import AdviseRequest, advise
from sim.generate import generate
from sim.workload_presets import get_preset

HERE = Path(__file__).parent
NUM_REQUESTS, HOUR_S = 20_000, 3600.0


def _commit() -> str | None:
    """The checkout's commit (with '+dirty' when it has changes), None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=HERE).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True, cwd=HERE).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _cpu_s() -> tuple[float, float]:
    """CPU seconds of this process and of its finished children (the worker pool, reaped when
    `advise` closes it): the figure to read when the shared machine is loaded."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _profile_workers(folder: Path) -> None:
    """Each pool worker profiles itself from its start and writes its stats when the pool shuts
    down (a multiprocessing finalizer: forked workers skip atexit)."""
    from multiprocessing.util import Finalize

    from advisor.advise import evaluate

    init = evaluate._init_worker

    def init_profiled(base: object) -> None:
        prof = cProfile.Profile()
        Finalize(None, lambda: prof.dump_stats(folder / f"worker-{os.getpid()}.prof"), exitpriority=100)
        prof.enable()
        init(base)

    evaluate._init_worker = init_profiled


def _key(task: object) -> str:
    """One simulation's name in the logs (any version of the evaluator: what it simulates)."""
    cfg, variant = task.config, task.variant  # type: ignore[attr-defined]
    text = cfg.model_copy(update={"label": None}).model_dump_json() + f"|{task.num_requests}|"  # type: ignore[attr-defined]
    return hashlib.sha1((text + (variant.model_dump_json() if variant else "")).encode()).hexdigest()[:12]


def _log_tasks(path: Path) -> None:
    """Every simulation's configuration, sample and time, one JSON line each (workers append),
    and every batch the evaluator runs (the parent appends to PATH.batches): what `--replay`
    packs onto idle workers."""
    from advisor.advise import evaluate

    sim, run_batch = evaluate.simulate_task, evaluate.Evaluator.map
    batches = path.with_suffix(".batches")

    def logged_batch(self: evaluate.Evaluator, tasks: list, *args: object, **kwargs: object) -> list:
        row = {"thread": threading.current_thread().name, "t0": time.time(), "keys": [_key(t) for t in tasks],
               "local": len(tasks) == 1 or not self.parallel}
        outs = run_batch(self, tasks, *args, **kwargs)  # type: ignore[arg-type]
        with batches.open("a") as f:
            f.write(json.dumps(row | {"t1": time.time()}) + "\n")
        return outs

    evaluate.Evaluator.map = logged_batch  # type: ignore[method-assign]

    def logged(workloads: object, task: evaluate.SimTask) -> evaluate.Outcome:
        w0, c0 = time.perf_counter(), time.process_time()
        out = sim(workloads, task)
        row = {"label": task.config.label, "num_gpus": task.config.num_gpus, "n": task.num_requests,
               "variant": task.variant.name if task.variant else None, "seed": task.variant.seed if task.variant else None,
               "wall_s": round(time.perf_counter() - w0, 3), "cpu_s": round(time.process_time() - c0, 3),
               "end_unix_s": round(time.time(), 3),
               "pid": os.getpid(), "key": _key(task), "error": out.error, "goodput_rps": out.metrics.goodput_rps,
               "e2e_p99_ms": out.metrics.e2e_p99_ms}
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return out

    evaluate.simulate_task = logged


def replay(tasks_path: Path, workers: int) -> dict[str, float]:
    """The advise run's simulations packed onto `workers` idle workers, each taking its measured
    CPU seconds: batches one after the other (the search and the ladder wait for each), longest
    first within a batch (as the evaluator submits them); the batches of the side-by-side
    analyses (several threads at once) pooled into one. An estimate of the wall time on an idle
    machine from a run on a loaded one (CPU seconds barely change with load; wall time does)."""
    cpu = {}
    for line in tasks_path.read_text().splitlines():
        row = json.loads(line)
        cpu[row["key"]] = row["cpu_s"]
    batches = [json.loads(line) for line in tasks_path.with_suffix(".batches").read_text().splitlines()]
    batches.sort(key=lambda b: b["t0"])
    main_thread = batches[0]["thread"]
    serial = [b for b in batches if b["thread"] == main_thread]
    side = [k for b in batches if b["thread"] != main_thread for k in b["keys"]]

    def makespan(keys: list[str], n: int) -> float:
        free = [0.0] * n
        for k in sorted(keys, key=lambda k: -cpu.get(k, 0.0)):
            i = free.index(min(free))
            free[i] += cpu.get(k, 0.0)
        return max(free)

    serial_s = sum(makespan(b["keys"], 1 if b["local"] else workers) for b in serial)
    side_s = makespan(side, workers)
    total = sum(cpu.values())
    return {"replayed_wall_s": round(serial_s + side_s, 1), "serial_batches_s": round(serial_s, 1),
            "side_by_side_s": round(side_s, 1), "cpu_s": round(total, 1),
            "perfect_packing_s": round(total / workers, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--budget", default="quick")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs to advise on (AdviseRequest.num_gpus): above 1 the "
                    "search takes TP sizes, replica counts and P:D splits in")
    ap.add_argument("--out", type=Path, default=None, help="results file (default: results.json here, 1 GPU; "
                    "results_gpus<N>.json for more)")
    ap.add_argument("--cprofile", type=Path, default=None, help="write cProfile stats of the parent "
                    "(parent.prof) and of each worker (worker-<pid>.prof) to this folder")
    ap.add_argument("--tasks", type=Path, default=None, help="append one JSON line per simulation (label, "
                    "requests, variant, wall and CPU seconds) to this file")
    ap.add_argument("--replay", type=Path, default=None, help="print the idle-machine estimate of a run logged "
                    "with --tasks FILE (see `replay`) and exit")
    args = ap.parse_args()
    if args.replay:
        print(json.dumps(replay(args.replay, args.workers), indent=2))
        return
    if args.tasks:
        _log_tasks(args.tasks)
    if args.cprofile:
        args.cprofile.mkdir(parents=True, exist_ok=True)
        _profile_workers(args.cprofile)
    spec = get_preset("chat-production")
    spec = spec.with_overrides(num_requests=NUM_REQUESTS, arrival=spec.arrival.model_copy(
        update={"rate_rps": NUM_REQUESTS / HOUR_S}).model_dump())
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    wl = generate(spec)
    t_gen = time.perf_counter() - t0
    stages: list[tuple[float, str]] = []
    cpu0 = _cpu_s()
    prof = cProfile.Profile() if args.cprofile else None
    start = time.perf_counter()
    if prof is not None:
        prof.enable()
    rec = advise(wl, AdviseRequest(workers=args.workers, budget=args.budget, num_gpus=args.gpus),
                 progress=lambda ev: ev.finished and stages.append((round(time.perf_counter() - start, 2), ev.text())))
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.cprofile / "parent.prof")
    cpu = [round(b - a, 2) for a, b in zip(cpu0, _cpu_s(), strict=True)]
    result = {
        "command": f"python benchmarks/advisor/latency.py --workers {args.workers} --budget {args.budget} "
                   f"--gpus {args.gpus}",
        "num_gpus": args.gpus, "commit": _commit(), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "load_average_before": load_before,
        "num_requests": len(wl), "trace_span_s": round(wl.duration_s, 1), "generate_s": round(t_gen, 2),
        "advise_s": rec.elapsed_s, "num_simulations": rec.num_simulations, "workers": args.workers,
        "cpus": os.cpu_count(),
        "cpu_s_parent": cpu[0], "cpu_s_workers": cpu[1], "load_average_after": os.getloadavg(), "python": platform.python_version(),
        "stages": stages, "best": rec.best.label, "baseline_goodput_rps": rec.baseline.metrics.goodput_rps,
        "best_goodput_rps": rec.best.metrics.goodput_rps,
        # what the search decided, to compare two versions of the search on the same traffic
        "ladder": [s.optimization for s in rec.ladder], "kept_defaults": [k.optimization for k in rec.kept_defaults],
        "rejected": [[r.optimization, round(r.delta_goodput_pct, 2)] for r in rec.rejected],
    }
    out = args.out or HERE / ("results.json" if args.gpus == 1 else f"results_gpus{args.gpus}.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
