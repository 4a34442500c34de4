"""benchmarks/kernels/bench_moe_h200.py's dry run on the CPU (interpreter, tiny shapes) writes its JSON
and report with every part, and fit_moe.py reads them back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def test_dry_run_measures_every_part_and_the_fit_reads_it(tmp_path):
    done = _run("benchmarks/kernels/bench_moe_h200.py", "--out", str(tmp_path), "--dry-run")
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((tmp_path / "moe.json").read_text())
    assert res["errors"] == []
    assert all(r["ok"] for r in res["check"]) and len(res["check"]) >= 6
    assert [r["T"] for r in res["speed"]] == [1, 4, 16]
    assert all(r["touched_experts"] <= r["E"] and "fused_us" in r and "loop_us" in r for r in res["speed"])
    assert {r["kind"] for r in res["engine"]} >= {"decode", "prefill"}
    assert {r["model"] for r in res["engine"]} == {"tiny-moe", "tiny-moe-all"}  # part 3 and part 4
    assert "| tiny-moe | 1 |" in (tmp_path / "moe.md").read_text()
    fit = _run("benchmarks/kernels/fit_moe.py", str(tmp_path / "moe.json"))
    assert fit.returncode == 0, fit.stderr[-2000:]
    assert "## tiny-moe" in fit.stdout and "| tiny-moe-all | True | decode | 1 |" in fit.stdout
