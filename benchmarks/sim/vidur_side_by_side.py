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
chunk and 256-request cap, with its default random-forest execution-time predictor and its
linear-regression one (the loop reads the same kind of lookup tables; the predicted step times,
and so the number of steps simulated, differ).

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

MD_SECTION = "## Side by side with Vidur"  # results.md keeps this section last (bench_simulator.py too)
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
    ap.add_argument("--md", action="store_true", help=f"rewrite the '{MD_SECTION}' section of results.md")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=SPEC["num_requests"])
    ap.add_argument("--predictors", default="random_forrest,linear_regression",
                    help="Vidur's execution-time predictors to run, comma-separated (its spelling; "
                         "random_forrest is its default)")
    ap.add_argument("--vidur-metrics", default="both", choices=("on", "off", "both"),
                    help="Vidur's in-loop metrics store (on is its default; off is its fastest loop)")
    args = ap.parse_args(argv)
    if not (args.vidur_src / "vidur" / "simulator.py").is_file():
        ap.error(f"--vidur-src {args.vidur_src}: no Vidur checkout there (vidur/simulator.py missing); "
                 "clone github.com/microsoft/vidur and pass its path")
    if not args.vidur_python.is_file():
        ap.error(f"--vidur-python {args.vidur_python}: not a file; make a venv with Vidur's requirements")
    args.predictors = [p.strip() for p in args.predictors.split(",") if p.strip()]
    if not args.predictors or set(args.predictors) - {"random_forrest", "linear_regression"}:
        ap.error(f"--predictors {','.join(args.predictors)}: choose from random_forrest, linear_regression")
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
    return path, {"source": f"a stand-in, as {VIDUR_ATTENTION} is absent from the checkout (the snapshot "
                  "reachable here leaves out every attention.csv blob; Vidur's later PyPI releases fetch profiles "
                  "from a Hugging Face dataset, unreachable here): closed forms fitted to 22 measured rows (and two "
                  "small-chunk floors) of "
                  "that file (vidur_attention_standin.py; within 10-15 % of them), on a grid like the real one, "
                  "which Vidur then trains on as usual", "fit": fit}


def _git_head(repo: Path) -> str:
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def _vidur_settings(args: argparse.Namespace, pred: str, trace: Path, attention: Path, metrics: bool) -> dict:
    return {
        "vidur_src": str(args.vidur_src.resolve()), "predictor": pred,
        "chunk_size": 2048, "batch_size_cap": 256, "max_tokens": 16384,
        "trace_file": str(trace.resolve()), "attention_file": str(attention.resolve()),
        "output_dir": str((args.work_dir / "vidur_output").resolve()),
        "cache_dir": str(_cache_dir(args, pred).resolve()),
        "chrome_trace": False, "write_metrics": metrics,
    }


def _cache_dir(args: argparse.Namespace, pred: str) -> Path:
    return args.work_dir / f"vidur_cache_{pred}"


def _run_runner(args: argparse.Namespace, settings: dict, name: str) -> dict:
    path = args.work_dir / f"vidur_settings_{name}.json"
    path.write_text(json.dumps(settings, indent=1))
    t0 = time.perf_counter()
    proc = subprocess.run([str(args.vidur_python), str(HERE / "vidur_runner.py"), str(path)],
                          check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"Vidur failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["subprocess_wall_s"] = time.perf_counter() - t0
    return out


def vidur_training(args: argparse.Namespace, pred: str, trace: Path, attention: Path) -> dict:
    """Vidur's one-time predictor training: run now if its cache is empty, else the record of it."""
    record = _cache_dir(args, pred) / "costline_training_record.json"
    if not any(_cache_dir(args, pred).glob("*.pkl")):
        settings = {**_vidur_settings(args, pred, trace, attention, True), "mode": "train"}
        out = _run_runner(args, settings, f"{pred}_train")
        out["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
        out["load_avg_end"] = os.getloadavg()
        record.write_text(json.dumps(out, indent=1))
    return json.loads(record.read_text()) if record.is_file() else {"note": "trained earlier, not recorded"}


def run_vidur(args: argparse.Namespace, pred: str, trace: Path, attention: Path, metrics: bool) -> dict:
    """Vidur in its own venv, predictor from its cache; the runner's JSON plus the best loop time."""
    settings = _vidur_settings(args, pred, trace, attention, metrics)
    runs = [_run_runner(args, settings, f"{pred}_metrics_{int(metrics)}") for _ in range(args.repeat)]
    return _best({"predictor": pred, "in_loop_metrics": metrics, "argv": runs[0].pop("argv"), "runs": runs},
                 "run_cpu_s")


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
                     "step_rows": int(res.steps["n_steps"].size),
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
    result["vidur_predictor_training"] = {p: vidur_training(args, p, trace, attention) for p in args.predictors}
    metrics = {"on": [True], "off": [False], "both": [True, False]}[args.vidur_metrics]
    result["vidur"] = {f"{p}, metrics {'on' if m else 'off'}": run_vidur(args, p, trace, attention, m)
                       for p in args.predictors for m in metrics}
    result["load_avg"]["after_vidur"] = os.getloadavg()
    result["costline"] = run_costline(requests, args.repeat)
    result["load_avg"]["end"] = os.getloadavg()
    result["comparison"] = compare(result)
    print(json.dumps(summary(result), indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        write_md_section(result, " ".join(["PYTHONPATH=. python benchmarks/sim/vidur_side_by_side.py",
                                           *(argv if argv is not None else sys.argv[1:])]))
    return result


def compare(result: dict) -> dict:
    """The ratio against Vidur's fastest loop, and per simulated step.

    Per step (a Vidur batch, a costline engine step) takes out how many steps each simulated:
    the predicted step lengths differ (see the TPOT columns), so Vidur's requests per CPU s at
    costline's step count is given too.
    """
    cl = result["costline"]["best"]
    vid = [v["best"] for v in result["vidur"].values()]
    fastest = max(v["requests_per_cpu_s"] for v in vid)
    us_per_batch = min(v["run_cpu_s"] / v["batches"] for v in vid) * 1e6
    at_costline_steps = cl["requests"] / (us_per_batch * 1e-6 * cl["engine_steps"])
    return {"fastest_vidur_requests_per_cpu_s": fastest,
            "ratio_costline_over_fastest_vidur": cl["requests_per_cpu_s"] / fastest,
            "cpu_us_per_step": {"fastest_vidur": us_per_batch,
                                "costline": cl["run_cpu_s"] / cl["engine_steps"] * 1e6},
            "fastest_vidur_at_costline_step_count_requests_per_cpu_s": at_costline_steps,
            "ratio_at_costline_step_count": cl["requests_per_cpu_s"] / at_costline_steps}


def summary(result: dict) -> dict:
    """The figures a reader compares, one line each."""
    rows = {f"vidur ({k})": v["best"] for k, v in result["vidur"].items()}
    rows["costline"] = result["costline"]["best"]
    keep = ("requests_per_cpu_s", "run_cpu_s", "mean_ttft_ms", "mean_tpot_ms", "completed",
            "batches", "engine_steps", "step_rows")
    return {"load_avg": result["load_avg"], **result["comparison"],
            **{k: {f: round(v[f], 3) for f in keep if f in v} for k, v in rows.items()}}


def _md_row(name: str, r: dict, iters: str) -> str:
    its = f"{r[iters]:,}" + (f" ({r['step_rows']:,} after skip-ahead)" if "step_rows" in r else "")
    return (f"| {name} | {r['run_cpu_s']:.3f} | {r['requests_per_cpu_s']:,.0f} | {its} | "
            f"{r['mean_ttft_ms']:.1f} | {r['mean_tpot_ms']:.2f} | {r['completed']:,} |")


def _md_head(result: dict, command: str) -> list[str]:
    la, w = result["load_avg"], result["workload"]
    return [MD_SECTION, "", f"- date_utc: {result['date_utc']}; command: `{command}`",
            (f"- costline {result['costline_commit']}, Vidur {result['vidur_commit']} (github microsoft/vidur), "
             f"machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, shared"),
            (f"- load average (1/5/15 min) at start {la['start'][0]:.2f}/{la['start'][1]:.2f}/"
             f"{la['start'][2]:.2f}, end {la['end'][0]:.2f}/{la['end'][1]:.2f}/{la['end'][2]:.2f}"),
            (f"- workload: {w['spec']}, {w['requests']:,} requests, mean prompt {w['mean_prompt_tokens']:,.0f} / "
             f"output {w['mean_output_tokens']:.0f} tokens; the same arrivals and lengths fed to both"), "",
            (f"| simulator | loop CPU s (best of {len(result['costline']['runs'])}) | simulated requests / CPU s "
             "| loop iterations (Vidur batches, costline engine steps) | mean TTFT ms | mean TPOT ms | completed |"),
            "|---|---:|---:|---:|---:|---:|---:|"]


def md_section(result: dict, command: str) -> list[str]:
    c = result["comparison"]
    lines = _md_head(result, command)
    for v in result["vidur"].values():
        name = (f"Vidur, {v['predictor']} predictor, in-loop metrics "
                f"{'on (its default)' if v['in_loop_metrics'] else 'off'}")
        lines.append(_md_row(name, v["best"], "batches"))
    lines += [_md_row("costline", result["costline"]["best"], "engine_steps"), "",
              (f"costline / fastest Vidur loop: **{c['ratio_costline_over_fastest_vidur']:.1f}x** "
               "(issue 26 asks >= 10x). Per simulated step (a Vidur batch, a costline engine step): Vidur (cheapest variant) "
               f"{c['cpu_us_per_step']['fastest_vidur']:.1f} CPU us, costline {c['cpu_us_per_step']['costline']:.1f} "
               f"CPU us; at costline's step count that Vidur would run "
               f"{c['fastest_vidur_at_costline_step_count_requests_per_cpu_s']:,.0f} requests / CPU s "
               f"({c['ratio_at_costline_step_count']:.1f}x).")]
    setup = min(r["setup_cpu_s"] for v in result["vidur"].values() for r in v["runs"])
    trained = "; ".join(f"{p}: {_training_text(t)}" for p, t in result["vidur_predictor_training"].items())
    lines += ["", (f"Not in the loop figures: Vidur's set-up per simulator ({setup:.1f} CPU s or more: config, "
                   "trace, predictor from its cache, prediction tables) and its one-time predictor "
                   f"training ({trained}).")]
    return lines + [x for n in notes(result) for x in ("", n)]


def _training_text(tr: dict) -> str:
    if "train_wall_s" not in tr:
        return tr.get("note", "?")
    return (f"{tr['train_wall_s']:,.0f} s wall, {tr['train_own_cpu_s'] + tr['train_workers_cpu_s']:,.0f} CPU s, "
            f"load average {tr['load_avg_end'][0]:.1f} at its end, {tr['date_utc']}")


def notes(result: dict) -> list[str]:
    """What is not the same on the two sides (the loop figures do not depend on it, the TTFT/TPOT do)."""
    att = result["vidur_attention_profile"]["source"]
    return [
        ("What differs: costline simulates llama-3.1-8b on its a100-80gb spec with vLLM V1's scheduler "
         "(chunked prefill, 2,048 tokens, 256 sequences, 0.92 of memory); Vidur simulates Meta-Llama-3-8B "
         "(same shapes) from its own A100 profiles with its Sarathi scheduler at the same 2,048-token chunk "
         "and 256-request cap (its `vllm` scheduler is vLLM V0's, prefill without chunks), 0.9 of memory. "
         f"Vidur's attention profile: {att}. Both simulate the same requests to completion; their "
         "predicted step times differ (the TPOT columns), so they simulate different numbers of steps, "
         "hence the per-step figures. costline's skip-ahead advances runs of identical decode steps in "
         "one iteration of its loop (the count in brackets)."),
        ("Timing: `time.process_time()` around `Simulation.run()` (costline, this process) and "
         "`Simulator.run()` (Vidur, a subprocess per run with its own venv, `vidur_runner.py`), one after "
         "the other on the same machine; Vidur's chrome trace and plots are off (its default has the "
         "chrome trace on inside the loop, which only makes it slower).")]


def write_md_section(result: dict, command: str) -> None:
    path = HERE / "results.md"
    text = path.read_text() if path.is_file() else "# Simulator speed\n"
    head = text[:text.index(MD_SECTION)].rstrip() if MD_SECTION in text else text.rstrip()
    path.write_text(head + "\n\n" + "\n".join(md_section(result, command)) + "\n")


if __name__ == "__main__":
    main()
