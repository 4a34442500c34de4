"""benchmarks/kernels/bench_moe_h200.py's dry run on the CPU (interpreter, tiny shapes) writes its JSON
and report with every part (old and new paths, the engine), and fit_moe.py reads them back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the GPU call's time budget (--budget-s 170) would cut a dry run on a slow CPU short (the speed part stops
# at 0.7 of it: ~120 s, where the dry run takes ~35 s on the 2-core machine and 2-3x that on slower ones)
NO_BUDGET = ("--budget-s", "3600")


def run_bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def test_dry_run_measures_every_part_and_the_fit_reads_it(tmp_path):
    done = run_bench("benchmarks/kernels/bench_moe_h200.py", "--out", str(tmp_path), "--dry-run", *NO_BUDGET)
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((tmp_path / "moe.json").read_text())
    assert res["errors"] == []
    assert all(r["ok"] for r in res["check"]) and len(res["check"]) >= 6
    assert [r["T"] for r in res["speed"]] == [1, 4, 16]
    assert all(r["touched_experts"] <= r["E"] and "fused_us" in r and "old_us" in r for r in res["speed"])
    assert any(k.startswith("direct") for k in res["speed"][0]["fused_by_tiles"])  # T=1: the direct path timed
    assert all(r["ok"] and len(r["errors_by_path"]) >= 6 for r in res["check"] if "errors_by_path" in r)
    assert {r["kind"] for r in res["engine"]} >= {"decode", "prefill"}
    assert {r["model"] for r in res["engine"]} == {"tiny-moe", "tiny-moe-all"}  # part 3 and part 4
    assert "| tiny-moe | 1 |" in (tmp_path / "moe.md").read_text()
    fit = run_bench("benchmarks/kernels/fit_moe.py", str(tmp_path / "moe.json"))
    assert fit.returncode == 0, fit.stderr[-2000:]
    assert "## tiny-moe" in fit.stdout and "| tiny-moe-all | True | decode | 1 |" in fit.stdout
