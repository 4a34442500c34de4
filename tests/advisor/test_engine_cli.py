"""`costline engine bench` and `costline engine run` end to end on the CPU (tiny model)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from costline.cli import app
from costline.engine_commands import ENGINE_CLI_FLAGS


def _reject_constant(name: str) -> None:
    raise AssertionError(f"{name} in the output: not strict JSON")


def _json_head(text: str) -> dict:
    """The JSON object the command printed first; strict (NaN/Infinity fail)."""
    return json.loads(text[: text.rindex("}") + 1], parse_constant=_reject_constant)


def test_engine_bench_reports_throughput():
    res = CliRunner().invoke(app, ["engine", "bench", "--model", "tiny", "--device", "cpu",
                                   "--num-prompts", "3", "--input-len", "8", "--output-len", "4"])
    assert res.exit_code == 0, res.output
    out = _json_head(res.output)
    assert out["num_prompts"] == 3 and out["wall_s"] > 0
    # every prompt generates exactly --output-len tokens (vllm bench throughput ignores EOS)
    assert out["output_tokens_per_s"] == pytest.approx(3 * 4 / out["wall_s"])
    assert out["total_tokens_per_s"] == pytest.approx(3 * (8 + 4) / out["wall_s"])


def test_engine_run_replays_a_workload(tmp_path):
    prom = tmp_path / "m.prom"
    res = CliRunner().invoke(app, [
        "engine", "run", "--model", "tiny", "--device", "cpu", "--workload", "lab-random",
        "--first", "3", "--speedup", "1000", "--max-prompt-len", "48", "--max-model-len", "256",  # short warm-up
        "--out", str(tmp_path), "--metrics-file", str(prom)])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    printed = _json_head(res.stdout)  # the saved summary, None values left out
    assert "kernel variants compiled" in res.stderr  # the warm-up ran before the replay
    assert printed.pop("date") and printed == {k: v for k, v in summary.items() if v is not None and k != "date"}
    rows = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    steps = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert summary["num_prompts"] == 3 == len(rows)
    assert all(r["prompt_len"] <= 48 for r in rows)
    assert sum(s["num_output_tokens"] for s in steps) == sum(r["num_output_tokens"] for r in rows)
    assert "vllm:e2e_request_latency_seconds_bucket" in prom.read_text()


@pytest.mark.parametrize("command", ["run", "bench", "serve"])
@pytest.mark.parametrize("args, message", [
    (["--max-num-seqs", "0"], "--max-num-seqs 0: must be an integer >= 1"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5: must be in (0, 1]"),
    (["--max-num-batched-tokens", "16", "--max-num-seqs", "32"],
     "--max-num-batched-tokens 16: must be >= --max-num-seqs (32)"),
    (["--max-num-batched-tokens", "lots"], "--max-num-batched-tokens 'lots': use an integer"),
    (["--dtype", "int3"], "--dtype int3: must be one of auto, bfloat16, float16, float32"),
])
def test_bad_engine_flags_are_named_as_typed(command, args, message):
    res = CliRunner().invoke(app, ["engine", command, "--model", "tiny", "--device", "cpu", *args],
                             terminal_width=300)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert "max_num_seqs" not in res.output and "gpu_memory_utilization" not in res.output


def test_run_and_bench_share_the_engine_options_and_say_which_defaults():
    engine = typer.main.get_command(app).commands["engine"]

    def options(command: str) -> set[str]:
        return {o for p in engine.commands[command].params for o in (*p.opts, *p.secondary_opts)}

    shared = {s for f in ENGINE_CLI_FLAGS for s in f.spellings} | {"--disable-prefix-caching",
                                                                    "--no-enable-prefix-caching"}
    assert shared <= options("run") and shared <= options("bench") and shared <= options("serve")
    assert "vllm serve" in engine.commands["run"].help and "LLM" in engine.commands["bench"].help


def test_a_kv_cache_larger_than_memory_is_refused_before_allocating(tmp_path):
    # 1e11 blocks of the tiny model's 8 KiB: ~763 TiB, far beyond any machine; the allocator is
    # never asked (it would take minutes to fail, or be killed)
    res = CliRunner().invoke(app, ["engine", "run", "--model", "tiny", "--device", "cpu", "-w", "lab-random",
                                   "--first", "2", "--num-gpu-blocks-override", "100000000000",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    assert "--num-gpu-blocks-override 100000000000: needs 762,939.5 GiB of KV cache" in res.output
    assert "lower --num-gpu-blocks-override" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "run").exists()


def test_serve_refuses_a_busy_port_and_a_bad_tokenizer_before_building(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = CliRunner().invoke(app, ["engine", "serve", "--device", "cpu", "--port", str(port)], terminal_width=300)
    assert res.exit_code == 2 and f"--port {port}: cannot listen there" in res.output, res.output
    res = CliRunner().invoke(app, ["engine", "serve", "--device", "cpu", "--tokenizer", "bpe"], terminal_width=300)
    assert res.exit_code == 2 and "--tokenizer 'bpe': use auto, byte or word" in res.output


def test_serve_answers_to_the_hf_id_and_the_alias():
    from costline.engine_commands import _preset_or_name, _served_names

    assert _served_names("llama-3.1-8b", None) == ["meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"]
    assert _served_names("meta-llama/Llama-3.1-8B", None) == ["meta-llama/Llama-3.1-8B", "llama-3.1-8b"]
    assert _served_names("tiny", None) == ["tiny"]
    assert _served_names("tiny", ["a", "b", "a"]) == ["a", "b"]
    assert _preset_or_name("Meta-Llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b"
    assert _preset_or_name("no-such-model") == "no-such-model"
