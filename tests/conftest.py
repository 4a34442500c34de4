"""Shared test fixtures, and the CPU interpreter set-up the Triton tests need.

Triton kernels run on the CPU through Triton's interpreter here: TRITON_INTERPRET must be set
before triton is first imported, so it is set at import time (dev.sh sets it too; set it to 0 on
a GPU machine to run the compiled kernels). The interpreter's Triton 3.6 faults are patched
here, by the tests, and never by importing a production module.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.builtin_traces import TRACES_DIR

os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import _interpreter_compat

_interpreter_compat.apply()

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def traces_dir() -> Path:
    """The real traces shipped in the package (sim/traces_data, gzip-compressed)."""
    return TRACES_DIR
