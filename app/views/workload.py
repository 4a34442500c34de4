"""Workload: pick a preset or built-in trace, upload a trace or spec, or edit a generated spec;
its statistics and plots (arrivals over time, length histograms, prefix-reuse curve)."""

from __future__ import annotations

import io
from typing import Any

import streamlit as st
from pydantic import ValidationError

from app import MAX_UPLOAD_MB, state
from app.compute import Upload, scenario_workload
from app.figures import arrivals_figure, lengths_figure, prefix_reuse_curve, reuse_figure
from app.scenario import (
    APP_MAX_REQUESTS,
    CUSTOM,
    DEFAULT_TRACE_REQUESTS,
    DEFAULT_WORKLOAD,
    UPLOAD,
    Scenario,
)
from app.spec_edit import (
    LAW_PARAMS,
    SpecEditError,
    arrival_rate_burstiness,
    law_params,
    parse_task_mix,
    task_mix_text,
    with_arrival,
    with_law,
    with_prefixes,
)
from app.widgets import error_text, fmt
from sim.builtin_traces import BUILTIN_TRACES
from sim.describe import describe_workload
from sim.traces import export_mooncake
from sim.workload import Workload
from sim.workload_presets import get_preset, preset_names
from sim.workload_spec import WorkloadSpec

KINDS = ("preset", "built-in trace", "upload", "edit a spec")
UPLOAD_TYPES = ["jsonl", "csv", "json", "gz", "yaml", "yml"]
FORMATS = ["auto", "mooncake", "azure", "burstgpt"]


def kind_of(s: Scenario) -> str:
    if s.workload == CUSTOM:
        return "edit a spec"
    if s.workload == UPLOAD:
        return "upload"
    return "built-in trace" if s.workload in BUILTIN_TRACES else "preset"


def first_n(s: Scenario) -> int:
    return int(st.number_input("simulate the first N requests", min_value=1, max_value=APP_MAX_REQUESTS,
                               value=s.first or DEFAULT_TRACE_REQUESTS, step=500, key="w.first",
                               help=f"a trace holds ~10k requests; 2,000 answer in ~1 s (at most {APP_MAX_REQUESTS:,} "
                               "here)"))


def pick_source(s: Scenario) -> dict[str, Any]:
    kind = st.radio("Source", KINDS, index=KINDS.index(kind_of(s)), horizontal=True, key="w.kind")
    if kind == "preset":
        names = preset_names()
        name = st.selectbox("preset", names, index=names.index(s.workload if s.workload in names else DEFAULT_WORKLOAD),
                            key="w.preset")
        return {"workload": name, "spec": None, "first": None, "trace_format": "auto", "lenient": False}
    if kind == "built-in trace":
        names = list(BUILTIN_TRACES)
        name = st.selectbox("trace", names, index=names.index(s.workload) if s.workload in names else 0,
                            key="w.trace", format_func=lambda n: f"{n}: {BUILTIN_TRACES[n].description}")
        return {"workload": name, "spec": None, "first": first_n(s), "trace_format": "auto", "lenient": False}
    if kind == "upload":
        f = st.file_uploader("Mooncake JSONL, Azure or BurstGPT CSV (plain or .gz), or a workload spec (JSON)",
                             type=UPLOAD_TYPES, key="w.upload", max_upload_size=MAX_UPLOAD_MB)
        if f is not None:
            st.session_state[state.UPLOAD_KEY] = Upload(f.name, f.getvalue())
        st.caption("An uploaded file stays in this session: a shared link cannot carry it.")
        c1, c2 = st.columns(2)
        fmt_ = c1.selectbox("trace format", FORMATS, index=FORMATS.index(s.trace_format), key="w.format")
        lenient = c2.checkbox("skip bad rows", value=s.lenient, key="w.lenient",
                              help="skip malformed rows (counted in the notes) instead of refusing the file")
        return {"workload": UPLOAD, "spec": None, "first": first_n(s), "trace_format": fmt_, "lenient": lenient}
    return {"workload": CUSTOM, "spec": edit_spec(s).model_dump_json(), "first": None, "trace_format": "auto",
            "lenient": False}


def base_spec(s: Scenario) -> WorkloadSpec:
    if s.spec:
        return WorkloadSpec.model_validate_json(s.spec)
    return get_preset(s.workload if s.workload in preset_names() else DEFAULT_WORKLOAD)


def law_controls(spec: WorkloadSpec, field: str, title: str, col: Any) -> WorkloadSpec:
    law = getattr(spec, field)
    kinds = list(LAW_PARAMS) + ([law.kind] if law.kind not in LAW_PARAMS else [])
    kind = col.selectbox(f"{title} law", kinds, index=kinds.index(law.kind), key=f"spec.{field}.kind")
    if kind not in LAW_PARAMS:
        col.caption(f"{kind} law: edit it in the JSON below")
        return spec
    start = law_params(law) if kind == law.kind else LAW_PARAMS[kind]
    params = {k: col.number_input(f"{title} {k}", value=v, min_value=0 if isinstance(v, int) else 0.0,
                                  key=f"spec.{field}.{kind}.{k}") for k, v in start.items()}
    return with_law(spec, field, kind, params)


def edit_spec(s: Scenario) -> WorkloadSpec:
    """The spec the editor's controls describe (an error is shown and the last valid spec kept)."""
    spec = base_spec(s)
    apply_json(spec)
    spec = base_spec(state.scenario())
    try:
        return edited(spec)
    except (SpecEditError, ValidationError, ValueError) as exc:
        st.error(f"workload spec: {str(exc).splitlines()[0]}")
        return spec


def edited(spec: WorkloadSpec) -> WorkloadSpec:
    c1, c2, c3 = st.columns(3)
    n = c1.number_input("requests", min_value=1, max_value=APP_MAX_REQUESTS, value=min(spec.num_requests, APP_MAX_REQUESTS),
                        step=500, key="spec.n")
    rate, burst = arrival_rate_burstiness(spec)
    rate = c2.number_input("rate (req/s)", min_value=0.01, value=float(rate), key="spec.rate")
    if burst is not None:
        burst = c3.number_input("burstiness (1 = Poisson, < 1 burstier)", min_value=0.01, value=float(burst),
                                key="spec.burstiness")
    spec = with_arrival(spec.with_overrides(num_requests=int(n)), float(rate), burst)
    left, right = st.columns(2)
    spec = law_controls(spec, "prompt_tokens", "prompt", left)
    spec = law_controls(spec, "output_tokens", "output", right)
    c1, c2 = st.columns(2)
    sys_share = c1.slider("share of requests with a shared system prompt", 0.0, 1.0, key="spec.system_share",
                          value=float(spec.system_prompts.share_of_requests) if spec.system_prompts else 0.0)
    dyn_share = c2.slider("dynamic-prefix share (per-request content early in the prompt)", 0.0, 1.0,
                          key="spec.dynamic_share",
                          value=float(spec.dynamic_prefix.share_of_requests) if spec.dynamic_prefix else 0.0)
    spec = with_prefixes(spec, sys_share, dyn_share)
    mix = st.text_input("task mix (NAME:WEIGHT ...)", value=task_mix_text(spec.task_mix), key="spec.mix")
    return WorkloadSpec.model_validate(spec.model_dump() | {"task_mix": parse_task_mix(mix)})


def apply_json(spec: WorkloadSpec) -> None:
    """The whole spec as JSON, editable; "Apply" validates it and resets the controls to it."""
    with st.expander("the spec as JSON (edit everything)"):
        text = st.text_area("spec JSON", value=spec.to_json(), height=300, key="spec.json")
        if not st.button("Apply JSON", key="spec.apply"):
            return
        try:
            new = WorkloadSpec.model_validate_json(text)
        except ValidationError as exc:
            lines = [f"field '{'.'.join(str(x) for x in e['loc'])}': {e['msg']}" for e in exc.errors()]
            st.error("invalid workload spec: " + "; ".join(lines))
            return
        for key in [k for k in st.session_state if str(k).startswith("spec.") and k != "spec.json"]:
            del st.session_state[key]
        state.update(workload=CUSTOM, spec=new.model_dump_json())


def statistics(d: dict[str, Any]) -> None:
    cols = st.columns(6)
    for col, (label, value) in zip(cols, (
            ("Requests", d["requests"]), ("Duration (s)", d["duration_s"]), ("Mean rate (req/s)", d["mean_rate_rps"]),
            ("Inter-arrival CV", d["interarrival_cv"]),
            ("Prefix reuse (tokens %)", 100 * d["prefix_reuse"]["token_fraction"]), ("Sessions", d["sessions"])),
            strict=True):
        col.metric(label, fmt(value))
    rows = [{"tokens": name, **{k: fmt(v) for k, v in d[key].items()}}
            for name, key in (("prompt", "prompt_tokens"), ("output", "output_tokens"))]
    st.dataframe(rows, hide_index=True, key="lengths")
    mix = ", ".join(f"{k} {100 * v:.0f}%" for k, v in d["task_mix"].items())
    st.caption(f"task mix: {mix}" + (f" | notes: {'; '.join(d['notes'])}" if d["notes"] else ""))


def trace_text(wl: Workload) -> str:
    """The workload as `costline workload export` writes it (re-uploading it gives the same requests)."""
    buf = io.StringIO()
    export_mooncake(wl, buf)
    return buf.getvalue()


def main() -> None:
    st.title("Workload")
    s = state.scenario()
    try:
        s = state.update(**pick_source(s))
        if s.workload == UPLOAD and state.upload() is None:
            st.info("Upload a trace or a spec to see its statistics and simulate it.")
            return
        wl = scenario_workload(s, state.upload())
    except Exception as exc:  # noqa: BLE001 - shown on the page, an input error or a bug as such
        st.error(f"cannot read this workload: {error_text(exc)}")
        return
    d = describe_workload(wl)
    statistics(d)
    left, right = st.columns(2)
    if s.spec or s.workload in preset_names():
        left.download_button("workload spec (JSON)", base_spec(s).to_json(), file_name=f"{wl.name}.json",
                             mime="application/json", key="dl.spec")
    right.download_button("these requests (Mooncake JSONL)", trace_text(wl), file_name=f"{wl.name}.jsonl",
                          mime="application/jsonl", key="dl.trace",
                          help="upload it here again, or replay it with vllm bench serve --dataset-name timed_trace; "
                          "exact arrival times and task names ride along")
    st.plotly_chart(arrivals_figure(wl), key="arrivals")
    st.plotly_chart(lengths_figure(wl), key="lengths_fig")
    curve = prefix_reuse_curve((r.hash_ids for r in wl.requests), wl.prompt_len, wl.hash_block_size)
    st.plotly_chart(reuse_figure(curve), key="reuse")


main()
