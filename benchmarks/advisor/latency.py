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
import json
import os
import platform
import resource
import time
from pathlib import Path

from advisor.advise import AdviseRequest, advise
from sim.generate import generate
from sim.workload_presets import get_preset

HERE = Path(__file__).parent
NUM_REQUESTS, HOUR_S = 20_000, 3600.0


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


def _log_tasks(path: Path) -> None:
    """Every simulation's configuration, sample and time, one JSON line each (workers append)."""
    from advisor.advise import evaluate

    sim = evaluate.simulate_task

    def logged(workloads: object, task: evaluate.SimTask) -> evaluate.Outcome:
        w0, c0 = time.perf_counter(), time.process_time()
        out = sim(workloads, task)
        row = {"label": task.config.label, "num_gpus": task.config.num_gpus, "n": task.num_requests,
               "variant": task.variant.name if task.variant else None, "seed": task.variant.seed if task.variant else None,
               "wall_s": round(time.perf_counter() - w0, 3), "cpu_s": round(time.process_time() - c0, 3),
               "pid": os.getpid(), "error": out.error, "goodput_rps": out.metrics.goodput_rps,
               "e2e_p99_ms": out.metrics.e2e_p99_ms}
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return out

    evaluate.simulate_task = logged


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
    args = ap.parse_args()
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
        "num_gpus": args.gpus, "load_average_before": load_before,
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
