"""The costline dashboard's entry point: `streamlit run app/main.py` (or `costline app`).

Four pages: What-if (the default), Workload, Advisor, Calibration. The scenario lives in the
session and in the URL's query parameters, so a link reproduces what it shows.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app import state

VIEWS = Path(__file__).with_name("views")

# a unicode emoji: the browser draws it as the favicon itself (a :material/...: icon or an emoji
# shortcode is fetched from the internet, which fails offline)
PAGE_ICON = "📈"
st.set_page_config(page_title="costline what-if", page_icon=PAGE_ICON, layout="wide")
state.init()
whatif = st.Page(VIEWS / "whatif.py", title="What-if", url_path="what-if", default=True)


def whatif_alias() -> None:
    """/whatif, the path the other pages' names suggest, opens What-if (served at the root)."""
    st.switch_page(whatif)


page = st.navigation([
    whatif,
    st.Page(VIEWS / "workload.py", title="Workload", url_path="workload"),
    st.Page(VIEWS / "advisor.py", title="Advisor", url_path="advisor"),
    st.Page(VIEWS / "calibration.py", title="Calibration", url_path="calibration"),
    st.Page(whatif_alias, title="What-if", url_path="whatif", visibility="hidden"),
])
state.show_url_problems()
page.run()
state.sync_url()
