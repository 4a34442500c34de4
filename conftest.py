"""Marks the tests listed in tests/slow_tests.txt `slow` (measured, not guessed: see the file), so a
development loop can run `bash dev.sh test -m "not slow"`; CI runs the whole suite."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if re.sub(r"\[.*\]$", "", item.nodeid) in SLOW:
            item.add_marker(pytest.mark.slow)
