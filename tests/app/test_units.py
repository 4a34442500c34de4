"""The dashboard's pure parts against independent references: the scenario's URL round-trip,
the data behind each chart, the spec editor, the calibration summary, `costline app`."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import app.calibration as app_calibration
from app.calibration import SCALED, profile_info, read_profile, validation_rows
from app.figures import (
    arrivals_per_bin,
    cost_line_figure,
    decimate,
    ecdf,
    interpolate_gain,
    latency_rows,
    prefix_reuse_curve,
    timeline_series,
    waterfall_figure,
)
from app.scenario import APP_MAX_REQUESTS, Scenario, from_query_params, pack_spec, to_query_params
from app.spec_edit import SpecEditError, parse_task_mix, with_arrival, with_law, with_prefixes
from engine.core.slo import SLO
from engine.core.summary_record import LatencyStats
from sim.describe import interarrival_cv, prefix_reuse
from sim.generate import generate
from sim.workload_presets import get_preset
from sim.workload_spec import GammaArrival, PoissonArrival

# ----------------------------------------------------------------------------- scenario <-> URL


def test_default_scenario_has_an_empty_url() -> None:
    assert to_query_params(Scenario()) == {}
    assert from_query_params({}) == (Scenario(), [])


@settings(max_examples=40, deadline=None)
@given(seqs=st.none() | st.integers(1, 4096), caching=st.booleans(), util=st.floats(0.5, 1.0),
       policy=st.sampled_from(["fcfs", "priority"]), gpus=st.integers(1, 32),  # 32: the dashboard's budget
       slo=st.sampled_from(["ttft:500 tpot:50", "", "e2el:9000"]), seed=st.integers(0, 2**31),
       source=st.fixed_dictionaries({"lenient": st.booleans(), "first": st.none() | st.integers(1, APP_MAX_REQUESTS),
                                     "trace_format": st.sampled_from(["auto", "mooncake", "azure", "burstgpt"])}),
       pd=st.sampled_from([{"disagg": ""}, {"disagg": "3:1"}, {"disagg": "3:1", "kv_link": "nvlink"}]))
def test_scenario_round_trips_through_the_url(seqs, caching, util, policy, gpus, slo, seed, source, pd) -> None:
    flags = {k: v for k, v in {"max_num_seqs": seqs, "enable_prefix_caching": caching,
                               "gpu_memory_utilization": util, "scheduling_policy": policy}.items()
             if v is not None}
    s = Scenario(num_gpus=gpus, slo=slo, seed=seed, flags=flags, workload="custom", **source, **pd,
                 spec=get_preset("lab-poisson").model_dump_json())
    params = to_query_params(s)
    assert all(isinstance(v, str) for v in params.values())
    back, problems = from_query_params(params)
    assert problems == []
    assert back == s


def test_flags_travel_under_their_vllm_spelling() -> None:
    s = Scenario(flags={"enable_prefix_caching": False, "max_num_batched_tokens": 2048})
    assert to_query_params(s) == {"enable-prefix-caching": "false", "max-num-batched-tokens": "2048"}


@pytest.mark.parametrize(("params", "named"), [
    ({"max-num-seqs": "many"}, "max-num-seqs"),
    ({"block-size": "8"}, "block-size"),  # flash_attn needs a multiple of 16 (vLLM's start-up rule)
    ({"num_gpus": "0"}, "num_gpus"),
    ({"enable-prefix-caching": "maybe"}, "enable-prefix-caching"),
    ({"spec": "not-a-spec"}, "spec"),
    ({"colour": "blue"}, "colour"),
])
def test_a_bad_url_parameter_is_ignored_and_named(params, named) -> None:
    s, problems = from_query_params({"gpu": "h100-sxm", **params})
    assert s == Scenario(gpu="h100-sxm")  # the rest of the link still applies
    assert len(problems) == 1 and named in problems[0]


def test_a_packed_spec_is_short_enough_for_a_url() -> None:
    assert len(pack_spec(get_preset("chat-production").model_dump_json())) < 1200


# ----------------------------------------------------------------------------- chart data


def test_arrivals_per_bin_by_hand() -> None:
    t, counts = arrivals_per_bin(np.array([10.0, 10.2, 11.9, 12.0, 14.5]), 1.0)
    assert t.tolist() == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert counts.tolist() == [2, 1, 1, 0, 1]


def test_prefix_reuse_curve_by_hand() -> None:
    # blocks of 4 tokens: B reuses A's first two blocks (8 tokens), C repeats B's first block
    # then breaks the run, D reuses nothing it did not itself bring
    ids = [[1, 2, 3], [1, 2, 9], [1, 7, 2], [5, 5]]
    prompt = np.array([12, 10, 12, 8])
    curve = prefix_reuse_curve(ids, prompt, 4)
    reused = np.array([0, 8, 4, 0])
    assert np.allclose(curve, np.cumsum(reused) / np.cumsum(prompt))


@pytest.mark.parametrize("preset", ["chat-production", "agent-multiturn", "code-bursty"])
def test_prefix_reuse_curve_ends_at_describes_total(preset) -> None:
    # sim.describe computes the same share by a vectorised segment algorithm
    wl = generate(get_preset(preset).with_overrides(num_requests=600))
    curve = prefix_reuse_curve((r.hash_ids for r in wl.requests), wl.prompt_len, wl.hash_block_size)
    assert curve[-1] == pytest.approx(prefix_reuse(wl)["token_fraction"], abs=1e-12)
    assert curve[-1] > 0.05


def test_ecdf_by_hand() -> None:
    x, y = ecdf(np.array([3.0, np.nan, 1.0, 2.0, 2.0]))
    assert x.tolist() == [1.0, 2.0, 2.0, 3.0]
    assert y.tolist() == [0.25, 0.5, 0.75, 1.0]


def test_latency_rows_judge_p99_against_the_slo() -> None:
    summary = SimpleNamespace(**{k: LatencyStats(p50_ms=base, p90_ms=2 * base, p99_ms=6 * base)
                                 for k, base in (("ttft", 100), ("tpot", 10), ("itl", 20), ("e2el", 1000))})
    rows = {r["metric"]: r for r in latency_rows(summary, SLO(ttft_ms=500, tpot_ms=100))}
    assert rows["TTFT (ms)"]["p99"] == 600 and rows["TTFT (ms)"]["p99 meets SLO"] == "no"
    assert rows["TPOT (ms)"]["SLO (ms)"] == "100" and rows["TPOT (ms)"]["p99 meets SLO"] == "yes"  # 60 <= 100
    # issue 28: ITL (p99 120 ms here) is not judged against the TPOT target (vLLM's --goodput has no ITL key)
    assert rows["ITL (ms)"]["SLO (ms)"] == "—" and rows["ITL (ms)"]["p99 meets SLO"] == "—"
    # an SLO the user did not set reads "not set", never None
    assert rows["E2E (ms)"]["SLO (ms)"] == "not set" and rows["E2E (ms)"]["p99 meets SLO"] == "—"
    assert rows["E2E (ms)"]["p99"] == 6000
    assert latency_rows(summary, SLO(e2el_ms=5000))[3]["p99 meets SLO"] == "no"  # 6000 > 5000


def test_timeline_series_sorts_by_time_and_accumulates_preemptions() -> None:
    steps = {"t_start_s": np.array([0.2, 0.0, 0.1]), "replica": np.array([1, 0, 0]),
             "num_prefill_seqs": np.array([1, 2, 0]), "num_decode_seqs": np.array([3, 0, 5]),
             "kv_usage": np.array([0.5, 0.1, 0.3]), "num_waiting": np.array([0, 4, 2]),
             "num_preempted": np.array([2, 0, 1])}
    s = timeline_series(steps)
    assert s["t_s"].tolist() == [0.0, 0.1, 0.2]
    assert s["batch_size"].tolist() == [2, 5, 4]
    assert s["kv_usage_pct"].tolist() == pytest.approx([10, 30, 50])
    assert s["preemptions_so_far"].tolist() == [0, 1, 3]


def test_decimate_keeps_the_ends_and_spreads_evenly() -> None:
    assert decimate(5, 10).tolist() == [0, 1, 2, 3, 4]
    assert decimate(101, 5).tolist() == [0, 25, 50, 75, 100]


def test_cost_line_marks_the_operating_point_on_the_curve() -> None:
    line = {"optimization": "prefix caching", "variable": "prefix reuse", "unit": "%",
            "points": [{"x": 40.0, "gain_pct": 15.0}, {"x": 0.0, "gain_pct": -1.0}, {"x": 20.0, "gain_pct": 6.0}],
            "break_even": 3.0, "operating_point": 27.0, "answer": ""}
    assert interpolate_gain(line["points"], 27.0) == pytest.approx(6.0 + 7 / 20 * 9.0)
    fig = cost_line_figure(line)
    star = fig.data[1]
    assert list(star.x) == [27.0] and list(star.y) == [pytest.approx(9.15)]
    assert fig.layout.shapes[0].x0 == 3.0  # the break-even line


def test_waterfall_total_is_the_sum_of_the_rungs() -> None:
    fig = waterfall_figure([{"optimization": "a", "delta_goodput_pct": 10.0},
                            {"optimization": "b", "delta_goodput_pct": -2.5}])
    w = fig.data[0]
    assert list(w.x) == ["a", "b", "total"] and list(w.measure) == ["relative", "relative", "total"]
    assert w.text[-1] == "+7.5%"


# ----------------------------------------------------------------------------- spec editor


def test_rate_and_burstiness_make_vllms_gamma_arrivals() -> None:
    base = get_preset("lab-poisson")
    spec = with_arrival(base, 4.0, 0.25)
    assert spec.arrival == GammaArrival(rate_rps=4.0, burstiness=0.25)
    wl = generate(spec.with_overrides(num_requests=4000))
    assert interarrival_cv(wl.arrival_s) == pytest.approx(1 / math.sqrt(0.25), rel=0.1)  # CV = 1/sqrt(b)
    assert with_arrival(spec, 4.0, 1.0).arrival == PoissonArrival(rate_rps=4.0)
    assert with_arrival(base, base.arrival.rate_rps, 1.0) is base  # nothing changed


def test_length_law_edit_keeps_the_clip_bounds() -> None:
    base = get_preset("chat-production")
    spec = with_law(base, "prompt_tokens", "fixed", {"tokens": 700})
    assert spec.prompt_tokens.kind == "fixed" and spec.prompt_tokens.tokens == 700
    assert (spec.prompt_tokens.min_tokens, spec.prompt_tokens.max_tokens) == (16, 32000)
    with pytest.raises(SpecEditError, match="prompt_tokens uniform"):
        with_law(base, "prompt_tokens", "uniform", {"low": 900, "high": 100})


def test_prefix_edits() -> None:
    base = get_preset("lab-random")  # no shared content at all
    spec = with_prefixes(base, 0.5, 0.2)
    assert spec.system_prompts.share_of_requests == 0.5
    assert spec.dynamic_prefix.share_of_requests == 0.2
    assert with_prefixes(spec, 0.0, 0.0).system_prompts is None


@pytest.mark.parametrize("text", ["chat=1", "chat:0", "chat:-1", "chat:x", "", ":1", "chat:inf"])
def test_bad_task_mix_is_refused_with_the_form_to_use(text) -> None:
    with pytest.raises(SpecEditError, match="NAME:WEIGHT|at least one"):
        parse_task_mix(text)


def test_task_mix_parses() -> None:
    assert parse_task_mix("chat:0.6 code:0.4") == {"chat": 0.6, "code": 0.4}


def test_flags_text_spells_flags_as_vllm_serve_does() -> None:
    from app.recommendation import flags_text

    assert flags_text({"enable_prefix_caching": False, "max_num_batched_tokens": 4096}) == \
        "--disable-prefix-caching --max-num-batched-tokens 4096"
    assert flags_text({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}) == \
        """--speculative-config '{"method":"ngram","num_speculative_tokens":4}'"""
    assert flags_text(["--max-num-seqs", "64"]) == "--max-num-seqs 64"
    assert flags_text(None) == ""


# ----------------------------------------------------------------------------- calibration


def test_profile_info_reads_status_and_validation(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(app_calibration, "PROFILES_DIR", tmp_path)  # a shipped profile, by name
    p = tmp_path / "h100-scaled.json"
    p.write_text(json.dumps({"name": "h100-scaled", "hardware": "h100-sxm",
                             "validation": {"ttft_p99": {"median_abs_error_pct": 4.2, "worst_p99_pct": 8.0},
                                            "tpot_p50": 2.5}}))
    info = profile_info("default", used="h100-scaled", status=SCALED)
    assert info.scaled and info.name == "h100-scaled"
    assert info.validation == [{"metric": "ttft_p99", "median_abs_error_pct": 4.2, "worst_p99_pct": 8.0},
                               {"metric": "tpot_p50", "error": 2.5}]
    assert info.provenance == {"hardware": "h100-sxm"}


def test_a_profile_is_read_by_shipped_name_only(tmp_path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"validation": {"leak": 1}, "hardware": "x"}))
    for name in (str(secret), str(tmp_path / "secret"), "../../../" + str(secret), "/etc/passwd", ".hidden"):
        assert read_profile(name) == {}
        assert profile_info("default", used=name).provenance == {}


def test_a_summary_without_profile_keys_ran_first_principles() -> None:
    info = profile_info("default")
    assert (info.name, info.status, info.scaled) == ("default", "first principles", False)
    assert validation_rows([{"metric": "x", "error": 1}]) == [{"metric": "x", "error": 1}]


# ----------------------------------------------------------------------------- costline app


def test_costline_app_without_streamlit_says_how_to_install(monkeypatch, capsys) -> None:
    from advisor.commands import app as app_cmd
    from costline.cli import main

    monkeypatch.setattr(app_cmd.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit) as exc:
        main(["app", "--port", "8599"])
    assert exc.value.code == 2
    assert "pip install -e '.[app]'" in capsys.readouterr().err


def test_costline_app_runs_streamlit_on_the_packaged_app() -> None:
    from advisor.commands.app import APP_MAIN, streamlit_command

    cmd = streamlit_command(8600, "127.0.0.1", headless=True)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4] == str(APP_MAIN) and APP_MAIN.is_file()
    assert cmd[cmd.index("--server.port") + 1] == "8600"
    assert cmd[cmd.index("--server.headless") + 1] == "true"


def test_validation_rows_of_a_shipped_profile():
    # the format `costline validate --write-profile-validation` writes into the H200 profiles
    v = {"date": "2026-12-01", "command": "costline validate ...", "runs": ["a", "b", "c"], "runs_passed": ["b"],
         "median_abs_error": 0.0123, "worst_p99_abs_error": 0.481,
         "median_abs_error_by_metric": {"output_throughput": 0.0023, "p99_ttft_ms": 0.05}}
    rows = validation_rows(v)
    assert rows[:2] == [{"metric": "output_throughput", "median |error| over runs": "0.2%"},
                        {"metric": "p99_ttft_ms", "median |error| over runs": "5.0%"}]
    assert [r["median |error| over runs"] for r in rows[2:]] == ["1.2%", "48.1%", "1 of 3"]
    shipped = read_profile("h200-llama-3.1-8b")["validation"]
    assert len(validation_rows(shipped)) == len(shipped["median_abs_error_by_metric"]) + 3
