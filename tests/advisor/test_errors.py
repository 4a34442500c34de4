"""Validation failures read as plain words naming the option as typed, never pydantic's own
message (internal type names, a documentation URL)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from costline.cli import app

runner = CliRunner()


@pytest.mark.parametrize("args, message", [
    (["simulate", "-w", "lab-poisson", "-n", "5", "--num-gpus", "0"], "--num-gpus 0: must be >= 1"),
    (["simulate", "-w", "lab-poisson", "-n", "5", "--router", "fastest"],
     "--router 'fastest': must be one of 'round_robin', 'least_loaded' or 'prefix_aware'"),
    (["engine", "bench", "--model", "tiny", "--device", "cpu", "--num-prompts", "-3"],
     "error: --num-prompts -3: must be an integer >= 1"),
    (["engine", "bench", "--model", "tiny", "--device", "cpu", "--output-len", "0"],
     "error: --output-len 0: must be an integer >= 1"),
])
def test_plain_messages(args, message):
    res = runner.invoke(app, args, terminal_width=300)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert "pydantic" not in res.output and "errors.pydantic.dev" not in res.output
