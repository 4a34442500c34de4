"""benchmarks/kernels/bench_moe_h200.py's dry run on the CPU (interpreter, tiny shapes) writes its JSON
and report with every part (old and new paths, the engine), and fit_moe.py reads them back."""

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
    assert all(r["touched_experts"] <= r["E"] and "fused_us" in r and "old_us" in r for r in res["speed"])
    assert any(k.startswith("direct") for k in res["speed"][0]["fused_by_tiles"])  # T=1: the direct path timed
    assert all(r["ok"] and len(r["errors_by_path"]) >= 6 for r in res["check"] if "errors_by_path" in r)
    assert {r["kind"] for r in res["engine"]} >= {"decode", "prefill"}
    assert {r["model"] for r in res["engine"]} == {"tiny-moe", "tiny-moe-all"}  # part 3 and part 4
    assert "| tiny-moe | 1 |" in (tmp_path / "moe.md").read_text()
    fit = _run("benchmarks/kernels/fit_moe.py", str(tmp_path / "moe.json"))
    assert fit.returncode == 0, fit.stderr[-2000:]
    assert "## tiny-moe" in fit.stdout and "| tiny-moe-all | True | decode | 1 |" in fit.stdout


def test_focus_run5_dry_run_times_run4s_best_against_run5s_plans(tmp_path):
    """The next GPU call's mode (`--focus --run5`) on the CPU: every run 5 feature passes the probe, every
    timed plan passed its check, and each T's row holds run 4's best (the baseline) beside run 5's plans."""
    from kernels.moe_plans import DIRECT_RUN5, plan_key, run4_best

    done = _run("benchmarks/kernels/bench_moe_h200.py", "--out", str(tmp_path), "--dry-run", "--focus", "--run5",
                "--tokens", "16", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((tmp_path / "moe.json").read_text())
    assert res["errors"] == [] and res["meta"]["focus_baseline"] == "run4_best"
    assert {"sorted", "fused"} <= set(res["meta"]["probe_ok"])
    assert res["check"] and all(r["ok"] for r in res["check"])
    rows = {r["T"]: r for r in res["speed"]}
    assert set(rows) == {1, 16}
    one = rows[1]["fused_by_tiles"]
    assert rows[1]["run3_plan"] == plan_key(run4_best(1)) and {plan_key(p) for p in DIRECT_RUN5} | {
        plan_key(run4_best(1))} == set(one)
    assert any(" sorted persist1" in key for key in rows[16]["fused_by_tiles"])  # the shrunk prefill plans
    assert "run 4 best" in (tmp_path / "moe.md").read_text()
