"""engine_plan_terms.py: the engine plan's time at each T from focus-mode results, the MoE factors
fitted from them into a profile file (only with --force), a clear error for a T whose engine plan no
file timed."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

from benchmarks.kernels import engine_plan_terms as ept
from kernels.moe_plans import engine_tiles, plan_key
from sim.cost_model import CostProfile, MoeTerms
from sim.hardware import get_gpu

ROOT = Path(__file__).resolve().parents[2]
START = ROOT / "benchmarks/calibration/data/moe/start/h200-qwen3-30b-a3b.json"


def _row(t: int, times: dict[str, float]) -> dict:
    return {"preset": "qwen3-30b-a3b", "T": t, "H": 2048, "N": 768, "E": 128, "k": 8,
            "touched_experts": 128.0 * (1 - (1 - 8 / 128) ** t), "fused_by_tiles": times}


def _file(path: Path, rows: list[dict]) -> Path:
    path.write_text(json.dumps({"meta": {"gpu": "NVIDIA H200", "date": "2026-12-03"}, "speed": rows}))
    return path


def test_the_engine_plan_time_is_taken_and_a_later_file_wins(tmp_path):
    one, big = plan_key(engine_tiles(1, 8, 128)), plan_key(engine_tiles(4096, 8, 128))
    a = _file(tmp_path / "a.json", [_row(1, {one: 30.0, "other plan": 10.0}), _row(4096, {big: 700.0})])
    b = _file(tmp_path / "b.json", [_row(1, {one: 23.3})])
    rows, dates = ept.engine_rows([a, b], "qwen3-30b-a3b")
    assert [(r["T"], r["fused_us"], r["fused_tiles"]) for r in rows] == [(1, 23.3, one), (4096, 700.0, big)]
    assert len(dates) == 2


def test_a_repeat_file_gives_the_engine_plans_median_even_as_a_candidate(tmp_path):
    """repeat_engine_plans.py's repeat.json: at T = 1 the plan the engine runs now was a --candidates row beside the
    plan it ran then; its median (not the row plan's, nor a failed candidate) is taken, and the layer comes from
    the file's meta."""
    one = plan_key(engine_tiles(1, 8, 128))
    focus = _file(tmp_path / "a.json", [_row(1, {one: 30.0})])
    repeat = tmp_path / "repeat.json"
    repeat.write_text(json.dumps({"meta": {"gpu": "NVIDIA H200", "date": "d", "layer": {"H": 2048, "N": 768, "E": 128,
                                                                                       "k": 8}},
                                  "rows": [{"T": 1, "plan": "the plan then", "median_us": 23.1, "touched_experts": 8.0,
                                            "candidates": [{"plan": one, "median_us": 22.1},
                                                           {"plan": "broken", "check_failed": "relative error 1"}]}]}))
    rows, _ = ept.engine_rows([focus, repeat], "qwen3-30b-a3b")
    (row,) = rows
    assert (row["fused_us"], row["fused_tiles"], row["touched_experts"]) == (22.1, one, 8.0)
    assert (row["H"], row["N"], row["E"], row["k"]) == (2048, 768, 128, 8)


def test_a_t_whose_engine_plan_was_not_timed_is_named(tmp_path):
    a = _file(tmp_path / "a.json", [_row(2, {"some other plan": 40.0})])
    with pytest.raises(SystemExit, match=r"T=2: the engine's plan .* is not among the timed plans"):
        ept.engine_rows([a], "qwen3-30b-a3b")


def test_into_needs_force_and_keeps_the_fixed_cost(tmp_path, monkeypatch):
    one, big = plan_key(engine_tiles(1, 8, 128)), plan_key(engine_tiles(4096, 8, 128))
    a = _file(tmp_path / "a.json", [_row(1, {one: 23.3}), _row(4096, {big: 653.4})])
    prof = tmp_path / "p.json"
    shutil.copy(START, prof)
    before = prof.read_text()
    monkeypatch.setattr(sys, "argv", ["engine_plan_terms.py", str(a), "--into", str(prof)])
    with pytest.raises(SystemExit, match="pass --force"):
        ept.main()
    assert prof.read_text() == before  # nothing written without --force
    monkeypatch.setattr(sys, "argv", ["engine_plan_terms.py", str(a), "--into", str(prof), "--force"])
    ept.main()
    old, new = CostProfile.load(START), CostProfile.load(prof)
    assert new.moe.layer_fixed_s == old.moe.layer_fixed_s and new.moe.routing_skew == old.moe.routing_skew
    assert [t for t, _ in new.moe.bytes_factor_by_tokens] == [1] and [t for t, _ in new.moe.flops_factor_by_tokens] == [4096]
    # by hand: T = 4096 is compute-bound; its factor is the time over the FLOPs of the rows the plan
    # computes: 2 T k (3 H N) FLOPs at the H200's bf16 rate times the profile's GEMM compute efficiency,
    # times the padding of each expert's Binomial(T, k/E) pairs to 128-row blocks, E[ceil(n / 128)]
    # summed over the pmf (not the survival-function sum the model uses)
    flops = 2 * 4096 * 8 * 3 * 2048 * 768
    side_s = flops / (get_gpu("h200").bf16_tflops * 1e12 * old.gemm_compute_efficiency)
    n = np.arange(4097)
    pad = 128 * 128 * (binom.pmf(n, 4096, 8 / 128) * np.ceil(n / 128)).sum() / (4096 * 8)
    assert 1.2 < pad < 1.3
    assert new.moe.flops_factor_by_tokens[0][1] == pytest.approx(653.4e-6 / (side_s * pad), abs=1e-4)
    assert new.moe.block_rows_by_tokens == ept.block_rows_knots(8, 128, 16384)


def test_block_knots_follow_the_engine_plan_at_every_step_size():
    knots = ept.block_rows_knots(8, 128, 9000)
    terms = MoeTerms(block_rows_by_tokens=knots)
    for t in range(1, 9001):
        assert terms.block_rows(t) == getattr(engine_tiles(t, 8, 128), "block_m", 1), t
