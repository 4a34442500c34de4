"""Work around two faults of Triton 3.6's CPU interpreter, only when ``TRITON_INTERPRET=1``.

1. NumPy >= 2.4 (triton-lang/triton#9171): the interpreter holds scalars as 1-element arrays and converts them for ``range()`` with
``int(array)``, which NumPy 2.4 turned into a TypeError, so any kernel whose loop bound is a
run-time value fails under ``TRITON_INTERPRET=1``. Upstream fixed it by squeezing the array; we
re-register ``__index__`` the same way.
2. ``tl.dot`` on bfloat16: the interpreter stores bf16 as raw uint16 bits and multiplies those
   bits as integers. We widen bf16 operands to float32 first (exact: every bf16 is a float32),
   which is what the tensor cores compute with a float32 accumulator.

Compiled (GPU) runs are untouched. This is test and benchmark scaffolding, tied to the
``triton==3.6.0`` pin: tests/conftest.py and the benchmarks' CPU dry runs call ``apply()``; no
production module imports it.
"""

from __future__ import annotations

import os

import numpy as np

_applied = False


def apply() -> None:
    """Install both fixes into the interpreter (idempotent; a no-op unless TRITON_INTERPRET=1)."""
    global _applied
    if _applied or os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:  # no interpreter in this Triton: nothing to fix
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return

    def patch_lang_tensor(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        # the scope restores attributes last-in first-out, so this second patch unwinds cleanly
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor

    builder_cls = interpreter.InterpreterBuilder
    original_dot = builder_cls.create_dot
    tl = interpreter.tl

    def widen(handle):  # type: ignore[no-untyped-def]
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        as_f32 = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None)
        return interpreter.TensorHandle(
            as_f32.view(np.float32).reshape(handle.data.shape), tl.float32
        )

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # type: ignore[no-untyped-def]
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    builder_cls.create_dot = create_dot
    _applied = True
