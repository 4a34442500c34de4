"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at import time.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
