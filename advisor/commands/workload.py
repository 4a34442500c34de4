"""`costline workload ...`: describe, fit and export workloads (presets, spec files, real traces).

Bad input (a malformed trace, an invalid spec, an unknown preset) prints one clear message
naming the file, line, field and fix on stderr and exits with status 2, never a traceback.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from sim.arrivals import scale_rate
from sim.describe import describe_workload
from sim.fit import fit_spec
from sim.traces import TraceFormatError, export_mooncake
from sim.workload_presets import get_preset, preset_names
from sim.workload_source import SourceOptions, SpecFileError, load_workload

app = typer.Typer(help="Describe, fit and export workloads and real traces.", no_args_is_help=True)

F = TypeVar("F", bound=Callable[..., Any])


def _clean_errors(fn: F) -> F:
    """Turn input errors into one message on stderr and exit status 2."""

    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (TraceFormatError, SpecFileError, ValueError, KeyError, OSError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            Console(stderr=True).print(f"[bold red]error:[/] {msg}", highlight=False, markup=True, soft_wrap=True)
            raise typer.Exit(code=2) from None

    return run  # type: ignore[return-value]


# Options shared by every command that reads a source. Annotated defaults keep the functions
# callable from Python with plain values (`costline demo` calls `describe` directly).
Source = Annotated[str, typer.Argument(
    help="preset name, spec file (.json) or trace file (Mooncake JSONL, Azure or BurstGPT CSV)")]
Fmt = Annotated[str, typer.Option("--format", help="trace format: auto, mooncake, azure, burstgpt")]
Lenient = Annotated[bool, typer.Option("--lenient", help="skip bad trace rows (reported with counts and reasons)")]
BlockSize = Annotated[int | None, typer.Option(
    "--hash-block-size", help="tokens per hash id of a trace (Mooncake: 512, inferred)")]
KeepFailed = Annotated[bool, typer.Option(
    "--keep-failed", help="BurstGPT: keep failed rows (Response tokens = 0) as 1-token outputs")]
Spread = Annotated[bool, typer.Option(
    "--spread", help="spread tied timestamps (Mooncake's 3-s steps) uniformly within each step, seeded")]
Seed = Annotated[int | None, typer.Option("--seed", help="seed for a spec/preset (overrides its own) and for --spread")]
NumReq = Annotated[int | None, typer.Option("--num-requests", "-n", help="requests to generate from a spec/preset")]
StartS = Annotated[float | None, typer.Option("--start-s", help="keep arrivals at or after this time (s)")]
EndS = Annotated[float | None, typer.Option("--end-s", help="keep arrivals before this time (s)")]
First = Annotated[int | None, typer.Option("--first", help="keep only the first N requests (after the window)")]
Speedup = Annotated[float | None, typer.Option(
    "--speedup", help="divide arrival times by this factor (2 = twice the rate)")]
Rate = Annotated[float | None, typer.Option("--rate", help="rescale time to this mean rate (req/s)")]


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
    """The human-readable describe report (the figures of ../shared/traces/README.md)."""
    console = console or Console()
    t = Table(show_header=False, box=None, pad_edge=False, title=f"[bold]{d['name']}[/]", title_justify="left")
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


@app.command("describe")
@_clean_errors
def describe(
    source: Source, as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    trace_format: Fmt = "auto", lenient: Lenient = False, hash_block_size: BlockSize = None,
    keep_failed: KeepFailed = False, spread: Spread = False, seed: Seed = None, num_requests: NumReq = None,
    start_s: StartS = None, end_s: EndS = None, first: First = None, speedup: Speedup = None, rate: Rate = None,
) -> None:
    """Request count, duration, rate, burstiness, length percentiles, prefix reuse and task mix."""
    wl = load_workload(source, SourceOptions(
        trace_format=trace_format, lenient=lenient, hash_block_size=hash_block_size, keep_failed=keep_failed,
        spread=spread, seed=seed, num_requests=num_requests, start_s=start_s, end_s=end_s, first=first,
        speedup=speedup, rate_rps=rate))
    d = describe_workload(wl)
    if as_json:
        sys.stdout.write(json.dumps(_json_safe(d), indent=2) + "\n")
    else:
        print_description(d)


@app.command("fit")
@_clean_errors
def fit(
    source: Source,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the spec here (default: stdout)")] = None,
    lengths: Annotated[str, typer.Option("--lengths", help="empirical (trace quantiles) or lognormal")] = "empirical",
    rate_scale: Annotated[float, typer.Option("--rate-scale", help="multiply the fitted rate ('my traffic, doubled' = 2)")] = 1.0,
    trace_format: Fmt = "auto", lenient: Lenient = False, hash_block_size: BlockSize = None,
    keep_failed: KeepFailed = False, spread: Spread = False, seed: Seed = None,
    start_s: StartS = None, end_s: EndS = None, first: First = None,
) -> None:
    """Write a WorkloadSpec that reproduces the source's rate, burstiness, lengths and reuse."""
    if lengths not in ("empirical", "lognormal"):
        raise typer.BadParameter("--lengths must be 'empirical' or 'lognormal'")
    if not rate_scale > 0:
        raise typer.BadParameter("--rate-scale must be > 0")
    wl = load_workload(source, SourceOptions(
        trace_format=trace_format, lenient=lenient, hash_block_size=hash_block_size, keep_failed=keep_failed,
        spread=spread, seed=seed, start_s=start_s, end_s=end_s, first=first))
    spec = fit_spec(wl, lengths=lengths, seed=seed or 0)  # type: ignore[arg-type]
    if rate_scale != 1.0:
        # same duration at the higher rate: scale the request count with the rate
        spec = spec.with_overrides(arrival=scale_rate(spec.arrival, rate_scale).model_dump(),
                                   num_requests=max(1, round(spec.num_requests * rate_scale)),
                                   description=spec.description + f" Rate scaled x{rate_scale:g}.")
    text = spec.to_json() + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        Console(stderr=True).print(f"wrote {output}: {spec.description}", highlight=False)


@app.command("export")
@_clean_errors
def export(
    source: Source,
    output: Annotated[Path, typer.Option("--output", "-o", help="Mooncake JSONL file to write")],
    trace_format: Fmt = "auto", lenient: Lenient = False, hash_block_size: BlockSize = None,
    keep_failed: KeepFailed = False, spread: Spread = False, seed: Seed = None, num_requests: NumReq = None,
    start_s: StartS = None, end_s: EndS = None, first: First = None, speedup: Speedup = None, rate: Rate = None,
) -> None:
    """Write any workload as Mooncake JSONL, replayable by `vllm bench serve --dataset-name timed_trace`."""
    wl = load_workload(source, SourceOptions(
        trace_format=trace_format, lenient=lenient, hash_block_size=hash_block_size, keep_failed=keep_failed,
        spread=spread, seed=seed, num_requests=num_requests, start_s=start_s, end_s=end_s, first=first,
        speedup=speedup, rate_rps=rate))
    export_mooncake(wl, output)
    Console(stderr=True).print(
        f"wrote {len(wl):,} requests to {output}; replay with: vllm bench serve --dataset-name timed_trace "
        f"--dataset-path {output} --timed-trace-sec-multiplier 0.001 "
        f"--timed-trace-chunk-hash-size {wl.hash_block_size}", highlight=False, soft_wrap=True)


@app.command("presets")
def presets() -> None:
    """List the built-in workload presets, one line each."""
    t = Table(show_header=True, box=None)
    t.add_column("preset", style="bold cyan", no_wrap=True)
    t.add_column("what it models")
    for name in preset_names():
        t.add_row(name, get_preset(name).description)
    Console().print(t, highlight=False)
