"""bench_moe_h200.py's focus mode (`--focus --run6`, the round whose plans the engine runs) as a CPU dry
run: a file of its own so the test runner can put it beside the other dry run (each takes half a minute
or more in the interpreter)."""

from __future__ import annotations

import json

from benchmarks.kernels.test_bench_moe import NO_BUDGET, run_bench


def test_focus_run6_dry_run_times_run5s_best_against_run6s_plans(tmp_path):
    """The focus mode (`--focus --run6`) on the CPU: the features its plans need pass the probe (only those are probed) and each
    T's row holds run 5's best (the baseline) beside run 6's plans. The check part is skipped here (it
    doubles the interpreter's time): tests/kernels/test_moe_run5.py checks every run 6 plan against
    the float32 loop."""
    from kernels.moe_plans import DIRECT_RUN6, plan_key, run5_best

    done = run_bench("benchmarks/kernels/bench_moe_h200.py", "--out", str(tmp_path), "--dry-run", *NO_BUDGET, "--focus", "--run6",
                "--tokens", "16", "1", "--skip", "check")
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((tmp_path / "moe.json").read_text())
    assert res["errors"] == [] and res["meta"]["focus_baseline"] == "run5_best"
    assert {"sorted", "joint", "pipe"} <= set(res["meta"]["probe_ok"])  # what run 6 times
    rows = {r["T"]: r for r in res["speed"]}
    assert set(rows) == {1, 16}
    one = rows[1]["fused_by_tiles"]
    assert rows[1]["run3_plan"] == plan_key(run5_best(1)) and {plan_key(p) for p in DIRECT_RUN6} | {
        plan_key(run5_best(1))} == set(one)
    assert any(" upersist1" in key for key in rows[16]["fused_by_tiles"])  # the shrunk prefill plans
    assert "baseline (run5_best)" in (tmp_path / "moe.md").read_text()
