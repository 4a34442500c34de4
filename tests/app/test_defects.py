"""The dashboard defects of issue 28 (item 6), each driven by Streamlit's AppTest: the advisor's
progress bar, and the others below."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from advisor.advise.progress import ProgressEvent
from tests.app.recommendation_fixture import recommendation
from tests.conftest import REPO

MAIN = str(REPO / "app" / "main.py")


def app() -> AppTest:
    return AppTest.from_file(MAIN, default_timeout=120)


def advisor_page() -> AppTest:
    at = app()
    at.run()
    at.switch_page("views/advisor.py").run()
    return at


class Bar:
    """Stands in for st.progress: records what the advisor page shows."""

    def __init__(self, shown: list) -> None:
        self.shown = shown

    def progress(self, value: float, text: str | None = None) -> Bar:
        self.shown.append((value, text))
        return self

    def empty(self) -> None:
        pass


def test_advisor_progress_bar_shows_the_counts_and_eta(monkeypatch) -> None:
    import streamlit

    import advisor.advise

    shown: list = []
    monkeypatch.setattr(streamlit, "progress", lambda value=0.0, text=None: Bar(shown).progress(value, text))

    def fake(workload, request, progress=None):
        progress(ProgressEvent("search", 12, 46, 6.0, 17.0, 0.12))
        progress(ProgressEvent("cost lines", 34, 34, 3.0, 0.0, 0.8, finished=True))
        return recommendation()

    monkeypatch.setattr(advisor.advise, "advise", fake)
    at = advisor_page()
    at.button(key="adv.run").click().run()
    assert not at.exception and not at.error
    assert (0.12, "search: 12/46 simulations, ETA 17 s") in shown
    assert (0.8, "cost lines: 34/34 simulations, done in 3 s") in shown


# ------------------------------------------------------------------ export -> upload round trip
def chat_300():
    from sim.workload_source import SourceOptions, load_workload

    return load_workload("chat-production", SourceOptions(num_requests=300))


def exported(wl) -> str:
    import io

    from sim.traces import export_mooncake

    buf = io.StringIO()
    export_mooncake(wl, buf)
    return buf.getvalue()


def test_export_then_load_keeps_every_column_and_the_simulation(tmp_path) -> None:
    import numpy as np

    from sim.run import SimConfig, run
    from sim.workload_source import SourceOptions, load_workload

    wl = chat_300()
    assert np.unique(np.rint(wl.arrival_s * 1000)).size < np.unique(wl.arrival_s).size == 300  # ms ties exist
    path = tmp_path / "chat.jsonl"
    path.write_text(exported(wl))
    back = load_workload(str(path), SourceOptions())
    np.testing.assert_array_equal(back.arrival_s, wl.arrival_s - wl.arrival_s[0])  # 300 distinct, exactly
    np.testing.assert_array_equal(back.prompt_len, wl.prompt_len)
    np.testing.assert_array_equal(back.output_len, wl.output_len)
    assert back.category.tolist() == wl.category.tolist()  # the task mix
    np.testing.assert_array_equal(back.session_id, wl.session_id)
    a_ids, a_off = wl.flat_hash_ids()
    b_ids, b_off = back.flat_hash_ids()
    np.testing.assert_array_equal(a_ids, b_ids)
    np.testing.assert_array_equal(a_off, b_off)
    assert back.hash_block_size == wl.hash_block_size
    config = SimConfig(slo="ttft:500 tpot:50")
    unstable = {"date", "wall_s", "simulated_requests_per_wall_s", "label"}
    same = [{k: v for k, v in run(w, config).summary().to_json_dict().items() if k not in unstable} for w in (wl, back)]
    assert same[0] == same[1]


def test_export_then_upload_on_the_workload_page_shows_the_same_workload() -> None:
    from app.compute import Upload
    from sim.workload_source import SourceOptions, load_workload

    at = app()
    at.run()
    at.switch_page("views/workload.py").run()
    assert "these requests (Mooncake JSONL)" in [d.proto.label for d in at.get("download_button")]
    before = {m.label: m.value for m in at.metric}
    mix = [c.value.split(" | notes")[0] for c in at.caption if c.value.startswith("task mix")]
    # what the button serves for the page's workload (the default preset, 2,000 requests)
    data = exported(load_workload("chat-production", SourceOptions(seed=0))).encode()
    at.radio(key="w.kind").set_value("upload").run()
    at.session_state["upload"] = Upload("chat.jsonl", data)
    at.run()
    assert not at.exception and not at.error
    assert {m.label: m.value for m in at.metric} == before
    assert [c.value.split(" | notes")[0] for c in at.caption if c.value.startswith("task mix")] == mix
    assert mix and "chat" in mix[0]


def test_export_then_upload_gives_the_same_recommendation(tmp_path) -> None:
    from advisor.advise.evaluate import Evaluator
    from advisor.advise.scenarios import SCENARIOS
    from advisor.advise.search import BudgetPlan, search
    from sim.workload_source import SourceOptions, load_workload

    wl = chat_300().take(list(range(60)))
    path = tmp_path / "chat.jsonl"
    path.write_text(exported(wl))
    back = load_workload(str(path), SourceOptions())
    found = []
    for w in (wl, back):
        ctx = SCENARIOS[0].context(len(w))
        ctx.plan_override = BudgetPlan(first_slice=20, max_slice=60, max_pool=4)  # small: same code path
        with Evaluator(w) as ev:
            best = search(ev, ctx).best
        found.append((best.cand, best.outcome.metrics))
    assert found[0] == found[1]


# ------------------------------------------------------------------ A/B headings
def test_ab_heading_names_the_flags_that_differ() -> None:
    at = app()
    at.run()
    at.button(key="pin").click().run()
    at.toggle(key="flag.enable_prefix_caching").set_value(False)
    at.number_input(key="flag.max_num_batched_tokens").set_value(2048)
    at.run()
    assert not at.exception
    heading = next(h.value for h in at.subheader if h.value.startswith("A: "))
    assert heading == ("A: --max-num-batched-tokens auto (default), --enable-prefix-caching (default) vs "
                       "B: --max-num-batched-tokens 2048, --disable-prefix-caching")


# ------------------------------------------------------------------ figures and placeholders
def test_figures_have_three_significant_digits_not_two_decimals() -> None:
    from app.widgets import fmt

    assert [fmt(x) for x in (2418.0, 593.8, 42.37, 7.25, 0.93, 0.012345, -1.5, 0.0, 1e-9)] == \
        ["2,418", "594", "42.4", "7.25", "0.930", "0.0123", "-1.50", "0", "0"]
    assert fmt(12) == "12" and fmt(None) == "-" and fmt(float("nan")) == "-"
    at = app()
    at.run()
    shown = {m.label: m.value for m in at.metric}
    assert "." not in shown["Output (tok/s)"] and float(shown["Output (tok/s)"].replace(",", "")) > 100


def test_flags_left_to_vllm_show_its_default_in_a_short_placeholder() -> None:
    at = app()
    at.run()
    # vLLM's start-up defaults for the API server on an 80+ GB GPU, and Llama-3.1-8B's context
    expected = {"max_num_batched_tokens": "auto: 8,192", "max_num_seqs": "auto: 1,024",
                "max_model_len": "auto: 131,072", "num_gpu_blocks_override": "auto"}
    for name, text in expected.items():
        box = at.number_input(key=f"flag.{name}")
        assert box.value is None and box.proto.placeholder == text, name
        assert len(text) <= 16  # fits the sidebar's narrowest control


# ------------------------------------------------------------------ bad input
PYDANTIC_WORDS = ("validation error", "Input should", "type=", "errors.pydantic", "For further information")


def test_bad_url_values_show_one_line_naming_the_parameter() -> None:
    cases = {"num_gpus": "abc", "gpu-memory-utilization": "2", "slo": "fast", "seed": "-1", "first": "0",
             "max-num-seqs": "1e3", "kv-cache-dtype": "int3", "router": "x", "lenient": "maybe", "disagg": "x:y"}
    for key, value in cases.items():
        at = app()
        at.query_params[key] = value
        at.run()
        assert not at.exception and not at.error, key
        msgs = [w.value for w in at.warning]
        assert len(msgs) == 1 and "\n" not in msgs[0], (key, msgs)
        assert msgs[0].startswith(f"query parameter {key}") and msgs[0].endswith("ignored"), msgs[0]
        assert not any(w in msgs[0] for w in PYDANTIC_WORDS), msgs[0]
        assert at.metric  # the page still runs the rest of the scenario


def test_a_bad_upload_leaves_the_calibration_page_working() -> None:
    from app.compute import Upload

    at = app()
    at.run()
    at.switch_page("views/workload.py").run()
    at.radio(key="w.kind").set_value("upload").run()
    at.session_state["upload"] = Upload("broken.csv", b"when,what\n1,2\n")
    at.run()
    at.switch_page("views/calibration.py").run()
    assert not at.exception and not at.error
    assert len(at.warning) == 1 and "broken.csv" in at.warning[0].value
    shown = {m.label: m.value for m in at.metric}
    assert shown["Cost profile in use"] == "h200-llama-3.1-8b" and shown["Status"]


def test_the_page_icon_is_an_emoji_drawn_locally(monkeypatch) -> None:
    import streamlit
    from streamlit.string_util import is_emoji

    seen = {}
    real = streamlit.set_page_config
    monkeypatch.setattr(streamlit, "set_page_config", lambda **kw: (seen.update(kw), real(**kw))[1])
    at = app()
    at.run()
    assert not at.exception
    icon = seen["page_icon"]
    # a :material/...: icon or a shortcode makes the browser fetch it from the internet
    assert isinstance(icon, str) and is_emoji(icon) and not icon.startswith(":")


# ------------------------------------------------------------------ advisor page
def test_advisor_page_objective_and_report_downloads(monkeypatch) -> None:
    import advisor.advise
    from app.recommendation import report_files

    seen = []

    def fake(workload, request, progress=None):
        seen.append(request)
        return recommendation()

    monkeypatch.setattr(advisor.advise, "advise", fake)
    at = advisor_page()
    at.session_state["adv.objective"] = "cost"
    at.button(key="adv.run").click().run()
    assert not at.exception and not at.error
    assert seen[0].objective == "cost"
    labels = [d.proto.label for d in at.get("download_button")]
    assert {"recommendation.json", "report.md", "serve.sh"} <= set(labels)
    rec = recommendation()
    files = report_files(rec)
    assert files["report.md"].startswith("# costline advise: chat-production")
    assert rec["serve_command"] in files["report.md"] and rec["serve_command"] in files["serve.sh"]
    assert files["serve.sh"].startswith("#!/usr/bin/env bash")
    assert report_files({"best": {}}) == {}  # a partial file: only recommendation.json is offered
