"""`costline calibrate`: fit the simulator's cost profile to engine step traces (sim/calibrate.py),
or, with `--from-bench`, to request-level measurements of a server (`vllm bench serve` results and
/metrics scrapes, sim/request_fit.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from advisor.console import console as plain_console
from advisor.options import Force, clean_errors
from engine.core.model_spec import get_model
from engine.core.outputs import check_output_file, staged_file
from sim.config import EngineConfig
from sim.engine_runs import check_run_for_fit
from sim.hardware import GPU_PRESETS, get_gpu

if TYPE_CHECKING:
    from sim.calibrate import FitResult


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def print_fit(fit: FitResult, console: Console) -> None:
    """The held-out error per step kind, the fitted terms and the KV block check."""
    t = Table(title=f"{fit.profile.name}: held-out |relative error| ({fit.n_steps} steps, "
              f"{fit.n_warmup_dropped} warm-up steps dropped)")
    for c in ("step kind", "fitted", "held out", "outliers", "GPU p50", "GPU p90", "step p50", "step p90"):
        t.add_column(c, justify="left" if c == "step kind" else "right")
    for kind, e in fit.errors.items():
        t.add_row(kind, str(e.n_fit), str(e.n_held_out), str(e.n_outliers), _pct(e.gpu_median), _pct(e.gpu_p90),
                  _pct(e.step_median), _pct(e.step_p90))
    console.print(t)
    p = fit.profile
    for kind in ("decode", "mixed", "mixed_graph"):
        if getattr(p, kind) is not None:  # mixed_graph: from runs with cudagraph_mode FULL only
            console.print(f"{kind}: {getattr(p, kind).model_dump()}", highlight=False)
    console.print(f"cpu: {p.cpu.model_dump()} (held-out p50 {_pct(fit.cpu_error_median)})", highlight=False)
    if p.cpu_sync is not None:  # host terms of synchronous runs, fitted apart
        console.print(f"cpu (sync scheduling): {p.cpu_sync.model_dump()}", highlight=False)
    console.print(f"overlap: {p.overlap.model_dump()}", highlight=False)
    for m in fit.memory_checks:
        console.print(f"KV blocks {m.run}: engine {m.engine_blocks:,}, simulator {m.sim_blocks:,}", highlight=False)


def _with_tp_terms(profile, tp_runs: list[Path], collectives: Path, model, gpu, default: EngineConfig,
                   console: Console):
    """The fitted profile with TP terms fitted from the TP runs and the sweep (sim/tp_fit.py)."""
    from sim.tp_fit import fit_tp_terms, load_tp_run, read_sweep

    for r in tp_runs:
        check_run_for_fit(r, model.name, gpu.name)
    sweep, _ = read_sweep(collectives)
    terms = fit_tp_terms(sweep, [load_tp_run(r, default) for r in tp_runs], model, gpu, profile,
                         {"runs": [str(r) for r in tp_runs], "collectives": str(collectives),
                          "compute_priced_by": profile.name})
    f = terms.provenance["fit"]
    console.print(f"tp: TP{terms.tensor_parallel_size} all-reduce {terms.allreduce_latency_s * 1e6:.1f} us + "
                  f"bytes at {terms.allreduce_bus_gb_per_s:.0f} GB/s bus, overlap {terms.overlap_fraction:.2f}, "
                  f"{terms.step_s * 1e6:.0f} us per step; held-out step error {_pct(f['held_out_median_rel_error'])} "
                  f"(first principles {_pct(f['held_out_median_rel_error_first_principles'])})", highlight=False)
    return profile.model_copy(update={"tp": terms})


@clean_errors
def calibrate(
    runs: Annotated[list[Path] | None, typer.Argument(
        help="engine run folders (steps.jsonl + run.json) or steps.jsonl[.gz] files; with --from-bench, more "
        "bench results (.json) and scrapes (other names, after those of --from-metrics)")] = None,
    model: Annotated[str, typer.Option("--model", help="model preset the runs served")] = "",
    gpu: Annotated[str, typer.Option("--gpu", help="GPU preset the runs ran on")] = "",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="write the fitted profile JSON here (an existing file needs --force)")] = None,
    scaled: Annotated[bool, typer.Option("--scaled", help="also write profiles scaled by datasheet ratios to the A100, H100, B200 and L4 presets beside --out")] = False,
    async_scheduling: Annotated[bool, typer.Option("--async-scheduling", help="bare steps files (no run.json) were recorded with async scheduling")] = False,
    max_num_seqs: Annotated[int | None, typer.Option("--max-num-seqs", min=1, help="bare steps files: the engine's max_num_seqs (its CUDA graph sizes)")] = None,
    memory_runs: Annotated[list[Path] | None, typer.Option(
        "--memory-runs", help="engine run folders whose run.json memory terms size the KV pool, when the timed "
        "runs' engines were sized by --num-gpu-blocks-override (repeat the option)")] = None,
    from_bench: Annotated[list[Path] | None, typer.Option(
        "--from-bench", help="fit from `vllm bench serve --save-result --save-detailed` result files instead of step "
        "traces (repeat, or list more files after the options)")] = None,
    from_metrics: Annotated[list[Path] | None, typer.Option(
        "--from-metrics", help="with --from-bench: /metrics scrapes of the server, before and after each run in run "
        "order (or one per run of a server started for it)")] = None,
    serve_args: Annotated[str, typer.Option(
        "--serve-args", help="with --from-bench: the engine flags the server ran with, as typed to `vllm serve` "
        "(e.g. \"--max-num-seqs 256 --max-num-batched-tokens 8192\")")] = "",
    profile: Annotated[str, typer.Option(
        "--profile", help="with --from-bench: the profile to start from (auto: the one `simulate` picks)")] = "auto",
    hold_out_every: Annotated[int, typer.Option(
        "--hold-out-every", min=2, help="with --from-bench: every K-th run is held out of the fit and scored (one "
        "run: its odd requests are)")] = 3,
    max_seconds: Annotated[float, typer.Option(
        "--max-seconds", min=1, help="with --from-bench: the fit's budget in CPU seconds")] = 240.0,
    tp_runs: Annotated[list[Path] | None, typer.Option(
        "--tp-runs", help="engine run folders recorded with --tensor-parallel-size > 1: fit the profile's TP terms "
        "(overlap, cost per TP step) from them, the one-GPU fit pricing their compute (repeat the option)")] = None,
    tp_collectives: Annotated[Path | None, typer.Option(
        "--tp-collectives", help="with --tp-runs: the all-reduce sweep (collectives.json of benchmarks/tp/h200x2.py) "
        "the latency and bus bandwidth are fitted from")] = None,
    longest_excess: Annotated[str, typer.Option(
        "--longest-excess", help="steps with prefill price their longest decode's context as the decodes' mean + "
        "this weight x its excess over the mean (0-1; 1: the whole context, as profiles fitted before it); auto: "
        "fit at 1, 0.7, 0.5 and 0.35 and keep the weight whose held-out steps with prefill come out best")] = "1",
    force: Force = False,
) -> None:
    """Fit a cost profile (schema v2) for one model on one GPU from engine step traces, or from a server's
    request-level measurements (--from-bench); print the fit."""
    if not model or not gpu:
        raise ValueError(f"give {'--model' if not model else '--gpu'}: the model and GPU the measurements come from")
    if from_bench:
        from advisor.commands.calibrate_bench import calibrate_from_bench

        calibrate_from_bench(from_bench, [*(from_metrics or [])], list(runs or []), model=model, gpu=gpu, out=out,
                             serve_args=serve_args, profile=profile, hold_out_every=hold_out_every,
                             max_seconds=max_seconds, force=force)
        return
    if from_metrics or serve_args:
        raise ValueError("--from-metrics and --serve-args go with --from-bench; add --from-bench RESULT.json")
    if not runs:
        raise ValueError("give engine run folders to fit on, or --from-bench RESULT.json")
    _calibrate_from_steps(runs, model, gpu, out, scaled=scaled, async_scheduling=async_scheduling,
                          max_num_seqs=max_num_seqs, memory_runs=memory_runs or [], tp_runs=tp_runs or [],
                          tp_collectives=tp_collectives, force=force, longest_excess=parse_longest_excess(longest_excess))


def parse_longest_excess(text: str) -> float | None:
    """--longest-excess: None for auto, else the weight in [0, 1]; anything else names the flag."""
    if text.strip().lower() == "auto":
        return None
    try:
        w = float(text)
    except ValueError:
        w = float("nan")
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"--longest-excess {text!r}: give a weight from 0 to 1 (1: the longest decode's whole "
                         "context) or auto")
    return w


def _check_outputs(out: Path | None, model: str, scaled: bool, inputs: list[Path], force: bool) -> None:
    """Before the work: a refused --out (or a scaled file beside it) must not cost a fit."""
    from sim.calibrate import SCALED_GPUS

    if scaled and out is None:
        raise ValueError("--scaled writes beside --out: give --out PROFILE.json too")
    if out is None:
        return
    check_output_file(out, flag="--out", force=force, inputs=inputs)
    if scaled:  # the files write_scaled_profiles will write
        for name in SCALED_GPUS:
            check_output_file(out.parent / f"{GPU_PRESETS[name].name}-{model}.json", flag="--scaled",
                              force=force, inputs=inputs)


def _calibrate_from_steps(runs: list[Path], model: str, gpu: str, out: Path | None, *, scaled: bool,
                          async_scheduling: bool, max_num_seqs: int | None, memory_runs: list[Path],
                          tp_runs: list[Path], tp_collectives: Path | None, force: bool,
                          longest_excess: float | None = 1.0) -> None:
    """The step-trace fit: check everything, fit, print, write (and the scaled copies). `longest_excess`:
    GpuTerms.decode_max_excess, None: chosen (`choose_longest_excess`)."""
    # scipy's optimisers load only for this command (the CLI's other commands start without them)
    from sim.calibrate import choose_longest_excess, fit_profile, load_run, write_scaled_profiles
    from sim.cost_model import CostProfile
    from sim.models import preset_of
    from sim.validate import read_run_info

    model = preset_of(model)  # a Hugging Face id as its preset
    m, g = get_model(model), get_gpu(gpu)
    _check_outputs(out, model, scaled, [*runs, *memory_runs], force)
    for r in runs:  # every run checked (and of this model and GPU) before the first is fitted
        check_run_for_fit(r, model, gpu)
    if bool(tp_runs) != (tp_collectives is not None):
        raise ValueError("--tp-runs and --tp-collectives go together: the sweep gives the all-reduce's latency "
                         "and bandwidth, the runs its overlap with compute")
    default = EngineConfig(async_scheduling=async_scheduling, max_num_seqs=max_num_seqs)
    memory = [read_run_info(d).model_dump() for d in memory_runs]
    loaded = [load_run(r, default) for r in runs]
    for r in loaded:  # a TP run's steps are not one GPU's: they would bend the single-GPU fit
        tp = ((r.run_info or {}).get("engine_args") or {}).get("tensor_parallel_size") or 1
        if tp > 1:
            raise ValueError(f"{r.path}: recorded at --tensor-parallel-size {tp}; pass it with --tp-runs, "
                             "and one-GPU runs as RUNS")
    # a mixture of experts keeps the shipped profile's measured MoE kernel terms (sim/calibrate.py moe_kept_fields)
    moe_base = CostProfile.for_target(model, gpu) if m.is_moe else None
    console = plain_console()
    if longest_excess is None:
        fit, scores = choose_longest_excess(loaded, m, g, engine_config=default, memory_runs=memory, moe_base=moe_base)
        console.print("longest-decode weight: " + ", ".join(f"{w:g} {v:.3f}" for w, v in scores.items())
                      + f" (held-out median + p90 |error| of steps with prefill): {fit.profile.mixed.decode_max_excess:g}",
                      highlight=False)
    else:
        fit = fit_profile(loaded, m, g, default, memory_runs=memory, moe_base=moe_base, longest_excess=longest_excess)
    print_fit(fit, console)
    if tp_runs:
        fit.profile = _with_tp_terms(fit.profile, tp_runs, tp_collectives, m, g, default, console)
    if out is None:
        console.print("not written: pass --out PROFILE.json to keep it", highlight=False)
        return
    with staged_file(out) as tmp:
        tmp.write_text(fit.profile.to_json())
    written = [out]
    if scaled:
        written += write_scaled_profiles(fit.profile, out.parent, force=force)
    console.print(f"wrote {', '.join(str(p) for p in written)}", highlight=False)
