"""The tensor-parallel benchmark scripts on the CPU: their summaries on hand-made rows, and their
dry runs (gloo, tiny models), which take the paths the GPU calls take."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.tp import h200x2, one_gpu


def test_one_gpu_summary_ratio_noise_and_verdict():
    plan = one_gpu.Plan.of(True, "tiny")
    rows = []
    for batch, ctx in plan.grid:
        for eng, ms in (("plain", 10.0), ("tp1", 10.1), ("tp1-nccl", 10.6), ("plain", 10.2)):
            rows.append({"engine": eng, "batch": batch, "context": ctx, "gpu_ms_p50": ms})

    class Core:
        class spec:
            num_layers = 2

    out = one_gpu.summarize(rows, plan, {"plain": Core, "tp1": Core, "tp1-nccl": Core})
    row = out["grid"][0]
    assert row["gpu_ms"]["plain"] == pytest.approx(10.1)  # median of its two slots
    assert row["tp1_over_plain"] == pytest.approx(10.1 / 10.1)
    assert row["noise"] == pytest.approx(0.2 / 10.1)
    assert out["collectives_per_step"] == 2 * 2 + 2
    assert row["nccl_extra_us_per_collective"] == pytest.approx(1e3 * 0.5 / 6)
    assert out["verdict_tp1_costs_nothing"] is True


def test_h200x2_compare_and_plans():
    runs = [{"name": "decode-b8-c512", "tpot_p50_ms": 10.0}]
    parts = {"8b-tp1": {"runs": runs, "greedy_tokens": [[1, 2]]},
             "8b-tp2": {"runs": [{"name": "decode-b8-c512", "tpot_p50_ms": 6.0}], "greedy_tokens": [[1, 2]]}}
    got = h200x2.compare(parts)["8b"]
    assert got == {"tokens_equal": True, "tpot_tp2_over_tp1": {"decode-b8-c512": 0.6}}
    plan = h200x2.model_plan("70b40-tp2", dry=False)
    assert (plan.name, plan.tp, plan.base) == ("llama-3.1-70b-40l", 2, "llama-3.1-70b")
    assert h200x2.model_plan("70b-tp2", dry=False).layers is None


def test_one_gpu_dry_run(tmp_path):
    assert one_gpu.main(["--dry-run", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    tokens = res["phases"]["tokens"]["value"]
    assert tokens["equal"] == {"plain": True, "tp1": True, "tp1-nccl": True}
    assert res["phases"]["build"]["value"]["collectives_captured"]["all_reduce"] > 0
    assert len(res["phases"]["steps"]["value"]["grid"]) == 2


def test_h200x2_dry_run_one_model(tmp_path):
    assert h200x2.main(["--dry-run", "--out", str(tmp_path), "--parts", "collectives,8b-tp1,8b-tp2"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["phases"]["compare"]["value"]["8b"]["tokens_equal"] is True
    assert res["phases"]["collectives"]["rows"] > 0
    run = json.loads(next((tmp_path / "runs" / "tiny" / "tp2" / "fit").glob("*/run.json")).read_text())
    assert run["engine_args"]["tensor_parallel_size"] == 2
    assert "fit" in res["phases"]  # the TP fit ran (on CPU times its terms may be refused: named, not raised)


def test_one_gpu_shared_dry_run(tmp_path, monkeypatch):
    from benchmarks.tp import one_gpu_shared

    monkeypatch.setenv("COSTLINE_TP_SHARE_DEVICE", "0")  # the script sets it to 1; restored after
    assert one_gpu_shared.main(["--dry-run", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    for mode in ("sync", "async"):
        v = res["phases"]["fp32"]["value"][mode]
        assert v["tokens_equal"] and v["all_reduces_per_forward"] == v["expected_per_forward"]
    assert res["phases"]["fp32"]["value"]["async"]["counts"]["broadcast"] > 0  # in-flight tokens sent
    assert one_gpu_shared.agreement([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5]]) == 3 / 5
