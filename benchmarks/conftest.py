"""The benchmark scripts' own tests (test_*.py beside each script: tiny shapes on the CPU, the
same paths the GPU runs take) run in the suite; like tests/conftest.py, the Triton interpreter is
set up here (TRITON_INTERPRET before triton's first import, its Triton 3.6 faults patched)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import _interpreter_compat

_interpreter_compat.apply()
