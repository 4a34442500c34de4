"""`costline simulate`: run a workload through a simulated vLLM deployment.

    costline simulate --workload chat-production --model llama-3.1-8b --gpu h200 --num-gpus 2 \\
        --max-num-batched-tokens 8192 --disable-prefix-caching --goodput "ttft:500 tpot:50" --out runs/a
    costline simulate --compare runs/a runs/b

Engine flags carry vLLM's names and spellings (`--disable-prefix-caching`,
`--speculative-config '{...}'`, sizes like `8k`), so a run's configuration pastes into
`vllm serve`; they are built from `engine.core.flags`, and the command only turns options into a
`sim.run.SimConfig` and calls `sim.run.run`. Files under `--out`: requests and steps tables (Parquet when pyarrow is
installed, else CSV), `summary.json` (`vllm bench serve` keys) and `metrics.prom`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from advisor.console import console as plain_console
from advisor.console import styled
from advisor.options import Force, ModelOpt, clean_errors, flag_options, source_options
from advisor.report import warn_unserved
from engine.core.flags import FlagError
from engine.core.input_files import expect
from engine.core.outputs import check_output_dir
from engine.core.summary_record import RunSummary
from sim.config import ENGINE_CONFIG_FLAGS, DisaggConfig, EngineConfig
from sim.memory import plan_memory
from sim.metrics import SimResult, jsonable  # jsonable: the summary as strict JSON (NaN -> null)
from sim.run import (
    MAX_KV_BLOCK_COARSENING,
    LoadedWorkload,
    SimConfig,
    check_simulation_size,
    kv_block_coarsening_for,
    load,
    run,
)
from sim.workload_source import SourceOptions, all_at_time_zero, cap_prompt_lengths


def parse_disagg(text: str | None, *, link: str, link_gb_per_s: float | None,
                 link_latency_ms: float | None) -> DisaggConfig | None:
    """`--disagg 3:1` (prefill:decode replica counts) and its link options as a DisaggConfig.

    The link options only mean something with `--disagg`: given without it they are refused
    rather than silently ignored."""
    _check_link(link, link_gb_per_s, link_latency_ms)
    if not text:
        given = [f for f, v, d in (("--kv-link", link, "network"), ("--kv-link-gb-per-s", link_gb_per_s, None),
                                   ("--link-latency-ms", link_latency_ms, None)) if v != d]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise ValueError(f"{', '.join(given)} only {verb} to disaggregated prefill; add --disagg P:D "
                             f"(e.g. --disagg 3:1) or drop {', '.join(given)}")
        return None
    m = re.fullmatch(r"\s*(\d+)\s*[:Pp]\s*(\d+)\s*[Dd]?\s*", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise FlagError("disaggregation", repr(text), "give prefill:decode replica counts, e.g. {disaggregation} 3:1")
    return DisaggConfig(num_prefill_replicas=int(m.group(1)), num_decode_replicas=int(m.group(2)), link=link,
                        link_gb_per_s=link_gb_per_s,
                        link_latency_s=None if link_latency_ms is None else link_latency_ms / 1e3)


def _check_link(link: str, link_gb_per_s: float | None, link_latency_ms: float | None) -> None:
    """The KV link options as typed (the config holds seconds, the user typed milliseconds)."""
    if link not in ("network", "nvlink"):
        raise ValueError(f"--kv-link {link!r}: must be network or nvlink")
    if link_gb_per_s is not None and not (math.isfinite(link_gb_per_s) and link_gb_per_s > 0):
        raise ValueError(f"--kv-link-gb-per-s {link_gb_per_s:g}: must be a bandwidth > 0 in GB/s "
                         "(a 400 Gbit/s NIC is 50)")
    if link_latency_ms is not None and not (math.isfinite(link_latency_ms) and link_latency_ms >= 0):
        raise ValueError(f"--link-latency-ms {link_latency_ms:g}: must be a time >= 0 in ms (e.g. 0.5)")


def parse_coarsening(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.isdigit() or not 1 <= int(text) <= MAX_KV_BLOCK_COARSENING:
        raise FlagError("kv_block_coarsening", repr(text), f"use an integer from 1 to {MAX_KV_BLOCK_COARSENING} "
                        "or 'auto' (coarser blocks model another engine)")
    return int(text)


def coarsening_warning(config: SimConfig, requests: list) -> str | None:
    """A fixed --sim-block-coarsening coarser than the workload's hash blocks changes the answer
    (prefix hits end on coarse boundaries, a request's last block wastes more of the pool): say so."""
    want = config.kv_block_coarsening
    if want == "auto" or want == 1:
        return None
    auto = kv_block_coarsening_for("auto", config.engine.block_size, requests)
    if want <= auto:
        return None
    return (f"warning: --sim-block-coarsening {want} is coarser than this workload's "
            f"{min(r.hash_block_size for r in requests)}-token hash blocks: prefix hits and KV fragmentation "
            f"are approximated, latencies may differ from the engine's; auto would use {auto}")


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x:,.1f}"


def print_summary(s: RunSummary, console: Console) -> None:
    t = Table(title=styled((str(s.label or "simulation"), "bold"), f": {s.deployment}"), title_justify="left")
    t.add_column("metric", style="bold cyan")
    for c in ("mean", "p50", "p90", "p99"):
        t.add_column(c, justify="right")
    for stats, name in ((s.ttft, "TTFT (ms)"), (s.tpot, "TPOT (ms)"), (s.itl, "ITL (ms)"), (s.e2el, "E2E (ms)"),
                        (s.queue_time, "queue (ms)")):
        t.add_row(name, _ms(stats.mean_ms), _ms(stats.median_ms), _ms(stats.p90_ms), _ms(stats.p99_ms))
    console.print(t)
    g = Table(show_header=False, box=None)
    g.add_column(style="bold cyan")
    g.add_column()
    for name, line in _summary_lines(s):
        g.add_row(name, line)
    console.print(g)


def _summary_lines(s: RunSummary) -> list[tuple[str, str]]:
    """The summary's figures beyond the latency table, one (name, text) per line."""
    lines = [("requests", (f"{s.completed:,} completed, {s.rejected:,} rejected, {s.unfinished:,} "
                          f"unfinished over {s.duration_s:,.1f} s")),
             ("throughput", (f"{s.request_throughput:.2f} req/s, {s.output_throughput:,.0f} output tok/s "
                            f"({s.output_throughput_per_gpu:,.0f} per GPU), {s.total_token_throughput:,.0f} total tok/s"))]
    if s.request_goodput is not None:
        slo = " ".join(f"{k}:{v:g}" for k, v in (s.slo.as_dict() if s.slo else {}).items())
        lines.append(("goodput", (f"{s.request_goodput:.2f} req/s ({s.request_goodput_per_gpu:.2f} per GPU) "
                                 f"under {slo} ms")))
    lines.append(("prefix cache", (f"hit rate {s.prefix_cache_hit_rate:.1%} ({s.prefix_cache_hits_tokens:,} "
                                  f"of {s.prefix_cache_queries_tokens:,} tokens)")))
    lines.append(("engine", (f"GPU busy {s.gpu_busy_share:.0%}, CPU {s.cpu_share_of_step_time:.1%} of step "
                            f"time, {s.num_preemptions:,} preemptions, KV usage max {s.kv_cache_usage_max:.0%} "
                            f"of {s.num_gpu_blocks:,} blocks")))
    if s.spec_decode_num_drafts:
        lines.append(("spec decode", (f"acceptance rate {s.spec_decode_acceptance_rate:.1%}, "
                                     f"mean acceptance length {s.spec_decode_acceptance_length:.2f}")))
    if s.mean_kv_transfer_ms is not None:
        lines.append(("KV transfer", f"mean {s.mean_kv_transfer_ms:.2f} ms per request (queueing included)"))
    if s.serve_command:
        lines.append(("run", s.serve_command))
    if s.profile:
        lines.append(("cost profile", f"{s.profile} ({s.profile_status})" + validation_note(s.profile_validation)))
    coarse = s.kv_block_coarsening or 1
    lines.append(("simulated", f"{s.num_engine_steps:,} engine steps in {s.wall_s:.2f} s wall "
                               f"({s.simulated_requests_per_wall_s:,.0f} requests/s)"
                               + (f"; KV blocks coarsened x{coarse}" if coarse > 1 else "")))
    return lines


def validation_note(v: dict[str, Any] | None) -> str:
    """How the profile did against the real engine (`costline validate --write-profile-validation`)."""
    if not v or v.get("median_abs_error") is None:
        return ""
    runs, passed = v.get("runs") or [], v.get("runs_passed") or []
    worst = v.get("worst_p99_abs_error")
    return (f": median |error| {v['median_abs_error']:.1%} over {len(runs)} held-out engine runs"
            + (f", worst p99 {worst:.1%}" if worst is not None else "")
            + f"; {len(passed)} of {len(runs)} within issue 10's targets (docs/validation.md)")


COMPARE_KEYS = ("completed", "failed", "duration", "request_throughput", "request_goodput",
                "request_goodput_per_gpu", "output_throughput", "output_throughput_per_gpu", "mean_ttft_ms",
                "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms", "num_preemptions",
                "prefix_cache_hit_rate", "gpu_busy_share", "cpu_share_of_step_time", "spec_decode_acceptance_length",
                "mean_kv_transfer_ms", "num_gpus")


def compare_runs(a_dir: str, b_dir: str, console: Console) -> None:
    from sim.metrics import load_summary

    a, b = load_summary(a_dir), load_summary(b_dir)
    for folder, s in ((a_dir, a), (b_dir, b)):  # a number or null where a figure belongs, else named
        for k in COMPARE_KEYS:
            if s.get(k) is not None:
                expect(Path(folder) / "summary.json", [k], s[k], (int, float), "a number or null")
    from sim.flag_diff import headings

    # the headings name what sets the runs apart: the flags that differ, as vllm serve spells them
    a_flags, b_flags = headings(a.get("vllm_args"), b.get("vllm_args"))
    t = Table(title=styled(("compare", "bold"), f" A: {a_flags} | B: {b_flags}"), title_justify="left")
    t.add_column("metric", style="bold cyan")
    t.add_column(f"A: {a_dir}", justify="right")
    t.add_column(f"B: {b_dir}", justify="right")
    t.add_column("B / A", justify="right")
    t.add_row("deployment", str(a.get("deployment")), str(b.get("deployment")), "")
    for k in COMPARE_KEYS:
        x, y = a.get(k), b.get(k)
        if x is None and y is None:
            continue
        ratio = f"{y / x:.2f}x" if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x else "-"
        fmt = (lambda v: "-" if v is None else (f"{v:,.3f}" if isinstance(v, float) else f"{v:,}"))
        t.add_row(k, fmt(x), fmt(y), ratio)
    console.print(t)


# The command's options, one typed alias each (typer reads the Annotated metadata), so the
# command's signature reads as a list of names and defaults.
WorkloadOpt = Annotated[str | None, typer.Option("--workload", "-w", help="preset name, spec file (.json) or trace file")]
GpuOpt = Annotated[str, typer.Option("--gpu", help="GPU preset (h200, h100-sxm, a100-80gb, l4, b200, ...)")]
NumGpusOpt = Annotated[int | None, typer.Option("--num-gpus", help="GPUs in total: replicas = num_gpus / tensor_parallel_size")]
SeedOpt = Annotated[int, typer.Option("--seed", help="seed of the simulation (acceptance draws) and of a generated workload")]
RouterOpt = Annotated[str, typer.Option("--router", help="round_robin, least_loaded or prefix_aware")]
DisaggOpt = Annotated[str | None, typer.Option("--disagg", help="disaggregated prefill: P:D replica counts, e.g. 3:1")]
KvLinkOpt = Annotated[str, typer.Option("--kv-link", help="P/D KV link: network (NIC) or nvlink")]
KvLinkGbPerSOpt = Annotated[float | None, typer.Option("--kv-link-gb-per-s", help="P/D link bandwidth per GPU in GB/s (bytes, not bits; a 400 Gbit/s NIC is 50); default: measured for the GPU and link where known (H200 NVLink: 375), else the GPU's datasheet")]
LinkLatencyMsOpt = Annotated[float | None, typer.Option("--link-latency-ms", help="fixed cost per KV transfer; default: measured for the GPU and link where known (H200 NVLink: 0.13 ms), else 0.5")]
GoodputOpt = Annotated[str | None, typer.Option("--goodput", help="SLOs in ms, e.g. \"ttft:500 tpot:50 e2el:10000\"")]
ProfileOpt = Annotated[str, typer.Option("--profile", help="cost profile name (sim/profiles) or JSON path; auto: the one fitted or scaled for this model and GPU, else default (first principles)")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="write tables, summary.json and metrics.prom here (a run already there needs --force)")]
LabelOpt = Annotated[str | None, typer.Option("--label", help="name of this run in the summary, the saved run and "
                                              "--compare (default: its flags)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the summary JSON")]
CoarseningOpt = Annotated[str, typer.Option("--sim-block-coarsening", help="speed option: engine KV blocks per simulated block, an integer or 'auto' (as coarse as the workload's hash blocks; e.g. 32 on Mooncake)")]
NoSkipAheadOpt = Annotated[bool, typer.Option("--no-skip-ahead", help="step every decode step (slow; for checks)")]
CompareOpt = Annotated[tuple[str, str] | None, typer.Option("--compare", help="two saved run directories: A B")]
MaxPromptLenOpt = Annotated[int | None, typer.Option(
    "--max-prompt-len", min=1, help="truncate longer prompts (and their hash ids) to this many tokens "
    "(as `engine run`)")]
NoArrivalsOpt = Annotated[bool, typer.Option("--no-arrivals", help="submit everything at t=0 (offline, as "
                                             "`engine run --no-arrivals`)")]


@clean_errors
@flag_options(ENGINE_CONFIG_FLAGS, into="engine_flags")
@source_options(exclude=("seed",))
def simulate(
    workload: WorkloadOpt = None,
    model: ModelOpt = "llama-3.1-8b",
    gpu: GpuOpt = "h200",
    num_gpus: NumGpusOpt = None,
    seed: SeedOpt = 0,
    router: RouterOpt = "least_loaded",
    disagg: DisaggOpt = None,
    kv_link: KvLinkOpt = "network",
    kv_link_gb_per_s: KvLinkGbPerSOpt = None,
    link_latency_ms: LinkLatencyMsOpt = None,
    goodput: GoodputOpt = None,
    profile: ProfileOpt = "auto",
    out: OutOpt = None,
    label: LabelOpt = None,
    as_json: JsonOpt = False,
    sim_block_coarsening: CoarseningOpt = "1",
    no_skip_ahead: NoSkipAheadOpt = False,
    compare: CompareOpt = None,
    max_prompt_len: MaxPromptLenOpt = None,
    no_arrivals: NoArrivalsOpt = False,
    force: Force = False,
    engine_flags: dict[str, Any] | None = None,
    source: SourceOptions | None = None,
) -> None:
    """Simulate a workload on `vllm serve` replicas (server defaults); print a summary, optionally save the run."""
    console = plain_console()
    if compare:
        compare_runs(compare[0], compare[1], console)
        return
    if workload is None:
        raise ValueError("--workload is required (a preset such as chat-production, a spec .json or a trace file); "
                         "or use --compare A B")
    config = SimConfig(
        model=model, gpu=gpu, num_gpus=num_gpus, engine=EngineConfig(**(engine_flags or {})), router=router,
        disaggregation=parse_disagg(disagg, link=kv_link, link_gb_per_s=kv_link_gb_per_s,
                                    link_latency_ms=link_latency_ms),
        seed=seed, profile=profile, slo=goodput, skip_ahead=not no_skip_ahead,
        kv_block_coarsening=parse_coarsening(sim_block_coarsening), label=label)
    _check_deployment(config)  # configuration errors before the workload is built
    if out is not None:  # before any work: a refused --out must not cost a simulation
        check_output_dir(out, flag="--out", force=force, inputs=[workload, profile])
    loaded = reshape(load(workload, source, seed=seed), max_prompt_len=max_prompt_len, no_arrivals=no_arrivals)
    warning = coarsening_warning(config, loaded.requests)
    if warning:
        plain_console(stderr=True).print(warning, soft_wrap=True)
    result = _run_with_progress(loaded, config, show=not as_json)
    summary = result.summary()
    warn_unserved(summary)
    if out is not None:
        paths = result.save(out, force=force)
        if not as_json:
            console.print(f"wrote {', '.join(str(p) for p in paths.values())}", highlight=False)
    if as_json:
        sys.stdout.write(json.dumps(jsonable(summary.to_json_dict()), indent=2) + "\n")
        return
    print_summary(summary, console)
    _hint_coarsening(result, config, loaded, console)


def _check_deployment(config: SimConfig) -> None:
    """The deployment's and the memory plan's errors, before the workload is loaded."""
    deployment = config.deployment()
    if config.kv_block_coarsening != "auto":  # "auto" depends on the workload: `run` checks it then
        check_simulation_size(deployment, config.kv_block_coarsening)
    else:
        plan_memory(deployment.model, deployment.gpu, deployment.engine.resolved_for(deployment.gpu, deployment.model))


def _hint_coarsening(result: SimResult, config: SimConfig, loaded: LoadedWorkload, console: Console) -> None:
    """A slow exact run of a workload known per coarse hash block: say the speed option exists."""
    block_size = config.engine.block_size
    if (result.meta.get("kv_block_coarsening") == 1 and result.wall_s > 5
            and kv_block_coarsening_for("auto", block_size, loaded.requests) > 1):
        console.print(f"hint: this workload's prefixes are known per {loaded.requests[0].hash_block_size}-token "
                      "block; --sim-block-coarsening auto simulates it several times faster "
                      "(benchmarks/sim/results.md)", style="dim", highlight=False)


def reshape(loaded: LoadedWorkload, *, max_prompt_len: int | None, no_arrivals: bool) -> LoadedWorkload:
    """The workload options `simulate` shares with `engine run`, applied by the same functions."""
    if max_prompt_len is None and not no_arrivals:
        return loaded
    requests, notes = cap_prompt_lengths(loaded.requests, max_prompt_len), list(loaded.notes)
    if max_prompt_len is not None:
        notes.append(f"prompts capped at {max_prompt_len} tokens")
    if no_arrivals:
        requests = all_at_time_zero(requests)
        notes.append("every request submitted at t=0")
    return LoadedWorkload(requests, loaded.name, notes)


def _run_with_progress(loaded: LoadedWorkload, config: SimConfig, *, show: bool):
    """`run`, with a progress bar on a terminal when the workload is large."""
    if not (show and len(loaded.requests) >= 5000 and sys.stderr.isatty()):
        return run(loaded, config)
    from rich.progress import Progress

    with Progress(console=plain_console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"simulating {len(loaded.requests):,} requests", total=1.0)
        return run(loaded, config, progress=lambda f: bar.update(task, completed=f))


__all__ = ["compare_runs", "parse_coarsening", "parse_disagg", "reshape", "simulate", "validation_note"]
