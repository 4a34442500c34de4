"""Work around three faults of Triton 3.6's CPU interpreter, and two slownesses, only when ``TRITON_INTERPRET=1``.

1. NumPy >= 2.4 (triton-lang/triton#9171): the interpreter holds scalars as 1-element arrays and converts them for ``range()`` with
``int(array)``, which NumPy 2.4 turned into a TypeError, so any kernel whose loop bound is a
run-time value fails under ``TRITON_INTERPRET=1``. Upstream fixed it by squeezing the array; we
re-register ``__index__`` the same way.
2. ``tl.dot`` on bfloat16: the interpreter stores bf16 as raw uint16 bits and multiplies those
   bits as integers. We widen bf16 operands to float32 first (exact: every bf16 is a float32),
   which is what the tensor cores compute with a float32 accumulator.
3. Conversions to fp8 (``x.to(tl.float8e4nv)``): the interpreter's bit-twiddling emulation
   flushes values below e4m3's smallest normal (2**-6) to zero and rounds half-up without
   carrying into the exponent, where the GPU (``cvt.rn`` on sm_89+) rounds to nearest even with
   subnormals. Conversions from or to e4m3fn / e5m2 go through torch's casts instead, which
   round as the GPU does, so the FP8 KV-cache tests compare against the hardware's rounding.

4. Speed: every call of a ``@triton.jit`` helper from inside a kernel re-patches the whole language
   (``_patch_lang``: ``inspect.getmembers`` over ``tl``, ``tl.tensor``, ``tl.math``, a new wrapper per
   builtin), although the launch that is running patched the same modules already and the helper's
   patches are never restored. That was ~30% of a kernel test's time (cProfile of the MoE bench's dry
   run: 37 of 120 s). A helper call inside a launch now reuses the launch's patches when the helper
   sees no language module the launch did not patch.

5. Speed: two pieces of the interpreter's type bookkeeping that every op pays: ``_get_np_dtype``
   builds its 18-entry dtype table on each call (~7% of a fused-MoE test's time in cProfile), and
   ``tl.tuple_type`` formats its name (a string of every member type) on construction, though it is
   read only when printed (~9%), and ``tl.tuple`` (the interpreter makes one per tensor shape) works
   out its type from its values on construction, read far less often (~10%). The table is built
   once, the name and the tuple's type when first read (from the same values): the same results.

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
        # bf16 is the top half of a float32: a shift is exact, subnormals included (the
        # interpreter's own conversion loses bf16 subnormals)
        bits = np.ascontiguousarray(handle.data).view(np.uint16).astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32).reshape(handle.data.shape), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # type: ignore[no-untyped-def]
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    builder_cls.create_dot = create_dot
    _patch_fp8_casts(interpreter)
    _patch_lang_once_per_launch(interpreter)
    _patch_type_bookkeeping(interpreter)
    _applied = True


def _lang_modules(fn, tl) -> frozenset:  # type: ignore[no-untyped-def]
    """The language modules `fn` sees, which `_patch_lang` patches (by identity)."""
    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


def _patch_lang_once_per_launch(interpreter) -> None:  # type: ignore[no-untyped-def]
    original = interpreter._patch_lang
    tl = interpreter.tl
    running: list[LaunchPatches] = []  # the running launch's patches (launches do not nest)

    class LaunchPatches:
        """A launch's patch scopes (its own, then its helpers' that saw other modules) and the
        language modules they cover; restoring unwinds them last-in first-out."""

        def __init__(self, scope, langs: frozenset) -> None:  # type: ignore[no-untyped-def]
            self.scopes = [scope]
            self.langs = langs

        def restore(self) -> None:
            for scope in reversed(self.scopes):
                scope.restore()
            running.remove(self)

    class NoPatches:  # what a helper's call gets (Triton never restores it)
        def restore(self) -> None:
            pass

    def patch_lang(fn):  # type: ignore[no-untyped-def]
        langs = _lang_modules(fn, tl)
        if running and langs <= running[-1].langs:
            return NoPatches()  # a helper called inside the launch: already patched
        if running:  # a helper that sees a module the launch did not patch: the launch restores it too
            running[-1].scopes.append(original(fn))
            running[-1].langs |= langs
            return NoPatches()
        running.append(LaunchPatches(original(fn), langs))
        return running[-1]

    interpreter._patch_lang = patch_lang


def _patch_type_bookkeeping(interpreter) -> None:  # type: ignore[no-untyped-def]
    tl = interpreter.tl
    np_of = {  # Triton 3.6's table in _get_np_dtype, built once
        tl.int1: np.dtype(bool), tl.float16: np.dtype(np.float16), tl.float32: np.dtype(np.float32),
        tl.float64: np.dtype(np.float64), tl.int8: np.dtype(np.int8), tl.uint8: np.dtype(np.uint8),
        tl.int16: np.dtype(np.int16), tl.uint16: np.dtype(np.uint16), tl.int32: np.dtype(np.int32),
        tl.uint32: np.dtype(np.uint32), tl.int64: np.dtype(np.int64), tl.uint64: np.dtype(np.uint64),
        tl.bfloat16: np.dtype(np.uint16),  # stored as uint16
        tl.float8e5: np.dtype(np.uint8), tl.float8e5b16: np.dtype(np.uint8), tl.float8e4nv: np.dtype(np.uint8),
        tl.float8e4b8: np.dtype(np.uint8), tl.float8e4b15: np.dtype(np.uint8),  # stored as uint8
    }
    pointer = np.dtype(np.uint64)

    def get_np_dtype(tt_dtype):  # type: ignore[no-untyped-def]
        if isinstance(tt_dtype, tl.pointer_type):
            return pointer
        if isinstance(tt_dtype, tl.block_type):
            if isinstance(tt_dtype.element_ty, tl.pointer_type):
                return pointer
            return np_of[tt_dtype.element_ty]
        return np_of[tt_dtype]

    interpreter._get_np_dtype = get_np_dtype
    _patch_lazy_tuple_types(tl)


def _patch_lazy_tuple_types(tl) -> None:  # type: ignore[no-untyped-def]
    tuple_type = tl.core.tuple_type

    def init(self, types, fields=None):  # type: ignore[no-untyped-def]
        self.types = types
        self.fields = fields or [""] * len(types)

    def get_name(self) -> str:
        name = self.__dict__.get("_name")
        if name is None:
            name = self._name = "[" + ",".join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + "]"
        return name

    def set_name(self, value: str) -> None:
        self._name = value

    tuple_type.__init__ = init
    tuple_type.name = property(get_name, set_name)

    lang_tuple, type_of_values = tl.core.tuple, tl.core._type_for_tuple_values

    def tuple_init(self, args, type=None):  # type: ignore[no-untyped-def]
        self.values = [i for i in args]
        if isinstance(type, tuple_type):
            self.type = type
        elif type is not None:  # make_template in ASTFunction.deserialize may pass a list/tuple
            self.type = tuple_type(type)
        # else: the values' type, worked out when first read

    def get_type(self):  # type: ignore[no-untyped-def]
        ty = self.__dict__.get("_type")
        if ty is None:
            ty = self._type = type_of_values(self.values)
        return ty

    def set_type(self, value) -> None:  # type: ignore[no-untyped-def]
        self._type = value

    lang_tuple.__init__ = tuple_init
    lang_tuple.type = property(get_type, set_type)


def _patch_fp8_casts(interpreter) -> None:  # type: ignore[no-untyped-def]
    import torch

    tl = interpreter.tl
    fp8_torch = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}
    # dtypes the interpreter stores as raw bits, with the integer view of their storage
    bits_torch = {**fp8_torch, tl.bfloat16: torch.bfloat16}
    bits_view = {torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8,
                 torch.bfloat16: torch.int16}
    plain_torch = {tl.float16: torch.float16, tl.float32: torch.float32}
    builder_cls = interpreter.InterpreterBuilder
    original = builder_cls.create_fp_to_fp

    def to_torch(data: np.ndarray, dtype) -> torch.Tensor:  # type: ignore[no-untyped-def]
        if dtype in bits_torch:
            t_dtype = bits_torch[dtype]
            return torch.from_numpy(np.ascontiguousarray(data)).view(bits_view[t_dtype]).view(t_dtype)
        return torch.from_numpy(np.ascontiguousarray(data)).to(plain_torch[dtype])

    def from_torch(t: torch.Tensor, dtype) -> np.ndarray:  # type: ignore[no-untyped-def]
        if dtype in bits_torch:
            raw = t.to(bits_torch[dtype]).view(bits_view[bits_torch[dtype]]).numpy()
            return raw.view(interpreter._get_np_dtype(dtype))
        return t.to(plain_torch[dtype]).numpy()

    def create_fp_to_fp(self, src, dst_type, rounding_mode):  # type: ignore[no-untyped-def]
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if src_ty not in fp8_torch and dst_ty not in fp8_torch:
            return original(self, src, dst_type, rounding_mode)
        if src_ty not in bits_torch | plain_torch or dst_ty not in bits_torch | plain_torch:
            return original(self, src, dst_type, rounding_mode)
        wide = to_torch(src.data, src_ty).float()  # exact: every source value fits float32
        return interpreter.TensorHandle(from_torch(wide, dst_ty).reshape(src.data.shape), dst_ty)

    builder_cls.create_fp_to_fp = create_fp_to_fp
