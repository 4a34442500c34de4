"""`costline engine bench` and `costline engine run` end to end on the CPU (tiny model)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from advisor.cli import app


def _json_head(text: str) -> dict:
    return json.loads(text[: text.rindex("}") + 1])


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
    pytest.importorskip("sim.workload_source", reason="workload loading comes from the foundation branch")
    prom = tmp_path / "m.prom"
    res = CliRunner().invoke(app, [
        "engine", "run", "--model", "tiny", "--device", "cpu", "--workload", "lab-random",
        "--first", "3", "--speedup", "1000", "--max-prompt-len", "48", "--max-model-len", "2048",
        "--out", str(tmp_path), "--metrics-file", str(prom)])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    steps = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert summary["num_prompts"] == 3 == len(rows)
    assert all(r["prompt_len"] <= 48 for r in rows)
    assert sum(s["num_output_tokens"] for s in steps) == sum(r["num_output_tokens"] for r in rows)
    assert "vllm:e2e_request_latency_seconds_bucket" in prom.read_text()


def test_engine_run_bad_flag_names_it():
    res = CliRunner().invoke(app, ["engine", "run", "--model", "tiny", "--max-num-seqs", "0"])
    assert res.exit_code != 0
    assert "max_num_seqs" in res.output
