"""Marks the tests listed in tests/slow_tests.txt `slow` (measured, not guessed: see the file), so a
development loop can run `bash dev.sh test -m "not slow"`; CI runs the whole suite."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

# One intra-op thread per test process. `dev.sh test` runs a pytest-xdist worker per core, and
# torch's OpenMP pool (a thread per core in each worker) then spins waiting for threads that the
# other workers hold: the tiny CPU models' steps took 10-50x the CPU time (an `engine run` test:
# 19 CPU s with the pool, 0.4 s without, measured 2026-12-02 on the 2-core machine). Set before
# torch is first imported (OpenMP reads it once); subprocesses the tests start inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported by a plugin before this file: set the pool directly
    sys.modules["torch"].set_num_threads(1)

_LIST = Path(__file__).with_name("tests") / "slow_tests.txt"
SLOW = frozenset(line.strip() for line in _LIST.read_text().splitlines() if line.strip() and not line.startswith("#"))


def _build_each_app_once() -> None:
    """typer's CliRunner rebuilds the click command from the Typer app on every invoke (typing
    hints of ~200 options: ~30 ms each), and the CLI tests invoke it thousands of times (the
    hostile-input corpus alone ~400): build each app's command once. A Typer app is not changed
    after its module is imported (commands are registered at import), so the command stays valid."""
    import typer.testing

    build = typer.testing._get_command
    built: dict[int, tuple[typer.Typer, Any]] = {}  # id(app) -> (app, command): the app kept alive

    def get_command(app: typer.Typer) -> Any:
        if id(app) not in built:
            built[id(app)] = (app, build(app))
        return built[id(app)][1]

    typer.testing._get_command = get_command


_build_each_app_once()


_SECONDS = Path(__file__).with_name("tests") / "file_seconds.txt"
FILE_SECONDS = {f: float(s) for s, f in (line.split() for line in _SECONDS.read_text().splitlines()
                                           if line.strip() and not line.startswith("#"))}


def _heavy_files_first(items: list[pytest.Item]) -> None:
    """Order the files by their measured seconds (tests/file_seconds.txt), most first, each file's
    own order kept. `dev.sh test` deals whole files to its workers in collection order
    (pytest-xdist --dist loadfile): a heavy file dealt last keeps one worker busy while the other
    idles; dealt first, the light files fill in behind it (longest job first)."""
    items.sort(key=lambda item: -FILE_SECONDS.get(item.nodeid.split("::", 1)[0], 0.0))  # stable sort


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if re.sub(r"\[.*\]$", "", item.nodeid) in SLOW:
            item.add_marker(pytest.mark.slow)
    _heavy_files_first(items)
