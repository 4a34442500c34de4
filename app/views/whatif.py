"""What-if: the deployment and every engine flag as controls; goodput, throughput and latency
percentiles against the SLOs, CDFs and timelines; pin a run as A and compare B beside it."""

from __future__ import annotations

import json
from operator import attrgetter
from typing import Any

import streamlit as st
from pydantic import ValidationError

from app import state
from app.compute import RunOutput, run_scenario, table_parquet
from app.figures import cdf_figure, finite_or_none, latency_rows, timeline_figure
from app.scenario import Scenario
from app.widgets import deployment_controls, error_text, flag_controls, fmt
from engine.core.run_summary import jsonable
from engine.core.summary_record import RunSummary

# (label, RunSummary field, lower is better)
HEADLINE = (("Goodput (req/s)", "request_goodput", False), ("Throughput (req/s)", "request_throughput", False),
            ("Output (tok/s)", "output_throughput", False), ("p99 TTFT (ms)", "ttft.p99_ms", True),
            ("p99 TPOT (ms)", "tpot.p99_ms", True), ("Preemptions", "num_preemptions", True))
# the comparison's rows: (name shown, as summary.json names it; RunSummary field)
COMPARE = (("request_goodput", "request_goodput"), ("request_throughput", "request_throughput"),
           ("output_throughput", "output_throughput"), ("output_throughput_per_gpu", "output_throughput_per_gpu"),
           *((f"{p}_{m}_ms", f"{m}.{p}_ms") for m in ("ttft", "tpot", "itl") for p in ("p50", "p90", "p99")),
           ("p99_e2el_ms", "e2el.p99_ms"), ("num_preemptions", "num_preemptions"),
           ("prefix_cache_hit_rate", "prefix_cache_hit_rate"), ("kv_cache_usage_max", "kv_cache_usage_max"),
           ("completed", "completed"), ("rejected", "rejected"), ("num_gpus", "num_gpus"))


def figure(summary: RunSummary, field: str) -> Any:
    """A summary's field by its dotted path ("ttft.p99_ms"); None where the run had no sample."""
    return finite_or_none(attrgetter(field)(summary))


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
    for col, (label, field, lower_is_better) in zip(cols, HEADLINE, strict=True):
        value = figure(out.summary, field)
        delta = None
        if pinned is not None and value is not None and figure(pinned["summary"], field) is not None:
            delta = fmt(value - figure(pinned["summary"], field))
        col.metric(label, fmt(value), delta=delta, delta_color="inverse" if lower_is_better else "normal")


def compare_table(a: RunSummary, b: RunSummary) -> list[dict[str, Any]]:
    rows = []
    for key, field in COMPARE:
        x, y = figure(a, field), figure(b, field)
        ratio = y / x if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x else None
        rows.append({"metric": key, "A (pinned)": fmt(x), "B (now)": fmt(y), "B / A": fmt(ratio)})
    return rows


def ab_titles(a: RunSummary, a_label: str, b: RunSummary, b_label: str) -> tuple[str, str]:
    """What sets the pinned run A and the current run B apart: the vLLM flags that differ, and
    the workload / deployment when they differ too."""
    from sim.flag_diff import headings

    fa, fb = headings(a.vllm_args, b.vllm_args)
    if a_label == b_label and a.deployment == b.deployment:
        return fa, fb
    return f"{a_label} ({a.deployment}), {fa}", f"{b_label} ({b.deployment}), {fb}"


def downloads(s: Scenario, out: RunOutput) -> None:
    summary = json.dumps(jsonable(out.summary.to_json_dict()) | {"scenario": s.model_dump()}, indent=2)
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
    st.caption(f"{summ.deployment} | workload {s.workload} | {summ.num_prompts:,} requests | "
               f"simulated in {out.wall_s:.2f} s | profile {summ.profile or s.profile}")
    headline(out, pinned)
    st.subheader("Latency against the SLOs")
    ms = st.column_config.NumberColumn(format="%.1f")
    st.dataframe(latency_rows(summ, summ.slo), hide_index=True, key="latency",
                 column_config={"p50": ms, "p90": ms, "p99": ms})
    st.code(summ.serve_command or "", language="bash")
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
        st.plotly_chart(cdf_figure(out.requests, summ.slo,
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
