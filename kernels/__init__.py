"""Kernels of the engine's forward: Triton versions and their plain-PyTorch references.

- ``kernels.reference``: the references (plain PyTorch; the tests' yardstick and the CPU path).
- ``kernels.paged_attention``, ``kernels.cache_write``, ``kernels.fused``, ``kernels.fp8_linear``:
  the Triton kernels.
- ``get_backend("torch" | "triton") -> Backend``: one set or the other behind one interface.

Importing this package imports neither torch nor triton; each set is imported when chosen.
"""

from kernels.backend import (
    BACKEND_NAMES,
    DECODE_MAX_QUERY_LEN,
    Backend,
    BackendName,
    compiled_kernel_count,
    compiled_kernel_keys,
    get_backend,
)

__all__ = ["BACKEND_NAMES", "DECODE_MAX_QUERY_LEN", "Backend", "BackendName", "compiled_kernel_count", "compiled_kernel_keys", "get_backend"]
