"""Calibration: which cost profile the scenario's run used, its validation error per metric, and
a warning when the GPU's profile is scaled from another GPU rather than validated on it."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import state
from app.calibration import FIRST_PRINCIPLES, profile_info
from app.compute import scenario_workload
from app.scenario import Scenario
from app.widgets import error_text
from sim.profile_files import load_profile
from sim.run import profile_meta


def profile_summary(s: Scenario) -> dict[str, Any]:
    """The `profile*` keys a run of the scenario records, without running it: the profile depends
    on the model, the GPU and the profile chosen, not on the workload, so a workload that cannot
    be read (a bad upload) leaves this page working."""
    cfg = s.sim_config()
    return profile_meta(load_profile(cfg.profile, cfg.model, cfg.gpu))


def main() -> None:
    st.title("Calibration")
    s = state.scenario()
    try:
        summary = profile_summary(s)
    except Exception as exc:  # noqa: BLE001 - shown on the page, an input error or a bug as such
        st.error(f"cannot load the cost profile of this scenario: {error_text(exc).splitlines()[0]}")
        return
    try:
        scenario_workload(s, state.upload())
    except Exception as exc:  # noqa: BLE001 - the profile below does not depend on the workload
        st.warning(f"the workload cannot be simulated: {error_text(exc).splitlines()[0]} (fix it on the Workload "
                   "page; the profile below does not depend on it)")
    info = profile_info(summary, s.profile)
    c1, c2 = st.columns(2)
    c1.metric("Cost profile in use", info.name)
    c2.metric("Status", info.status)
    st.caption(f"for {s.model} on {s.gpu} (choose the profile on the What-if page)")
    if info.scaled:
        st.warning(f"The {s.gpu} profile is scaled from another GPU by datasheet ratios, not validated on "
                   f"{s.gpu}: its absolute latencies may be off; relative comparisons hold better.")
    elif info.status == FIRST_PRINCIPLES:
        st.info("First-principles profile: datasheet rates and typical kernel efficiencies, not fitted to "
                "measurements.")
    st.subheader("Validation error per metric")
    if info.validation:
        st.dataframe(info.validation, hide_index=True, key="cal.validation")
    else:
        st.caption("This profile carries no validation (no `validation` field in its JSON).")
    if info.provenance:
        st.subheader("Provenance")
        st.json(info.provenance)


main()
