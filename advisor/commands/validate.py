"""`costline validate`: engine runs replayed in the simulator, per metric, against issue 10's targets.

    costline validate /data/h200/*/validation/* --profile auto --profile default --out benchmarks/calibration

Each RUN_DIR is an engine run folder (run.json, summary.json, workload.jsonl, steps.jsonl; what the
GPU script writes). For every run and every `--profile` it prints a table (engine, simulator,
signed error per metric) and with `--out` writes `validation.md` and `validation.json` there. A run
the profile was fitted on (its provenance lists it) is refused unless `--allow-fitted`: a fit
checked on its own data proves nothing.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from advisor.console import console as plain_console
from advisor.console import styled
from advisor.options import Force, clean_errors
from engine.core.outputs import (
    check_output_dir,
    check_output_file,
    refuse_input_overlap,
    staged_file,
)
from engine.core.run_summary import SLO
from sim.cost_model import CostProfile
from sim.validate import (
    ERROR_METRICS,
    MEDIAN_ABS_ERROR_TARGET,
    P99_ABS_ERROR_TARGET,
    RankingReport,
    RunComparison,
    RunFolderError,
    ValidationReport,
    fitted_runs,
    profile_path,
    rank_runs,
    read_run_info,
    resolve_profile,
    validate_run,
    was_fitted_on,
)

REPORT_FILES = ("validation.md", "validation.json")
# Rows of a workload's table: label, summary key.
TABLE_ROWS = (
    ("output tok/s", "output_throughput"), ("requests/s", "request_throughput"),
    *((f"{name} {stat}", f"{key}_{m}_ms") for m, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"),
                                                           ("e2el", "e2e"))
      for stat, key in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"))),
    ("preemptions", "num_preemptions"), ("prefix-hit tokens", "prefix_cache_hits_tokens"),
    ("prefix-hit rate", "prefix_cache_hit_rate"), ("completed", "completed"), ("rejected", "rejected"),
    ("unfinished", "unfinished"), ("engine steps", "num_engine_steps"), ("queue mean (ms)", "mean_queue_time_ms"),
    ("GPU busy", "gpu_busy_share"), ("KV blocks", "num_gpu_blocks"),
)


@clean_errors
def validate(
    run_dirs: Annotated[list[Path], typer.Argument(help="engine run folders (run.json, summary.json, workload.jsonl, "
                                                   "steps.jsonl)", show_default=False)],
    profile: Annotated[list[str] | None, typer.Option(
        "--profile", help="cost profile: a name (sim/profiles), a JSON path, or auto (the fitted profile of the "
        "run's model and GPU, else default); repeat to compare profiles")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="folder for validation.md and validation.json (existing ones need --force)")] = None,
    allow_fitted: Annotated[bool, typer.Option(
        "--allow-fitted", help="also validate on runs the profile was fitted on (proves little)")] = False,
    write_profile_validation: Annotated[bool, typer.Option(
        "--write-profile-validation", help="store the per-metric errors in each profile JSON's 'validation' "
        "field")] = False,
    rank: Annotated[str | None, typer.Option(
        "--rank", help='also check that the simulator orders the runs (configurations of one workload) by '
        'goodput at this SLO as the engine does, e.g. "ttft:1000 tpot:35"')] = None,
    force: Force = False,
) -> None:
    """Replay engine runs in the simulator with identical requests, flags and KV blocks; compare per metric."""
    profiles = profile or ["auto"]
    rank_slo = SLO.parse(rank) if rank is not None else None
    if out is not None:  # before any work: a refused --out must not cost the simulations
        check_report_outputs(out, force=force, inputs=[*run_dirs, *(profile_path(p) for p in profiles)])
    plan = plan_runs(run_dirs, profiles, allow_fitted=allow_fitted)
    if write_profile_validation:
        check_profiles_writable({p for _, p in plan})
    console = plain_console()
    results = []
    for run_dir, prof in plan:
        res = validate_run(run_dir, prof)
        print_comparison(res, console)
        results.append(res)
    report = build_report(results, command_line(run_dirs, profiles, out, allow_fitted, write_profile_validation,
                                                rank))
    if rank_slo is not None:
        report = report.model_copy(update={"ranking": rank_runs(run_dirs, rank_slo, profiles[0])})
    print_overview(report, console)
    if out is not None:
        write_report(report, out)
        console.print(f"wrote {out / REPORT_FILES[0]}, {out / REPORT_FILES[1]}", highlight=False)
    if write_profile_validation:
        store_validations(report, console)


def build_report(results: list[RunComparison], command: str) -> ValidationReport:
    profiles = sorted({r.profile for r in results})
    return ValidationReport(command=command, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                            profiles=profiles, fitted_runs={p: fitted_runs(p) for p in profiles}, runs=results)


def store_validations(report: ValidationReport, console: Console) -> None:
    """Each fitted profile's summary into its JSON; a first-principles one is left as it is, as
    "validated" would hide that it is first principles."""
    for prof in report.profiles:
        if not CostProfile.load(prof).is_fitted:
            console.print(f"not stored in {prof}: a first-principles profile keeps its status", highlight=False)
            continue
        path = store_profile_validation(prof, [r for r in report.runs if r.profile == prof], report.command)
        console.print(f"stored the validation summary in {path}", highlight=False)


# --------------------------------------------------------------------------- checks before work
def check_report_outputs(out: Path, *, force: bool, inputs: list[Path]) -> None:
    refuse_input_overlap(out, inputs, "--out")  # the folder itself, whether or not it exists
    if not out.exists():
        check_output_dir(out, flag="--out", inputs=inputs)
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder for {' and '.join(REPORT_FILES)}")
    for name in REPORT_FILES:
        check_output_file(out / name, flag="--out", force=force, inputs=inputs)


def plan_runs(run_dirs: list[Path], profiles: list[str], *, allow_fitted: bool) -> list[tuple[Path, str]]:
    """(run folder, resolved profile) pairs; a run a profile was fitted on is refused unless allowed."""
    plan = []
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            raise RunFolderError(f"{run_dir}: not a folder; give engine run folders (run.json, summary.json, "
                                 "workload.jsonl)")
        info = read_run_info(run_dir)
        for prof in profiles:
            resolved = resolve_profile(prof, info.model, info.gpu)
            entry = was_fitted_on(run_dir, fitted_runs(resolved), info.name)
            if entry is not None and not allow_fitted:
                raise ValueError(f"{run_dir}: profile {resolved} was fitted on this run (its provenance lists "
                                 f"{entry}); validate on held-out runs, or pass --allow-fitted")
            if (run_dir, resolved) not in plan:  # `auto` may resolve to a profile also named
                plan.append((run_dir, resolved))
    return plan


def check_profiles_writable(profiles: set[str]) -> None:
    if "validation" not in CostProfile.model_fields:
        raise ValueError("--write-profile-validation: this CostProfile has no 'validation' field yet (it comes "
                         "with the fitted-profile schema); drop the flag")
    for prof in profiles:
        path = profile_path(prof)
        if not path.is_file():
            raise ValueError(f"--write-profile-validation: profile {prof} is not a file ({path})")
        check_output_file(path, flag="--write-profile-validation", force=True)


def command_line(run_dirs: list[Path], profiles: list[str], out: Path | None, allow_fitted: bool,
                 write_profile_validation: bool = False, rank: str | None = None) -> str:
    """The command that regenerates the report (run folders as given)."""
    parts = ["costline", "validate", *map(str, run_dirs)]
    for p in profiles:
        parts += ["--profile", p]
    if allow_fitted:
        parts.append("--allow-fitted")
    if write_profile_validation:
        parts.append("--write-profile-validation")
    if rank is not None:
        parts += ["--rank", rank]
    if out is not None:
        parts += ["--out", str(out), "--force"]
    return shlex.join(parts)


# --------------------------------------------------------------------------- output
COUNT_KEYS = frozenset({"num_preemptions", "prefix_cache_hits_tokens", "completed", "rejected", "unfinished",
                        "num_engine_steps", "num_gpu_blocks", "n"})


def fmt_value(key: str, v: float | None) -> str:
    if v is None:
        return "-"
    if key in ("prefix_cache_hit_rate", "gpu_busy_share"):
        return f"{v:.1%}"
    if key in COUNT_KEYS:
        return f"{int(v):,}"
    return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"


def fmt_error(key: str, m) -> str:
    if key == "prefix_cache_hit_rate" and m.engine is not None and m.sim is not None:
        return f"{(m.sim - m.engine) * 100:+.2f} pt"
    if key in ("num_preemptions", "completed", "rejected", "unfinished", "num_engine_steps") and m.engine is not None \
            and m.sim is not None:
        return f"{m.sim - m.engine:+,.0f}"
    return "-" if m.error is None else f"{m.error:+.1%}"


def _verdict_line(r: RunComparison) -> str:
    v = r.verdict
    head = "PASS" if v.passed else "FAIL"
    return (f"{head}: median |error| {_pct(v.median_abs_error)} (target {MEDIAN_ABS_ERROR_TARGET:.0%}), worst p99 "
            f"{_pct(v.max_p99_abs_error)} (target {P99_ABS_ERROR_TARGET:.0%})")


def _other_failures(r: RunComparison) -> list[str]:
    """The failed targets the verdict line does not already state (the median's)."""
    return [f for f in r.verdict.failures if not f.startswith("median |error|")]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _kv_line(r: RunComparison) -> str:
    kv = r.kv_blocks
    own = "cannot size it" if kv.sim_own is None else f"{kv.sim_own:,} ({_signed(kv.sim_own_error)})"
    return f"KV blocks: engine {kv.engine:,}, simulated {kv.simulated:,}; simulator by itself {own}"


def _signed(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def print_comparison(r: RunComparison, console: Console) -> None:
    t = Table(title=styled((r.name, "bold"), f" ({r.purpose}, {r.model} on {r.gpu}, profile {r.profile})"),
              title_justify="left")
    for col, just in (("metric", "left"), ("engine", "right"), ("sim", "right"), ("error", "right")):
        t.add_column(col, justify=just, style="bold cyan" if col == "metric" else None)
    for label, key in TABLE_ROWS:
        m = r.metric(key)
        t.add_row(label, fmt_value(key, m.engine), fmt_value(key, m.sim), fmt_error(key, m))
    console.print(t)
    console.print(_kv_line(r), highlight=False)
    if r.latency_basis:
        console.print(r.latency_basis, highlight=False)
    for k in r.step_kinds:
        if k.engine_steps or k.sim_steps:
            console.print(f"  {k.kind}: GPU ms per step engine {_ms(k.engine_gpu_ms)} ({k.engine_steps:,} steps, "
                          f"slowest {_ms(k.engine_max_gpu_ms)}), sim {_ms(k.sim_gpu_ms)} ({k.sim_steps:,} steps, "
                          f"{_signed(k.gpu_error)}); cost model on the engine's steps {_ms(k.model_gpu_ms)} "
                          f"({_signed(k.model_gpu_error)})", highlight=False)
    console.print(_verdict_line(r) + "".join(f"\n  - {f}" for f in _other_failures(r)), highlight=False)


def print_overview(report: ValidationReport, console: Console) -> None:
    t = Table(title=styled(("validation", "bold")), title_justify="left")
    for col in ("model", "run", "profile", "median |err|", "worst p99", "preemptions e/s", "pass"):
        t.add_column(col)
    for r in report.runs:
        pre = r.metric("num_preemptions")
        t.add_row(r.model, r.name, r.profile, _pct(r.verdict.median_abs_error), _pct(r.verdict.max_p99_abs_error),
                  f"{fmt_value('n', pre.engine)} / {fmt_value('n', pre.sim)}", "yes" if r.verdict.passed else "no")
    console.print(t)
    if report.ranking is not None:
        print_ranking(report.ranking, console)


def print_ranking(rk: RankingReport, console: Console) -> None:
    slo = " ".join(f"{k.removesuffix('_ms')}:{v:g}" for k, v in rk.slo.items())
    t = Table(title=styled((f"goodput order at {slo}", "bold"), f" (engine spread {rk.spread:.1%})"),
              title_justify="left")
    for col in ("run", "engine req/s", "sim req/s", "error", "engine rank", "sim rank"):
        t.add_column(col)
    for r in rk.runs:
        t.add_row(r.name, f"{r.engine_goodput:.3g}", f"{r.sim_goodput:.3g}", _pct(r.error),
                  str(rk.engine_order.index(r.name) + 1), str(rk.sim_order.index(r.name) + 1))
    console.print(t)
    verdict = "same order" if rk.passed else "ORDER DIFFERS"
    console.print(f"{verdict}: {rk.pairs_agreeing} of {rk.pairs_separated} pairs the engine separates by more "
                  f"than {rk.separation:.0%} agree; following the simulator's pick loses {rk.pick_loss:.1%} of "
                  "goodput", highlight=False)
    for d in rk.disagreements:
        console.print(f"  {d}", highlight=False)


def write_report(report: ValidationReport, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("validation.json", report.to_json()), ("validation.md", render_markdown(report))):
        with staged_file(out / name) as tmp:
            tmp.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- markdown
def render_markdown(report: ValidationReport) -> str:
    """The report as markdown: the command, which runs fitted which profile, an overview, and per
    workload a table with one engine column and one simulator + error pair per profile."""
    lines = ["# Simulator vs engine: validation", "",
             f"Generated {report.date} by (one command regenerates it):", "", "```", report.command, "```", "",
             (f"Targets (issue 10): median |error| <= {MEDIAN_ABS_ERROR_TARGET:.0%} over throughput and TTFT / "
             f"TPOT / ITL / e2e mean, p50, p90, p99; every p99 within {P99_ABS_ERROR_TARGET:.0%}; preemptions "
             "within 5% (or 2); prefix-hit rate within 1 point. Error = (sim - engine) / engine."), ""]
    lines += _fitting_lines(report) + _overview_lines(report)
    if report.ranking is not None:
        lines += _ranking_lines(report.ranking)
    by_run: dict[str, list[RunComparison]] = {}
    for r in report.runs:
        by_run.setdefault(r.run_dir, []).append(r)
    for runs in by_run.values():
        lines += _run_section(runs)
    return "\n".join(lines) + "\n"


def _ranking_lines(rk: RankingReport) -> list[str]:
    slo = " ".join(f"{k.removesuffix('_ms')}:{v:g}" for k, v in rk.slo.items())
    lines = [f"## Goodput order at {slo}", "",
             (f"Engine spread {rk.spread:.1%}; {rk.pairs_agreeing} of {rk.pairs_separated} pairs the engine "
              f"separates by more than {rk.separation:.0%} come out in the same order in the simulator "
              f"(**{'pass' if rk.passed else 'fail'}**); following the simulator's pick loses {rk.pick_loss:.1%} "
              "of goodput."), "", "| run | engine req/s | sim req/s | error | engine rank | sim rank |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rk.runs:
        lines.append(f"| {r.name} | {r.engine_goodput:.3g} | {r.sim_goodput:.3g} | {_pct(r.error)} | "
                     f"{rk.engine_order.index(r.name) + 1} | {rk.sim_order.index(r.name) + 1} |")
    return [*lines, *(f"- {d}" for d in rk.disagreements), ""]


def _fitting_lines(report: ValidationReport) -> list[str]:
    lines = ["## Profiles and the runs they were fitted on", ""]
    for prof in report.profiles:
        fitted = report.fitted_runs.get(prof) or []
        used = "; ".join(fitted) if fitted else "none listed (a first-principles or hand-made profile)"
        lines.append(f"- `{prof}`: fitted on {used}")
    validated = sorted({f"{r.name} ({r.purpose})" for r in report.runs})
    lines += [f"- validated on: {', '.join(validated)}", ""]
    return lines


def _overview_lines(report: ValidationReport) -> list[str]:
    lines = ["## Overview", "", ("| model | run | purpose | profile | median \\|err\\| | worst p99 | preemptions "
             "engine / sim | prefix-hit rate engine / sim | KV blocks engine / sim by itself | pass |"),
             "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in report.runs:
        pre, hit, kv = r.metric("num_preemptions"), r.metric("prefix_cache_hit_rate"), r.kv_blocks
        own = "-" if kv.sim_own is None else f"{kv.sim_own:,}"
        lines.append(f"| {r.model} | {r.name} | {r.purpose} | {r.profile} | {_pct(r.verdict.median_abs_error)} | "
                     f"{_pct(r.verdict.max_p99_abs_error)} | {fmt_value('n', pre.engine)} / {fmt_value('n', pre.sim)} | "
                     f"{fmt_value('prefix_cache_hit_rate', hit.engine)} / {fmt_value('prefix_cache_hit_rate', hit.sim)} | "
                     f"{kv.engine:,} / {own} | {'yes' if r.verdict.passed else '**no**'} |")
    return lines + [""]


def _ms(x: float | None) -> str:
    return fmt_value("x_ms", x)


def _run_section(runs: list[RunComparison]) -> list[str]:
    first = runs[0]
    flags = ", ".join(f"{k}={v}" for k, v in first.flags.items())
    lines = [f"## {first.model}: {first.name}", "", f"{first.description or ''}".strip(), "",
             (f"{first.model} on {first.gpu}, {first.num_requests:,} requests, arrivals "
             f"{'as recorded' if first.honor_arrivals else 'all at t=0'}; {flags}. {_kv_line(first)}."), ""]
    head = "| metric | engine | " + " | ".join(f"sim `{r.profile}` | error" for r in runs) + " |"
    lines += [head, "|---|---:|" + "---:|---:|" * len(runs)]
    for label, key in TABLE_ROWS:
        ms = [r.metric(key) for r in runs]
        cells = " | ".join(f"{fmt_value(key, m.sim)} | {fmt_error(key, m)}" for m in ms)
        lines.append(f"| {label} | {fmt_value(key, ms[0].engine)} | {cells} |")
    lines += ["", ("GPU time per step by step kind (ms; the engine's CUDA events, the simulator's own steps, and "
                   "the cost model on the engine's steps, i.e. with the schedule held fixed), and the mean step "
                   "period (under async scheduling a long step's GPU time lands in the next step's period):"), "",
              "| step kind | engine steps | engine GPU (max) | engine period | " + " | ".join(
                  f"sim `{r.profile}` steps | GPU | error | period | model on engine steps | error" for r in runs)
              + " |", "|---|---:|---:|---:|" + "---:|---:|---:|---:|---:|---:|" * len(runs)]
    for i, k in enumerate(first.step_kinds):
        if not (k.engine_steps or any(r.step_kinds[i].sim_steps for r in runs)):
            continue
        cells = " | ".join(f"{s.sim_steps:,} | {_ms(s.sim_gpu_ms)} | {_signed(s.gpu_error)} | {_ms(s.sim_period_ms)} | "
                           f"{_ms(s.model_gpu_ms)} | {_signed(s.model_gpu_error)}"
                           for s in (r.step_kinds[i] for r in runs))
        lines.append(f"| {k.kind} | {k.engine_steps:,} | {_ms(k.engine_gpu_ms)} ({_ms(k.engine_max_gpu_ms)}) | "
                     f"{_ms(k.engine_period_ms)} | {cells} |")
    lines.append("")
    lines += [f"- `{r.profile}`: {_verdict_line(r)}" + "".join(f"; {f}" for f in _other_failures(r))
              + (f" ({r.latency_basis})" if r.latency_basis else "") for r in runs]
    return lines + [""]


# --------------------------------------------------------------------------- the profile's validation field
def profile_validation_summary(results: list[RunComparison], command: str) -> dict[str, Any]:
    """Per metric the median |error| over the runs, the worst p99 |error|, and which runs passed."""
    per_metric = {}
    for key in ERROR_METRICS:
        errs = [abs(r.metric(key).error) for r in results if r.metric(key).error is not None]
        per_metric[key] = float(np.median(errs)) if errs else None
    medians = [r.verdict.median_abs_error for r in results if r.verdict.median_abs_error is not None]
    p99s = [r.verdict.max_p99_abs_error for r in results if r.verdict.max_p99_abs_error is not None]
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "command": command,
            "runs": [r.name for r in results], "runs_passed": [r.name for r in results if r.verdict.passed],
            "median_abs_error": float(np.median(medians)) if medians else None,
            "worst_p99_abs_error": max(p99s, default=None), "median_abs_error_by_metric": per_metric}


def store_profile_validation(profile: str, results: list[RunComparison], command: str) -> Path:
    """Write the summary into the profile JSON's `validation` field; the result must still load."""
    path = profile_path(profile)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["validation"] = profile_validation_summary(results, command)
    with staged_file(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        CostProfile.load(tmp)
    return path


__all__ = ["command_line", "profile_validation_summary", "render_markdown", "store_profile_validation", "validate"]
