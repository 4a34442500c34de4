"""Every page driven by Streamlit's AppTest: change controls, and the numbers shown must equal
what the public API (`sim.run.run`, `sim.describe.describe_workload`) gives for the same scenario;
bad input shows a clear error on the page, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.compute import RunCache, Upload, simulate
from app.recommendation import advise_api
from app.scenario import Scenario
from app.widgets import fmt
from sim.config import EngineConfig
from sim.describe import describe_workload
from sim.generate import generate
from sim.run import SimConfig, run
from sim.workload_presets import get_preset
from sim.workload_source import SourceOptions, load_workload
from sim.workload_spec import PoissonArrival
from tests.app.recommendation_fixture import recommendation
from tests.conftest import REPO

MAIN = str(REPO / "app" / "main.py")
SLO = "ttft:500 tpot:50"
HEADLINE = {"Goodput (req/s)": "request_goodput", "Throughput (req/s)": "request_throughput",
            "Output (tok/s)": "output_throughput", "p99 TTFT (ms)": "p99_ttft_ms",
            "p99 TPOT (ms)": "p99_tpot_ms", "Preemptions": "num_preemptions"}


def api_summary(workload="chat-production", **config) -> dict:
    """The API's answer for a scenario, computed without the dashboard."""
    return run(workload, SimConfig(slo=SLO, kv_block_coarsening="auto", **config)).summary().to_json_dict()


def app() -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    return at


def shown(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def assert_headline(at: AppTest, summary: dict) -> None:
    assert not at.exception, at.exception
    assert shown(at) == {label: fmt(summary[key]) for label, key in HEADLINE.items()}


# ----------------------------------------------------------------------------- What-if


def test_whatif_shows_the_apis_numbers_for_the_default_scenario() -> None:
    at = app()
    at.run()
    api = api_summary()
    assert_headline(at, api)
    table = at.dataframe[0].value.set_index("metric")
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E")):
        for p in ("p50", "p90", "p99"):
            assert table.loc[f"{name} (ms)", p] == pytest.approx(api[f"{p}_{key}_ms"])
    assert table.loc["TTFT (ms)", "p99 meets SLO"] == ("yes" if api["p99_ttft_ms"] <= 500 else "no")
    assert table.loc["E2E (ms)", "SLO (ms)"] == "not set" and table.loc["ITL (ms)", "SLO (ms)"] == "—"
    assert len(at.get("plotly_chart")) == 2  # CDFs and timelines
    assert at.code[0].value == "vllm serve meta-llama/Llama-3.1-8B-Instruct"


def test_flag_controls_change_the_run_and_the_url() -> None:
    at = app()
    at.run()
    at.toggle(key="flag.enable_prefix_caching").set_value(False)
    at.number_input(key="flag.max_num_batched_tokens").set_value(2048)
    at.run()
    assert_headline(at, api_summary(engine=EngineConfig(enable_prefix_caching=False, max_num_batched_tokens=2048)))
    assert at.query_params["enable-prefix-caching"] == "false"
    assert at.query_params["max-num-batched-tokens"] == "2048"
    assert "--disable-prefix-caching" in at.code[0].value and "--max-num-batched-tokens 2048" in at.code[0].value


def test_pin_a_and_compare_b_side_by_side() -> None:
    at = app()
    at.run()
    at.button(key="pin").click().run()
    at.selectbox(key="dep.gpu").set_value("h100-sxm").run()
    a, b = api_summary(), api_summary(gpu="h100-sxm")
    assert_headline(at, b)
    compare = at.dataframe[1].value.set_index("metric")
    for key in ("request_goodput", "p99_ttft_ms", "p99_tpot_ms"):
        assert compare.loc[key, "A (pinned)"] == fmt(a[key])
        assert compare.loc[key, "B (now)"] == fmt(b[key])
    goodput = next(m for m in at.metric if m.label == "Goodput (req/s)")
    assert goodput.delta == fmt(b["request_goodput"] - a["request_goodput"])


def test_a_shared_url_reproduces_its_scenario() -> None:
    at = app()
    at.query_params.update({"gpu": "h100-sxm", "num_gpus": "2", "max-num-seqs": "64", "seed": "3"})
    at.run()
    assert_headline(at, api_summary(gpu="h100-sxm", num_gpus=2, seed=3, engine=EngineConfig(max_num_seqs=64)))
    assert at.selectbox(key="dep.gpu").value == "h100-sxm"
    assert at.number_input(key="flag.max_num_seqs").value == 64


def test_disaggregated_prefill_control() -> None:
    from sim.config import DisaggConfig

    at = app()
    at.run()
    at.text_input(key="dep.disagg").input("1:1").run()
    assert_headline(at, api_summary(disaggregation=DisaggConfig(num_prefill_replicas=1, num_decode_replicas=1)))
    assert at.query_params["disagg"] == "1:1"
    at.text_input(key="dep.disagg").input("three").run()
    assert not at.exception and "--disagg 'three'" in at.error[0].value


def test_bad_url_parameter_and_bad_flag_show_clear_errors() -> None:
    at = app()
    at.query_params.update({"max-num-seqs": "many"})
    at.run()
    assert not at.exception
    assert any("max-num-seqs" in w.value and "ignored" in w.value for w in at.warning)
    at.number_input(key="flag.block_size").set_value(8).run()
    assert not at.exception
    assert len(at.error) == 1 and "--block-size 8" in at.error[0].value
    assert not at.metric  # nothing stale shown under the error
    at.number_input(key="flag.block_size").set_value(16)
    at.text_input(key="flag.speculative_config").input('{"method":"ngram"').run()
    assert not at.exception
    assert len(at.error) == 1 and at.error[0].value.startswith("invalid setting: --speculative-config")
    at.text_input(key="flag.speculative_config").input("").run()
    at.number_input(key="flag.max_num_seqs").set_value(100_000).run()  # beyond the token budget: vLLM refuses
    assert not at.exception
    assert "--max-num-seqs 100000" in at.error[0].value and "--max-num-batched-tokens" in at.error[0].value


def test_a_run_holds_the_scenario_and_a_rerun_comes_from_the_cache() -> None:
    """What a run and its cache hold; how fast they are is benchmarks/app/whatif_latency.py's."""
    s = Scenario()
    out = simulate(s, None)
    cache = RunCache()
    assert cache.get(s, None) is None
    cache.put(s, None, out)
    assert cache.get(s, None) is out
    assert cache.get(Scenario(seed=1), None) is None  # another scenario is another run
    assert out.summary.num_prompts == 2000


def test_downloads_hold_the_runs_tables() -> None:
    import io

    import pyarrow.parquet as pq

    from app.compute import table_parquet

    out = simulate(Scenario(workload="lab-random"), None)
    back = pq.read_table(io.BytesIO(table_parquet(out.requests))).to_pydict()
    assert list(back) == list(out.requests)
    for col in ("request_id", "ttft_s", "status"):
        assert back[col] == out.requests[col].tolist() or np.allclose(back[col], out.requests[col], equal_nan=True)
    at = app()
    at.run()
    names = [d.proto.label for d in at.get("download_button")]
    assert names == ["summary.json", "requests.parquet", "steps.parquet"]


# ----------------------------------------------------------------------------- Workload


def workload_page() -> AppTest:
    at = app()
    at.run()
    at.switch_page("views/workload.py").run()
    return at


def test_workload_page_shows_describes_figures() -> None:
    at = workload_page()
    d = describe_workload(load_workload("chat-production", SourceOptions(seed=0)))
    assert not at.exception
    m = shown(at)
    assert m["Requests"] == "2,000" and m["Mean rate (req/s)"] == fmt(d["mean_rate_rps"])
    assert m["Prefix reuse (tokens %)"] == fmt(100 * d["prefix_reuse"]["token_fraction"])
    assert m["Inter-arrival CV"] == fmt(d["interarrival_cv"])
    assert len(at.get("plotly_chart")) == 3  # arrivals, lengths, prefix reuse


def test_a_builtin_trace_simulates_its_first_n_requests() -> None:
    at = workload_page()
    at.radio(key="w.kind").set_value("built-in trace").run()
    at.selectbox(key="w.trace").set_value("azure-code-2023")
    at.number_input(key="w.first").set_value(400)
    at.run()
    assert not at.exception and not at.error
    assert shown(at)["Requests"] == "400"
    assert at.query_params["workload"] == "azure-code-2023" and at.query_params["first"] == "400"
    at.switch_page("views/whatif.py").run()
    assert_headline(at, api_summary(load_workload("azure-code-2023", SourceOptions(first=400))))


def test_edited_spec_drives_the_stats_and_the_whatif() -> None:
    at = workload_page()
    at.radio(key="w.kind").set_value("edit a spec").run()
    at.number_input(key="spec.rate").set_value(4.0)
    at.number_input(key="spec.burstiness").set_value(1.0)
    at.run()
    spec = get_preset("chat-production").model_copy(update={"arrival": PoissonArrival(rate_rps=4.0)})
    wl = generate(spec)
    assert not at.exception and not at.error
    assert shown(at)["Mean rate (req/s)"] == fmt(describe_workload(wl)["mean_rate_rps"])
    assert "spec" in at.query_params
    at.switch_page("views/whatif.py").run()
    assert_headline(at, api_summary(wl))


def test_bad_spec_json_names_the_field() -> None:
    at = workload_page()
    at.radio(key="w.kind").set_value("edit a spec").run()
    spec = json.loads(get_preset("lab-random").to_json())
    spec["arrival"]["rate_rps"] = -1
    at.text_area(key="spec.json").input(json.dumps(spec))
    at.button(key="spec.apply").click().run()
    assert not at.exception
    assert any("arrival" in e.value and "rate_rps" in e.value for e in at.error)


def upload_page(name: str, data: bytes) -> AppTest:
    at = workload_page()
    at.radio(key="w.kind").set_value("upload").run()
    at.session_state["upload"] = Upload(name, data)
    at.run()
    return at


def test_a_bad_upload_shows_an_error_naming_the_file_not_a_traceback() -> None:
    at = upload_page("broken.csv", b"when,what\n1,2\n")
    assert not at.exception
    assert len(at.error) == 1
    msg = at.error[0].value
    assert "broken.csv" in msg and "/tmp" not in msg and "Fix" in msg
    assert "--format" not in msg and "'trace format' control" in msg


def test_skip_bad_rows_reads_a_trace_with_a_broken_row() -> None:
    good = {"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}
    data = (json.dumps(good) + "\n" + '{"timestamp": 5, "input_length": -3}\n').encode()
    at = upload_page("rows.jsonl", data)
    assert len(at.error) == 1 and "rows.jsonl, line 2" in at.error[0].value
    at.checkbox(key="w.lenient").check().run()
    assert not at.exception and not at.error
    assert shown(at)["Requests"] == "1"


def test_an_uploaded_mooncake_trace_is_described_and_simulated(tmp_path) -> None:
    rows = [{"timestamp": 1000 * i, "input_length": 600 + 10 * i, "output_length": 20 + i,
             "hash_ids": [1, 100 + i]} for i in range(30)]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    at = upload_page("mine.jsonl", data)
    assert not at.exception and not at.error
    assert shown(at)["Requests"] == "30"
    at.switch_page("views/whatif.py").run()
    path = tmp_path / "mine.jsonl"
    path.write_bytes(data)
    assert_headline(at, api_summary(load_workload(str(path), SourceOptions(first=2000))))


# ----------------------------------------------------------------------------- Advisor


def advisor_page() -> AppTest:
    at = app()
    at.run()
    at.switch_page("views/advisor.py").run()
    return at


def test_advisor_page_renders_a_recommendation_from_its_keys() -> None:
    at = advisor_page()
    rec = recommendation("scaled, not validated")
    at.session_state["recommendation"] = rec
    at.run()
    assert not at.exception and not at.error
    m = {x.label: x for x in at.metric}
    assert m["Goodput (req/s)"].value == fmt(rec["best"]["metrics"]["goodput_rps"])
    assert m["Goodput (req/s)"].delta == fmt(7.25 - 5.5)
    assert m["p99 TTFT (ms)"].value == fmt(420.0)
    assert [c.value for c in at.code] == [rec["serve_command"]]
    assert any("scaled" in w.value for w in at.warning)
    assert len(at.get("plotly_chart")) == 3  # waterfall, one cost line, gap bars
    ladder = at.dataframe[1].value
    assert ladder["optimization"].tolist() == ["prefix caching", "chunked prefill 4096"]
    assert ladder["goodput %"].tolist() == ["16.4", "13.3"]
    assert ladder["flags added"].tolist() == ["--enable-prefix-caching", "--max-num-batched-tokens 4096"]
    assert ladder["90% interval"].tolist() == ["+16.4% (90%: +9.0% to +23.8%)", "+13.3% (90%: +4.1% to +22.5%)"]
    kept = at.dataframe[2].value  # a change inside the error bars: vLLM's default stays
    assert kept["optimization"].tolist() == ["block size: 64"]
    assert kept["gain (90% interval)"].tolist() == ["+0.7% (90%: -2.4% to +3.8%)"]
    assert any("Kept at vLLM's default" in x.value and "2.0%" in x.value for x in at.markdown)
    assert any("fallback: prefix caching only (max regret 7.5%)" in c.value for c in at.caption)
    robust = at.dataframe[4].value
    assert robust["regret %"].tolist() == ["5.0"]
    assert not any(x.value.startswith("Verdict") for x in (*at.success, *at.warning))  # an old file: none


def test_advisor_page_opens_with_the_verdict() -> None:
    at = advisor_page()
    rec = recommendation()
    rec["verdict"] = {"meets": False, "num_gpus": 1, "gpu": "h200", "checks": [], "slo_attainment": 0.93,
                      "attainment_line": 0.99, "gpus_needed": 2, "text": "MISSES the SLO ...; about 2 GPUs"}
    rec["serve_notes"] = ["<eagle3-head-for-X> is a placeholder"]
    at.session_state["recommendation"] = rec
    at.run()
    assert not at.exception
    assert at.warning[0].value == "Verdict: MISSES the SLO ...; about 2 GPUs"
    assert any(w.value == "<eagle3-head-for-X> is a placeholder" for w in at.warning)
    rec["verdict"] |= {"meets": True, "text": "MEETS the SLO"}
    at.run()
    assert at.success[0].value == "Verdict: MEETS the SLO"


def test_advisor_page_forbid_and_allow_reach_the_request(monkeypatch) -> None:
    import advisor.advise

    seen = []

    def fake(workload, request, progress=None):
        seen.append(request)
        return recommendation()

    monkeypatch.setattr(advisor.advise, "advise", fake)
    at = advisor_page()
    at.multiselect(key="adv.forbid").set_value(["fp8-weights", "spec"]).run()
    at.button(key="adv.run").click().run()
    assert not at.exception and not at.error
    assert seen[0].forbid == ["fp8-weights", "ngram", "eagle3"] and seen[0].allow is None
    at.multiselect(key="adv.allow").set_value(["block-size"]).run()
    at.button(key="adv.run").click().run()
    assert seen[1].allow == ["block-size"]
    at.number_input(key="adv.usd").set_value(2.5).run()
    at.button(key="adv.run").click().run()
    assert seen[2].gpu_hour_usd == {"h200": 2.5}


def test_advisor_page_shows_cost_and_the_gpu_comparison(monkeypatch) -> None:
    import advisor.advise

    seen = []

    def fake(workload, request, gpus, progress=None):
        seen.append((request, gpus))
        rec = recommendation()
        rec["cost"] = {"text": "at $4.00/GPU-hour: 1x h200 cost $4.00/hour"}
        rec["gpu_comparison"] = [
            {"gpu": "h200", "num_gpus": 1, "meets": False, "gpus_needed": 2, "goodput_rps": 5.0, "ttft_p99_ms": 600.0,
             "tpot_p99_ms": 20.0, "usd_per_gpu_hour": 4.0, "usd_per_hour_at_slo": 8.0,
             "usd_per_m_output_tokens_at_slo": 2.4},
            {"gpu": "b200", "num_gpus": 1, "meets": True, "gpus_needed": 1, "goodput_rps": 7.0, "ttft_p99_ms": 300.0,
             "tpot_p99_ms": 12.0, "usd_per_gpu_hour": 5.25, "usd_per_hour_at_slo": 5.25,
             "usd_per_m_output_tokens_at_slo": 1.5}]
        return rec

    monkeypatch.setattr(advisor.advise, "compare_gpus", fake)
    at = advisor_page()
    at.multiselect(key="adv.compare").set_value(["b200"]).run()
    at.button(key="adv.run").click().run()
    assert not at.exception and seen[0][1] == ["b200"]
    assert any(m.value == "**Cost:** at $4.00/GPU-hour: 1x h200 cost $4.00/hour" for m in at.markdown)
    table = next(d.value for d in at.dataframe if "$/GPU-hour" in d.value.columns)
    assert table["GPU"].tolist() == ["h200", "b200"] and table["SLO"].tolist() == ["MISSED", "met"]
    assert table["$/M output tokens at SLO"].tolist() == [fmt(2.4), fmt(1.5)]


def test_advisor_page_says_whether_the_advisor_is_installed() -> None:
    at = advisor_page()
    assert not at.exception
    api = advise_api()
    if api is None:
        assert any("advisor is not installed" in i.value for i in at.info)
        return
    # the advisor has landed: run it for real on a small workload (60 requests, as the CLI's
    # test_assumptions: the page's rendering is under test, not the search) and render its answer
    assert not at.info
    at.session_state["scenario"] = Scenario(workload="custom", spec=get_preset("lab-random").with_overrides(
        num_requests=60).model_dump_json())
    at.button(key="adv.run").click().run(timeout=600)
    assert not at.exception and not at.error
    rec = at.session_state["recommendation"]
    assert {x.label: x.value for x in at.metric}["Goodput (req/s)"] == fmt(rec["best"]["metrics"]["goodput_rps"])
    assert [c.value for c in at.code] == [rec["serve_command"]]


def test_a_bad_recommendation_file_is_refused_clearly() -> None:
    from app.recommendation import RecommendationError, load_json

    with pytest.raises(RecommendationError, match="missing best, baseline, ladder"):
        load_json(b'{"serve_command": "vllm serve x"}')
    with pytest.raises(RecommendationError, match="not a JSON recommendation"):
        load_json(b"\xff\xfe")


# ----------------------------------------------------------------------------- Calibration


def test_calibration_page_shows_the_profile_the_run_used() -> None:
    at = app()
    at.run()
    at.switch_page("views/calibration.py").run()
    api = api_summary()
    assert not at.exception
    m = shown(at)
    assert m["Cost profile in use"] == (api.get("profile") or Scenario().profile)
    assert m["Status"] == (api.get("profile_status") or "first principles")


def test_calibration_page_warns_when_the_profile_is_scaled(monkeypatch) -> None:
    import app.calibration as cal

    info = cal.ProfileInfo("h100-sxm-llama-3.1-8b", cal.SCALED,
                           validation=[{"metric": "ttft_p99", "median_abs_error_pct": 4.0}])
    monkeypatch.setattr(cal, "profile_info", lambda *args, **kwargs: info)
    at = app()
    at.run()
    at.switch_page("views/calibration.py").run()
    assert not at.exception
    assert any("scaled from another GPU" in w.value for w in at.warning)
    assert at.dataframe[0].value["median_abs_error_pct"].tolist() == [4.0]


# ----------------------------------------------------------------------------- no torch


def test_no_page_imports_torch() -> None:
    code = f"""
import sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file({MAIN!r}, default_timeout=120)
at.run()
for page in ("workload", "advisor", "calibration"):
    at.switch_page(f"views/{{page}}.py").run()
    assert not at.exception, at.exception
print("torch" in sys.modules, "triton" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["False", "False"]
