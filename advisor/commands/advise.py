"""`costline advise`: which optimizations to turn on for this traffic, what each buys, where it
stops paying, and the `vllm serve` command.

    costline advise -w chat-production --model llama-3.1-8b --gpu h200 --num-gpus 1 \\
        --slo "ttft_p99:500 tpot_p99:50" --out runs/advice

The work is `advisor.advise.advise` (the dashboard calls the same function); this command parses
options, shows progress, prints the report and writes `--out`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from advisor.console import console as plain_console
from advisor.options import Force, ModelOpt, clean_errors, source_options
from sim.workload_source import SourceOptions

if TYPE_CHECKING:  # imported where used: `costline --help` stays quick
    from advisor.advise import AdviseRequest
    from advisor.advise.records import Recommendation


def _check_slo(text: str) -> None:
    """Refuse a malformed --slo naming the option as typed (SLO.parse names vLLM's --goodput)."""
    from advisor.advise.records import normalise_slo
    from engine.core.flags import FlagError
    from engine.core.run_summary import SLO

    try:
        SLO.parse(normalise_slo(text))
    except FlagError as exc:
        raise ValueError(f"--slo {text!r}: " + exc.render(lambda f: "--slo" if f == "slo" else f).split(": ", 1)[1]) from None


def _gpus(text: str | None) -> list[str]:
    """--compare-gpus h100,b200 as GPU presets; an unknown one refused naming the flag."""
    from sim.hardware import get_gpu

    names = []
    for part in (text or "").replace(" ", ",").split(","):
        if part:
            try:
                names.append(get_gpu(part).name)
            except ValueError as exc:
                raise ValueError(f"--compare-gpus {text!r}: {exc}") from None
    return names


@contextmanager
def progress_display() -> Iterator[Any]:
    """Where `advise` shows its progress: a rich bar per phase (done/total simulations, ETA) when
    stderr is a terminal, else a plain line per phase on stderr every few seconds (a pipe, a log)."""
    from advisor.advise.progress import PlainLines, ProgressEvent, duration_text

    err = plain_console(stderr=True)
    if not err.is_terminal:
        yield PlainLines(sys.stderr)
        return
    columns = (TextColumn("{task.description}", markup=False), BarColumn(),
               TextColumn("{task.completed:.0f}/{task.total:.0f} simulations", markup=False),
               TextColumn("{task.fields[eta]}", markup=False), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        rows: dict[str, TaskID] = {}

        def show(ev: ProgressEvent) -> None:
            eta = "" if ev.finished else ("ETA ..." if ev.eta_s is None else f"ETA {duration_text(ev.eta_s)}")
            if ev.phase not in rows:
                rows[ev.phase] = bar.add_task(ev.phase, total=ev.total, eta=eta)
            bar.update(rows[ev.phase], completed=ev.done, total=max(ev.total, 1), eta=eta,
                       description=f"{ev.phase} ({ev.detail})" if ev.detail and not ev.finished else ev.phase)

        yield show


# The command's options, one typed alias each (typer reads the Annotated metadata), so the
# command's signature reads as a list of names and defaults.
WorkloadOpt = Annotated[str, typer.Option("--workload", "-w", help="preset, spec file, trace file or built-in trace name")]
GpuOpt = Annotated[str, typer.Option("--gpu", help="GPU preset (h200, h100-sxm, a100-80gb, ...)")]
NumGpusOpt = Annotated[int, typer.Option("--num-gpus", help="GPUs to deploy on")]
SloOpt = Annotated[str, typer.Option("--slo", help="targets in ms: \"ttft_p99:500 tpot_p99:50\" (or vLLM's \"ttft:500 tpot:50\")")]
ObjectiveOpt = Annotated[str, typer.Option("--objective", help="goodput, min-gpus or cost (requests within the SLO per dollar)")]
BudgetOpt = Annotated[str, typer.Option("--budget", help="quick (slices up to 1,000 requests) or full (the whole trace)")]
SeedOpt = Annotated[int, typer.Option("--seed", help="seed of the simulations and of a generated workload")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", help="local processes (default: the CPU cores)")]
RayOpt = Annotated[str | None, typer.Option("--ray", help="run the simulations on Ray: auto or a cluster address")]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="cost profile (default: what the simulator picks)")]
MinGainOpt = Annotated[float, typer.Option("--min-gain", help="recommend a change only when the low end of its gain's 90% interval is above this many percent")]
AcceptanceOpt = Annotated[str | None, typer.Option("--acceptance", help="your vLLM's measured acceptance per draft token: \"eagle3:chat=0.71,code=0.8\" (METHOD: optional)")]
VllmMetricsOpt = Annotated[Path | None, typer.Option("--vllm-metrics", help="a /metrics scrape of your vLLM: its spec-decode acceptance (--acceptance wins where both say)")]
AllowOpt = Annotated[str | None, typer.Option("--allow", help="search only options that change these, comma-separated: "
                                              "prefix-caching, token-budget, max-num-seqs, block-size, ngram, eagle3, fp8-kv, "
                                              "fp8-weights, gpu-memory-utilization, tp, pd, or the groups spec, fp8, "
                                              "parallelism (default: all)")]
ForbidOpt = Annotated[str | None, typer.Option("--forbid", help="never recommend options that change these (same names "
                                               "as --allow), e.g. fp8-weights,spec")]
GpuHourUsdOpt = Annotated[str | None, typer.Option("--gpu-hour-usd", help="$ per GPU-hour: 3.5 for --gpu, or "
                                                   "h100-sxm=2.5,h200=3.6 (defaults with source and date: "
                                                   "advisor/advise/prices.py; none for l4, t4)")]
CompareGpusOpt = Annotated[str | None, typer.Option("--compare-gpus", help="also advise on these GPU types and show "
                                                    "them side by side with $ at the SLO, e.g. h100,b200")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="write recommendation.json, report.md + charts, serve.sh and alerts.yaml (Prometheus rules) here")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print recommendation.json instead of the report")]


@clean_errors
@source_options(exclude=("seed",))
def advise(
    workload: WorkloadOpt = "chat-production",
    model: ModelOpt = "llama-3.1-8b",
    gpu: GpuOpt = "h200",
    num_gpus: NumGpusOpt = 1,
    slo: SloOpt = "ttft_p99:500 tpot_p99:50",
    objective: ObjectiveOpt = "goodput",
    budget: BudgetOpt = "quick",
    seed: SeedOpt = 0,
    workers: WorkersOpt = None,
    ray: RayOpt = None,
    profile: ProfileOpt = None,
    min_gain: MinGainOpt = 2.0,
    acceptance: AcceptanceOpt = None,
    vllm_metrics: VllmMetricsOpt = None,
    allow: AllowOpt = None,
    forbid: ForbidOpt = None,
    gpu_hour_usd: GpuHourUsdOpt = None,
    compare_gpus: CompareGpusOpt = None,
    out: OutOpt = None,
    force: Force = False,
    as_json: JsonOpt = False,
    source: SourceOptions | None = None,
) -> None:
    """Recommend vLLM flags for your traffic, with the numbers behind each choice."""
    from advisor.advise import AdviseRequest
    from advisor.advise.report import print_report, write_outputs
    from engine.core.outputs import check_output_dir

    _check_slo(slo)
    others = _gpus(compare_gpus)
    request = AdviseRequest(model=model, gpu=gpu, num_gpus=num_gpus, slo=slo, objective=objective,  # type: ignore[arg-type]
                            budget=budget, seed=seed, ray=ray, profile=profile,  # type: ignore[arg-type]
                            min_gain_pct=min_gain,
                            acceptance=_acceptance(vllm_metrics, acceptance),  # type: ignore[arg-type]
                            allow=allow, forbid=forbid, gpu_hour_usd=gpu_hour_usd,  # type: ignore[arg-type]
                            **({"workers": workers} if workers else {}))
    inputs = [workload, profile, vllm_metrics]
    if out is not None:
        check_output_dir(out, flag="--out", force=force, inputs=inputs)  # refuse before minutes of work, not after
    console = plain_console(stderr=as_json)
    rec = _recommend(workload, request, others, source)
    if as_json:
        print(rec.model_dump_json(indent=2))
    else:
        print_report(rec, console)
    if out is not None:
        path = write_outputs(rec, out, force=force, inputs=inputs)
        console.print(f"wrote {path}/recommendation.json, report.md, serve.sh, alerts.yaml and charts")


def _acceptance(vllm_metrics: Path | None, acceptance: str | None) -> dict[str, Any] | str | None:
    """--acceptance as typed, or with --vllm-metrics the scrape's acceptance (--acceptance wins where both say)."""
    if vllm_metrics is None:
        return acceptance
    from advisor.advise.records import parse_acceptance
    from advisor.advise.vllm_metrics import acceptance_from_metrics

    measured = acceptance_from_metrics(vllm_metrics) | (parse_acceptance(acceptance) if acceptance else {})
    return measured or acceptance


def _recommend(workload: str, request: AdviseRequest, others: list[str],
               source: SourceOptions | None) -> Recommendation:
    """The recommendation (per GPU type with --compare-gpus), with the progress display."""
    from advisor.advise import advise as run_advise
    from advisor.advise import compare_gpus as run_compare

    with progress_display() as progress:
        if others:
            return run_compare(workload, request, others, progress=progress, source=source)
        return run_advise(workload, request, progress=progress, source=source)
