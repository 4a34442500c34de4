"""`costline workload ...`: describe, fit and export workloads (presets, spec files, real traces).

Bad input (a malformed trace, an invalid spec, an unknown preset) prints one clear message
naming the file, line, field and fix on stderr and exits with status 2, never a traceback.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from advisor.console import console as plain_console
from advisor.console import styled
from advisor.help import HELP
from advisor.options import Force, clean_errors, source_options
from engine.core.input_files import plain_message
from engine.core.outputs import check_output_file, is_stdout, staged_file
from sim.arrivals import scale_rate
from sim.builtin_traces import BUILTIN_TRACES
from sim.describe import describe_workload
from sim.fit import fit_spec
from sim.traces import export_mooncake
from sim.workload_presets import get_preset, preset_names
from sim.workload_source import SourceOptions, load_workload

app = typer.Typer(help="Describe, fit and export workloads and real traces.", no_args_is_help=True)

Source = Annotated[str, typer.Argument(
    help="preset name, spec file (.json) or trace file (Mooncake JSONL, Azure or BurstGPT CSV)")]


def _json_safe(x: Any) -> Any:
    """NaN (e.g. the CV of a one-request workload) as null, so the output stays valid JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def _fmt_int(x: float) -> str:
    return f"{math.floor(x + 0.5):,}"  # half up, as the README rounds


def _lengths_line(s: dict[str, float]) -> str:
    return (f"mean {s['mean']:,.1f}   p50 {_fmt_int(s['p50'])}   p90 {_fmt_int(s['p90'])}   "
            f"p99 {_fmt_int(s['p99'])}   (min {_fmt_int(s['min'])}, max {_fmt_int(s['max'])})")


def print_description(d: dict[str, Any], console: Console | None = None) -> None:
    """The human-readable describe report (the figures sim/traces_data/README.md quotes)."""
    console = console or plain_console()
    t = Table(show_header=False, box=None, pad_edge=False, title=styled((str(d["name"]), "bold")), title_justify="left")
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    t.add_row("requests", f"{d['requests']:,}")
    t.add_row("duration", f"{d['duration_s']:,.1f} s")
    t.add_row("mean rate", f"{d['mean_rate_rps']:.2f} req/s")
    t.add_row("burstiness", f"inter-arrival CV {d['interarrival_cv']:.2f}; index of dispersion "
              f"{d['index_of_dispersion_1s']:.1f} (1-s bins); {d['distinct_arrival_times']:,} distinct arrival times")
    t.add_row("prompt tokens", _lengths_line(d["prompt_tokens"]))
    t.add_row("output tokens", _lengths_line(d["output_tokens"]))
    r = d["prefix_reuse"]
    t.add_row("prefix reuse", f"{r['token_fraction']:.1%} of prompt tokens, {r['block_fraction']:.1%} of block "
              f"references ({d['hash_block_size']}-token hash blocks; upper bound: infinite cache)")
    t.add_row("task mix", ", ".join(f"{k} {v:.0%}" for k, v in sorted(d["task_mix"].items(), key=lambda kv: -kv[1])))
    if d["sessions"]:
        t.add_row("sessions", f"{d['sessions']:,} multi-turn sessions")
    for note in d["notes"]:
        t.add_row("note", note)
    console.print(t, highlight=False)


@app.command("describe", **HELP)
@clean_errors
@source_options(into="options")
def describe(
    source: Source, as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    options: SourceOptions | None = None,
) -> None:
    """Request count, duration, rate, burstiness, length percentiles, prefix reuse and task mix."""
    wl = load_workload(source, options)
    d = describe_workload(wl)
    if as_json:
        sys.stdout.write(json.dumps(_json_safe(d), indent=2) + "\n")
    else:
        print_description(d)


@app.command("fit", **HELP)
@clean_errors
@source_options(exclude=("num_requests", "speedup", "rate_rps"), into="options")
def fit(
    source: Source,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the spec here (default, or -: standard output)")] = None,
    lengths: Annotated[str, typer.Option("--lengths", help="empirical (trace quantiles) or lognormal")] = "empirical",
    rate_scale: Annotated[float, typer.Option("--rate-scale", help="multiply the fitted rate ('my traffic, doubled' = 2)")] = 1.0,
    force: Force = False,
    options: SourceOptions | None = None,
) -> None:
    """Write a WorkloadSpec that reproduces the source's rate, burstiness, lengths and reuse."""
    if lengths not in ("empirical", "lognormal"):
        raise typer.BadParameter("--lengths must be 'empirical' or 'lognormal'")
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise typer.BadParameter("--rate-scale must be a finite number > 0")
    opts = options or SourceOptions()
    if is_stdout(output):
        output = None
    if output is not None:
        check_output_file(output, flag="--output", force=force, inputs=[source])
    wl = load_workload(source, opts)
    spec = fit_spec(wl, lengths=lengths, seed=opts.seed or 0)  # type: ignore[arg-type]
    if rate_scale != 1.0:
        # same duration at the higher rate: scale the request count with the rate
        try:
            spec = spec.with_overrides(arrival=scale_rate(spec.arrival, rate_scale).model_dump(),
                                       num_requests=max(1, min(round(spec.num_requests * rate_scale), 2**62)),
                                       description=spec.description + f" Rate scaled x{rate_scale:g}.")
        except ValueError as exc:  # the scaled rate or request count leaves a spec's bounds
            first = exc.errors()[0] if hasattr(exc, "errors") else None
            why = f"{'.'.join(map(str, first['loc']))}: {plain_message(first)}" if first else str(exc)
            raise ValueError(f"--rate-scale {rate_scale:g}: the scaled spec is out of bounds ({why}); use a "
                             "smaller factor") from None
    text = spec.to_json() + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        with staged_file(output) as tmp:
            tmp.write_text(text)
        plain_console(stderr=True).print(f"wrote {output}: {spec.description}")


@app.command("export", **HELP)
@clean_errors
@source_options(into="options")
def export(
    source: Source,
    output: Annotated[Path, typer.Option("--output", "-o", help="Mooncake JSONL file to write (-: standard output)")],
    force: Force = False,
    options: SourceOptions | None = None,
) -> None:
    """Write any workload as Mooncake JSONL, replayable by `vllm bench serve --dataset-name timed_trace`."""
    if is_stdout(output):
        export_mooncake(load_workload(source, options), sys.stdout)
        return
    check_output_file(output, flag="--output", force=force, inputs=[source])
    wl = load_workload(source, options)
    with staged_file(output) as tmp:
        export_mooncake(wl, tmp)
    plain_console(stderr=True).print(
        f"wrote {len(wl):,} requests to {output}; replay with: vllm bench serve --dataset-name timed_trace "
        f"--dataset-path {output} --timed-trace-sec-multiplier 0.001 "
        f"--timed-trace-chunk-hash-size {wl.hash_block_size}", highlight=False, soft_wrap=True)


@app.command("presets", **HELP)
def presets() -> None:
    """List the built-in workloads (generated presets and shipped real traces), one line each."""
    t = Table(show_header=True, box=None)
    t.add_column("workload", style="bold cyan", no_wrap=True)
    t.add_column("what it models")
    for name in preset_names():
        t.add_row(name, get_preset(name).description)
    for trace in BUILTIN_TRACES.values():
        t.add_row(trace.name, f"{trace.description} ({trace.licence})")
    plain_console().print(t)
