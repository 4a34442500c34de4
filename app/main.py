"""The costline dashboard's entry point: `streamlit run app/main.py` (or `costline app`).

Four pages: What-if (the default), Workload, Advisor, Calibration. The scenario lives in the
session and in the URL's query parameters, so a link reproduces what it shows.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app import state

VIEWS = Path(__file__).with_name("views")

st.set_page_config(page_title="costline what-if", page_icon=":material/speed:", layout="wide")
state.init()
page = st.navigation([
    st.Page(VIEWS / "whatif.py", title="What-if", url_path="whatif", default=True),
    st.Page(VIEWS / "workload.py", title="Workload", url_path="workload"),
    st.Page(VIEWS / "advisor.py", title="Advisor", url_path="advisor"),
    st.Page(VIEWS / "calibration.py", title="Calibration", url_path="calibration"),
])
state.show_url_problems()
page.run()
state.sync_url()
