"""The two-GPU disaggregation benchmark's code path on the CPU (gloo, tiny model): the sweep, the
1P1D runs and the simulator comparison run end to end, and what they write agrees with itself
(transfer bytes = blocks x the tiny layout's block bytes, one link fit per transport, one table
row per served workload, every request finished)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_BLOCK_BYTES_16 = 2 * 2 * 16 * 2 * 16 * 4  # K/V x layers x tokens x KV heads x head_dim x fp32


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("disagg")
    subprocess.run([sys.executable, str(ROOT / "benchmarks/disagg/bench_h200x2.py"), "--dry-run", "--out", str(out),
                    "--phases", "env,sweep,pd"], check=True, cwd=ROOT, capture_output=True, timeout=600)
    return out


def test_sweep_rows_and_fits(bench):
    rows = [json.loads(x) for x in (bench / "sweep.jsonl").read_text().splitlines()]
    assert {r["transport"] for r in rows} == {"gloo", "ipc"}
    for r in rows:
        per_block = TINY_BLOCK_BYTES_16 * r["block_size"] // 16
        assert r["bytes"] == r["num_blocks"] * per_block and r["transfer_s"] > 0
    fits = json.loads((bench / "link_fit.json").read_text())
    assert set(fits) == {"gloo", "ipc"} and all(f["num_records"] == len(rows) // 2 for f in fits.values())


def test_simulator_comparison_covers_every_served_workload(bench, tmp_path):
    pd = json.loads((bench / "results.json").read_text())["phases"]["pd"]
    assert all(v["num_finished"] == v["num_requests"] and v["pools_intact"] for v in pd.values())
    md = tmp_path / "sim_vs_engine.md"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/disagg/fit_sim.py"), "--dry-run", "--bench", str(bench),
                    "--out", str(md)], check=True, cwd=ROOT, capture_output=True, timeout=600)
    text = md.read_text()
    assert "Simulated with the sweep fit" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| workload")]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == list(pd)
    assert "Median |error| over workloads: ttft_p50_ms" in text
