"""Fit a mixture-of-experts profile from `moe_sweep.py`'s sweep runs and validate it on the held-out runs.

Per model: unpack `<model>-sweep.tar.xz` and `<model>-validation.tar.xz` (from --archives) into
--work, fit the profile with `costline calibrate`'s code (sim/calibrate.py `fit_profile`; the experts
priced by the shipped profile's measured MoE kernel factors, scaled by a fitted `experts` multiplier
per step kind, the step constants fitted beside them), replay every validation run in the simulator
with `costline validate`'s code (sim/validate.py `validate_run`), with the fitted profile and with
the profile it started from (first principles + the kernel factors), and write `<name>.md` / `.json`:
per run and metric (TTFT / TPOT / e2e mean, p50, p99, output throughput) engine, simulator, error;
per run the median |error| over those and `costline validate`'s verdict (median over its 18 metrics,
worst p99); over the runs the median of the medians and the worst p99.

    python3 benchmarks/calibration/moe_validate.py --archives benchmarks/calibration/data/moe --work runs/moe \
        --base-profile benchmarks/calibration/data/moe/start --out benchmarks/calibration --write-profiles
    python3 benchmarks/calibration/moe_validate.py --archives /tmp/moe/out --models tiny-moe --as-gpu h200 \
        --work /tmp/moe/fit --out /tmp/moe/fit --name dry-run   # the CPU dry run's outputs
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from advisor.commands.validate import profile_validation_summary
from engine.core.model_spec import get_model
from sim.calibrate import choose_longest_excess, load_run
from sim.config import EngineConfig
from sim.cost_model import PROFILES_DIR, CostProfile
from sim.hardware import get_gpu
from sim.validate import RunComparison, validate_run

TABLE_METRICS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                 "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "output_throughput")
SHORT = {"mean_ttft_ms": "TTFT mean", "median_ttft_ms": "TTFT p50", "p99_ttft_ms": "TTFT p99",
         "mean_tpot_ms": "TPOT mean", "median_tpot_ms": "TPOT p50", "p99_tpot_ms": "TPOT p99",
         "mean_e2el_ms": "E2E mean", "median_e2el_ms": "E2E p50", "p99_e2el_ms": "E2E p99",
         "output_throughput": "out tok/s"}
PARTS = ("sweep", "validation")
# Sweep runs whose decode-only steps stay out of the fit: the long-context supplement's decode batches
# of 17-32 hold one decode 5-8x longer than the rest, and fitted on, they pulled the decode knots there
# (a blind ranking slice's decode steps of 17+ went from -2.2% to -5.4%, its TPOT p90 from -1.8% to -7.2%)
PREFILL_STEPS_ONLY_RUNS: tuple[str, ...] = ("long-context-",)


def unpack(archives: Path, model: str, work: Path, as_gpu: str | None, validation_set: str = "") -> Path:
    """The model's run folders under work/<model>/{sweep,validation} (replaced when unpacked again).
    `as_gpu`: rewrite each run.json's GPU (a CPU dry run's runs say "cpu", which no preset prices).
    `validation_set` "long": the held-out runs from `<model>-long-validation.tar.xz` (moe_sweep.py
    --long-validation) instead of the sweep call's own."""
    root = work / model
    for part in PARTS:
        label = f"{model}-{validation_set}" if validation_set and part == "validation" else model
        src = archives / f"{label}-{part}.tar.xz"
        if not src.is_file():
            if part == "sweep":
                raise SystemExit(f"--archives {archives}: no {src.name}; give the folder moe_sweep.py packed into")
            print(f"no {src.name}: fitted only, nothing to validate on", flush=True)
            continue
        if (root / part).exists():
            shutil.rmtree(root / part)
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(src) as t:
            t.extractall(root, filter="data")
    # moe_sweep.py's supplements (--supplement, --eager-supplement, --small-mixed-supplement): more sweep
    # runs, one archive a call (<model>-extra-, -extra2-, ...: each call's --extra-name)
    for extra in sorted(archives.glob(f"{model}-extra*-sweep.tar.xz")):
        with tarfile.open(extra) as t:
            t.extractall(root, members=[m for m in t.getmembers() if m.name.startswith("sweep/")], filter="data")
    for f in root.glob("*/*/run.json"):
        info = json.loads(f.read_text())
        # moe_sweep.py's top-up calls (34d917c and before) wrote their label ("<model>-long") as the model
        fixed = info | ({"gpu": as_gpu} if as_gpu else {}) | {"model": model}
        if fixed != info:
            f.write_text(json.dumps(fixed, indent=2) + "\n")
    return root


def run_folders(root: Path, part: str) -> list[Path]:
    """Run folders of one part that hold steps (a run the deadline cut before its first step has none)."""
    out = []
    for d in sorted((root / part).iterdir()) if (root / part).is_dir() else ():
        steps = d / "steps.jsonl"
        if (d / "run.json").is_file() and steps.is_file() and steps.stat().st_size > 0:
            out.append(d)
    return out


def standin_note(run_dir: Path) -> str:
    """How the sweep's random-weight engine was set up, where its run.json says (moe_sweep.py's
    --temperature / --embed-scale / --residual-scale: which experts its tokens route to)."""
    info = json.loads((run_dir / "run.json").read_text())
    parts = [f"{k.replace('_', ' ')} x{info[k]:g}" for k in ("embed_scale", "residual_scale") if info.get(k, 1.0) != 1.0]
    temperature = (info.get("sampling") or {}).get("temperature")
    if temperature:
        parts.append(f"sampled at temperature {temperature:g}")
    return f"; stand-in engine: {', '.join(parts)}" if parts else ""


def fit(model: str, gpu: str, sweep: list[Path], base: CostProfile, archives: Path) -> tuple[CostProfile, dict]:
    """The v2 profile fitted on the sweep runs, the MoE kernel terms and first-principles fields of `base` kept."""
    m, g = get_model(model), get_gpu(gpu)
    runs = [load_run(d, EngineConfig()) for d in sweep]
    for r in runs:  # moe_sweep.py --long-context-supplement's runs: recorded for their steps with prefill
        r.prefill_steps_only = r.name.startswith(PREFILL_STEPS_ONLY_RUNS)
    prov = {"moe_base_profile": f"{base.name} ({base.source})", "moe_kernel_terms": (base.moe.source if base.moe
                                                                                     else "MoeTerms prior"),
            "sweep": "benchmarks/calibration/moe_sweep.py", "archives": str(archives)}
    # the longest decode's weight in steps with prefill: chosen on the fit's held-out steps
    res, excess_scores = choose_longest_excess(runs, m, g, engine_config=EngineConfig(), name=f"{g.name}-{m.name}",
                                               provenance=prov, moe_base=base)
    prof = res.profile
    src = (f"measured ({g.name} x {m.name}): fitted from {res.n_steps} engine steps of {len(runs)} sweep run(s) by "
           "sim/calibrate.py (benchmarks/calibration/moe_sweep.py), the experts priced by the fused MoE kernel's "
           "measured factors (moe.source) times a fitted multiplier per step kind" + standin_note(sweep[0]))
    prof = prof.model_copy(update={"source": src})
    errors = {k: e.as_dict() for k, e in res.errors.items()}
    return prof, {"n_steps": res.n_steps, "n_warmup_dropped": res.n_warmup_dropped, "errors": errors,
                  "longest_excess": prof.mixed.decode_max_excess, "longest_excess_scores": excess_scores,
                  "cpu_error_median": res.cpu_error_median,
                  "memory_checks": [{"run": c.run, "engine": c.engine_blocks, "sim": c.sim_blocks}
                                    for c in res.memory_checks]}


def run_row(c: RunComparison) -> dict:
    """One validation run: the table's metrics, their median |error|, and costline validate's verdict."""
    metrics = {k: c.metric(k).model_dump() for k in TABLE_METRICS}
    errs = [abs(v["error"]) for v in metrics.values() if v["error"] is not None]
    p99 = [abs(metrics[k]["error"]) for k in TABLE_METRICS if k.startswith("p99") and metrics[k]["error"] is not None]
    kinds = [{"kind": k.kind, "engine_steps": k.engine_steps, "engine_gpu_ms": k.engine_gpu_ms,
              "model_gpu_ms": k.model_gpu_ms, "model_gpu_error": k.model_gpu_error,
              "engine_period_ms": k.engine_period_ms, "sim_period_ms": k.sim_period_ms} for k in c.step_kinds]
    return {"run": c.name, "description": c.description, "requests": c.num_requests, "flags": c.flags,
            "metrics": metrics, "median_abs_error": float(np.median(errs)) if errs else None,
            "max_p99_abs_error": max(p99, default=None), "validate_median_abs_error": c.verdict.median_abs_error,
            "validate_max_p99_abs_error": c.verdict.max_p99_abs_error, "passed": c.verdict.passed,
            "failures": c.verdict.failures, "preemptions": (c.metric("num_preemptions").engine,
                                                             c.metric("num_preemptions").sim),
            "steps": (c.metric("num_engine_steps").engine, c.metric("num_engine_steps").sim), "step_kinds": kinds,
            "latency_basis": c.latency_basis}


def summary(rows: list[dict]) -> dict:
    med = [r["median_abs_error"] for r in rows if r["median_abs_error"] is not None]
    p99 = [r["max_p99_abs_error"] for r in rows if r["max_p99_abs_error"] is not None]
    vmed = [r["validate_median_abs_error"] for r in rows if r["validate_median_abs_error"] is not None]
    vp99 = [r["validate_max_p99_abs_error"] for r in rows if r["validate_max_p99_abs_error"] is not None]
    return {"validate_passed": sum(bool(r["passed"]) for r in rows), "validate_max_p99_abs_error": max(vp99, default=None),
            "runs": len(rows), "median_abs_error": float(np.median(med)) if med else None,
            "max_run_median_abs_error": max(med, default=None), "max_p99_abs_error": max(p99, default=None),
            "validate_median_abs_error": float(np.median(vmed)) if vmed else None,
            "target_met": bool(med and p99 and max(med) <= 0.05 and max(p99) <= 0.10)}


def validate(runs: list[Path], profile_path: Path) -> tuple[list[dict], list[RunComparison]]:
    comparisons = [validate_run(d, str(profile_path)) for d in runs]
    return [run_row(c) for c in comparisons], comparisons


def one_model(a: argparse.Namespace, model: str) -> dict:
    t0 = time.perf_counter()
    root = unpack(a.archives, model, a.work, a.as_gpu, a.validation_set)
    sweep, held = run_folders(root, "sweep"), run_folders(root, "validation")
    gpu = a.as_gpu or json.loads((sweep[0] / "run.json").read_text())["gpu"]
    shipped = PROFILES_DIR / f"{gpu}-{model}.json"
    given = a.base_profile
    if given is not None and Path(given).is_dir():  # a folder of starting profiles, one per model
        given = Path(given) / f"{gpu}-{model}.json"
        if not given.is_file():
            raise SystemExit(f"--base-profile {a.base_profile}: no {given.name} there")
    base = CostProfile.load(given or (shipped if shipped.is_file() else "default"))
    if base.is_fitted and base.moe is None:
        raise SystemExit(f"{base.name}: a fitted profile without MoE terms cannot be the MoE base; pass "
                         "--base-profile with the kernel-factor profile")
    prof_dir = a.work / "profiles"
    prof_dir.mkdir(parents=True, exist_ok=True)
    # the starting profile as it was (its file may be overwritten below), to compare against
    start_path = prof_dir / f"{gpu}-{model}.start.json"
    start_path.write_text(base.model_copy(update={"validation": None}).to_json())
    prof, fit_info = fit(model, gpu, sweep, base, a.archives)
    fitted_path = prof_dir / f"{gpu}-{model}.json"
    fitted_path.write_text(prof.to_json())
    fitted_rows, comparisons = validate(held, fitted_path)
    start_rows, _ = validate(held, start_path)
    out = {"model": model, "gpu": gpu, "sweep_runs": [d.name for d in sweep], "validation_runs": [d.name for d in held],
           "profile": prof.model_dump(mode="json", include={"decode", "mixed", "mixed_graph", "moe", "overlap"}),
           "fit": fit_info, "fitted": {"runs": fitted_rows, "summary": summary(fitted_rows)},
           "start": {"profile": base.name, "source": base.source, "runs": start_rows, "summary": summary(start_rows)},
           "seconds": round(time.perf_counter() - t0, 1)}
    if a.write_profiles:
        prof = prof.model_copy(update={"validation": profile_validation_summary(
            comparisons, f"python3 benchmarks/calibration/moe_validate.py --archives {a.archives} --models {model}"),
            "provenance": kept_kernel_notes(prof, shipped)})
        (PROFILES_DIR / f"{gpu}-{model}.json").write_text(prof.to_json())
        out["profile_written"] = str(PROFILES_DIR / f"{gpu}-{model}.json")
    return out


def kept_kernel_notes(prof: CostProfile, shipped: Path) -> dict | None:
    """`prof`'s provenance with the shipped profile's `kernels_since` note (what changed in the engine's kernels
    after its runs were recorded): a refit on the same archives keeps it; a re-recorded sweep should drop it."""
    old = CostProfile.load(shipped).provenance if shipped.is_file() else None
    note = (old or {}).get("kernels_since")
    if not note:
        return prof.provenance
    print(f"kept provenance.kernels_since from {shipped} (drop it once the runs are re-recorded)")
    return {**(prof.provenance or {}), "kernels_since": note}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _abs(x: float | None) -> str:
    return "-" if x is None else f"{abs(x) * 100:.1f}%"


def markdown(results: list[dict], command: str) -> str:
    lines = ["# MoE presets: simulator vs engine on held-out runs (issue 29, item 4)", "",
             (f"Generated by `{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Error = (sim - "
             "engine) / engine. Median |err|: over the ten metrics of the row; `validate`: `costline validate`'s "
             "verdict (median over throughput and TTFT / TPOT / ITL / e2e mean, p50, p90, p99; worst p99). "
             "Target: median |error| <= 5%, every p99 <= 10%."), ""]
    for res in results:
        s, st = res["fitted"]["summary"], res["start"]["summary"]
        lines += [f"## {res['model']} on {res['gpu']}", "",
                  (f"Fitted on {len(res['sweep_runs'])} sweep runs ({res['fit']['n_steps']} steps); validated on "
                  f"{len(res['validation_runs'])} held-out runs ({sum(r['requests'] for r in res['fitted']['runs'])} requests). **Median |error| {_abs(s['median_abs_error'])}, "
                  f"worst run median {_abs(s['max_run_median_abs_error'])}, worst p99 {_abs(s['max_p99_abs_error'])}"
                  f"** (target {'met' if s['target_met'] else 'missed'}); the starting profile ({res['start']['profile']}, "
                  f"first principles + kernel factors): {_abs(st['median_abs_error'])}, worst p99 "
                  f"{_abs(st['max_p99_abs_error'])}. `costline validate` passes {s['validate_passed']} of "
                  f"{len(res['fitted']['runs'])} runs (its worst p99, ITL's included: "
                  f"{_abs(s['validate_max_p99_abs_error'])})."), ""]
        head = "| run | " + " | ".join(SHORT[k] for k in TABLE_METRICS) + " | median \\|err\\| | worst p99 | validate | steps eng / sim | preempt eng / sim |"
        lines += [head, "|" + "---|" * (len(TABLE_METRICS) + 6)]
        for r in res["fitted"]["runs"]:
            cells = [_pct(r["metrics"][k]["error"]) for k in TABLE_METRICS]
            lines.append(f"| {r['run']} | " + " | ".join(cells) + f" | {_abs(r['median_abs_error'])} | "
                         f"{_abs(r['max_p99_abs_error'])} | {_abs(r['validate_median_abs_error'])} / "
                         f"{_abs(r['validate_max_p99_abs_error'])} | {r['steps'][0]} / {r['steps'][1]} | "
                         f"{r['preemptions'][0]} / {r['preemptions'][1]} |")
        lines += [f"\n{r['run']}: {r['latency_basis']}." for r in res["fitted"]["runs"] if r.get("latency_basis")]
        lines += ["", "Engine values (ms; tok/s):", "", "| run | " + " | ".join(SHORT[k] for k in TABLE_METRICS) + " |",
                  "|" + "---|" * (len(TABLE_METRICS) + 1)]
        for r in res["fitted"]["runs"]:
            cells = ["-" if r["metrics"][k]["engine"] is None else f"{r['metrics'][k]['engine']:.1f}" for k in TABLE_METRICS]
            lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
        lines += ["", "Held-out step error of the fit (GPU time; median / p90):", ""]
        for k, e in res["fit"]["errors"].items():
            lines.append(f"- {k}: {e['n_fit']} fitted, {e['n_held_out']} held out: {_abs(e['gpu_median'])} / "
                         f"{_abs(e['gpu_p90'])} (whole step {_abs(e['step_median'])} / {_abs(e['step_p90'])})")
        p = res["profile"]
        lines += ["", "Experts multiplier per step kind (1 = the kernel bench's time): " + ", ".join(
            f"{k} {p[k]['experts']:.3f}" for k in ("decode", "mixed", "mixed_graph") if p.get(k)
            and p[k].get("experts") is not None), "",
            "Cost model on the engine's own steps of each kind (GPU time, mean; the schedule held fixed):", ""]
        for r in res["fitted"]["runs"]:
            kinds = "; ".join(f"{k['kind']} {k['engine_steps']} steps {_pct(k['model_gpu_error'])}" for k in r["step_kinds"])
            lines.append(f"- {r['run']}: {kinds}")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archives", type=Path, required=True, help="folder with <model>-sweep/-validation.tar.xz")
    ap.add_argument("--models", default="qwen3-30b-a3b,mixtral-8x7b", help="comma list (those with archives)")
    ap.add_argument("--work", type=Path, required=True, help="unpacked runs and profiles go here")
    ap.add_argument("--out", type=Path, required=True, help="folder for <name>.md and <name>.json")
    ap.add_argument("--name", default="moe_validation")
    ap.add_argument("--as-gpu", default=None, help="the dry run: price the runs as on this GPU")
    ap.add_argument("--base-profile", default=None, help="the profile whose MoE terms the fit keeps, or a "
                    "folder of them (<gpu>-<model>.json; the committed ones: benchmarks/calibration/data/moe/start); "
                    "default: the shipped sim/profiles/<gpu>-<model>.json")
    ap.add_argument("--write-profiles", action="store_true", help="write sim/profiles/<gpu>-<model>.json")
    ap.add_argument("--validation-set", choices=("", "long"), default="",
                    help="long: validate on moe_sweep.py --long-validation's runs (<model>-long-validation.tar.xz)")
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m and (a.archives / f"{m}-sweep.tar.xz").is_file()]
    if not models:
        raise SystemExit(f"--archives {a.archives}: no <model>-sweep.tar.xz for any of {a.models}")
    command = "python3 benchmarks/calibration/moe_validate.py " + " ".join(sys.argv[1:])
    results = []
    for m in models:
        res = one_model(a, m)
        s = res["fitted"]["summary"]
        print(f"{m}: median |err| {_abs(s['median_abs_error'])}, worst p99 {_abs(s['max_p99_abs_error'])} "
              f"({res['seconds']} s)", flush=True)
        results.append(res)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.json").write_text(json.dumps({"command": command, "models": results}, indent=2) + "\n")
    (a.out / f"{a.name}.md").write_text(markdown(results, command))
    print(f"wrote {a.out / (a.name + '.md')}, {a.out / (a.name + '.json')}")


if __name__ == "__main__":
    main()
