"""Dollars (advisor/advise/prices.py, dollars.py): $/GPU-hour defaults with a source, --gpu-hour-usd,
$/hour and $/million output tokens on the GPUs given and at the SLO, and --compare-gpus."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from advisor.advise import AdviseRequest, compare_gpus
from advisor.advise.dollars import cheapest, cost
from advisor.advise.prices import GPU_HOUR_USD, parse_gpu_hour_usd, price_of
from advisor.advise.records import Metrics
from advisor.advise.report import cost_line, markdown
from advisor.advise.verdict import verdict
from costline.cli import app
from sim.hardware import get_gpu
from tests.advisor.test_advise import SMALL

runner = CliRunner()


def _m(tok_s: float, attain: float) -> Metrics:
    return Metrics(goodput_rps=4.0, throughput_tok_s=tok_s, ttft_p50_ms=100.0, ttft_p99_ms=400.0, tpot_p50_ms=10.0,
                   tpot_p99_ms=20.0, itl_p99_ms=30.0, e2e_p99_ms=5000.0, slo_attainment=attain, preemptions=0)


def test_default_prices_have_a_source_and_a_date() -> None:
    assert set(GPU_HOUR_USD) == {"a100-80gb", "h100-sxm", "h200", "b200"}
    for p in GPU_HOUR_USD.values():
        assert p.usd_per_gpu_hour > 0 and "20" in p.source  # a year in every source
    assert price_of("h200", {}) == (4.0, GPU_HOUR_USD["h200"].source)
    assert price_of("h200", {"h200": 3.1}) == (3.1, "--gpu-hour-usd")
    assert price_of("l4", {}) is None


def test_gpu_hour_usd_spellings_and_errors() -> None:
    assert parse_gpu_hour_usd("3.5", "h200") == {"h200": 3.5}
    assert parse_gpu_hour_usd("h100=2.5,h200=3.6", "h200") == {"h100-sxm": 2.5, "h200": 3.6}  # h100 = h100-sxm
    assert AdviseRequest(gpu="l4", gpu_hour_usd=0.8).gpu_hour_usd == {"l4": 0.8}
    with pytest.raises(ValueError, match="must be above 0"):
        parse_gpu_hour_usd("-1", "h200")
    res = runner.invoke(app, ["advise", "-w", "lab-poisson", "-n", "20", "--gpu-hour-usd", "cheap"])
    assert res.exit_code == 2 and res.output.startswith("error: --gpu-hour-usd 'cheap': 'cheap' is not a price")
    res = runner.invoke(app, ["advise", "-w", "lab-poisson", "-n", "20", "--compare-gpus", "h100,h900"])
    assert res.exit_code == 2 and "--compare-gpus 'h100,h900': unknown GPU preset 'h900'" in res.output


def test_cost_arithmetic() -> None:
    v = verdict(_m(1000.0, 0.5), "ttft:500", 1, "h200")  # half the requests meet it: 2 GPUs
    c = cost(_m(1000.0, 0.5), v, "h200", {})
    assert c is not None and (c.usd_per_hour, c.gpus_at_slo, c.usd_per_hour_at_slo) == (4.0, 2, 8.0)
    assert c.usd_per_m_output_tokens == pytest.approx(4.0 / 3.6)  # $4/h over 3.6M tokens/h
    assert c.usd_per_m_output_tokens_at_slo == pytest.approx(8.0 / 3.6)
    assert c.requests_per_usd == pytest.approx(4.0 * 3600 / 4.0)
    assert "meeting the SLO takes about 2 GPUs: $8.00/hour, $2.22 per million output tokens" in c.text
    assert cost(_m(1000.0, 1.0), v, "l4", {}) is None


def test_compare_gpus_side_by_side(tmp_path) -> None:
    path = tmp_path / "small.json"
    path.write_text(SMALL.with_overrides(num_requests=60).to_json())  # two advice runs: the table is under test
    req = AdviseRequest(workers=1, slo="ttft_p99:300 tpot_p99:30", gpu_hour_usd="h200=3.0")
    rec = compare_gpus(str(path), req, ["h100"])
    assert [o.gpu for o in rec.gpu_comparison] == ["h200", "h100-sxm"]
    first = rec.gpu_comparison[0]
    assert first.goodput_rps == rec.best.metrics.goodput_rps and first.serve_command == rec.serve_command
    assert first.usd_per_gpu_hour == 3.0 and rec.gpu_comparison[1].usd_per_gpu_hour == 3.0  # given, then default
    assert rec.cost is not None and rec.cost.usd_per_gpu_hour == 3.0
    low = cheapest(rec.gpu_comparison)
    assert low is not None and low.usd_per_m_output_tokens_at_slo == min(
        o.usd_per_m_output_tokens_at_slo for o in rec.gpu_comparison)
    md = markdown(rec, [])
    assert f"**Cost:** {rec.cost.text}" in md and "## GPU types side by side" in md
    assert f"cheapest within the SLO: {low.gpu}" in md
    l4 = rec.model_copy(update={"cost": None, "request": req.model_copy(update={"gpu": get_gpu("l4").name})})
    assert "no default price for l4: pass --gpu-hour-usd" in cost_line(l4)
