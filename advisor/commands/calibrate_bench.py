"""`costline calibrate --from-bench`: a profile fitted to a server's request-level measurements.

    costline calibrate --from-bench r.json --from-metrics before.prom after.prom \\
        --model llama-3.1-8b --gpu h100-sxm --serve-args "--max-num-seqs 256" -o myprofile.json

Reads the `vllm bench serve --save-result --save-detailed` results and the /metrics scrapes
(sim/bench_results.py), starts from the profile `simulate` would use for this model and GPU, fits
its multipliers by simulation (sim/request_fit.py), prints the fit and held-out errors per run and
writes the profile (provenance `measured (request-level fit)`, the source files, the errors).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from rich.table import Table

from advisor.console import console as plain_console
from engine.core.outputs import check_output_file, staged_file
from sim.bench_results import BenchRun, ScrapeDelta, read_bench, read_scrape_pair
from sim.config import EngineConfig
from sim.hardware import get_gpu
from sim.models import preset_of
from sim.profile_files import load_profile
from sim.request_fit import (
    BenchCase,
    CaseScore,
    RequestFit,
    fit_request_level,
    fitted_profile,
    make_case,
)
from sim.serve_line import parse_serve_args


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def split_files(bench: list[Path], metrics: list[Path], extra: list[Path]) -> tuple[list[Path], list[Path]]:
    """Files listed after the options: results (.json) join --from-bench, the others (scrapes)
    join --from-metrics after its own (so `--from-metrics before.prom after.prom` reads right)."""
    return ([*bench, *(p for p in extra if p.suffix == ".json")],
            [*metrics, *(p for p in extra if p.suffix != ".json")])


def scrapes_per_run(metrics: list[Path], n_runs: int) -> list[ScrapeDelta | None]:
    """Two scrapes per run (before, after), or one per run; none at all is fine."""
    if not metrics:
        return [None] * n_runs
    if len(metrics) == 2 * n_runs:
        return [read_scrape_pair(metrics[2 * i:2 * i + 2]) for i in range(n_runs)]
    if len(metrics) == n_runs:
        return [read_scrape_pair([m]) for m in metrics]
    raise ValueError(f"--from-metrics: {len(metrics)} scrape(s) for {n_runs} benchmark run(s); give two per run "
                     "(before and after, in run order) or one per run of a server started for it")


def engine_for(serve_args: str, deltas: list[ScrapeDelta | None]) -> EngineConfig:
    """The server's flags; its KV block count from vllm:cache_config_info when the scrapes have it
    and --serve-args does not set --num-gpu-blocks-override."""
    engine = parse_serve_args(serve_args) if serve_args.strip() else EngineConfig()
    blocks = next((d.num_gpu_blocks for d in deltas if d is not None and d.num_gpu_blocks), None)
    if engine.num_gpu_blocks_override is None and blocks:
        engine = engine.model_copy(update={"num_gpu_blocks_override": blocks})
    return engine


def held_out_runs(cases: list[BenchCase], every: int) -> tuple[list[BenchCase], list[BenchCase]]:
    """(fit, held out): every `every`-th run held out (two runs: the second); one run: none
    (its requests are split instead)."""
    if len(cases) < 2:
        return cases, []
    held = set(range(every - 1, len(cases), every)) or {len(cases) - 1}
    return [c for i, c in enumerate(cases) if i not in held], [c for i, c in enumerate(cases) if i in held]


def print_request_fit(fit: RequestFit, cases: list[BenchCase]) -> None:
    console = plain_console()
    t = Table(title=f"request-level fit from {fit.base}: {fit.evaluations} simulations, {fit.seconds:.0f} s")
    for c in ("run", "role", "median |error|", "TTFT p50 meas / sim", "TPOT p50 meas / sim", "e2e p90 meas / sim"):
        t.add_column(c, justify="left" if c in ("run", "role") else "right")
    for s in [*fit.fit, *fit.held_out]:
        t.add_row(s.name, s.role, _pct(s.median_abs_error), *(_pair(s, k) for k in
                                                               ("median_ttft_ms", "median_tpot_ms", "p90_e2el_ms")))
    console.print(t)
    mult = ", ".join(f"{k} {v:.3f}" for k, v in fit.multipliers.as_dict().items())
    console.print(f"multipliers: {mult}", highlight=False)
    console.print(f"fit error (median |error|): {_pct(fit.fit_error)}; held out: {_pct(fit.held_out_error)}",
                  highlight=False)
    for c in cases:
        for note in [f"arrivals: {c.arrivals}", *c.notes]:
            console.print(f"{c.name}: {note}", highlight=False)


def _pair(s: CaseScore, key: str) -> str:
    m = next((m for m in s.metrics if m.metric == key), None)
    if m is None or m.engine is None or m.sim is None:
        return "-"
    return f"{m.engine:,.1f} / {m.sim:,.1f}"


def check_model_id(run: BenchRun, model: str) -> None:
    """A result whose `model_id` is a known model other than --model is refused (a profile is for the
    model that served); an id costline does not know (a local path, a served name) is taken as given."""
    if not run.model_id:
        return
    try:
        served = preset_of(run.model_id)
    except ValueError:
        return
    if served != model:
        raise ValueError(f"{run.path}: key 'model_id' is {run.model_id!r} ({served}), not --model {model}; give "
                         f"--model {served}, or leave this result out")


def calibrate_from_bench(bench: list[Path], metrics: list[Path], extra: list[Path], *, model: str, gpu: str,
                         out: Path | None, serve_args: str, profile: str, hold_out_every: int, max_seconds: float,
                         force: bool) -> None:
    bench, metrics = split_files(bench, metrics, extra)
    model, gpu = preset_of(model), get_gpu(gpu).name
    if out is not None:  # before the work: a refused --out must not cost a fit
        check_output_file(out, flag="--out", force=force, inputs=[*bench, *metrics])
    runs: list[BenchRun] = [r for p in bench for r in read_bench(p)]
    for r in runs:
        check_model_id(r, model)
    deltas = scrapes_per_run(metrics, len(runs))
    engine = engine_for(serve_args, deltas)
    cases = [make_case(r, engine, d) for r, d in zip(runs, deltas, strict=True)]
    base = load_profile(profile, model, gpu)
    fit_cases, held = held_out_runs(cases, hold_out_every)
    fit = fit_request_level(fit_cases, base, model, gpu, held_out=held, max_seconds=max_seconds)
    print_request_fit(fit, cases)
    console = plain_console()
    if out is None:
        console.print("not written: pass --out PROFILE.json to keep it", highlight=False)
        return
    prof = fitted_profile(fit, name=out.stem, model=model, gpu=gpu, sources=[str(p) for p in bench],
                          metrics_files=[str(p) for p in metrics], arrivals={c.name: c.arrivals for c in cases},
                          date=datetime.now(UTC).isoformat(timespec="seconds"))
    with staged_file(out) as tmp:
        tmp.write_text(prof.to_json())
    console.print(f"wrote {out} (use it: costline advise --profile {out} ...)", highlight=False)


__all__ = ["calibrate_from_bench", "check_model_id", "engine_for", "held_out_runs", "scrapes_per_run", "split_files"]
