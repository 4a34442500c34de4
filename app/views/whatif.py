"""What-if: the deployment and every engine flag as controls; goodput, throughput and latency
percentiles against the SLOs, CDFs and timelines; pin a run as A and compare B beside it."""

from __future__ import annotations

import json
from typing import Any

import streamlit as st
from pydantic import ValidationError

from app import state
from app.compute import RunOutput, run_scenario, table_parquet
from app.figures import cdf_figure, latency_rows, timeline_figure
from app.scenario import Scenario
from app.widgets import deployment_controls, error_text, flag_controls, fmt

HEADLINE = (("Goodput (req/s)", "request_goodput"), ("Throughput (req/s)", "request_throughput"),
            ("Output (tok/s)", "output_throughput"), ("p99 TTFT (ms)", "p99_ttft_ms"),
            ("p99 TPOT (ms)", "p99_tpot_ms"), ("Preemptions", "num_preemptions"))
COMPARE = ("request_goodput", "request_throughput", "output_throughput", "output_throughput_per_gpu",
           "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
           "p50_itl_ms", "p90_itl_ms", "p99_itl_ms", "p99_e2el_ms", "num_preemptions", "prefix_cache_hit_rate",
           "kv_cache_usage_max", "completed", "rejected", "num_gpus")


def error_message(exc: Exception) -> str:
    """A configuration error in one line per problem, naming the flag as `vllm serve` spells it
    (an internal error says it is a bug)."""
    return error_text(exc)


def controls() -> Scenario | None:
    """The sidebar's controls; the scenario they describe, or None (the error is on the page)."""
    s = state.scenario()
    with st.sidebar:
        st.subheader("Deployment")
        changes = deployment_controls(s)
        st.subheader("Engine flags (vllm serve)")
        with st.expander("all flags", expanded=True):
            flags = flag_controls(s)
    try:
        new = state.update(**changes, flags=flags)
        new.sim_config().deployment()
    except (ValidationError, ValueError) as exc:
        st.error(f"invalid setting: {error_message(exc)}")
        return None
    return new


def headline(out: RunOutput, pinned: dict[str, Any] | None) -> None:
    cols = st.columns(len(HEADLINE))
    for col, (label, key) in zip(cols, HEADLINE, strict=True):
        value = out.summary.get(key)
        delta = None
        if pinned is not None and value is not None and pinned["summary"].get(key) is not None:
            delta = fmt(value - pinned["summary"][key])
        lower_is_better = key.endswith("_ms") or key == "num_preemptions"
        col.metric(label, fmt(value), delta=delta, delta_color="inverse" if lower_is_better else "normal")


def compare_table(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key in COMPARE:
        x, y = a.get(key), b.get(key)
        ratio = y / x if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x else None
        rows.append({"metric": key, "A (pinned)": fmt(x), "B (now)": fmt(y), "B / A": fmt(ratio)})
    return rows


def ab_titles(a: dict[str, Any], a_label: str, b: dict[str, Any], b_label: str) -> tuple[str, str]:
    """What sets the pinned run A and the current run B apart: the vLLM flags that differ, and
    the workload / deployment when they differ too."""
    from sim.flag_diff import headings

    fa, fb = headings(a.get("vllm_args"), b.get("vllm_args"))
    if a_label == b_label and a.get("deployment") == b.get("deployment"):
        return fa, fb
    return f"{a_label} ({a.get('deployment')}), {fa}", f"{b_label} ({b.get('deployment')}), {fb}"


def downloads(s: Scenario, out: RunOutput) -> None:
    summary = json.dumps(out.summary | {"scenario": s.model_dump()}, indent=2)
    c1, c2, c3 = st.columns(3)
    c1.download_button("summary.json", summary, file_name="summary.json", mime="application/json", key="dl.json")
    c2.download_button("requests.parquet", table_parquet(out.requests), file_name="requests.parquet",
                       mime="application/octet-stream", key="dl.requests")
    c3.download_button("steps.parquet", table_parquet(out.steps), file_name="steps.parquet",
                       mime="application/octet-stream", key="dl.steps")


def simulate(s: Scenario) -> RunOutput | None:
    bar = st.progress(0.0, text="simulating ...")
    try:
        out = run_scenario(s, state.upload(), progress=lambda f: bar.progress(min(max(f, 0.0), 1.0),
                                                                             text="simulating ..."))
    except Exception as exc:  # noqa: BLE001 - shown on the page, an input error or a bug as such
        bar.empty()
        st.error(f"cannot simulate this scenario: {error_message(exc)}")
        return None
    bar.empty()
    return out


def results(s: Scenario, out: RunOutput) -> None:
    summ = out.summary
    pinned = st.session_state.get(state.PINNED)
    st.caption(f"{summ.get('deployment')} | workload {s.workload} | {summ['num_prompts']:,} requests | "
               f"simulated in {out.wall_s:.2f} s | profile {summ.get('profile') or s.profile}")
    headline(out, pinned)
    st.subheader("Latency against the SLOs")
    ms = st.column_config.NumberColumn(format="%.1f")
    st.dataframe(latency_rows(summ, summ.get("goodput_slo")), hide_index=True, key="latency",
                 column_config={"p50": ms, "p90": ms, "p99": ms})
    st.code(summ.get("serve_command") or "", language="bash")
    left, right = st.columns([1, 3])
    if left.button("Pin this run as A", key="pin"):
        st.session_state[state.PINNED] = {"label": s.label(), "summary": summ, "requests": out.requests}
        pinned = st.session_state[state.PINNED]
    if pinned is not None and right.button("Unpin A", key="unpin"):
        st.session_state.pop(state.PINNED)
        pinned = None
    if pinned is not None:
        a_title, b_title = ab_titles(pinned["summary"], pinned["label"], summ, s.label())
        st.subheader(f"A: {a_title} vs B: {b_title}")
        st.dataframe(compare_table(pinned["summary"], summ), hide_index=True, key="compare")
    cdf_tab, time_tab = st.tabs(["CDFs", "Timelines"])
    with cdf_tab:
        st.plotly_chart(cdf_figure(out.requests, summ.get("goodput_slo"),
                                   pinned["requests"] if pinned else None), key="cdf")
    with time_tab:
        st.plotly_chart(timeline_figure(out.steps), key="timeline")
    downloads(s, out)


def main() -> None:
    st.title("What-if")
    s = controls()
    if s is None:
        return
    st.caption("Change a flag in the sidebar and the run updates; the URL holds the scenario (share it).")
    out = simulate(s)
    if out is not None:
        results(s, out)


main()
