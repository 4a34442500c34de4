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
