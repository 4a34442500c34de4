"""`costline workload ...` and `costline demo`: reports, export, time options, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from costline.cli import app

MOONCAKE = "mooncake_conversation_trace.jsonl.gz"
AZURE = "AzureLLMInferenceTrace_code.csv.gz"
runner = CliRunner()


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode())
    return path


@pytest.mark.parametrize("name, figures", [
    (MOONCAKE, ["12,031", "3,537.0 s", "3.40 req/s", "index of dispersion 7.9", "37.4% of prompt tokens",
                "36.6% of block", "mean 12,035.1", "p50 6,909", "p90 27,367", "p99 85,400", "mean 342.6",
                "p50 350", "p90 597", "p99 1,119", "CV 3.03"]),
    (AZURE, ["8,819", "3,435.9 s", "2.57 req/s", "index of dispersion 13.2", "mean 2,047.8", "p50 1,469",
             "p90 5,188", "p99 7,436", "mean 27.9", "p50 13 ", "p90 55 ", "p99 251 ", "CV 13.15"]),
])
def test_cli_describe_prints_the_readme_figures(traces_dir, name, figures):
    res = runner.invoke(app, ["workload", "describe", str(traces_dir / name)], terminal_width=250)
    assert res.exit_code == 0, res.output
    for f in figures:
        assert f in res.output, f
    js = runner.invoke(app, ["workload", "describe", str(traces_dir / name), "--json"])
    assert json.loads(js.output)["requests"] in (12_031, 8_819)


def test_cli_export_prints_the_vllm_replay_command(tmp_path):
    out = tmp_path / "x.jsonl"
    res = runner.invoke(app, ["workload", "export", "lab-poisson", "-n", "50", "-o", str(out)], terminal_width=300)
    assert res.exit_code == 0, res.output
    assert "--timed-trace-chunk-hash-size 16" in res.output
    assert len(out.read_text().splitlines()) == 50


def test_time_options_in_the_cli():
    res = runner.invoke(app, ["workload", "describe", "azure-code-2023", "--json", "--start-s", "600",
                              "--end-s", "1200", "--first", "500", "--rate", "10"])
    d = json.loads(res.output)
    assert d["requests"] == 500 and d["mean_rate_rps"] == pytest.approx(10.0)


# ----------------------------------------------------------------------------- bad input


def test_cli_unknown_preset_and_bad_spec_exit_2(tmp_path):
    res = runner.invoke(app, ["workload", "describe", "no-such-preset"])
    assert res.exit_code == 2 and "neither a preset" in res.output
    p = write(tmp_path / "s.json", json.dumps({"arrival": {"kind": "poisson", "rate_rps": 0},
                                               "prompt_tokens": {"kind": "fixed", "tokens": 4},
                                               "output_tokens": {"kind": "fixed", "tokens": 4}}))
    res = runner.invoke(app, ["workload", "describe", str(p)], terminal_width=300)
    assert res.exit_code == 2 and "field 'arrival.rate_rps'" in res.output and "Traceback" not in res.output


def test_demo_describes_the_bundled_chat_workload(monkeypatch):
    """`costline demo`: the bundled workload described, then the real advise command with the demo's
    arguments (400 requests of chat-production, 8B on one H200, the quick budget), run here on 60 of
    them: the 400-request search took ~17 CPU s of the suite and searches as the advise tests do."""
    from advisor.commands import advise as advise_cmd

    real, calls = advise_cmd.advise, []

    def smaller(**kwargs):
        calls.append(kwargs)
        return real(**{**kwargs, "num_requests": 60})

    monkeypatch.setattr(advise_cmd, "advise", smaller)
    res = CliRunner().invoke(app, ["demo"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "chat-production" in res.output and "2,000" in res.output and "prefix reuse" in res.output
    assert calls == [{"workload": "chat-production", "model": "llama-3.1-8b", "gpu": "h200", "num_gpus": 1,
                      "slo": "ttft_p99:500 tpot_p99:50", "budget": "quick", "num_requests": 400}]
    assert "verdict:" in res.output and "vllm serve meta-llama/Llama-3.1-8B-Instruct" in res.output


def test_every_command_reading_a_source_has_the_same_source_options():
    import typer

    root = typer.main.get_command(app)
    workload, engine = root.commands["workload"], root.commands["engine"]

    def options(command) -> set[str]:
        return {o for p in command.params for o in p.opts if o.startswith("-")}

    full = options(workload.commands["describe"])
    assert {"--format", "--lenient", "--hash-block-size", "--keep-failed", "--spread", "--seed", "--num-requests",
            "--start-s", "--end-s", "--first", "--speedup", "--rate"} <= full
    assert full - {"--json"} <= options(workload.commands["export"]) | {"--json"}
    # simulate and engine run take --seed for the run itself (it also seeds a generated workload)
    for command in (root.commands["simulate"], engine.commands["run"]):
        assert full - {"--json", "--seed"} <= options(command)
    assert options(workload.commands["fit"]) >= full - {"--json", "--num-requests", "-n", "--speedup", "--rate"}


def test_source_options_reach_the_loader(tmp_path):
    from sim.workload_source import SourceOptions, load_workload

    res = runner.invoke(app, ["workload", "describe", "lab-poisson", "-n", "77", "--seed", "4", "--speedup", "2",
                              "--json"])
    d = json.loads(res.output)
    wl = load_workload("lab-poisson", SourceOptions(num_requests=77, seed=4, speedup=2.0))
    assert d["requests"] == 77 and d["duration_s"] == pytest.approx(float(wl.arrival_s[-1] - wl.arrival_s[0]))
