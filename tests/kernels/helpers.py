"""Settings, the closeness check and the random MoE layer the kernel tests share (the random
attention batches are in `kernels.paged_batches`)."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import HealthCheck

from kernels.moe_reference import fused_moe_ref, route_ref
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


def moe_layer(seed: int, t: int, e: int, k: int, h: int, n: int, dtype: torch.dtype = torch.float32):
    """A random MoE layer and its routing: x [T, H], w13 [E, 2N, H], w2 [E, H, N] (scaled so the
    outputs stay O(1)), and the top-k routing weights and ids of a random router (renormalised)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * n, h, generator=g) / h**0.5).to(dtype)
    w2 = (torch.randn(e, h, n, generator=g) / n**0.5).to(dtype)
    weights, ids = route_ref(torch.randn(t, e, generator=g), k, renormalize=True)
    return x, w13, w2, weights, ids


def moe_ref(x, w13, w2, weights, ids) -> torch.Tensor:
    """The float32 per-expert loop's output for `moe_layer`'s tensors."""
    return fused_moe_ref(x.float(), w13.float(), w2.float(), weights, ids)
