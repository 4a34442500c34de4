"""benchmarks/engine/bench_drift.py end to end on the CPU (tiny model): both GC modes, alternating,
no overwrite without --force, a spent budget."""

from __future__ import annotations

import json

from benchmarks.engine import bench_drift


def test_bench_drift_tiny_end_to_end(tmp_path):
    out = tmp_path / "drift"
    assert bench_drift.main(["--tiny", "--out", str(out), "--replays", "2", "--num-requests", "5"]) == 0
    doc = json.loads((out / "drift.json").read_text())
    assert set(doc["modes"]) == {"unfrozen", "frozen"}
    for mode, rows in doc["modes"].items():
        assert len(rows) == 2
        first, second = rows
        assert first["num_steps"] == second["num_steps"] == first["num_eager"] > 0  # CPU: no graphs
        assert (first["gc"]["frozen_objects"] > 0) == (mode == "frozen")
        # the same steps each replay, so the paired ratio exists
        assert second["eager_gpu_vs_first_paired"] > 0 and second["graph_gpu_vs_first_paired"] is None
    # the modes alternate in the engine
    assert [r["index_in_engine"] for r in doc["modes"]["unfrozen"]] == [1, 3]
    assert [r["index_in_engine"] for r in doc["modes"]["frozen"]] == [2, 4]
    assert bench_drift.main(["--tiny", "--out", str(out)]) == 2  # no overwrite without --force
    # a spent budget starts no replay, and says so
    assert bench_drift.main(["--tiny", "--out", str(out), "--force", "--budget-s", "0"]) == 0
    doc = json.loads((out / "drift.json").read_text())
    assert doc["modes"] == {"unfrozen": []} and "budget" in doc["stopped_early"]
