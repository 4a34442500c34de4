"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"


@pytest.fixture
def traces_dir() -> Path:
    """../shared/traces beside the checkout; skip (saying why) where it is absent."""
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (../shared/traces beside the checkout)")
    return TRACES
