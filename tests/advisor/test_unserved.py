"""Requests that could never be served are counted by reason in the summary (engine and
simulator alike) and announced on the terminal with the fix."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from typer.testing import CliRunner

from advisor.report import unserved_lines
from costline.cli import app
from engine.core.request import Request
from engine.core.run_summary import reason_counts, rejection_kind
from engine.core.scheduler import Scheduler, SchedulerConfig

runner = CliRunner()


def mooncake(path: Path, prompt_lens: list[int], output_len: int = 5) -> Path:
    """A trace with these prompt lengths, 0.1 s apart, no shared prefixes (512-token hash blocks)."""
    lines, next_id = [], 0
    for i, n in enumerate(prompt_lens):
        ids = list(range(next_id, next_id + -(-n // 512)))
        next_id += len(ids)
        lines.append(json.dumps({"timestamp": 100 * i, "input_length": n, "output_length": output_len,
                                 "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def scheduler_reason(prompt_len: int, **config) -> str:
    sched = Scheduler(SchedulerConfig(**config))
    sched.add_request(Request(0, 0.0, prompt_len, 5, tuple(range(-(-prompt_len // 16)))))
    (_rid, reason), = sched.schedule().rejected
    return reason


def test_one_cause_is_one_kind_whatever_the_request():
    a = scheduler_reason(900, max_model_len=800, num_gpu_blocks=1000)
    b = scheduler_reason(1900, max_model_len=800, num_gpu_blocks=1000)
    assert a != b and rejection_kind(a) == rejection_kind(b) == "exceeds max_model_len = 800"
    c = scheduler_reason(900, max_model_len=4096, num_gpu_blocks=40)
    assert rejection_kind(c) == "exceeds num_gpu_blocks = 40"
    assert rejection_kind("something else") == "something else"


def test_reason_counts_from_a_hand_made_table():
    r = {"status": np.array(["finished", "rejected", "rejected", "unfinished", "rejected"]),
         "finish_reason": np.array(["length", "x = 5 tokens exceeds max_model_len = 8", "blocks but num_gpu_blocks = 2",
                                    "", "y = 9 tokens exceeds max_model_len = 8"])}
    assert reason_counts(r) == {
        "rejected_reasons": {"exceeds max_model_len = 8": 2, "exceeds num_gpu_blocks = 2": 1},
        "unfinished_reasons": {"still in flight when the run stopped": 1}}
    lines = unserved_lines(SimpleNamespace(num_prompts=5, **reason_counts(r)))
    assert lines[0] == ("2 of 5 requests could never be served: exceeds max_model_len = 8; "
                        "raise --max-model-len (up to the model's context length) or send shorter requests")
    assert "--gpu-memory-utilization" in lines[1] and lines[2].startswith("1 of 5 requests did not finish")
    assert unserved_lines(SimpleNamespace(num_prompts=5, rejected_reasons={}, unfinished_reasons={})) == []


def test_simulate_counts_and_announces_rejections(tmp_path):
    lens = [100, 700, 300, 2000, 50, 1500]
    trace = mooncake(tmp_path / "t.jsonl", lens)
    res = runner.invoke(app, ["simulate", "-w", str(trace), "--max-model-len", "1000", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)  # the warning goes to stderr: stdout stays JSON
    expected = sum(n + 5 > 1000 for n in lens)
    assert summary["rejected"] == expected == 2
    assert summary["rejected_reasons"] == {"exceeds max_model_len = 1000": 2}
    assert summary["unfinished_reasons"] == {}
    assert "warning: 2 of 6 requests could never be served: exceeds max_model_len = 1000; raise --max-model-len" \
        in res.output
    clean = runner.invoke(app, ["simulate", "-w", str(trace), "--max-model-len", "4096"])
    assert clean.exit_code == 0 and "could never be served" not in clean.output


def test_engine_run_counts_and_announces_rejections(tmp_path):
    # a 512-token context keeps the engine's warm-up short (its prompts go up to the context length)
    trace = mooncake(tmp_path / "t.jsonl", [40, 600, 30])
    res = runner.invoke(app, ["engine", "run", "--model", "tiny", "--device", "cpu", "-w", str(trace),
                              "--speedup", "1000", "--max-model-len", "512", "--out", str(tmp_path / "e")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert summary["rejected"] == 1 and summary["completed"] == 2
    assert summary["rejected_reasons"] == {"exceeds max_model_len = 512": 1}
    assert "1 of 3 requests could never be served: exceeds max_model_len = 512" in res.output
