"""The plain verdict (advisor/advise/verdict.py): each SLO target met or missed at the recommended
configuration, the share of requests against the 99% line, the GPUs it would take; first in every
report."""

from __future__ import annotations

import io
import json

from rich.console import Console

from advisor.advise.records import Metrics
from advisor.advise.report import markdown, print_report, serve_script, write_outputs
from advisor.advise.verdict import slo_targets, verdict
from tests.advisor.test_advise import rec  # noqa: F401 - the module's real recommendation


def _metrics(ttft_p99: float, tpot_p99: float, attain: float) -> Metrics:
    return Metrics(goodput_rps=5.0, throughput_tok_s=2000.0, ttft_p50_ms=100.0, ttft_p99_ms=ttft_p99,
                   tpot_p50_ms=10.0, tpot_p99_ms=tpot_p99, itl_p99_ms=40.0, e2e_p99_ms=9000.0,
                   slo_attainment=attain, preemptions=0)


def test_the_issues_case_is_missed_with_the_gpus_it_takes() -> None:
    v = verdict(_metrics(593.8, 31.2, 0.973), "ttft_p99:500 tpot_p99:50", 1, "h200")
    assert not v.meets and v.gpus_needed == 2  # ceil(1 x 0.99 / 0.973)
    assert [(c.metric, c.met) for c in v.checks] == [("TTFT p99", False), ("TPOT p99", True)]
    assert v.text.startswith("MISSES the SLO at the recommended configuration on 1x h200: ")
    assert "TTFT p99 593.8 ms > 500 ms target: MISSED" in v.text
    assert "TPOT p99 31.2 ms <= 50 ms target: met" in v.text
    assert "SLO met by 97.3% of requests, below the 99% line" in v.text
    assert "about 2 GPUs" in v.text and "--num-gpus 2" in v.text


def test_a_met_slo_and_the_share_line() -> None:
    v = verdict(_metrics(420.0, 21.0, 0.995), "ttft:500 tpot:50", 2, "h100-sxm")
    assert v.meets and v.gpus_needed == 2 and "To meet it" not in v.text
    # every percentile under its target but fewer than 99% of requests meet both: missed
    assert not verdict(_metrics(420.0, 21.0, 0.95), "ttft:500 tpot:50", 1, "h200").meets
    assert slo_targets("ttft_p50:200 e2el:9000") == [("ttft", "p50", 200.0), ("e2el", "p99", 9000.0)]
    nobody = verdict(_metrics(5000.0, 90.0, 0.0), "ttft:500", 1, "h200")
    assert nobody.gpus_needed is None and "no replica count can be estimated" in nobody.text


def test_the_verdict_opens_every_report(rec, tmp_path) -> None:  # noqa: F811
    v = rec.verdict
    assert v is not None and v.slo_attainment == rec.best.metrics.slo_attainment and v.num_gpus == rec.best.num_gpus
    buf = io.StringIO()
    print_report(rec, Console(file=buf, width=100, color_system=None))
    assert buf.getvalue().startswith("verdict: " + v.text[:40])
    md = markdown(rec, []).splitlines()
    assert md[2] == f"**Verdict: {v.text}**"
    assert f"# verdict: {v.text}" in serve_script(rec)
    out = write_outputs(rec, tmp_path / "advice")
    data = json.loads((out / "recommendation.json").read_text())
    assert next(iter(data)) == "verdict" and data["verdict"]["text"] == v.text


def test_a_missed_slo_is_checked_on_more_gpus(tmp_path) -> None:
    from advisor.advise import AdviseRequest, advise
    from advisor.advise.verdict import meets
    from sim.config import EngineConfig
    from sim.run import SimConfig, run
    from tests.advisor.test_advise import SMALL

    path = tmp_path / "small.json"
    path.write_text(SMALL.to_json())
    slo = "ttft_p99:60 tpot_p99:9"
    missed = advise(str(path), AdviseRequest(workers=1, slo=slo))
    v = missed.verdict
    assert v is not None and not v.meets and v.gpus_checked and v.gpus_needed is not None
    assert v.gpus_needed > missed.best.num_gpus
    assert f"To meet it: {v.gpus_needed} GPUs, checked in simulation" in v.text
    assert missed.cost is not None and missed.cost.gpus_at_slo == v.gpus_needed
    assert f"meeting the SLO takes {v.gpus_needed} GPUs" in missed.cost.text
    # the claim holds when simulated independently: the recommended flags on that many GPUs meet
    # the SLO, on one GPU fewer they do not
    engine = EngineConfig(**{k: val for k, val in missed.best.flags.items() if k != "kv_transfer_config"})
    from advisor.advise.evaluate import outcome_of  # the advisor's own scoring of a summary

    def attained(n: int) -> bool:
        cfg = SimConfig(num_gpus=n, engine=engine, slo=slo.replace("_p99", ""), kv_block_coarsening="auto",
                        skip_ahead=True, seed=0)
        return meets(outcome_of(run(str(path), cfg).summary()).metrics, slo)

    assert attained(v.gpus_needed) and not attained(v.gpus_needed - 1)
