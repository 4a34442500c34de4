"""costline's simulator against Vidur's, side by side in one run, on the same conversation-like workload.

    PYTHONPATH=. python benchmarks/sim/vidur_side_by_side.py --vidur-src /work/vidur-src \\
        --vidur-python /work/vidur-venv/bin/python --out benchmarks/sim/vidur_side_by_side.json

Getting Vidur (it is not vendored here, nor a dependency of costline): clone github.com/microsoft/vidur
(this was measured at commit 7d47513), make a Python 3.11 venv and
`pip install numpy pandas scikit-learn wandb ddsketch fasteners plotly_express matplotlib seaborn kaleido`
(its requirements.txt; no ray is needed to simulate, wandb only has to import). Pass the checkout as
`--vidur-src` and that venv's python as `--vidur-python`.

The workload is `bench_conversation.py`'s (4,000 requests, Poisson 4 req/s, prompt mean ~1,157
tokens, output mean ~204), the very same lengths and arrival times written to the CSV that Vidur's
trace-replay request generator reads. One replica, TP1. costline: llama-3.1-8b on a100-80gb with
vLLM's defaults for that GPU (chunked prefill, 2,048 batched tokens, 256 sequences). Vidur:
meta-llama/Meta-Llama-3-8B on its a100 profiles (same shapes as Llama-3.1-8B), its Sarathi scheduler
(chunked prefill, decode first: the closest of its schedulers to vLLM V1) with the same 2,048-token
chunk and 256-request cap, its default random-forest execution-time predictor.

The figure: simulated requests per CPU second of each simulator's loop, `time.process_time()`
around `Simulation.run()` / `Simulator.run()` only (imports, workload and set-up outside; best of
`--repeat`). Vidur's set-up, which trains its predictor on first use (cached in `--work-dir`
afterwards) and fills its prediction tables, is reported apart. Vidur runs in a subprocess of its
own venv (`vidur_runner.py`), costline in this process, one after the other.

Where Vidur's checkout lacks the attention profile (the snapshot used here has every
`attention.csv` left out), a stand-in fitted to rows of the real file is written (see
`vidur_attention_standin.py`); the JSON says which was used.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_conversation import SPEC  # sibling benchmark: the workload to match
from vidur_attention_standin import write_standin

from engine.core.model_spec import get_model
from sim.config import DeploymentConfig
from sim.generate import generate
from sim.hardware import get_gpu
from sim.simulator import Simulation
from sim.workload_spec import WorkloadSpec

VIDUR_ATTENTION = "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/attention.csv"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vidur-src", type=Path, default=Path(os.environ.get("VIDUR_SRC", "/work/vidur-src")),
                    help="a checkout of github.com/microsoft/vidur")
    ap.add_argument("--vidur-python", type=Path, default=Path("/work/vidur-venv/bin/python"),
                    help="python of a venv with Vidur's requirements")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/costline-vidur"),
                    help="trace, stand-in profile, Vidur's predictor cache and output")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=SPEC["num_requests"])
    ap.add_argument("--predictor", default="random_forrest", choices=("random_forrest", "linear_regression"),
                    help="Vidur's execution-time predictor (its spelling); random_forrest is its default")
    ap.add_argument("--vidur-metrics", default="both", choices=("on", "off", "both"),
                    help="Vidur's in-loop metrics store (on is its default; off is its fastest loop)")
    args = ap.parse_args(argv)
    if not (args.vidur_src / "vidur" / "simulator.py").is_file():
        ap.error(f"--vidur-src {args.vidur_src}: no Vidur checkout there (vidur/simulator.py missing); "
                 "clone github.com/microsoft/vidur and pass its path")
    if not args.vidur_python.is_file():
        ap.error(f"--vidur-python {args.vidur_python}: not a file; make a venv with Vidur's requirements")
    if args.repeat < 1 or not 1 <= args.num_requests <= SPEC["num_requests"]:
        ap.error(f"--repeat >= 1 and 1 <= --num-requests <= {SPEC['num_requests']}")
    return args


def workload(num_requests: int) -> list:
    return list(generate(WorkloadSpec.model_validate(SPEC)).requests)[:num_requests]


def write_trace(requests: list, path: Path) -> None:
    """The same requests in the columns Vidur's trace-replay generator reads (seconds, tokens)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        w.writerows([r.arrival_s, r.prompt_len, r.output_len] for r in requests)


def attention_profile(vidur_src: Path, work: Path) -> tuple[Path, dict]:
    real = vidur_src / VIDUR_ATTENTION
    if real.is_file() and real.stat().st_size > 1_000_000:  # not a missing blob or an LFS pointer
        return real, {"source": f"Vidur's {VIDUR_ATTENTION}"}
    path = work / "attention_standin.csv"
    fit = write_standin(path)
    return path, {"source": "stand-in (benchmarks/sim/vidur_attention_standin.py): fits to rows of Vidur's "
                  f"real file; {VIDUR_ATTENTION} is absent from the checkout", "fit": fit}


def _git_head(repo: Path) -> str:
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def run_vidur(args: argparse.Namespace, trace: Path, attention: Path, write_metrics: bool) -> dict:
    """Vidur in its own venv; returns the runner's JSON plus the best loop time."""
    cache = args.work_dir / f"vidur_cache_{args.predictor}"
    settings = {
        "vidur_src": str(args.vidur_src.resolve()), "predictor": args.predictor,
        "chunk_size": 2048, "batch_size_cap": 256, "max_tokens": 16384,
        "trace_file": str(trace.resolve()), "attention_file": str(attention.resolve()),
        "output_dir": str((args.work_dir / "vidur_output").resolve()), "cache_dir": str(cache.resolve()),
        "chrome_trace": False, "write_metrics": write_metrics, "repeat": args.repeat,
    }
    cached = cache.is_dir() and any(cache.glob("*.pkl"))
    path = args.work_dir / f"vidur_settings_{int(write_metrics)}.json"
    path.write_text(json.dumps(settings, indent=1))
    t0 = time.perf_counter()
    proc = subprocess.run([str(args.vidur_python), str(HERE / "vidur_runner.py"), str(path)],
                          check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"Vidur failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["predictor_cache_hit_at_start"] = cached
    out["subprocess_wall_s"] = time.perf_counter() - t0
    return _best(out, "run_cpu_s")


def run_costline(requests: list, repeat: int) -> dict:
    dep = DeploymentConfig(model=get_model("llama-3.1-8b"), gpu=get_gpu("a100-80gb"), num_replicas=1)
    runs = []
    for _ in range(repeat):
        sim = Simulation(dep, requests)
        c0 = time.process_time()
        res = sim.run()
        cpu = time.process_time() - c0
        s = res.summary().to_json_dict()
        runs.append({"run_cpu_s": cpu, "requests": len(requests), "engine_steps": s["num_engine_steps"],
                     "completed": s["completed"], "mean_ttft_ms": s["mean_ttft_ms"],
                     "mean_tpot_ms": s["mean_tpot_ms"]})
    eng = dep.engine.resolved_for(dep.gpu, dep.model)
    return _best({"runs": runs, "max_num_batched_tokens": eng.max_num_batched_tokens,
                  "max_num_seqs": eng.max_num_seqs}, "run_cpu_s")


def _best(out: dict, key: str) -> dict:
    best = min(out["runs"], key=lambda r: r[key])
    out["best"] = {**best, "requests_per_cpu_s": best["requests"] / best[key]}
    return out


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    requests = workload(args.num_requests)
    trace = args.work_dir / "conversation_trace.csv"
    write_trace(requests, trace)
    attention, attention_info = attention_profile(args.vidur_src, args.work_dir)
    result: dict = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": machine(),
                    "costline_commit": _git_head(HERE), "vidur_commit": _git_head(args.vidur_src),
                    "workload": {"spec": SPEC["name"], "requests": len(requests),
                                 "mean_prompt_tokens": sum(r.prompt_len for r in requests) / len(requests),
                                 "mean_output_tokens": sum(r.output_len for r in requests) / len(requests)},
                    "vidur_attention_profile": attention_info, "load_avg": {"start": os.getloadavg()}}
    variants = {"on": [True], "off": [False], "both": [True, False]}[args.vidur_metrics]
    result["vidur"] = {}
    for wm in variants:
        result["vidur"]["metrics_on" if wm else "metrics_off"] = run_vidur(args, trace, attention, wm)
    result["load_avg"]["after_vidur"] = os.getloadavg()
    result["costline"] = run_costline(requests, args.repeat)
    result["load_avg"]["end"] = os.getloadavg()
    fastest_vidur = max(v["best"]["requests_per_cpu_s"] for v in result["vidur"].values())
    result["ratio_costline_over_fastest_vidur"] = result["costline"]["best"]["requests_per_cpu_s"] / fastest_vidur
    print(json.dumps(summary(result), indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def summary(result: dict) -> dict:
    """The figures a reader compares, one line each."""
    rows = {f"vidur ({k})": v["best"] for k, v in result["vidur"].items()}
    rows["costline"] = result["costline"]["best"]
    keep = ("requests_per_cpu_s", "run_cpu_s", "mean_ttft_ms", "mean_tpot_ms", "completed",
            "batches", "engine_steps")
    return {"load_avg": result["load_avg"], "ratio": round(result["ratio_costline_over_fastest_vidur"], 2),
            **{k: {f: round(v[f], 3) for f in keep if f in v} for k, v in rows.items()}}


if __name__ == "__main__":
    main()
