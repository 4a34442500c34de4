"""benchmarks/engine/diagnose.py end to end on the CPU (tiny model): every part runs in its own
process and writes its figures (the GPU run is the real check; this one keeps the script working)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine" / "diagnose.py"


@pytest.mark.slow
def test_every_part_writes_its_figures(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "all", "--tiny", "--out", str(tmp_path)], check=False,
                       capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    parts = json.loads((tmp_path / "all.json").read_text())["parts"]
    assert {k: v["rc"] for k, v in parts.items()} == {"startup-tiny": 0, "drift": 0, "host": 0}
    start = json.loads((tmp_path / "startup-tiny.json").read_text())
    assert start["ready_s"] > 0 and [p["name"] for p in start["startup"]["phases"]][:2] == ["model", "KV cache"]
    drift = json.loads((tmp_path / "drift.json").read_text())
    assert len(drift["replays"]) == 2 and drift["replays"][0]["steps"] == drift["replays"][1]["steps"] > 0
    host = json.loads((tmp_path / "host.json").read_text())
    for mode in ("async", "sync"):
        parts = host[mode]["per_step_us"]
        assert parts["prepare"] >= parts["_stage_block_tables"] > 0 and host[mode]["decode_steps_at_batch"] > 10
