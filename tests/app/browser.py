"""The dashboard in a real browser: `costline app` on a free localhost port, driven by headless
Chromium (Debian's `chromium` package) through Playwright. Used by tests/app/test_browser.py and,
to refresh the committed screenshots, as a script:

    .venv/bin/python -m tests.app.browser docs/screenshots
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.app.recommendation_fixture import recommendation

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90
CHART = ".js-plotly-plot"
METRIC = '[data-testid="stMetricValue"]'


class BrowserUnavailable(RuntimeError):
    """Chromium is missing and could not be installed; the message says how to install it."""


def chromium_path() -> str:
    """Debian's chromium, installed with apt-get when missing and we are root (CI is)."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        raise BrowserUnavailable("chromium is not installed and this user cannot install it: "
                                 "run `apt-get install -y chromium` as root")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise BrowserUnavailable(f"`{' '.join(cmd)}` failed ({done.returncode}): "
                                     f"{done.stderr.strip()[-400:]}; install chromium by hand")
    found = shutil.which("chromium")
    if not found:
        raise BrowserUnavailable("apt-get installed chromium but no `chromium` is on PATH")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_app(port: int | None = None) -> Iterator[str]:
    """`costline app --headless` on a free port; yields its URL and stops it afterwards."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "costline.cli", "app", "--port", str(port), "--headless"]
    # its own process group, so stopping it stops everything it started
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"costline app exited ({proc.returncode}): {proc.stdout.read() if proc.stdout else ''}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().decode().strip() == "ok":
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"costline app did not answer on {url} within {START_TIMEOUT_S} s")


@dataclass(slots=True)
class Tour:
    """What a walk through the pages saw: the What-if headline before and after one click, and
    the screenshots taken."""

    goodput_before: str = ""
    goodput_after: str = ""
    p99_ttft_before: str = ""
    p99_ttft_after: str = ""
    url_after: str = ""
    screenshots: list[Path] = field(default_factory=list)
    whatif_alias_url: str = ""  # where /whatif?... ended up
    page_not_found: int = -1  # "Page not found" texts seen there
    favicon: str = ""


def metric_value(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]', has_text=label).first
    return box.locator(METRIC).inner_text()


def tour(url: str, out_dir: Path, chromium: str, rec: dict | None = None) -> Tour:
    """Open each page, wait for its charts, click one control on What-if, save screenshots."""
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    seen = Tour()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1900})
        page.goto(f"{url}/")  # the default page (What-if) lives at the root
        page.wait_for_selector(CHART, timeout=60_000)
        seen.goodput_before = metric_value(page, "Goodput (req/s)")
        seen.p99_ttft_before = metric_value(page, "p99 TTFT (ms)")
        shot(page, out_dir / "whatif.png", seen)
        page.get_by_text("--enable-prefix-caching", exact=True).click()
        page.wait_for_function(
            """([label, before]) => [...document.querySelectorAll('[data-testid="stMetric"]')]
                 .some(m => m.innerText.includes(label)
                       && m.querySelector('[data-testid="stMetricValue"]').innerText !== before)""",
            arg=["p99 TTFT (ms)", seen.p99_ttft_before], timeout=60_000)
        page.wait_for_selector(CHART, timeout=60_000)
        seen.goodput_after = metric_value(page, "Goodput (req/s)")
        seen.p99_ttft_after = metric_value(page, "p99 TTFT (ms)")
        # the URL is written at the end of the script run (app/main.py: sync_url after the page),
        # so it can reach the browser after the metrics do: wait for it rather than read it early
        page.wait_for_function("() => window.location.search.includes('enable-prefix-caching')",
                               timeout=60_000)
        seen.url_after = page.url
        shot(page, out_dir / "whatif-prefix-caching-off.png", seen)
        page.get_by_role("tab", name="Timelines").click()
        page.get_by_text("Engine timelines").wait_for(state="visible", timeout=60_000)
        shot(page, out_dir / "whatif-timelines.png", seen)
        visit(page, f"{url}/workload", out_dir / "workload.png", seen, wait_for=CHART)
        advisor_page(page, url, out_dir, seen, rec)
        visit(page, f"{url}/calibration", out_dir / "calibration.png", seen, wait_for=METRIC)
        alias(page, url, seen)
        browser.close()
    return seen


def advisor_page(page, url: str, out_dir: Path, seen: Tour, rec: dict | None = None) -> None:
    """The Advisor page showing a recommendation.json uploaded through its file input (the test's
    fixture, or `rec`: a real recommendation for the committed screenshots)."""
    page.goto(f"{url}/advisor")
    path = out_dir / "recommendation.json"
    path.write_text(json.dumps(rec or recommendation()))
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
    page.wait_for_selector(CHART, timeout=60_000)
    path.unlink()
    shot(page, out_dir / "advisor.png", seen)


def alias(page, url: str, seen: Tour) -> None:
    """/whatif, the path the other pages' names suggest: What-if, with no "Page not found" pop-up."""
    page.goto(f"{url}/whatif?max-num-seqs=64")
    page.wait_for_selector(METRIC, timeout=60_000)
    page.wait_for_timeout(1000)  # the pop-up, if any, opens after the page's first draw
    seen.whatif_alias_url = page.url
    seen.page_not_found = page.get_by_text("Page not found").count()
    seen.favicon = page.evaluate("document.querySelector(\"link[rel='shortcut icon']\")?.href || ''")


def visit(page, url: str, path: Path, seen: Tour, wait_for: str) -> None:
    page.goto(url)
    page.wait_for_selector(wait_for, timeout=60_000)
    shot(page, path, seen)


def shot(page, path: Path, seen: Tour) -> None:
    page.wait_for_timeout(700)  # plotly animates its first draw
    page.screenshot(path=str(path), full_page=True)
    seen.screenshots.append(path)


def real_recommendation() -> dict:
    """What `bash dev.sh demo` shows: the advisor on 400 requests of chat-production, 8B on one H200."""
    from advisor.advise import AdviseRequest, advise
    from sim.workload_source import SourceOptions

    req = AdviseRequest(model="llama-3.1-8b", gpu="h200", num_gpus=1, slo="ttft_p99:500 tpot_p99:50", workers=2)
    return advise("chat-production", req, source=SourceOptions(num_requests=400)).model_dump(mode="json")


def main(out_dir: str) -> None:
    chromium = chromium_path()
    rec = real_recommendation()  # the committed screenshots show real numbers, not the test fixture
    with running_app() as url:
        seen = tour(url, Path(out_dir), chromium, rec)
    print(f"goodput {seen.goodput_before} -> {seen.goodput_after}; wrote "
          + ", ".join(str(p) for p in seen.screenshots))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")
