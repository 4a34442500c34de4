"""bench_moe_h200.py's next GPU call (`--focus --run5`) as a CPU dry run: a file of its own so the test
runner can put it beside the other dry run (each takes a minute or more in the interpreter)."""

from __future__ import annotations

import json

from benchmarks.kernels.test_bench_moe import run_bench


def test_focus_run5_dry_run_times_run4s_best_against_run5s_plans(tmp_path):
    """The next GPU call's mode (`--focus --run5`) on the CPU: every run 5 feature passes the probe and
    each T's row holds run 4's best (the baseline) beside run 5's plans. The check part is skipped here
    (it doubles the interpreter's time): tests/kernels/test_moe_run5.py checks every run 5 plan against
    the float32 loop."""
    from kernels.moe_plans import DIRECT_RUN5, plan_key, run4_best

    done = run_bench("benchmarks/kernels/bench_moe_h200.py", "--out", str(tmp_path), "--dry-run", "--focus", "--run5",
                "--tokens", "16", "1", "--skip", "check")
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((tmp_path / "moe.json").read_text())
    assert res["errors"] == [] and res["meta"]["focus_baseline"] == "run4_best"
    assert {"sorted", "fused"} <= set(res["meta"]["probe_ok"])
    rows = {r["T"]: r for r in res["speed"]}
    assert set(rows) == {1, 16}
    one = rows[1]["fused_by_tiles"]
    assert rows[1]["run3_plan"] == plan_key(run4_best(1)) and {plan_key(p) for p in DIRECT_RUN5} | {
        plan_key(run4_best(1))} == set(one)
    assert any(" sorted persist1" in key for key in rows[16]["fused_by_tiles"])  # the shrunk prefill plans
    assert "run 4 best" in (tmp_path / "moe.md").read_text()
