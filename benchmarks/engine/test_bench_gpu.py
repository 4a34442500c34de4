"""benchmarks/engine/bench_gpu.py: the host time of large decode steps, sync against async, and its
tiny part A end to end on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.engine import bench_gpu
from engine.core.records import StepRecord

ROOT = Path(__file__).resolve().parents[2]


def _step(prefill: int, decodes: int, schedule_s: float, prepare_s: float, sample_s: float) -> StepRecord:
    return StepRecord(num_prefill_tokens=prefill, num_prefill_seqs=int(prefill > 0), num_decode_seqs=decodes,
                      num_decode_tokens=decodes, schedule_s=schedule_s, prepare_s=prepare_s, sample_s=sample_s)


def test_bench_gpu_host_time_of_large_decode_steps():
    steps = [_step(0, 128, 1e-4, 2e-4, 3e-5), _step(0, 120, 3e-4, 4e-4, 5e-5),
             _step(0, 119, 9.0, 9.0, 9.0), _step(64, 127, 9.0, 9.0, 9.0)]  # too small / mixed: left out
    h = bench_gpu.host_decode_ms(steps, 120)
    assert h["num_steps"] == 2
    assert h["schedule_s"] == pytest.approx(0.2) and h["prepare_s"] == pytest.approx(0.3)
    assert h["sample_s"] == pytest.approx(0.04) and h["schedule_plus_prepare"] == pytest.approx(0.5)
    assert bench_gpu.host_decode_ms(steps[2:], 120)["schedule_s"] is None
    a = {"ours": {"output_tokens_per_s": 1000.0, "host_ms_decode_only": h},
         "ours_sync": {"output_tokens_per_s": 880.0, "host_ms_decode_only": h}}
    sva = bench_gpu.sync_vs_async(a)
    assert sva["throughput_ratio_sync_over_async"] == pytest.approx(0.88) and not sva["meets_target"]
    a["ours_sync"]["output_tokens_per_s"] = 910.0
    assert bench_gpu.sync_vs_async(a)["meets_target"]
    assert bench_gpu.sync_vs_async({"ours": a["ours"]}) is None


def test_bench_gpu_tiny_part_a_reports_host_time(tmp_path):
    skip = "hf_static,hf_cb,mooncake,profile,ours_old_decode_path"
    env = os.environ | {"TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks/engine/bench_gpu.py"), "--tiny", "--out", str(tmp_path),
                    "--skip", skip, "--budget-s", "120"], check=True, env=env, capture_output=True, cwd=ROOT)
    a = json.loads((tmp_path / "engine_bench.json").read_text())["part_a"]
    for mode in ("ours", "ours_sync"):
        h = a[mode]["host_ms_decode_only"]
        assert h["min_batch"] == 8 and h["num_steps"] > 0 and h["prepare_s"] > 0
        assert a[mode]["gc"]["frozen_objects"] > 0
    sva = a["sync_vs_async"]
    assert sva["throughput_ratio_sync_over_async"] == pytest.approx(
        a["ours_sync"]["output_tokens_per_s"] / a["ours"]["output_tokens_per_s"])
