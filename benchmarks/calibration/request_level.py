"""Request-level calibration validated on the engine's own runs (issue 27, items 3-4).

Each engine validation run (benchmarks/calibration/README.md: `runs/h200/<model>/validation/*`)
is turned into what a client and a scraper would have recorded against a server running it:
a `vllm bench serve --save-result --save-detailed` result (send times, TTFT, per-token gaps,
e2e, lengths; `sim.bench_results.bench_from_tables`) and the server's `/metrics` at the end
(`vllm:*` histograms and counters). No step trace goes in. For each model a profile is fitted
from a few runs (`FIT_RUNS`) with `sim.request_fit` from three starting profiles, then scored on
the other runs, next to the step-level profile (sim/profiles/h200-<model>.json) on the same
rebuilt workloads and on the exact workloads (`costline validate`).

    python benchmarks/calibration/request_level.py --runs runs/h200 --work runs/request_level \\
        --out benchmarks/calibration

writes request_level.json and request_level.md (the rebuilt bench files and scrapes go under
--work). `--bench-dir DIR --serve-args "..."` adds runs measured by a real client (DIR/*.json,
with DIR/<name>.prom or <name>.before.prom + <name>.after.prom when scraped).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np

from engine.core.records import REQUEST_COLUMNS
from engine.core.run_summary import RunTables
from sim.bench_results import bench_from_tables, read_bench, read_scrape_pair
from sim.models import hf_model_id
from sim.profile_files import load_profile
from sim.request_fit import (
    MAX_REQUESTS,
    BenchCase,
    CaseScore,
    RequestFit,
    fit_request_level,
    make_case,
    score,
)
from sim.validate import ERROR_METRICS, read_run_info, read_steps, sim_engine_config, validate_run

MODELS = ("llama-3.1-8b", "llama-3.2-1b")
# fitted on: a light and a heavy chat load, long prompts (sync), bursty code; the rest held out
FIT_RUNS = ("chat-low", "chat-high", "rag-long-prompt", "code-bursty")
STARTS = {"first principles": "default", "other model's fit": "other", "step-level fit": "self"}
TEXT_COLUMNS = ("status", "finish_reason", "category")


def read_request_table(path: Path) -> dict[str, np.ndarray]:
    """An engine run's requests.jsonl as engine/core/records.py columns (null: NaN)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = {}
    for c in REQUEST_COLUMNS:
        vals = [r.get(c) for r in rows]
        out[c] = (np.array([v or "" for v in vals], dtype=object) if c in TEXT_COLUMNS
                  else np.array([np.nan if v is None else v for v in vals], dtype=np.float64))
    return out


def engine_run_to_bench(run_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Write <out>/<name>.json (the bench result a client would have saved) and <name>.prom (the
    server's /metrics after the run, the server started for it). Returns what was written."""
    info = read_run_info(run_dir)
    requests, steps = read_request_table(run_dir / "requests.jsonl"), read_steps(run_dir / "steps.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    bench, spread = bench_from_tables(requests, steps, duration_s=float(summary["duration"]),
                                      model_id=hf_model_id(info.model), backend="costline-engine-replay",
                                      date=str(info.date or ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    bench_path, prom_path = out_dir / f"{info.name}.json", out_dir / f"{info.name}.prom"
    bench_path.write_text(json.dumps(bench))
    counters = {k: float(summary.get(k) or 0.0) for k in ("prefix_cache_queries_tokens", "prefix_cache_hits_tokens")}
    meta = {"model": info.model, "max_model_len": info.engine_args.get("max_model_len")}
    prom_path.write_text(RunTables(requests, steps, meta, counters).prometheus_text())
    return {"bench": bench_path, "prom": prom_path, "spread": spread, "info": info}


def engine_cases(model: str, runs_root: Path, work: Path, metrics: bool, max_requests: int = MAX_REQUESTS
                 ) -> tuple[dict[str, BenchCase], dict[str, Path]]:
    """Every non-speculative validation run of `model` as a case (bench file, + scrape when
    `metrics`), and its run folder. Speculative runs are left out: a bench file does not say
    what the drafts did."""
    cases, dirs = {}, {}
    for d in sorted((runs_root / model / "validation").iterdir()):
        info = read_run_info(d)
        if info.engine_args.get("speculative_config"):
            continue
        conv = engine_run_to_bench(d, work / model)
        delta = read_scrape_pair([conv["prom"]]) if metrics else None
        cases[info.name] = make_case(read_bench(conv["bench"])[0], sim_engine_config(info), delta,
                                     max_requests=max_requests)
        dirs[info.name] = d
    return cases, dirs


def pooled(scores: list[CaseScore]) -> float | None:
    errs = [abs(m.error) for s in scores for m in s.metrics if m.error is not None]
    return float(np.median(errs)) if errs else None


def validate_error(dirs: list[Path], profile: str) -> float | None:
    """`costline validate`'s pooled median |error| of `profile` on these runs (exact workloads)."""
    errs = []
    for d in dirs:
        errs += [abs(m.error) for m in validate_run(d, profile).metrics
                 if m.metric in ERROR_METRICS and m.error is not None]
    return float(np.median(errs)) if errs else None


def start_profile(which: str, model: str):
    if which == "default":
        return load_profile("default")
    other = next(m for m in MODELS if m != model)
    return load_profile(f"h200-{other if which == 'other' else model}")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fit_row(model: str, start: str, metrics: bool, fit: RequestFit, step_same: float | None,
            step_exact: float | None) -> dict[str, Any]:
    return {"model": model, "start": start, "metrics": metrics, "base_profile": fit.base,
            "multipliers": fit.multipliers.as_dict(), "fit_error": fit.fit_error, "held_out_error": fit.held_out_error,
            "step_level_same_rebuild": step_same, "step_level_exact_workload": step_exact,
            "ratio_to_step_level_same_rebuild": _ratio(fit.held_out_error, step_same),
            "ratio_to_step_level_exact": _ratio(fit.held_out_error, step_exact),
            "fit_seconds": round(fit.seconds, 1), "fit_cpu_seconds": round(fit.cpu_seconds, 1),
            "simulations": fit.evaluations,
            "held_out_runs": {s.name: s.median_abs_error for s in fit.held_out},
            "fit_runs": {s.name: s.median_abs_error for s in fit.fit}}


def run_model(model: str, runs_root: Path, work: Path, max_seconds: float, log: Any,
              max_requests: int = MAX_REQUESTS) -> list[dict[str, Any]]:
    rows = []
    for metrics in (False, True):
        cases, dirs = engine_cases(model, runs_root, work, metrics, max_requests)
        fit = [cases[n] for n in FIT_RUNS if n in cases]
        held = [c for n, c in cases.items() if n not in FIT_RUNS]
        step = load_profile(f"h200-{model}")
        step_same = pooled(score([(c, None) for c in held], step, model, "h200", "held-out"))
        step_exact = validate_error([dirs[c.name] for c in held], f"h200-{model}")
        for label, which in STARTS.items():
            base = start_profile(which, model)
            r = fit_request_level(fit, base, model, "h200", held_out=held, max_seconds=max_seconds)
            log(f"{model} {label} metrics={metrics}: {r.multipliers} fit {r.fit_error:.3f} held-out "
                f"{r.held_out_error:.3f} (step-level {step_same:.3f} same rebuild, {step_exact:.3f} exact) "
                f"{r.cpu_seconds:.0f} s CPU, {r.seconds:.0f} s wall, {r.evaluations} simulations")
            rows.append(fit_row(model, label, metrics, r, step_same, step_exact))
    return rows


def scrapes_of(bench: Path) -> list[Path]:
    """<name>.before.prom + <name>.after.prom, or <name>.prom, beside a bench result ([] if none)."""
    pair = [bench.with_suffix(".before.prom"), bench.with_suffix(".after.prom")]
    if all(p.is_file() for p in pair):
        return pair
    one = bench.with_suffix(".prom")
    return [one] if one.is_file() else []


def client_cases(bench_dir: Path, serve_args: str, log: Any) -> list[BenchCase]:
    """Every result file in `bench_dir` (measured by a real client) as a case, its scrapes
    when present; a JSON that is not a detailed result is skipped and named."""
    from sim.bench_results import BenchFileError
    from sim.serve_line import parse_serve_args

    engine = parse_serve_args(serve_args)
    cases = []
    for path in sorted(bench_dir.glob("*.json")):
        try:
            runs = read_bench(path)
        except BenchFileError as exc:
            log(f"skipped: {exc}")
            continue
        scrapes = scrapes_of(path)
        delta = read_scrape_pair(scrapes) if scrapes else None
        cases += [make_case(r, engine, delta) for r in runs]
    return cases


def run_client(bench_dir: Path, model: str, serve_args: str, max_seconds: float, log: Any,
               held_names: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Runs a client measured against the engine's HTTP server: `held_names` held out (else every
    third); the step-level profile scored on the same rebuilt requests (no engine run folder to
    validate it on exactly)."""
    from advisor.commands.calibrate_bench import held_out_runs

    cases = client_cases(bench_dir, serve_args, log)
    if len(cases) < 2:
        log(f"{bench_dir}: {len(cases)} result file(s); need two or more")
        return []
    fit, held = held_out_runs(cases, 3)
    if held_names:
        fit, held = [c for c in cases if c.name not in held_names], [c for c in cases if c.name in held_names]
    step_same = pooled(score([(c, None) for c in held], load_profile(f"h200-{model}"), model, "h200", "held-out"))
    rows = []
    for label, which in STARTS.items():
        r = fit_request_level(fit, start_profile(which, model), model, "h200", held_out=held, max_seconds=max_seconds)
        log(f"client {model} {label}: {r.multipliers} fit {r.fit_error:.3f} held-out {r.held_out_error:.3f} "
            f"(step-level {step_same:.3f})")
        row = fit_row(model, label, any(c.metrics for c in cases), r, step_same, None)
        rows.append(row | {"input_kind": f"client-measured ({bench_dir.name})"})
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


ENGINE_INTRO = ("Each engine validation run (benchmarks/calibration/data, unpacked as its README says) becomes the "
                "`vllm bench serve --save-detailed` result a client would have saved (send times, TTFT, per-token "
                "gaps, e2e, lengths) and, for the `+ metrics` rows, the server's `/metrics` at the end; no step "
                "trace is used. Fitted on {fit}; held out: every other non-speculative validation run. "
                "Step-level: the shipped profile fitted on step traces, on the same rebuilt requests, and on the "
                "exact workloads (`costline validate`).")
CLIENT_INTRO = ("Client-measured rows: results a real client saved against `costline engine serve` (OpenAI-"
                "compatible HTTP server, the engine behind it) on the H200, with /metrics scrapes before and "
                "after each run (benchmarks/calibration/data/h200-llama-3.1-8b-serve-bench.tar.xz). Held out: "
                "{held}. Step-level: the shipped profile on the same rebuilt requests (no step trace of these "
                "runs exists to validate it on exactly); client times include the HTTP path, which the simulator "
                "does not model.")


def _row_line(r: dict[str, Any]) -> str:
    m = r["multipliers"]
    ratio = " / ".join("-" if r.get(k) is None else f"{r[k]:.2f}x"
                       for k in ("ratio_to_step_level_same_rebuild", "ratio_to_step_level_exact"))
    kind = r.get("input_kind", "engine run as bench")
    return (f"| {r['model']} | {r['start']} | {kind}{' + metrics' if r['metrics'] else ''} | "
            f"{m['prefill']:.2f} / {m['decode']:.2f} / {m['kv']:.2f} / {m['host']:.2f} | {_pct(r['fit_error'])} | "
            f"{_pct(r['held_out_error'])} | {_pct(r['step_level_same_rebuild'])} | "
            f"{_pct(r['step_level_exact_workload'])} | {ratio} | {r['fit_cpu_seconds']:.0f} s CPU, "
            f"{r['fit_seconds']:.0f} s wall ({r['simulations']} sims) |")


def render_md(report: dict[str, Any]) -> str:
    rows = report["rows"]
    client = [r for r in rows if "input_kind" in r]
    lines = ["# Request-level calibration (issue 27)", "",
             f"Generated {report['date']} by " + " and ".join(f"`{c}`" for c in report.get("commands", [report["command"]]))
             + f". Method: {report['method']}.", "",
             ("Errors: median |relative error| over throughput and TTFT / TPOT / ITL / e2e mean, p50, p90, p99, "
             "pooled over the runs (as `costline validate`). Fit time: this process's CPU seconds (the fit is "
             "single-threaded) and the wall clock on the shared 2-core machine."), ""]
    if len(client) < len(rows):
        lines += [ENGINE_INTRO.format(fit=", ".join(report["fit_runs"])), ""]
    if client:
        lines += [CLIENT_INTRO.format(held=", ".join(next(iter(client))["held_out_runs"])), ""]
    lines += [("| model | start | input | multipliers (prefill / decode / kv / host) | fit error | held-out error | "
              "step-level, same rebuild | step-level, exact | held-out / step-level (same rebuild, exact) | fit time |"),
              "|---|---|---|---|---:|---:|---:|---:|---:|---:|", *map(_row_line, rows),
              "", "Held-out runs, median |error| per run (first-principles start):", ""]
    for r in rows:
        if r["start"] == "first principles":
            runs = ", ".join(f"{k} {_pct(v)}" for k, v in r["held_out_runs"].items())
            kind = r.get("input_kind", "engine run as bench")
            lines.append(f"- {r['model']}, {kind}{' + metrics' if r['metrics'] else ''}: {runs}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=Path("runs/h200"), help="unpacked engine runs (runs/h200)")
    ap.add_argument("--work", type=Path, default=Path("runs/request_level"), help="rebuilt bench files go here")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/calibration"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--max-seconds", type=float, default=240.0, help="CPU-time cap per fit")
    ap.add_argument("--bench-dir", type=Path, help="results a real client measured (*.json, *.prom beside)")
    ap.add_argument("--bench-model", default="llama-3.1-8b", help="the model the --bench-dir server ran")
    ap.add_argument("--serve-args", default="", help="the --bench-dir server's engine flags, as for vllm serve")
    ap.add_argument("--held-out", default="", help="--bench-dir runs to hold out (comma-separated names)")
    ap.add_argument("--name", default="request_level", help="output files: NAME.json and NAME.md")
    ap.add_argument("--max-requests", type=int, default=MAX_REQUESTS,
                    help="simulate at most the first N requests of each engine run (in send order)")
    ap.add_argument("--render", type=Path, nargs="+", help="only write NAME.json/.md from these report JSONs (rows joined)")
    args = ap.parse_args(argv)
    if args.render:
        parts = [json.loads(p.read_text()) for p in args.render]
        report = parts[0] | {"rows": [r for p in parts for r in p["rows"]],
                             "commands": [p["command"] for p in parts], "seconds": sum(p["seconds"] for p in parts)}
        (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / f"{args.name}.md").write_text(render_md(report))
        return 0
    t0 = time.perf_counter()
    rows = []
    for model in filter(None, args.models.split(",")):
        rows += run_model(model, args.runs, args.work, args.max_seconds, print, args.max_requests)
    if args.bench_dir is not None:
        rows += run_client(args.bench_dir, args.bench_model, args.serve_args, args.max_seconds, print,
                           tuple(filter(None, args.held_out.split(","))))
    from sim.request_fit import METHOD

    report = {"schema": "costline-request-level/1", "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "command": "python " + " ".join(shlex.quote(a) for a in [str(Path(__file__).relative_to(ROOT)),
                                                                       *(argv if argv is not None else sys.argv[1:])]),
              "method": METHOD, "fit_runs": list(FIT_RUNS), "rows": rows,
              "seconds": round(time.perf_counter() - t0, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(render_md(report))
    print(f"wrote {args.out / args.name}.json and .md in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
