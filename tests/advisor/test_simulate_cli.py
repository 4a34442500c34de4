"""`costline simulate`: a thin caller of `sim.run`; vLLM's flag spellings; errors name the flag as typed."""

from __future__ import annotations

import json
import shlex

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from advisor.options import clean_errors, flag_options
from costline.cli import app
from sim.config import ENGINE_CONFIG_FLAGS, EngineConfig
from sim.metrics import jsonable
from sim.run import SimConfig, run
from sim.workload_source import SourceOptions

runner = CliRunner()
# Differ from run to run by nature: the clock, and the wall time of the simulation.
UNSTABLE = {"date", "wall_s", "simulated_requests_per_wall_s"}

parser = typer.Typer()


@parser.command()
@clean_errors
@flag_options(ENGINE_CONFIG_FLAGS, into="flags")
def parse(flags: dict | None = None) -> None:
    """Print the EngineConfig the engine options describe (what `simulate` builds)."""
    typer.echo(EngineConfig(**(flags or {})).model_dump_json())


def parsed(args: list[str]) -> EngineConfig:
    res = runner.invoke(parser, args)
    assert res.exit_code == 0, res.output
    return EngineConfig.model_validate_json(res.output)


def test_simulate_and_compare(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    r1 = runner.invoke(app, ["simulate", "-w", "lab-poisson", "-n", "60", "--num-gpus", "2", "--out", str(a),
                             "--goodput", "ttft:200 tpot:20"])
    assert r1.exit_code == 0, r1.output
    assert "TTFT (ms)" in r1.output and "goodput" in r1.output
    r2 = runner.invoke(app, ["simulate", "-w", "lab-poisson", "-n", "60", "--disable-prefix-caching",
                             "--max-num-batched-tokens", "2K", "--out", str(b), "--json"])
    assert r2.exit_code == 0, r2.output
    s = json.loads(r2.output)
    assert s["num_gpus"] == 1 and "--disable-prefix-caching" in s["vllm_args"]
    assert "--max-num-batched-tokens 2048" in s["vllm_args"]
    r3 = runner.invoke(app, ["simulate", "--compare", str(a), str(b)])
    assert r3.exit_code == 0 and "p99_ttft_ms" in r3.output
    # the heading names the flags that differ (issue 28), not only the two folders
    words = " ".join(r3.output.split())
    assert ("A: --max-num-batched-tokens auto (default), --enable-prefix-caching (default) | "
            "B: --max-num-batched-tokens 2048, --disable-prefix-caching") in words
    bad = runner.invoke(app, ["simulate", "-w", "lab-poisson", "--model", "gpt-9"])
    assert bad.exit_code == 2 and "unknown model" in bad.output and "meta-llama/Llama-3.1-8B-Instruct" in bad.output


def test_json_summary_equals_the_api_summary():
    cli = runner.invoke(app, ["simulate", "-w", "lab-poisson", "-n", "40", "--num-gpus", "2", "--max-num-seqs",
                              "64", "--goodput", "ttft:200", "--seed", "3", "--json"])
    assert cli.exit_code == 0, cli.output
    config = SimConfig(num_gpus=2, engine=EngineConfig(max_num_seqs=64), slo="ttft:200", seed=3)
    api = jsonable(run("lab-poisson", config, source=SourceOptions(num_requests=40)).summary().to_json_dict())
    got = json.loads(cli.output)
    assert {k: v for k, v in got.items() if k not in UNSTABLE} == {k: v for k, v in api.items() if k not in UNSTABLE}


def test_disaggregation_options():
    r = runner.invoke(app, ["simulate", "-w", "lab-poisson", "-n", "30", "--disagg", "1:1", "--kv-link-gb-per-s",
                            "25", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["num_gpus"] == 2 and s["mean_kv_transfer_ms"] > 0 and "NixlConnector" in s["vllm_args"]
    bad = runner.invoke(app, ["simulate", "-w", "lab-poisson", "--disagg", "3-1"], terminal_width=300)
    assert bad.exit_code == 2 and "--disagg '3-1': give prefill:decode replica counts" in bad.output
    clash = runner.invoke(app, ["simulate", "-w", "lab-poisson", "--disagg", "1:1", "--num-gpus", "3"],
                          terminal_width=300)
    assert clash.exit_code == 2
    assert "--num-gpus 3: does not match --disagg 1:1 at --tensor-parallel-size 1 (2 GPUs)" in clash.output


@pytest.mark.parametrize("args, message", [
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5: must be in (0, 1]"),
    (["--max-num-batched-tokens", "100", "--max-num-seqs", "200"],
     "--max-num-batched-tokens 100: must be >= --max-num-seqs (200)"),
    (["--max-num-batched-tokens", "1k", "--max-model-len", "4k", "--disable-chunked-prefill"],
     "--max-num-batched-tokens 1000: must be >= --max-model-len (4000) when chunked prefill is off"),
    (["--max-num-seqs", "4096", "--gpu", "a100-80gb"],
     "--max-num-seqs 4096: must be <= --max-num-batched-tokens (2048, the default here)"),
    (["--tensor-parallel-size", "3"], "--tensor-parallel-size 3: must divide the model's 32 attention heads"),
    (["--block-size", "8"], "--block-size 8: must be a multiple of 16 for the flash_attn attention backend"),
    (["--scheduling-policy", "lifo"], "--scheduling-policy lifo: must be one of fcfs, priority"),
    (["--speculative-config", "{oops"], "--speculative-config '{oops': speculative_config is not valid JSON"),
    (["--sim-block-coarsening", "0"], "--sim-block-coarsening '0': use an integer from 1 to 64 or 'auto'"),
    (["--max-model-len", "200000"], "--max-model-len 200000: exceeds the model's max_position_embeddings"),
])
def test_errors_name_the_flag_and_the_fix(args, message):
    res = runner.invoke(app, ["simulate", "-w", "lab-poisson", "-n", "5", *args], terminal_width=400)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert "validation error" not in res.output and "pydantic" not in res.output


BOOL_SPELLINGS = {  # spelling -> value, as vLLM 0.33's parser reads them
    "enable_prefix_caching": {"--enable-prefix-caching": True, "--disable-prefix-caching": False,
                              "--no-enable-prefix-caching": False},
    "enable_chunked_prefill": {"--enable-chunked-prefill": True, "--disable-chunked-prefill": False,
                               "--no-enable-chunked-prefill": False},
    "async_scheduling": {"--async-scheduling": True, "--no-async-scheduling": False},
}


@settings(max_examples=40, deadline=None)
@given(st.fixed_dictionaries({k: st.sampled_from([None, *v]) for k, v in BOOL_SPELLINGS.items()}),
       st.integers(1, 64), st.sampled_from(["", "k", "K"]))
def test_spellings_and_sizes(choice, n, unit):
    args = [s for s in choice.values() if s]
    args += ["--max-model-len", f"{n}{unit}", "--max-num-batched-tokens", "64K"]
    cfg = parsed(args)
    for field, spelling in choice.items():
        want = EngineConfig.model_fields[field].default if spelling is None else BOOL_SPELLINGS[field][spelling]
        assert getattr(cfg, field) is want
    assert cfg.max_model_len == n * {"": 1, "k": 1000, "K": 1024}[unit]
    assert cfg.max_num_batched_tokens == 65536


def test_aliases():
    cfg = parsed(["-tp", "2", "-q", "fp8", "--device-memory-utilization", "0.5", "-sc",
                  '{"method":"ngram","num_speculative_tokens":3}'])
    assert (cfg.tensor_parallel_size, cfg.quantization, cfg.gpu_memory_utilization) == (2, "fp8", 0.5)
    assert cfg.speculative_config.num_speculative_tokens == 3


def test_printed_vllm_args_parse_back_to_the_same_config():
    cfg = EngineConfig(max_num_batched_tokens=16384, max_num_seqs=64, block_size=32, gpu_memory_utilization=0.8,
                       enable_prefix_caching=False, enable_chunked_prefill=False, max_model_len=8192,
                       scheduling_policy="priority", kv_cache_dtype="fp8", tensor_parallel_size=2,
                       async_scheduling=True, prefix_caching_hash_algo="xxhash", long_prefill_token_threshold=128,
                       speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    args = shlex.split(" ".join(cfg.to_vllm_args()))  # as a shell would pass them
    assert parsed(args) == cfg


def test_simulate_help_says_it_models_vllm_serve():
    command = typer.main.get_command(app).commands["simulate"]
    assert "vllm serve" in command.help
    spellings = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    assert {s for f in ENGINE_CONFIG_FLAGS for s in f.spellings} <= spellings
    assert {"--kv-link-gb-per-s", "--format", "--num-requests", "--rate"} <= spellings


def test_an_error_names_the_alias_the_user_typed(monkeypatch):
    args = ["simulate", "-w", "lab-poisson", "-n", "5", "-tp", "3"]
    monkeypatch.setattr("sys.argv", ["costline", *args])
    res = runner.invoke(app, args, terminal_width=300)
    assert res.exit_code == 2 and "-tp 3: must divide the model's 32 attention heads" in res.output
    assert "--tensor-parallel-size" not in res.output
