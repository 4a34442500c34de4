"""kernels/_interpreter_compat.py's fix 4: a @triton.jit helper called inside a launch reuses the
launch's patches of the language, and the language is whole again after the launch. The values
come from the interpreter itself (a helper in a loop against numpy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl


@triton.jit
def _scale(x, k):
    return x * k + 1


@triton.jit
def _helper_loop_kernel(x_ptr, out_ptr, N: tl.constexpr, CALLS: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    for i in range(CALLS):
        x = _scale(x, 2.0)
    tl.store(out_ptr + offs, x)


def _run(calls: int) -> torch.Tensor:
    x = torch.arange(8, dtype=torch.float32)
    out = torch.empty_like(x)
    _helper_loop_kernel[(1,)](x, out, N=8, CALLS=calls)
    return out


def _expected(calls: int) -> np.ndarray:
    x = np.arange(8, dtype=np.float32)
    for _ in range(calls):
        x = x * 2.0 + 1
    return x


def test_helpers_inside_a_launch_patch_the_language_once(monkeypatch):
    from triton.runtime import interpreter

    patched = []
    original = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: (patched.append(a[0]), original(*a))[1])
    np.testing.assert_array_equal(_run(1).numpy(), _expected(1))
    once = len(patched)
    patched.clear()
    np.testing.assert_array_equal(_run(6).numpy(), _expected(6))
    assert once > 0 and len(patched) == once  # six helper calls patch no more than one (Triton: 7x)


def test_the_language_is_restored_after_a_launch_and_after_a_failing_one():
    from triton.runtime import interpreter

    before = (tl.arange, tl.tensor.__add__, tl.core.load)
    _run(3)
    assert (tl.arange, tl.tensor.__add__, tl.core.load) == before
    with pytest.raises(interpreter.InterpreterError):  # fails inside the launch, after the patching
        _helper_loop_kernel[(1,)](torch.zeros(8), torch.zeros(4, dtype=torch.int64), N=8, CALLS="x")
    assert (tl.arange, tl.tensor.__add__, tl.core.load) == before
    np.testing.assert_array_equal(_run(2).numpy(), _expected(2))  # and the next launch still runs
