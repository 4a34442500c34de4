"""Marks the tests listed in tests/slow_tests.txt `slow` (measured, not guessed: see the file), so a
development loop can run `bash dev.sh test -m "not slow"`; CI runs the whole suite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

_LIST = Path(__file__).with_name("tests") / "slow_tests.txt"
SLOW = frozenset(line.strip() for line in _LIST.read_text().splitlines() if line.strip() and not line.startswith("#"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if re.sub(r"\[.*\]$", "", item.nodeid) in SLOW:
            item.add_marker(pytest.mark.slow)
