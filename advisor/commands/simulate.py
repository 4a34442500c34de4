"""`costline simulate`: run a workload through a simulated vLLM deployment.

    costline simulate --workload chat-production --model llama-3.1-8b --gpu h200 --num-gpus 2 \\
        --max-num-batched-tokens 8192 --disable-prefix-caching --goodput "ttft:500 tpot:50" --out runs/a
    costline simulate --compare runs/a runs/b

Engine flags carry vLLM's names and spellings (`--disable-prefix-caching`,
`--speculative-config '{...}'`, sizes like `8k`), so a run's configuration pastes into
`vllm serve`. Files under `--out`: requests and steps tables (Parquet when pyarrow is
installed, else CSV), `summary.json` (`vllm bench serve` keys) and `metrics.prom`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from advisor.commands.workload import (
    BlockSize,
    EndS,
    First,
    Fmt,
    KeepFailed,
    Lenient,
    NumReq,
    Rate,
    Speedup,
    Spread,
    StartS,
    _clean_errors,
)

SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")


def parse_size(text: str | None, flag: str) -> int | None:
    """vLLM's human-readable integers: `8k` = 8000, `8K` = 8192 (lower case decimal, upper binary)."""
    if text is None:
        return None
    m = SIZE.match(str(text))
    if not m:
        raise ValueError(f"{flag} {text!r}: use an integer, optionally with k/K, m/M or g/G (e.g. 8K = 8192)")
    num, unit = float(m.group(1)), m.group(2)
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    return int(num * mult)


def parse_disagg(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*[:Pp]\s*(\d+)\s*[Dd]?\s*", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"--disagg {text!r}: give prefill:decode replica counts, e.g. --disagg 3:1")
    return int(m.group(1)), int(m.group(2))


def build_deployment(*, model: str, gpu: str, num_gpus: int | None, router: str, disagg: str | None,
                     kv_link: str, link_gbps: float | None, link_latency_ms: float,
                     engine: dict[str, Any]):
    """A DeploymentConfig from command-line values (errors name the flag and the fix)."""
    from engine.model_spec import get_model
    from sim.config import DeploymentConfig, DisaggConfig, EngineConfig
    from sim.hardware import get_gpu

    eng = EngineConfig(**{k: v for k, v in engine.items() if v is not None})
    tp = eng.tensor_parallel_size
    pd = parse_disagg(disagg)
    if pd:
        need = (pd[0] + pd[1]) * tp
        if num_gpus is not None and num_gpus != need:
            raise ValueError(f"--num-gpus {num_gpus} does not match --disagg {pd[0]}:{pd[1]} at "
                             f"--tensor-parallel-size {tp} ({need} GPUs); drop --num-gpus or make them agree")
        d = DisaggConfig(num_prefill_replicas=pd[0], num_decode_replicas=pd[1], link=kv_link,
                         link_gbps=link_gbps, link_latency_s=link_latency_ms / 1e3)
        return DeploymentConfig(model=get_model(model), gpu=get_gpu(gpu), engine=eng, router=router,
                                disaggregation=d)
    n = num_gpus or tp
    if n % tp:
        raise ValueError(f"--num-gpus {n} is not a multiple of --tensor-parallel-size {tp}")
    return DeploymentConfig(model=get_model(model), gpu=get_gpu(gpu), engine=eng, num_replicas=n // tp,
                            router=router)


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x:,.1f}"


def print_summary(s: dict[str, Any], console: Console) -> None:
    t = Table(title=f"[bold]{s.get('label') or 'simulation'}[/]: {s['deployment']}", title_justify="left")
    t.add_column("metric", style="bold cyan")
    for c in ("mean", "p50", "p90", "p99"):
        t.add_column(c, justify="right")
    for key, name in (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("itl", "ITL (ms)"), ("e2el", "E2E (ms)"),
                      ("queue_time", "queue (ms)")):
        t.add_row(name, _ms(s[f"mean_{key}_ms"]), _ms(s[f"median_{key}_ms"]), _ms(s[f"p90_{key}_ms"]),
                  _ms(s[f"p99_{key}_ms"]))
    console.print(t)
    g = Table(show_header=False, box=None)
    g.add_column(style="bold cyan")
    g.add_column()
    g.add_row("requests", f"{s['completed']:,} completed, {s['rejected']:,} rejected, {s['unfinished']:,} "
              f"unfinished over {s['duration']:,.1f} s")
    g.add_row("throughput", f"{s['request_throughput']:.2f} req/s, {s['output_throughput']:,.0f} output tok/s "
              f"({s['output_throughput_per_gpu']:,.0f} per GPU), {s['total_token_throughput']:,.0f} total tok/s")
    if s.get("request_goodput") is not None:
        slo = " ".join(f"{k}:{v:g}" for k, v in (s.get("goodput_slo") or {}).items())
        g.add_row("goodput", f"{s['request_goodput']:.2f} req/s ({s['request_goodput_per_gpu']:.2f} per GPU) "
                  f"under {slo} ms")
    g.add_row("prefix cache", f"hit rate {s['prefix_cache_hit_rate']:.1%} ({s['prefix_cache_hits_tokens']:,} "
              f"of {s['prefix_cache_queries_tokens']:,} tokens)")
    g.add_row("engine", f"GPU busy {s['gpu_busy_share']:.0%}, CPU {s['cpu_share_of_step_time']:.1%} of step "
              f"time, {s['num_preemptions']:,} preemptions, KV usage max {s['kv_cache_usage_max']:.0%} "
              f"of {s['num_gpu_blocks']:,} blocks")
    if s.get("spec_decode_num_drafts"):
        g.add_row("spec decode", f"acceptance rate {s['spec_decode_acceptance_rate']:.1%}, "
                  f"mean acceptance length {s['spec_decode_acceptance_length']:.2f}")
    if s.get("mean_kv_transfer_ms") is not None:
        g.add_row("KV transfer", f"mean {s['mean_kv_transfer_ms']:.2f} ms per request (queueing included)")
    if s.get("vllm_args") is not None:
        g.add_row("vllm serve", s["vllm_args"] or "(defaults)")
    coarse = s.get("kv_block_coarsening") or 1
    g.add_row("simulated", f"{s['num_engine_steps']:,} engine steps in {s['wall_s']:.2f} s wall "
              f"({s['simulated_requests_per_wall_s']:,.0f} requests/s)"
              + (f"; KV blocks coarsened x{coarse}" if coarse > 1 else ""))
    console.print(g)


COMPARE_KEYS = ("completed", "failed", "duration", "request_throughput", "request_goodput",
                "request_goodput_per_gpu", "output_throughput", "output_throughput_per_gpu", "mean_ttft_ms",
                "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms", "num_preemptions",
                "prefix_cache_hit_rate", "gpu_busy_share", "cpu_share_of_step_time", "spec_decode_acceptance_length",
                "mean_kv_transfer_ms", "num_gpus")


def compare_runs(a_dir: str, b_dir: str, console: Console) -> None:
    from sim.metrics import load_summary

    a, b = load_summary(a_dir), load_summary(b_dir)
    t = Table(title="[bold]compare[/]", title_justify="left")
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


@_clean_errors
def simulate(
    workload: Annotated[str | None, typer.Option("--workload", "-w", help="preset name, spec file (.json) or trace file")] = None,
    model: Annotated[str, typer.Option("--model", help="model preset (llama-3.1-8b, llama-3.1-70b, qwen2.5-7b, ...)")] = "llama-3.1-8b",
    gpu: Annotated[str, typer.Option("--gpu", help="GPU preset (h200, h100-sxm, a100-80gb, l4, b200, ...)")] = "h200",
    num_gpus: Annotated[int | None, typer.Option("--num-gpus", help="GPUs in total: replicas = num_gpus / tensor_parallel_size")] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of the simulation (acceptance draws) and of a generated workload")] = 0,
    router: Annotated[str, typer.Option("--router", help="round_robin, least_loaded or prefix_aware")] = "least_loaded",
    disagg: Annotated[str | None, typer.Option("--disagg", help="disaggregated prefill: P:D replica counts, e.g. 3:1")] = None,
    kv_link: Annotated[str, typer.Option("--kv-link", help="P/D KV link: network (NIC) or nvlink")] = "network",
    link_gbps: Annotated[float | None, typer.Option("--link-gbps", help="P/D link bandwidth per GPU, GB/s (default: from the GPU)")] = None,
    link_latency_ms: Annotated[float, typer.Option("--link-latency-ms", help="fixed cost per KV transfer")] = 0.5,
    max_num_batched_tokens: Annotated[str | None, typer.Option("--max-num-batched-tokens")] = None,
    max_num_seqs: Annotated[str | None, typer.Option("--max-num-seqs")] = None,
    max_model_len: Annotated[str | None, typer.Option("--max-model-len")] = None,
    block_size: Annotated[int, typer.Option("--block-size")] = 16,
    enable_prefix_caching: Annotated[bool, typer.Option("--enable-prefix-caching/--disable-prefix-caching")] = True,
    no_enable_prefix_caching: Annotated[bool, typer.Option("--no-enable-prefix-caching", hidden=True)] = False,
    prefix_caching_hash_algo: Annotated[str, typer.Option("--prefix-caching-hash-algo")] = "builtin",
    enable_chunked_prefill: Annotated[bool, typer.Option("--enable-chunked-prefill/--disable-chunked-prefill")] = True,
    no_enable_chunked_prefill: Annotated[bool, typer.Option("--no-enable-chunked-prefill", hidden=True)] = False,
    long_prefill_token_threshold: Annotated[int, typer.Option("--long-prefill-token-threshold")] = 0,
    scheduling_policy: Annotated[str, typer.Option("--scheduling-policy")] = "fcfs",
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.92,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype")] = "auto",
    quantization: Annotated[str | None, typer.Option("--quantization", "-q", help="fp8 (dynamic FP8 weights)")] = None,
    num_gpu_blocks_override: Annotated[int | None, typer.Option("--num-gpu-blocks-override")] = None,
    tensor_parallel_size: Annotated[int, typer.Option("--tensor-parallel-size", "-tp")] = 1,
    async_scheduling: Annotated[bool, typer.Option("--async-scheduling/--no-async-scheduling")] = False,
    speculative_config: Annotated[str | None, typer.Option("--speculative-config", "-sc", help="JSON, e.g. '{\"method\":\"ngram\",\"num_speculative_tokens\":4}'")] = None,
    goodput: Annotated[str | None, typer.Option("--goodput", help="SLOs in ms, e.g. \"ttft:500 tpot:50 e2el:10000\"")] = None,
    profile: Annotated[str, typer.Option("--profile", help="cost profile name (sim/profiles) or JSON path")] = "default",
    out: Annotated[Path | None, typer.Option("--out", help="write tables, summary.json and metrics.prom here")] = None,
    label: Annotated[str | None, typer.Option("--label")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary JSON")] = False,
    sim_block_coarsening: Annotated[str, typer.Option("--sim-block-coarsening", help="speed option: engine KV blocks per simulated block, an integer or 'auto' (as coarse as the workload's hash blocks; e.g. 32 on Mooncake)")] = "1",
    no_skip_ahead: Annotated[bool, typer.Option("--no-skip-ahead", help="step every decode step (slow; for checks)")] = False,
    compare: Annotated[tuple[str, str] | None, typer.Option("--compare", help="two saved run directories: A B")] = None,
    trace_format: Fmt = "auto", lenient: Lenient = False, hash_block_size: BlockSize = None,
    keep_failed: KeepFailed = False, spread: Spread = False, num_requests: NumReq = None,
    start_s: StartS = None, end_s: EndS = None, first: First = None, speedup: Speedup = None, rate: Rate = None,
) -> None:
    """Simulate a workload on a vLLM-style deployment; print a summary, optionally save the run."""
    console = Console()
    if compare:
        compare_runs(compare[0], compare[1], console)
        return
    if workload is None:
        raise ValueError("--workload is required (a preset such as chat-production, a spec .json or a trace file); "
                         "or use --compare A B")
    from sim.cost_model import CostProfile
    from sim.metrics import SLO
    from sim.simulator import Simulation
    from sim.workload_source import SourceOptions, load_workload

    spec = json.loads(speculative_config) if speculative_config else None
    if spec is not None and not isinstance(spec, dict):
        raise ValueError("--speculative-config must be a JSON object")
    engine = {
        "max_num_batched_tokens": parse_size(max_num_batched_tokens, "--max-num-batched-tokens"),
        "max_num_seqs": parse_size(max_num_seqs, "--max-num-seqs"),
        "max_model_len": parse_size(max_model_len, "--max-model-len"), "block_size": block_size,
        "enable_prefix_caching": enable_prefix_caching and not no_enable_prefix_caching,
        "prefix_caching_hash_algo": prefix_caching_hash_algo,
        "enable_chunked_prefill": enable_chunked_prefill and not no_enable_chunked_prefill,
        "long_prefill_token_threshold": long_prefill_token_threshold, "scheduling_policy": scheduling_policy,
        "gpu_memory_utilization": gpu_memory_utilization, "kv_cache_dtype": kv_cache_dtype,
        "quantization": quantization, "num_gpu_blocks_override": num_gpu_blocks_override,
        "tensor_parallel_size": tensor_parallel_size, "async_scheduling": async_scheduling,
        "speculative_config": spec,
    }
    dep = build_deployment(model=model, gpu=gpu, num_gpus=num_gpus, router=router, disagg=disagg,
                           kv_link=kv_link, link_gbps=link_gbps, link_latency_ms=link_latency_ms, engine=engine)
    wl = load_workload(workload, SourceOptions(
        trace_format=trace_format, lenient=lenient, hash_block_size=hash_block_size, keep_failed=keep_failed,
        spread=spread, seed=seed, num_requests=num_requests, start_s=start_s, end_s=end_s, first=first,
        speedup=speedup, rate_rps=rate))
    reqs = wl.requests
    meta = {"workload": workload, "workload_notes": list(wl.notes)}
    coarsen: int | str = sim_block_coarsening
    if sim_block_coarsening != "auto":
        if not sim_block_coarsening.isdigit() or int(sim_block_coarsening) < 1:
            raise ValueError(f"--sim-block-coarsening {sim_block_coarsening!r}: use a positive integer or 'auto'")
        coarsen = int(sim_block_coarsening)
    sim = Simulation(dep, reqs, seed=seed, profile=CostProfile.load(profile), slo=SLO.parse(goodput),
                     skip_ahead=not no_skip_ahead, label=label or Path(workload).stem, meta=meta,
                     kv_block_coarsening=coarsen)
    if len(reqs) >= 5000 and not as_json and sys.stderr.isatty():
        from rich.progress import Progress
        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(f"simulating {len(reqs):,} requests", total=1.0)
            sim.progress = lambda f: bar.update(task, completed=f)
            result = sim.run()
    else:
        result = sim.run()
    summary = result.summary()
    summary["vllm_args"] = result.meta.get("vllm_args")
    if out is not None:
        paths = result.save(out)
        if not as_json:
            console.print(f"wrote {', '.join(str(p) for p in paths.values())}", highlight=False)
    if as_json:
        from sim.metrics import jsonable
        sys.stdout.write(json.dumps(jsonable(summary), indent=2) + "\n")
    else:
        print_summary(summary, console)
        if sim.coarsen == 1 and result.wall_s > 5 and sim._coarsening("auto") > 1:
            console.print(f"hint: this workload's prefixes are known per {reqs[0].hash_block_size}-token block; "
                          "--sim-block-coarsening auto simulates it several times faster "
                          "(benchmarks/sim/results.md)", style="dim", highlight=False)


__all__ = ["build_deployment", "compare_runs", "parse_size", "simulate"]
