"""repeat_engine_plans.py: the per-T summary by hand, the earlier module's plan built from the same
fields (none for a direct plan or a field the earlier module lacks), and the dry run's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.kernels import repeat_engine_plans as rep
from kernels.fused_moe import MoeTiles
from kernels.moe_direct import DirectTiles

ROOT = Path(__file__).resolve().parents[2]


def test_summary_by_hand():
    roof = rep.roofline(128.0, 4096, 2048, 768, 8)
    assert roof["flops"] == 2 * 4096 * 8 * 3 * 2048 * 768  # 309.2 GFLOP
    row = rep.summary(4096, [640.0, 660.0, 650.0], roof)
    assert row["median_us"] == 650.0 and (row["min_us"], row["max_us"]) == (640.0, 660.0)
    assert row["median_tflops"] == pytest.approx(309.237645312e9 / 650e-6 / 1e12, rel=1e-9)
    assert row["median_share_of_790"] == pytest.approx(row["median_tflops"] / 790)
    assert row["median_x_roofline"] == pytest.approx(650.0 / roof["roofline_us"])


def test_compare_plan_takes_the_same_fields_or_none(tmp_path):
    earlier = tmp_path / "fused_moe_old.py"
    earlier.write_text((ROOT / "kernels/fused_moe.py").read_text())
    mod = rep.load_compare(earlier)
    plan = MoeTiles(128, 128, 64, 8, 4, tma=True, joint=True, sorted_act=True, persistent=1)
    got = rep.compare_plan(mod, plan)
    assert type(got).__module__ == "fused_moe_compare" and got.persistent == 1 and got.block_m == 128
    assert rep.compare_plan(mod, DirectTiles()) is None


def test_compare_plan_refuses_a_field_the_earlier_module_lacks(tmp_path):
    earlier = tmp_path / "fused_moe_old.py"
    text = (ROOT / "kernels/fused_moe.py").read_text()
    earlier.write_text(text.replace("    up_persistent: int = 0\n", "").replace("self.up_persistent", "0"))
    mod = rep.load_compare(earlier)
    plain = MoeTiles(128, 128, 64, 8, 4, tma=True, joint=True, sorted_act=True)
    assert rep.compare_plan(mod, plain) is not None
    assert rep.compare_plan(mod, MoeTiles(128, 128, 64, 8, 4, tma=True, joint=True, sorted_act=True,
                                          up_persistent=1)) is None


def test_dry_run_writes_rounds_and_the_comparison(tmp_path):
    rep.main(["--out", str(tmp_path), "--dry-run", "--tokens", "16", "--rounds", "2",
              "--compare", str(ROOT / "kernels/fused_moe.py")])
    res = json.loads((tmp_path / "repeat.json").read_text())
    (row,) = res["rows"]
    assert row["T"] == 16 and len(row["us"]) == 2 and len(row["compare"]["us"]) == 2
    assert "Beside it" in (tmp_path / "repeat.md").read_text()


def _bench_json(path: Path, rows: dict[int, dict[str, float]]) -> Path:
    path.write_text(json.dumps({"speed": [{"preset": "qwen3-30b-a3b", "T": t, "fused_by_tiles": timed}
                                          for t, timed in rows.items()]}))
    return path


def test_challengers_are_the_fastest_known_plan_where_it_is_not_the_engines(tmp_path):
    from kernels.moe_plans import DIRECT_RUN6, engine_tiles, plan_key

    eng1, eng4096 = plan_key(engine_tiles(1, 8, 128)), plan_key(engine_tiles(4096, 8, 128))
    bench = _bench_json(tmp_path / "moe.json", {
        1: {eng1: 24.0, plan_key(DIRECT_RUN6[2]): 21.5, plan_key(DIRECT_RUN6[0]): 22.0, "not a known plan": 1.0},
        4096: {eng4096: 650.0, plan_key(DIRECT_RUN6[1]): 700.0}})
    got = rep.challenger_plans(bench, [1, 2, 4096], 8, 128)
    assert got == {1: DIRECT_RUN6[2]}  # T = 2 not timed; at 4096 the engine's plan was the fastest


def test_challenger_summary_by_hand():
    roof = rep.roofline(8.0, 1, 2048, 768, 8)
    c = rep.challenger_summary(1, [24.0, 23.0, 25.0], [21.6, 23.0, 20.0], "p", roof)
    assert c["plan"] == "p" and c["median_us"] == 21.6
    assert c["ratio_to_engine_median"] == pytest.approx(0.9)  # ratios 0.9, 1.0, 0.8


def test_dry_run_times_the_challenger_in_the_same_rounds(tmp_path):
    from kernels.moe_plans import DIRECT_RUN6, engine_tiles, plan_key

    bench = _bench_json(tmp_path / "moe.json", {1: {plan_key(engine_tiles(1, 4, 32)): 30.0,
                                                    plan_key(DIRECT_RUN6[0]): 20.0}})
    rep.main(["--out", str(tmp_path), "--dry-run", "--tokens", "1", "--rounds", "2", "--challengers", str(bench)])
    (row,) = json.loads((tmp_path / "repeat.json").read_text())["rows"]
    assert row["challenger"]["plan"] == plan_key(DIRECT_RUN6[0]) and len(row["challenger"]["us"]) == 2
    assert "Challengers" in (tmp_path / "repeat.md").read_text()


def _repeat_json(path: Path, date: str, rows: list[tuple]) -> Path:
    out = []
    for t, plan, us in rows:
        roof = rep.roofline(8.0 if t == 1 else 128.0, t, 2048, 768, 8)
        out.append({**rep.summary(t, us, roof), "plan": plan})
    path.write_text(json.dumps({"meta": {"date": date}, "rows": out}))
    return path


def test_pool_joins_the_rounds_of_one_plan_across_calls(tmp_path):
    a = _repeat_json(tmp_path / "a.json", "d1", [(1, "p", [24.0, 23.0]), (4096, "q", [650.0])])
    b = _repeat_json(tmp_path / "b.json", "d2", [(1, "p", [22.0, 25.0, 23.5]), (4096, "q2", [640.0])])
    rows = {(r["T"], r["plan"]): r for r in rep.pooled_rows([a, b])}
    assert set(rows) == {(1, "p"), (4096, "q"), (4096, "q2")}  # another plan at T is its own row
    p = rows[(1, "p")]
    assert p["us"] == [24.0, 23.0, 22.0, 25.0, 23.5] and p["median_us"] == 23.5
    assert p["median_x_roofline"] == pytest.approx(23.5 / rep.roofline(8.0, 1, 2048, 768, 8)["roofline_us"])
    assert rows[(4096, "q")]["median_share_of_790"] == pytest.approx(309.237645312e9 / 650e-6 / 1e12 / 790)
    assert [c["date"] for c in p["calls"]] == ["d1", "d2"]


def test_rotated_turns_the_order_a_place_each_round():
    assert [rep.rotated(["e", "a", "b"], r) for r in range(4)] == [
        ["e", "a", "b"], ["a", "b", "e"], ["b", "e", "a"], ["e", "a", "b"]]
    assert rep.rotated([], 3) == []


def test_candidate_rows_fastest_first_with_per_round_ratios_and_failures_last():
    roof = rep.roofline(8.0, 1, 2048, 768, 8)
    times = {"engine": [24.0, 22.0, 23.0], "slow": [26.0, 22.0, 25.3], "fast": [20.0, 22.0, 19.55]}
    rows = rep.candidate_rows(times, roof, 1, {"fast": rep.LaunchesAlone(7.5, 12.0)},
                              {"broken": "relative error 3.0e-01"})
    assert [r["plan"] for r in rows] == ["fast", "slow", "broken"]
    fast, slow, broken = rows
    assert fast["ratio_to_engine_median"] == pytest.approx(0.85)  # ratios 0.833, 1.0, 0.85
    assert slow["ratio_to_engine_median"] == pytest.approx(26 / 24)  # 1.083, 1.0, 1.1
    assert (fast["down_alone_us"], fast["up_alone_us"]) == (7.5, 12.0) and slow["down_alone_us"] is None
    assert broken == {"plan": "broken", "check_failed": "relative error 3.0e-01"}


def test_dry_run_times_each_candidate_beside_the_engine_and_reports_a_broken_one(tmp_path, monkeypatch):
    """--candidates run11 in the interpreter: every wide plan checked, timed each round beside the engine's plan,
    its down launch alone in round 0; a plan that raises (a 3-wide down tile: no power of two) is reported, not timed."""
    import dataclasses

    import kernels.moe_plans as mp

    real = mp.run11_candidates
    monkeypatch.setattr(mp, "run11_candidates", lambda t, k, e: [
        *real(t, k, e), dataclasses.replace(real(t, k, e)[0], down_block_n=3)])
    rep.main(["--out", str(tmp_path), "--dry-run", "--tokens", "1", "--rounds", "2", "--candidates", "run11"])
    (row,) = json.loads((tmp_path / "repeat.json").read_text())["rows"]
    timed = [c for c in row["candidates"] if "check_failed" not in c]
    assert {c["plan"] for c in timed} == {mp.plan_key(p) for p in real(1, 4, 32)}
    assert all(len(c["us"]) == 2 and c["down_alone_us"] > 0 and c["up_alone_us"] > 0 for c in timed)
    assert row["down_alone_us"] > 0 and row["up_alone_us"] > 0
    (bad,) = [c for c in row["candidates"] if "check_failed" in c]
    assert "n3k" in bad["plan"] and bad["check_failed"]
    assert "check failed" in (tmp_path / "repeat.md").read_text()


def test_peak_fields_by_hand():
    """A plan of 1e12 FLOPs at 2,000 and 2,500 us (500 and 400 TFLOP/s) beside GEMM rounds of 800 and 640
    TFLOP/s: shares 0.625 each; at 500 TFLOP/s beside 250 / 1,000 / 2,000 the shares are 2, 0.5, 0.25."""
    f = rep.peak_fields([2000.0, 2500.0], [800.0, 640.0], 1e12)
    assert f["median_peak_tflops"] == pytest.approx(720.0)
    assert f["median_share_of_peak"] == pytest.approx(0.625)
    g = rep.peak_fields([2000.0, 2000.0, 2000.0], [250.0, 1000.0, 2000.0], 1e12)
    assert g["median_share_of_peak"] == pytest.approx(0.5)


def test_dry_run_with_peak_reports_the_same_round_share(tmp_path):
    rep.main(["--out", str(tmp_path), "--tokens", "4", "--rounds", "2", "--dry-run", "--peak"])
    row = json.loads((tmp_path / "repeat.json").read_text())["rows"][0]
    assert len(row["peak_tflops"]) == 2 and all(p > 0 for p in row["peak_tflops"])
    flops = rep.roofline(row["touched_experts"], row["T"], *rep.DRY[:2], rep.DRY[3])["flops"]
    shares = sorted(flops / us / 1e6 / p for us, p in zip(row["us"], row["peak_tflops"]))
    assert row["median_share_of_peak"] == pytest.approx(sum(shares) / 2)
    assert "dense GEMM (64 cubed" in (tmp_path / "repeat.md").read_text()


def test_used_blocks_by_hand():
    """Experts 0 and 1 with 3 and 1 pairs at 2-row blocks: 2 + 1 blocks; a second routing with 4 pairs on expert
    0: 2 blocks; the mean 2.5; a direct plan (block_m 0) has none."""
    import torch

    a = torch.tensor([[0, 1], [0, 0]])
    b = torch.tensor([[0, 0], [0, 0]])
    assert rep.used_blocks([a], 3, 2) == 3
    assert rep.used_blocks([a, b], 3, 2) == 2.5
    assert rep.used_blocks([a], 3, 0) == 0.0
