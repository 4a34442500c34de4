"""Session state shared by the pages: the scenario (mirrored into the URL), the upload, the run
pinned as A.

Widgets are created with their value taken from the scenario and a key of their own, and each
page writes the scenario back from its widgets; so a setting survives a page switch (Streamlit
drops the state of widgets a page no longer shows) and the URL always describes what is shown.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app.compute import Upload
from app.scenario import Scenario, from_query_params, to_query_params

SCENARIO, UPLOAD_KEY, PINNED, PROBLEMS, STARTED = "scenario", "upload", "pinned", "url_problems", "started"


def init() -> None:
    """On a session's first run, read the scenario from the URL (what a shared link carries)."""
    if STARTED in st.session_state:
        return
    scenario, problems = from_query_params(dict(st.query_params.to_dict()))
    st.session_state[SCENARIO] = scenario
    st.session_state[PROBLEMS] = problems
    st.session_state[STARTED] = True


def scenario() -> Scenario:
    return st.session_state.get(SCENARIO) or Scenario()


def update(**changes: Any) -> Scenario:
    """The scenario with `changes` applied (validated), stored for every page and the URL."""
    new = Scenario.model_validate(scenario().model_dump() | changes)
    st.session_state[SCENARIO] = new
    return new


def upload() -> Upload | None:
    return st.session_state.get(UPLOAD_KEY)


def sync_url() -> None:
    """Mirror the scenario into the query parameters (only what differs from the defaults)."""
    want = to_query_params(scenario())
    if dict(st.query_params.to_dict()) != want:
        st.query_params.from_dict(want)


def show_url_problems() -> None:
    """One warning per ignored URL parameter; what the link carried is shown as text, never as
    Markdown (a link or image in a parameter stays inert)."""
    for msg in st.session_state.get(PROBLEMS, []):
        st.warning(inert_markdown(msg))


_MARKDOWN = str.maketrans({c: "\\" + c for c in "[]<>`$"})


def inert_markdown(text: str) -> str:
    """`text` with the characters that make Markdown links, images, HTML, code and maths escaped."""
    return text.translate(_MARKDOWN)


__all__ = ["init", "scenario", "show_url_problems", "sync_url", "update", "upload"]
