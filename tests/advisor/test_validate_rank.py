"""`costline validate --rank`: does the simulator order configurations of one workload by goodput
as the engine does? The pair logic against hand-computed cases, and the command end to end on
simulator runs posing as engine runs (the simulator must then reproduce every goodput exactly)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from costline.cli import app
from engine.core.run_summary import SLO
from sim.validate import RankedRun, ValidationReport, ranking
from tests.advisor.test_validate_cli import write_run

runner = CliRunner()


def runs(pairs: dict[str, tuple[float, float]]) -> list[RankedRun]:
    return [RankedRun(name=n, engine_goodput=e, sim_goodput=s, error=(s - e) / e) for n, (e, s) in pairs.items()]


def test_pairs_the_engine_separates_must_agree():
    # engine: a 10 > b 9.8 (2%: not separated) > c 8 > d 5; simulator swaps a/b (allowed) and c/d (not)
    rk = ranking(runs({"a": (10, 9.0), "b": (9.8, 9.5), "c": (8, 4.0), "d": (5, 6.0)}), SLO(ttft_ms=500))
    assert rk.pairs_separated == 5  # every pair but a-b
    assert rk.pairs_agreeing == 4 and not rk.passed
    assert len(rk.disagreements) == 1 and rk.disagreements[0].startswith("c > d")
    assert rk.engine_order == ["a", "b", "c", "d"] and rk.sim_order == ["b", "a", "d", "c"]
    assert rk.pick_loss == pytest.approx(0.02)  # the simulator picks b: 9.8 instead of 10
    assert rk.spread == pytest.approx(0.5)


def test_same_order_passes_with_no_pick_loss():
    rk = ranking(runs({"x": (3, 3.3), "y": (2, 2.4), "z": (1, 1.1)}), SLO(tpot_ms=50))
    assert rk.passed and rk.pairs_separated == rk.pairs_agreeing == 3 and rk.pick_loss == 0.0


def test_rank_option_end_to_end(tmp_path):
    base = tmp_path / "h200" / "llama-3.2-1b" / "validation"
    dirs = [write_run(base / "seqs16", "seqs16"), write_run(base / "seqs4", "seqs4", max_num_seqs=4),
            write_run(base / "budget128", "budget128", max_num_batched_tokens=128)]
    out = tmp_path / "report"
    res = runner.invoke(app, ["validate", *map(str, dirs), "--profile", "default", "--rank", "ttft:800 tpot:40",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    rk = ValidationReport.from_json((out / "validation.json").read_text()).ranking
    assert rk is not None and rk.passed and rk.pick_loss == 0.0
    for r in rk.runs:  # the "engine" is the simulator: goodputs equal
        assert r.sim_goodput == pytest.approx(r.engine_goodput, rel=1e-9)
    assert len({round(r.engine_goodput, 6) for r in rk.runs}) == 3  # the configurations differ
    assert "goodput order at ttft:800 tpot:40" in res.output and "same order" in res.output
    assert "## Goodput order at ttft:800 tpot:40" in (out / "validation.md").read_text()
    assert "--rank" in json.loads((out / "validation.json").read_text())["command"]


def test_a_bad_rank_slo_names_the_pair(tmp_path):
    d = write_run(tmp_path / "r", "r")
    res = runner.invoke(app, ["validate", str(d), "--profile", "default", "--rank", "ttft=800"])
    assert res.exit_code == 2 and "ttft=800" in res.output
