"""Settings and the closeness check the kernel tests share (the random batches are in
`kernels.paged_batches`)."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import HealthCheck

from kernels.paged_batches import rel_norm_error

# hypothesis settings of the kernel and engine property tests: no deadline (the Triton interpreter is
# slow and uneven), reproducible examples
SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "derandomize": True}

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(out).any(), "output holds NaN: an element was not written"
    err = rel_norm_error(out, ref)
    assert err <= TOLERANCE[dtype], f"relative norm error {err:.3g} > {TOLERANCE[dtype]}"


def interpreter_distinct(plans: list) -> list:
    """The plans that run differently in the Triton interpreter: warps and pipeline stages only tune
    the compiled code (the interpreter runs each program's ops one after another whatever they
    are), so plans that differ in nothing else are one test. Every other field (tiles, flags that
    pick a code path, persistent grids) keeps plans apart."""
    tuning = {"num_warps": 4, "num_stages": 1, "down_num_warps": 0, "down_num_stages": 0}
    seen: dict[str, object] = {}
    for p in plans:
        key = repr(dataclasses.replace(p, **{f: v for f, v in tuning.items() if hasattr(p, f)}))
        seen.setdefault(key, p)
    return list(seen.values())
