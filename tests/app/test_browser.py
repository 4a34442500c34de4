"""The dashboard in a real browser: `costline app` on a free localhost port, headless Chromium
(Debian's package, apt-get installed by `chromium_path` when missing), one click that must change
the numbers, and a screenshot of each page under out/test-artifacts/app/."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from tests.app.browser import REPO, BrowserUnavailable, chromium_path, running_app, tour

ARTIFACTS = REPO / "out" / "test-artifacts" / "app"
PAGES = ("whatif.png", "whatif-prefix-caching-off.png", "whatif-timelines.png", "workload.png", "advisor.png", "calibration.png")


def test_browser_click_changes_the_numbers_and_every_page_renders() -> None:
    try:
        chromium = chromium_path()
    except BrowserUnavailable as exc:  # never a silent skip: the browser test must run
        pytest.fail(f"the browser test needs Chromium: {exc}")
    with running_app() as url:
        seen = tour(url, ARTIFACTS, chromium)
    # the default scenario, then prefix caching off: the simulator's p99 TTFT must move
    assert seen.goodput_before and seen.p99_ttft_before
    assert seen.p99_ttft_after != seen.p99_ttft_before
    assert float(seen.p99_ttft_after.replace(",", "")) > float(seen.p99_ttft_before.replace(",", ""))
    # the click reached the URL: the scenario is shareable
    assert parse_qs(urlparse(seen.url_after).query).get("enable-prefix-caching") == ["false"]
    assert [p.name for p in seen.screenshots] == list(PAGES)
    # issue 28: /whatif opens What-if (at the root, the URL's scenario kept), no "Page not found"
    assert seen.page_not_found == 0
    assert urlparse(seen.whatif_alias_url).path == "/" and "max-num-seqs=64" in seen.whatif_alias_url
    assert seen.favicon.startswith("data:image/svg+xml")  # drawn locally, nothing fetched
    for p in seen.screenshots:
        assert p.stat().st_size > 20_000, f"{p} looks empty"
