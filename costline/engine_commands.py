"""`costline engine ...`: run the real engine on a workload, or measure its offline throughput.

torch is imported inside the commands, so `costline --help` stays light.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from advisor.help import HELP
from advisor.options import Force, clean_errors, flag_options, source_options
from advisor.report import warn_unserved
from engine.core.config import EngineArgs
from engine.core.flags import ENGINE_ONLY_FLAGS, SCHEDULING_FLAGS
from engine.core.outputs import check_output_dir, check_output_file, staged_dir, staged_file
from engine.core.summary_record import RunSummary
from sim.workload_source import SourceOptions

app = typer.Typer(help="Run the real engine (paged KV, continuous batching) on a workload.",
                  no_args_is_help=True)

# `engine run` and `engine bench` take the same engine flags, from one definition each.
ENGINE_CLI_FLAGS = (*ENGINE_ONLY_FLAGS, *SCHEDULING_FLAGS)


# Prompt tokens `engine bench` generates up front, as Python lists (~36 bytes a token): 10M tokens
# are ~0.4 GB, far beyond what an offline throughput measurement needs to be steady.
MAX_BENCH_PROMPT_TOKENS = 10_000_000


def _check_bench_sizes(num_prompts: int, input_len: int, output_len: int) -> None:
    """Before any prompt is generated: each count positive, the prompts' size in tokens."""
    for flag, value in (("--num-prompts", num_prompts), ("--input-len", input_len), ("--output-len", output_len)):
        if value < 1:
            _fail(f"{flag} {value}: must be an integer >= 1")
    if num_prompts * input_len > MAX_BENCH_PROMPT_TOKENS:
        _fail(f"--num-prompts {num_prompts} x --input-len {input_len} = {num_prompts * input_len:,} prompt "
              f"tokens, more than {MAX_BENCH_PROMPT_TOKENS:,}; lower --num-prompts or --input-len")


def _check_bench_length(input_len: int, output_len: int, max_model_len: int) -> None:
    # vLLM's offline LLM refuses a prompt longer than max_model_len (vllm/v1/engine/processor.py
    # `_validate_model_input`); a prompt that fits but leaves no room for --output-len tokens would
    # stop early and report a throughput for tokens never generated, so it is refused too.
    if input_len + output_len > max_model_len:
        _fail(f"--input-len {input_len} + --output-len {output_len} exceeds the model length "
              f"{max_model_len}; lower them, or raise --max-model-len (up to the model's positions)")


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


def _inputs(cfg: EngineArgs, workload: str) -> list[str | None]:
    """What the run reads from disk: the workload file, the model and draft model folders."""
    draft = cfg.speculative_config.model if cfg.speculative_config is not None else None
    return [workload, cfg.model, draft]


def _check_outputs(out: Path, metrics_file: Path | None, *, force: bool, inputs: list[str | None]) -> None:
    check_output_dir(out, flag="--out", force=force, inputs=inputs)
    if metrics_file is not None:
        check_output_file(metrics_file, flag="--metrics-file", force=force, inputs=inputs)


@app.command("run", **HELP)
@clean_errors
@flag_options(ENGINE_CLI_FLAGS, into="engine_flags")
@source_options(exclude=("seed",))
def run(
    workload: Annotated[str, typer.Option("--workload", "-w", help="workload preset, spec file or trace file")] = "lab-random",
    max_prompt_len: Annotated[int | None, typer.Option(
        "--max-prompt-len", min=1, help="truncate longer prompts (and their hash ids) to this many tokens")] = None,
    no_arrivals: Annotated[bool, typer.Option("--no-arrivals", help="submit everything at t=0 (offline)")] = False,
    out: Annotated[Path, typer.Option("--out", help="folder for requests.jsonl, steps.jsonl, summary.json (a run already there needs --force; while running, the live steps.jsonl is in .NAME.partial-* beside it)")] = Path("runs/engine"),
    metrics_file: Annotated[Path | None, typer.Option("--metrics-file", help="write Prometheus text here")] = None,
    metrics_port: Annotated[int | None, typer.Option("--metrics-port", help="serve Prometheus metrics on this port")] = None,
    metrics_host: Annotated[str, typer.Option(
        "--metrics-host", help="address --metrics-port listens on (0.0.0.0: every interface)")] = "127.0.0.1",
    force: Force = False,
    disagg: Annotated[str | None, typer.Option(
        "--disagg", help="P:D: P prefill and D decode instances, one process and GPU each, KV moved between "
                         "them (also writes transfers.jsonl)")] = None,
    engine_flags: dict | None = None,
    source: SourceOptions | None = None,
) -> None:
    """Timed replay of a workload as `vllm serve` would see it (server defaults): per-request
    TTFT/TPOT/ITL/e2e/queue and a per-step trace."""
    cfg = EngineArgs(usage_context="api_server", **(engine_flags or {}))
    _require_torch()
    from engine.preflight import check_engine_args, check_metrics_endpoint

    check_metrics_endpoint(metrics_port, metrics_host)  # before the model load and the warm-up
    _check_outputs(out, metrics_file, force=force, inputs=_inputs(cfg, workload))  # before any work
    check_engine_args(cfg)
    if disagg is not None:
        if cfg.tensor_parallel_size > 1:
            _fail("--disagg runs each instance on one GPU; drop --tensor-parallel-size")
        return _run_disagg(cfg, disagg, workload, max_prompt_len, no_arrivals, out, metrics_file, metrics_port,
                           source, force)
    from engine.engine_loop import EngineCore
    from engine.metrics import EngineMetrics
    from engine.replay import replay
    from sim.workload_source import cap_prompt_lengths, load_workload

    wl = load_workload(workload, source)
    requests = cap_prompt_lengths(wl.requests, max_prompt_len)
    core = EngineCore(cfg, progress=lambda line: typer.echo(line, err=True))
    warm = core.warm_up()  # compile every kernel variant before the clock starts
    typer.echo(f"warm-up: {warm.num_requests} requests, {warm.num_steps} steps, {warm.seconds:.1f} s, "
               f"{warm.kernels_compiled} kernel variants compiled", err=True)
    metrics = EngineMetrics(cfg.model, core.max_model_len) if (metrics_file or metrics_port) else None
    if metrics and metrics_port:
        metrics.serve(metrics_port, host=metrics_host)
    _check_outputs(out, metrics_file, force=force, inputs=_inputs(cfg, workload))  # again: the model load took a while
    with staged_dir(out) as folder:  # the live step trace streams into the folder aside
        res = replay(core, requests, honor_arrivals=not no_arrivals, metrics=metrics,
                     trace_file=folder / "steps.jsonl")
        summary = res.write_files(folder)
    core.close()  # the tensor-parallel workers, if any
    if metrics and metrics_file:
        with staged_file(metrics_file) as tmp:
            metrics.write(str(tmp))
    typer.echo(json.dumps({k: v for k, v in summary.items() if v is not None}, indent=2))
    warn_unserved(RunSummary.from_json_dict(summary))
    typer.echo(f"wrote {out}/requests.jsonl, steps.jsonl, summary.json, metrics.prom, scheduler_stats.json")


def _run_disagg(cfg: EngineArgs, disagg: str, workload: str, max_prompt_len: int | None, no_arrivals: bool,
                out: Path, metrics_file: Path | None, metrics_port: int | None, source, force: bool) -> None:
    """`engine run --disagg P:D`: the replay across P + D instance processes (engine/disagg/)."""
    from engine.core.disagg_records import DisaggSplit
    from engine.disagg.router import replay_disagg
    from sim.workload_source import cap_prompt_lengths, load_workload

    split = DisaggSplit.parse(disagg)
    if metrics_file is not None or metrics_port is not None:
        _fail("--disagg writes its metrics.prom into --out; drop --metrics-file / --metrics-port")
    requests = cap_prompt_lengths(load_workload(workload, source).requests, max_prompt_len)
    res = replay_disagg(cfg, requests, split=split, honor_arrivals=not no_arrivals)
    _check_outputs(out, None, force=force, inputs=_inputs(cfg, workload))  # again: the replay took a while
    with staged_dir(out) as folder:
        summary = res.write_files(folder)
    typer.echo(json.dumps({k: v for k, v in summary.items() if v is not None}, indent=2))
    for err in res.errors:
        typer.echo(f"warning: {err.splitlines()[-1]}", err=True)
    warn_unserved(RunSummary.from_json_dict(summary))
    typer.echo(f"wrote {out}/requests.jsonl, steps.jsonl, transfers.jsonl, pools.json, summary.json, metrics.prom")


@app.command("serve", **HELP)
@clean_errors
@flag_options(ENGINE_CLI_FLAGS, into="engine_flags")
def serve(
    host: Annotated[str, typer.Option("--host", help="address to listen on (0.0.0.0: every interface)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="port to listen on")] = 8000,
    served_model_name: Annotated[list[str] | None, typer.Option(
        "--served-model-name", help="model name(s) the API answers to (default: the Hugging Face id of a preset "
                                    "and its alias)")] = None,
    tokenizer: Annotated[str, typer.Option(
        "--tokenizer", help="auto, byte (the byte-level models) or word (one token per whitespace word; "
                            "docs/serve.md)")] = "auto",
    max_num_queued_reqs: Annotated[int | None, typer.Option(
        "--max-num-queued-reqs", min=1, help="requests in flight (waiting + running) beyond which a new one gets "
                                             "503 + Retry-After (default: unbounded, as vLLM)")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn's log level")] = "warning",
    engine_flags: dict | None = None,
) -> None:
    """The engine behind an OpenAI-compatible HTTP API, as `vllm serve` (server defaults):
    /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
    if tokenizer not in ("auto", "byte", "word"):
        _fail(f"--tokenizer {tokenizer!r}: use auto, byte or word")
    flags = dict(engine_flags or {})
    names = _served_names(flags.get("model", "tiny"), served_model_name)
    if not Path(flags.get("model", "tiny")).is_dir():
        flags["model"] = _preset_or_name(flags.get("model", "tiny"))
    cfg = EngineArgs(usage_context="api_server", **flags)
    _require_torch()
    from engine.preflight import check_engine_args

    _check_listen(host, port)  # before the model load and the warm-up
    check_engine_args(cfg)
    from engine.serve.server import build_served_model
    from engine.serve.server import serve as run_server

    model = build_served_model(cfg, names, tokenizer=tokenizer, max_num_queued_reqs=max_num_queued_reqs,
                               progress=lambda line: typer.echo(line, err=True))
    typer.echo(f"serving {', '.join(names)} on http://{host}:{port} (tokenizer: {model.tokenizer.name}, "
               f"max_model_len {model.max_model_len})", err=True)
    run_server(model, host, port, log_level=log_level)


def _check_listen(host: str, port: int) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.bind((host, port))
    except OSError as exc:
        _fail(f"--host {host} --port {port}: cannot listen there ({exc.strerror}); pick a free port or "
              "another address")


def _preset_or_name(name: str) -> str:
    from sim.models import preset_of

    try:
        return preset_of(name)
    except ValueError:
        return name  # not a preset: EngineArgs / the loader say what is wrong with it


def _served_names(model: str, given: list[str] | None) -> list[str]:
    """--served-model-name, else the preset's Hugging Face id then its alias (both accepted)."""
    if given:
        return list(dict.fromkeys(given))
    from sim.models import hf_model_id

    if Path(model).is_dir():
        return [model]
    return list(dict.fromkeys([hf_model_id(model), _preset_or_name(model)]))


@app.command("bench", **HELP)
@clean_errors
@flag_options(ENGINE_CLI_FLAGS, into="engine_flags")
def bench(
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="prompts to generate")] = 64,
    input_len: Annotated[int, typer.Option("--input-len", help="tokens per prompt")] = 128,
    output_len: Annotated[int, typer.Option("--output-len", help="tokens generated per prompt")] = 64,
    engine_flags: dict | None = None,
) -> None:
    """Offline throughput as vLLM's `LLM` class sees it (offline defaults): N random prompts of
    fixed lengths, all at once, ignore_eos."""
    _check_bench_sizes(num_prompts, input_len, output_len)
    _require_torch()
    import time

    import numpy as np

    from engine.llm import LLM
    from engine.preflight import check_engine_args
    from engine.sampling import SamplingParams

    cfg = EngineArgs(usage_context="offline", **(engine_flags or {}))
    check_engine_args(cfg)  # device, backend, model size: before the model is built
    llm = LLM(**cfg.model_dump())
    _check_bench_length(input_len, output_len, llm.engine.max_model_len)
    rng = np.random.default_rng(cfg.seed)
    vocab = llm.engine.spec.vocab_size
    prompts = [rng.integers(16, vocab, input_len).tolist() for _ in range(num_prompts)]
    sp = SamplingParams(max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    t = time.perf_counter()
    outs = llm.generate(prompts, sp)
    wall = time.perf_counter() - t
    gen = sum(len(o.token_ids) for o in outs)
    llm.close()  # the tensor-parallel workers, if any
    typer.echo(json.dumps({"model": cfg.model, "device": str(llm.engine.device), "num_prompts": num_prompts,
                           "input_len": input_len, "output_len": output_len, "wall_s": wall,
                           "output_tokens_per_s": gen / wall,
                           "total_tokens_per_s": (gen + num_prompts * input_len) / wall,
                           **_spec_stats(llm.engine.scheduler.stats)}, indent=2))


def _spec_stats(stats) -> dict:
    """vLLM's spec-decode figures of a bench run (nothing without drafts)."""
    drafts, tokens, accepted = stats.num_spec_drafts, stats.num_spec_draft_tokens, stats.num_spec_accepted_tokens
    if not drafts:
        return {}
    return {"spec_decode_num_drafts": drafts, "spec_decode_draft_tokens": tokens,
            "spec_decode_accepted_tokens": accepted, "spec_decode_acceptance_rate": accepted / tokens,
            "spec_decode_acceptance_length": 1 + accepted / drafts}
