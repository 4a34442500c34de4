"""Bounded, checked reading of the small input files users hand over: a JSON document (run.json,
summary.json, a cost profile, a model's config.json, a workload spec) or a YAML spec.

One reader for all of them, so each refuses the same way before anything large is built:
- only a regular file (a folder, a device or a pipe is named as such), at most `max_bytes`
  (its size is checked before it is read, and the read itself is capped);
- bytes that are not UTF-8, and JSON or YAML syntax errors, with the line and column;
- NaN and Infinity (Python's `json` accepts them; they would turn into silently wrong figures)
  unless the caller allows them, integers of thousands of digits, absurd nesting;
- YAML: the safe loader, without aliases (`*name`: "billion laughs" expands a few lines into
  gigabytes) and at most `MAX_YAML_BYTES`;
- a value of the wrong JSON type is named by the file, its key path and what was expected
  (`expect`, `expect_object`).

Errors are `InputFileError` (a `ValueError`): the user can fix them, the message says how.
Lives in engine/ because the engine's model loader reads config.json with it (engine/ imports
neither sim/ nor advisor/). No torch here.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 << 20  # a profile, run.json or config.json is a few KB; a fitted spec < 1 MB
MAX_YAML_BYTES = 1 << 20  # YAML specs are written by hand
MAX_NESTING = 64  # JSON/YAML containers inside containers; real files nest 4-5 deep


class InputFileError(ValueError):
    """An input file that cannot be used as it is; the message names the file, where, and the fix."""


def check_regular_file(path: str | Path, what: str = "file") -> Path:
    """`path` if it is a regular file (or a link to one); InputFileError naming what it is otherwise.
    Devices and pipes are refused: /dev/zero would be read forever."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such {what}; check the path") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot be read ({exc.strerror}); check the path and its permissions") from None
    if stat.S_ISDIR(mode):
        raise InputFileError(f"{path}: is a folder, not a {what}; name the file")
    if not stat.S_ISREG(mode):
        kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
                else "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise InputFileError(f"{path}: is {kind}, not a {what}; save it to a file and give its path")
    return path


def read_bytes(path: str | Path, *, max_bytes: int, what: str = "file") -> bytes:
    """The file's bytes, refused when larger than `max_bytes` (checked before reading)."""
    path = check_regular_file(path, what)
    size = path.stat().st_size
    if size > max_bytes:
        raise InputFileError(f"{path}: {size:,} bytes, more than the {max_bytes:,} a {what} may hold; "
                             "check that this is the file you meant")
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputFileError(f"{path}: cannot be read ({exc.strerror}); check the file and its permissions") from None
    if len(data) > max_bytes:  # grew while we looked
        raise InputFileError(f"{path}: more than the {max_bytes:,} bytes a {what} may hold")
    return data


def decode_utf8(path: str | Path, raw: bytes) -> str:
    """`raw` as text; a byte that is not UTF-8 is named with its line and column."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputFileError(f"{path}, line {line}, column {col}: byte 0x{raw[exc.start]:02x} is not UTF-8; "
                             "save the file as UTF-8") from None


def json_type(value: Any) -> str:
    """A value's JSON type in words ('a list', 'an object', ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of containers, stopping past `limit` (no recursion)."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(text: str, path: str | Path, *, allow_nan: bool = False, fix: str = "correct the file") -> Any:
    """`text` as JSON, with the line and column of a syntax error."""
    try:
        value = json.loads(text, parse_constant=None if allow_nan else _refuse_constant)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{path}, line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg}); "
                             f"{fix}") from None
    except RecursionError:
        raise InputFileError(f"{path}: JSON nested too deeply; {fix}") from None
    except ValueError as exc:  # NaN/Infinity, or an integer of more than 4300 digits
        raise InputFileError(f"{path}: not usable JSON ({exc}); {fix}") from None
    if _depth(value, MAX_NESTING) > MAX_NESTING:
        raise InputFileError(f"{path}: JSON nested more than {MAX_NESTING} levels deep; {fix}")
    return value


def read_json(path: str | Path, *, what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES,
              allow_nan: bool = False, expect: type | None = dict, fix: str = "correct the file") -> Any:
    """A JSON file, bounded and checked; `expect` (dict by default) is the top-level type."""
    text = decode_utf8(path, read_bytes(path, max_bytes=max_bytes, what=what))
    value = parse_json(text, path, allow_nan=allow_nan, fix=fix)
    if expect is not None and not isinstance(value, expect):
        want = "a JSON object ({...})" if expect is dict else "a JSON list" if expect is list else expect.__name__
        raise InputFileError(f"{path}: the {what} must be {want}, not {json_type(value)}; {fix}")
    return value


def key_path(parts: Sequence[Any]) -> str:
    """('engine_args', 'max_num_seqs') -> 'engine_args.max_num_seqs'; list indices as [i]."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + str(p))
    return out or "(top level)"


def expect(path: str | Path, keys: Sequence[Any], value: Any, types: type | tuple[type, ...], expected: str) -> Any:
    """`value` if it is of `types` (a bool is never a number); else InputFileError naming the key."""
    numbers = (int, float)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in (
        types if isinstance(types, tuple) else (types,)) and any(t in numbers for t in (
            types if isinstance(types, tuple) else (types,))))
    if isinstance(value, float) and ok and not math.isfinite(value):
        ok = False
    if not ok:
        got = (f"{value} (NaN and Infinity are not numbers here)" if isinstance(value, float)
               else f"{json_type(value)} ({_short(value)})")
        raise InputFileError(f"{path}: key '{key_path(keys)}' must be {expected}, not {got}")
    return value


def expect_object(path: str | Path, keys: Sequence[Any], value: Any) -> dict[str, Any]:
    return expect(path, keys, value, dict, "an object ({...})")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


# pydantic's error types in plain words (its own name internal classes and add a URL)
PLAIN = {
    "greater_than_equal": "must be >= {ge}", "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}", "less_than": "must be < {lt}",
    "int_type": "must be an integer", "int_parsing": "must be an integer", "int_from_float": "must be a whole number",
    "float_type": "must be a number", "float_parsing": "must be a number", "finite_number": "must be a finite number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false",
    "string_type": "must be a string", "list_type": "must be a list ([...])", "tuple_type": "must be a list ([...])",
    "dict_type": "must be an object ({{...}})", "model_type": "must be an object ({{...}})",
    "model_attributes_type": "must be an object ({{...}})", "literal_error": "must be one of {expected}",
    "missing": "is required", "extra_forbidden": "is not a known key (check its spelling)",
    "union_tag_invalid": "kind must be one of {expected_tags}",
}


def plain_message(err: dict[str, Any]) -> str:
    """One pydantic error in plain words."""
    try:
        return PLAIN[err["type"]].format(**(err.get("ctx") or {}))
    except (KeyError, IndexError):
        return str(err["msg"]).removeprefix("Value error, ")


def validation_lines(path: str | Path, exc: Any, data: Any = None, prefix: Sequence[Any] = ()) -> list[str]:
    """A pydantic ValidationError as one line per problem: the key path, what is wrong, the value."""
    lines = []
    for err in exc.errors():
        loc = [*prefix, *err["loc"]]
        got = f" (got {_short(err.get('input'))})" if err["type"] != "missing" else ""
        lines.append(f"{path}: key '{key_path(loc)}' {plain_message(err)}{got}")
    return lines


# --------------------------------------------------------------------------- YAML
def load_yaml(text: str, path: str | Path, *, fix: str = "correct the YAML there") -> Any:
    """YAML with the safe loader, refusing aliases (no "billion laughs"), over-long text and deep
    nesting; a syntax error names the line and column."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - depends on the environment
        raise InputFileError(f"{path}: YAML needs PyYAML (pip install pyyaml); install it, or write the "
                             "file as JSON") from None
    if len(text.encode("utf-8")) > MAX_YAML_BYTES:
        raise InputFileError(f"{path}: more than {MAX_YAML_BYTES:,} bytes of YAML; write a large spec as JSON")
    loader: Callable[..., Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _refuse_aliases(yaml, text, path, loader)  # events only: no node is built before this passes
        value = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise InputFileError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', None) or exc}); "
                             f"{fix}") from None
    except RecursionError:
        raise InputFileError(f"{path}: YAML nested too deeply; {fix}") from None
    if _depth(value, MAX_NESTING) > MAX_NESTING:
        raise InputFileError(f"{path}: YAML nested more than {MAX_NESTING} levels deep; {fix}")
    return value


def _refuse_aliases(yaml: Any, text: str, path: str | Path, loader: Any) -> None:
    """Scan the event stream (no node is built) for an alias or absurd nesting."""
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            m = event.start_mark
            raise InputFileError(f"{path}, line {m.line + 1}, column {m.column + 1}: YAML aliases (*name) are "
                                 "not allowed (they can expand a few lines into gigabytes); write the value out")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                raise InputFileError(f"{path}: YAML nested more than {MAX_NESTING} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


__all__ = [
    "MAX_JSON_BYTES",
    "MAX_NESTING",
    "MAX_YAML_BYTES",
    "PLAIN",
    "InputFileError",
    "check_regular_file",
    "decode_utf8",
    "expect",
    "expect_object",
    "json_type",
    "key_path",
    "load_yaml",
    "parse_json",
    "plain_message",
    "read_bytes",
    "read_json",
    "validation_lines",
]
