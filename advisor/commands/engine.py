"""`costline engine ...`: run the real engine on a workload, or measure its offline throughput.

torch is imported inside the commands, so `costline --help` stays light.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Run the real engine (paged KV, continuous batching) on a workload.",
                  no_args_is_help=True)

Model = Annotated[str, typer.Option("--model", help="model preset (llama-3.2-1b, tiny, ...) or a HF-style directory")]


def _engine_args(**kw):
    from pydantic import ValidationError

    from engine.config import EngineArgs

    try:
        return EngineArgs(**kw)
    except ValidationError as exc:  # the message names the field (= the flag)
        raise typer.BadParameter(str(exc)) from None


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=2)


def _require_torch() -> None:
    """The engine needs torch (and triton on a GPU); the core install has neither."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        _fail("the engine needs PyTorch, which this install lacks: pip install 'costline[engine]' "
              "(on a CPU-only machine install a CPU build first, e.g. pip install torch==2.13.0; "
              "`bash dev.sh test` sets up both)")


@app.command("run")
def run(
    model: Model = "tiny",
    workload: Annotated[str, typer.Option("--workload", help="workload preset, spec file or trace file")] = "lab-random",
    first: Annotated[int | None, typer.Option("--first", help="replay only the first N requests")] = None,
    speedup: Annotated[float | None, typer.Option("--speedup", help="compress arrival times by this factor")] = None,
    max_prompt_len: Annotated[int | None, typer.Option(
        "--max-prompt-len", help="truncate longer prompts (and their hash ids) to this many tokens")] = None,
    no_arrivals: Annotated[bool, typer.Option("--no-arrivals", help="submit everything at t=0 (offline)")] = False,
    out: Annotated[Path, typer.Option("--out", help="folder for requests.jsonl, steps.jsonl, summary.json")] = Path("runs/engine"),
    metrics_file: Annotated[Path | None, typer.Option("--metrics-file", help="write Prometheus text here")] = None,
    metrics_port: Annotated[int | None, typer.Option("--metrics-port", help="serve Prometheus metrics on this port")] = None,
    dtype: Annotated[str, typer.Option("--dtype")] = "auto",
    device: Annotated[str, typer.Option("--device")] = "auto",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len")] = None,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs")] = 256,
    max_num_batched_tokens: Annotated[int, typer.Option("--max-num-batched-tokens")] = 8192,
    block_size: Annotated[int, typer.Option("--block-size")] = 16,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
    num_gpu_blocks_override: Annotated[int | None, typer.Option("--num-gpu-blocks-override")] = None,
    enable_prefix_caching: Annotated[bool, typer.Option("--enable-prefix-caching/--disable-prefix-caching")] = True,
    enable_chunked_prefill: Annotated[bool, typer.Option("--enable-chunked-prefill/--disable-chunked-prefill")] = True,
    long_prefill_token_threshold: Annotated[int, typer.Option("--long-prefill-token-threshold")] = 0,
    scheduling_policy: Annotated[str, typer.Option("--scheduling-policy")] = "fcfs",
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager")] = False,
    async_scheduling: Annotated[bool, typer.Option("--async-scheduling")] = False,
) -> None:
    """Timed replay of a workload: per-request TTFT/TPOT/ITL/e2e/queue, a per-step trace."""
    _require_torch()
    import dataclasses

    from engine.core import EngineCore
    from engine.metrics import EngineMetrics
    from engine.replay import replay
    from sim.workload_source import SourceOptions, load_workload

    cfg = _engine_args(
        model=model, dtype=dtype, device=device, seed=seed, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization, num_gpu_blocks_override=num_gpu_blocks_override,
        enable_prefix_caching=enable_prefix_caching, enable_chunked_prefill=enable_chunked_prefill,
        long_prefill_token_threshold=long_prefill_token_threshold, scheduling_policy=scheduling_policy,
        enforce_eager=enforce_eager, async_scheduling=async_scheduling)
    try:
        wl = load_workload(workload, SourceOptions(first=first, speedup=speedup))
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    requests = list(wl.requests)
    if max_prompt_len is not None:
        requests = [r if r.prompt_len <= max_prompt_len else dataclasses.replace(
            r, prompt_len=max_prompt_len, hash_ids=r.hash_ids[: -(-max_prompt_len // r.hash_block_size)],
            prompt_token_ids=None) for r in requests]
    try:
        core = EngineCore(cfg)
    except ValueError as exc:
        _fail(str(exc))
    metrics = EngineMetrics(model, core.max_model_len) if (metrics_file or metrics_port) else None
    if metrics and metrics_port:
        metrics.serve(metrics_port)
    out.mkdir(parents=True, exist_ok=True)
    res = replay(core, requests, honor_arrivals=not no_arrivals, metrics=metrics,
                 trace_file=out / "steps.jsonl")
    res.write(out)
    if metrics and metrics_file:
        metrics.write(str(metrics_file))
    s = res.summary()
    s.pop("scheduler_stats", None)
    typer.echo(json.dumps({k: v for k, v in s.items() if v is not None}, indent=2, default=float))
    typer.echo(f"wrote {out}/requests.jsonl, steps.jsonl, summary.json")


@app.command("bench")
def bench(
    model: Model = "tiny",
    num_prompts: Annotated[int, typer.Option("--num-prompts")] = 64,
    input_len: Annotated[int, typer.Option("--input-len")] = 128,
    output_len: Annotated[int, typer.Option("--output-len")] = 64,
    dtype: Annotated[str, typer.Option("--dtype")] = "auto",
    device: Annotated[str, typer.Option("--device")] = "auto",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs")] = 256,
    max_num_batched_tokens: Annotated[int, typer.Option("--max-num-batched-tokens")] = 8192,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager")] = False,
    async_scheduling: Annotated[bool, typer.Option("--async-scheduling")] = False,
) -> None:
    """Offline throughput: N random prompts of fixed lengths, all at once, ignore_eos."""
    _require_torch()
    import time

    import numpy as np

    from engine.llm import LLM
    from engine.sampling import SamplingParams

    cfg = _engine_args(model=model, dtype=dtype, device=device, seed=seed, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens,
                         gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                         async_scheduling=async_scheduling)
    llm = LLM(**cfg.model_dump())
    rng = np.random.default_rng(seed)
    vocab = llm.engine.spec.vocab_size
    prompts = [rng.integers(16, vocab, input_len).tolist() for _ in range(num_prompts)]
    sp = SamplingParams(max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    t = time.perf_counter()
    outs = llm.generate(prompts, sp)
    wall = time.perf_counter() - t
    gen = sum(len(o.token_ids) for o in outs)
    typer.echo(json.dumps({"model": model, "device": str(llm.engine.device), "num_prompts": num_prompts,
                           "input_len": input_len, "output_len": output_len, "wall_s": wall,
                           "output_tokens_per_s": gen / wall,
                           "total_tokens_per_s": (gen + num_prompts * input_len) / wall}, indent=2))
