"""speed_against_commit's arithmetic: best of each side, the ratio, and refusal of unlike runs."""

from __future__ import annotations

import pytest

from benchmarks.sim.speed_against_commit import compare


def _run(rps, steps=64693, rows=10246):
    return {"simulated_requests_per_cpu_s": rps, "requests": 4000, "engine_steps": steps, "step_rows": rows,
            "completed": 4000}


def test_best_of_each_side_and_the_ratio_at_the_reference_machine():
    got = compare({"earlier": [_run(3859), _run(4739)], "here": [_run(10438), _run(11364)]}, 5775.0)
    assert got["best"] == {"earlier": 4739, "here": 11364}
    assert got["speedup"] == pytest.approx(2.398, abs=5e-4)
    assert got["at_reference_machine"] == round(5775 * 11364 / 4739)  # 13,848


def test_runs_that_simulate_different_steps_are_refused():
    with pytest.raises(SystemExit, match="step_rows"):
        compare({"earlier": [_run(4000)], "here": [_run(12000, rows=9000)]}, 5775.0)
