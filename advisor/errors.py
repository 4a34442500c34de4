"""Input faults told apart from internal ones.

An input error is one the user can fix: our code refused the input on purpose, with a message
that names the flag, field, file or line and the fix. Everything else that escapes a command is a
bug, whatever its type: a `KeyError` from a dictionary look-up, numpy's "negative dimensions are
not allowed", an `AttributeError` on a JSON list where an object was expected. Those must never
be shown as if the input were at fault; the command line says it is a bug and `--debug` prints
the traceback (advisor/cli.py), the dashboard says the same (app/).

The test, `is_input_error(exc)`:
- a pydantic `ValidationError` (a model refused a value: the caller names the field);
- an exception of a class defined in this project deriving `ValueError` (`TraceFormatError`,
  `SpecFileError`, `FlagError`, `OutputPathError`, `InputFileError`, ...): raised only for inputs;
- a plain `ValueError`, `KeyError` or `OSError` raised by a `raise` statement of this project's
  own code (its traceback ends on one) outside the modules whose errors guard internal invariants
  (the scheduler, the block pool, the kernels);
- an `OSError` carrying a file name (permission denied, disk full: the user's to fix).
"""

from __future__ import annotations

import linecache
from pathlib import Path

from pydantic import ValidationError

PROJECT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "engine", "advisor", "app", "kernels")
# Errors raised here guard invariants between our own layers: reaching the user they are bugs.
INTERNAL = ("kernels/", "engine/core/scheduler.py", "engine/core/block_pool.py", "engine/core/decode_skip.py",
            "engine/core/scheduler_output.py", "engine/runner.py")
DEBUG = False  # --debug was given (advisor/cli.py sets it): print tracebacks of input errors too
BUG = "internal error (a bug in costline, not a problem with your input)"


def _last_frame(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def raised_on_purpose(exc: BaseException) -> bool:
    """Whether `exc` was raised by a `raise` statement in this project's code (not by Python or a
    library on our behalf, not by a module guarding internal invariants)."""
    tb = _last_frame(exc)
    if tb is None:
        return False
    try:
        file = Path(tb.tb_frame.f_code.co_filename).resolve()
        rel = file.relative_to(PROJECT).as_posix()
    except (ValueError, OSError):
        return False
    if rel.split("/")[0] not in PACKAGES or rel.startswith(INTERNAL):
        return False
    return linecache.getline(str(file), tb.tb_lineno).lstrip().startswith("raise ")


def is_input_error(exc: BaseException) -> bool:
    """Whether the user can fix `exc` (see the module's docstring)."""
    if isinstance(exc, ValidationError):
        return True
    if isinstance(exc, ValueError) and type(exc).__module__.split(".")[0] in PACKAGES:
        return True
    if isinstance(exc, OSError) and getattr(exc, "filename", None) is not None:
        return True
    return isinstance(exc, ValueError | KeyError | OSError) and raised_on_purpose(exc)


def error_text(exc: BaseException) -> str:
    """An input error's message (a KeyError's is its argument, not its repr)."""
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc)


def bug_line(exc: BaseException) -> str:
    """One line for an internal error: what it was, and that it is a bug."""
    what = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return f"{BUG}: {what}"


__all__ = ["BUG", "bug_line", "error_text", "is_input_error", "raised_on_purpose"]
