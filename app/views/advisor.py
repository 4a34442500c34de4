"""Advisor: the recommendation for the scenario's workload and deployment (or a saved
recommendation.json): best vs baseline, the ladder as a waterfall, cost lines with the operating
point, the lab -> production gap, the robustness table and the `vllm serve` command."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import state
from app.compute import scenario_workload
from app.recommendation import RecommendationError, advise_api, as_dict, load_json, render
from app.scenario import Scenario
from app.widgets import error_text
from engine.core.run_summary import SLO

REC_KEY = "recommendation"
MAX_RECOMMENDATION_MB = 8  # a recommendation.json is ~100 KB
# `costline advise --objective`, as the CLI's help words them
OBJECTIVES = {"goodput": "goodput", "min-gpus": "fewest GPUs", "cost": "cost (requests per $)"}


def run_advisor(s: Scenario, budget: str, *, allow: list[str] | None = None, forbid: list[str] | None = None,
                gpu_hour_usd: float = 0.0, compare: list[str] | None = None,
                objective: str = "goodput") -> dict[str, Any] | None:
    api = advise_api()
    assert api is not None
    advise, request_cls = api
    bar = st.progress(0.0, text="starting the advisor ...")

    def progress(ev: Any) -> None:  # an advisor.advise.progress.ProgressEvent, on this script's thread
        bar.progress(min(max(float(ev.fraction), 0.0), 1.0), text=ev.text())

    try:
        wl = scenario_workload(s, state.upload())
        request = request_cls(model=s.model, gpu=s.gpu, num_gpus=s.num_gpus, slo=SLO.parse(s.slo), seed=s.seed,
                              budget=budget, profile=None if s.profile == "auto" else s.profile, objective=objective,
                              allow=allow or None, forbid=forbid or [], gpu_hour_usd=gpu_hour_usd or None)
        if compare:
            from advisor.advise import compare_gpus

            rec = as_dict(compare_gpus(wl, request, compare, progress=progress))
        else:
            rec = as_dict(advise(wl, request, progress=progress))
    except Exception as exc:  # noqa: BLE001 - shown on the page, an input error or a bug as such
        st.error(f"the advisor refused this scenario: {error_text(exc).splitlines()[0]}")
        return None
    finally:
        bar.empty()
    return rec


def main() -> None:
    st.title("Advisor")
    s = state.scenario()
    if advise_api() is None:
        st.info("The advisor is not installed here (advisor.advise is missing): load a recommendation.json "
                "below to view one.")
    else:
        st.caption(f"Workload {s.workload}, {s.model} on {s.num_gpus}x {s.gpu}, SLOs {s.slo or '-'} "
                   "(change them on the What-if and Workload pages).")
        left, right = st.columns(2)
        budget = left.segmented_control("search budget", ["quick", "full"], default="quick", key="adv.budget")
        objective = right.segmented_control("--objective", list(OBJECTIVES), default="goodput", key="adv.objective",
                                            format_func=lambda o: OBJECTIVES[o], help="what the search maximises")
        from advisor.advise.space import FEATURE_GROUPS, FEATURES

        names = [*FEATURE_GROUPS, *FEATURES]
        left, right = st.columns(2)
        forbid = left.multiselect("--forbid: never recommend", names, key="adv.forbid",
                                  help="e.g. fp8-weights (output quality) or spec (no draft model)")
        allow = right.multiselect("--allow: search only these (empty = all)", names, key="adv.allow")
        from sim.hardware import GPU_PRESETS

        left, right = st.columns(2)
        usd = left.number_input(f"--gpu-hour-usd: $ per {s.gpu} GPU-hour (0 = the default table)", min_value=0.0,
                                max_value=999.0, value=0.0, step=0.1, key="adv.usd")
        compare = right.multiselect("--compare-gpus: also advise on", [g for g in GPU_PRESETS if g != s.gpu],
                                    key="adv.compare")
        if st.button("Run the advisor", key="adv.run", type="primary"):
            rec = run_advisor(s, budget or "quick", allow=allow, forbid=forbid, gpu_hour_usd=usd, compare=compare,
                              objective=objective or "goodput")
            if rec is not None:
                st.session_state[REC_KEY] = rec
    f = st.file_uploader("or load a recommendation.json", type=["json"], key="adv.upload",
                         max_upload_size=MAX_RECOMMENDATION_MB)
    if f is not None:
        try:
            st.session_state[REC_KEY] = load_json(f.getvalue())
        except RecommendationError as exc:
            st.error(str(exc))
    rec = st.session_state.get(REC_KEY)
    if rec is not None:
        try:
            render(as_dict(rec))
        except (RecommendationError, KeyError, TypeError, AttributeError, ValueError) as exc:
            st.error(f"cannot show this recommendation: it lacks or mistypes {exc} (load the recommendation.json "
                     "`costline advise --out` writes)")


main()
