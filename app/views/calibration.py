"""Calibration: which cost profile the scenario's run used, its validation error per metric, and
a warning when the GPU's profile is scaled from another GPU rather than validated on it."""

from __future__ import annotations

import streamlit as st

from app import state
from app.calibration import FIRST_PRINCIPLES, profile_info
from app.compute import run_scenario
from app.widgets import error_text


def main() -> None:
    st.title("Calibration")
    s = state.scenario()
    try:
        out = run_scenario(s, state.upload())
    except Exception as exc:  # noqa: BLE001 - shown on the page, an input error or a bug as such
        st.error(f"cannot simulate this scenario: {error_text(exc).splitlines()[0]}")
        return
    info = profile_info(s.profile, used=out.summary.profile, status=out.summary.profile_status,
                        validation=out.summary.profile_validation)
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
