"""One entry point from "what the user named" to a `Workload`: a preset, a spec file or a trace.

Shared by the command line and the dashboard, so both read sources the same way.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.core.flags import FlagError
from engine.core.input_files import InputFileError, decode_utf8, load_yaml, parse_json, read_bytes
from engine.core.request import Request
from sim.builtin_traces import BUILTIN_TRACES, builtin_trace_path
from sim.generate import generate
from sim.traces import TraceFormat, check_input_file, load_trace, spread_ties
from sim.workload import Workload
from sim.workload_presets import get_preset, preset_names
from sim.workload_spec import MAX_ARRIVAL_S, MAX_REQUESTS, MAX_TOKENS, WorkloadSpec


class SourceOptions(BaseModel):
    """How to read and reshape a source; every field maps to a `costline workload` option."""

    # `--speedup inf` would put every arrival at 0 s, `--start-s nan` empty the window
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    trace_format: TraceFormat = "auto"
    lenient: bool = False
    hash_block_size: int | None = Field(None, ge=1, le=MAX_TOKENS)
    keep_failed: bool = False
    spread: bool = False  # spread tied timestamps (Mooncake's 3-s steps) within each step
    seed: int | None = None  # spec seed override; also seeds `spread`
    num_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)  # spec size override
    start_s: float | None = None
    end_s: float | None = None
    first: int | None = Field(None, ge=1)
    speedup: float | None = Field(None, gt=0)
    rate_rps: float | None = Field(None, gt=0)


class SpecFileError(ValueError):
    """A spec file that does not validate; the message lists each field path and problem."""


_PLAIN = {
    "greater_than_equal": "must be >= {ge}", "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}", "less_than": "must be < {lt}",
    "int_parsing": "use an integer", "int_from_float": "use a whole number", "float_parsing": "use a number",
    "finite_number": "must be a finite number (NaN and Infinity are refused)",
    "literal_error": "must be one of {expected}", "missing": "is required",
    "extra_forbidden": "is not a known field (check its spelling)",
    "model_type": "must be an object of named fields", "model_attributes_type": "must be an object of named fields",
    "dict_type": "must be an object", "string_type": "use a string", "union_tag_invalid": "kind must be one of {expected_tags}",
}


def _is_spec_file(path: Path) -> bool:
    """Whether `path` holds a spec rather than a trace: by extension (.yaml, .yml; .jsonl, .csv
    and .gz are traces), else by content: a .json file not opening with `{`, one JSON document (an object without Mooncake's `timestamp`), or a
    file opening with `{` whose first line is not a complete JSON object (a spec spread over
    lines, perhaps broken) -- so a spec with a syntax error is reported as a spec."""
    suffixes = [x.lower() for x in path.suffixes]
    if suffixes[-1:] in (['.yaml'], ['.yml']):
        return True
    if '.jsonl' in suffixes or suffixes[-1:] in (['.csv'], ['.gz']):
        return False
    check_input_file(path)
    with path.open("rb") as f:
        head = f.read(65536)
    text = head.decode("utf-8-sig", errors="replace").lstrip()
    if not text.startswith("{"):
        return suffixes[-1:] == [".json"]  # a .json document that is not an object: a spec in error
    first = text.splitlines()[0].strip()
    try:
        obj = json.loads(first)
    except (ValueError, RecursionError):
        # a one-line object that fails to parse is a broken trace row; an opening brace alone is a spec
        return not first.endswith("}")
    if not isinstance(obj, dict):
        return False
    return "timestamp" not in obj and not (set(obj) & {"input_length", "output_length", "hash_ids"})


def _typed_loc(loc: tuple, data: object) -> str:
    """pydantic's error location as the user wrote it: without the union tags (`poisson`) it
    inserts for discriminated fields."""
    parts: list[str] = []
    for key in loc:
        if isinstance(data, dict) and key not in data and data.get("kind") == key:
            continue
        parts.append(str(key))
        data = data.get(key) if isinstance(data, dict) else (
            data[key] if isinstance(data, list) and isinstance(key, int) and key < len(data) else None)
    return ".".join(parts)


def _plain(err: dict) -> str:
    try:
        return _PLAIN[err["type"]].format(**(err.get("ctx") or {}))
    except (KeyError, IndexError):
        return str(err["msg"]).removeprefix("Value error, ")


# A spec is a few KB (`costline workload fit` writes ~20 KB with 1,001 quantiles per length law);
# a larger file is refused before it is parsed.
MAX_SPEC_BYTES = 16 << 20


def _parse_spec_text(path: Path) -> object:
    """The spec file's document; SpecFileError with line and column when it does not parse.
    YAML is read without aliases (engine/core/input_files.py); NaN and Infinity parse, so that the
    spec's validation names the field that holds them."""
    fix = "write the spec as one JSON object (`costline workload fit` writes one)"
    try:
        check_input_file(path)
        text = decode_utf8(path, read_bytes(path, max_bytes=MAX_SPEC_BYTES, what="workload spec"))
        if path.suffix.lower() in (".yaml", ".yml"):
            return load_yaml(text, path)
        return parse_json(text, path, allow_nan=True, fix=fix)
    except InputFileError as exc:
        raise SpecFileError(str(exc)) from None


def load_spec(path: str | Path) -> WorkloadSpec:
    """A spec file validated; SpecFileError names the file, the line or field path, and the fix."""
    path = Path(path)
    data = _parse_spec_text(path)
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        lines = [f"{path}: invalid workload spec ({exc.error_count()} problem(s))"]
        for err in exc.errors():
            loc = _typed_loc(err["loc"], data)
            got = repr(err.get("input"))
            got = got if len(got) <= 60 else got[:57] + "..."
            lines.append(f"  field '{loc}': {_plain(err)} (got {got})" if loc else f"  {_plain(err)} (got {got})")
        lines.append("Fix: correct those fields; `costline workload presets` shows valid examples")
        raise SpecFileError("\n".join(lines)) from None


def resolve_spec(source: str, opts: SourceOptions) -> WorkloadSpec | None:
    """The spec `source` names (preset or spec file) with size/seed overrides, or None for a trace."""
    if source in preset_names():
        spec = get_preset(source)
    elif builtin_trace_path(source) is not None or not Path(source).exists():
        return None
    elif _is_spec_file(Path(source)):
        spec = load_spec(source)
    else:
        return None
    changes: dict[str, object] = {}
    if opts.num_requests is not None:
        changes["num_requests"] = opts.num_requests
    if opts.seed is not None:
        changes["seed"] = opts.seed
    return spec.with_overrides(**changes) if changes else spec


def load_workload(source: str, opts: SourceOptions | None = None) -> Workload:
    """Generate (preset, spec file) or load (trace file) `source`, then window, cut and scale it:
    time window first, then the first N, then the speed-up or target rate."""
    opts = opts or SourceOptions()
    spec = resolve_spec(source, opts)
    if spec is not None:
        try:
            wl = generate(spec)
        except ValueError as exc:
            raise SpecFileError(f"{source}: {exc}") from None
        wl.notes.append(f"generated from {'preset' if source in preset_names() else 'spec'} {spec.name!r} "
                        f"(seed {spec.seed})")
    elif builtin_trace_path(source) is not None:
        wl = load_trace(builtin_trace_path(source), opts.trace_format, lenient=opts.lenient,
                        hash_block_size=opts.hash_block_size, keep_failed=opts.keep_failed)
        wl.notes.append(f"built-in trace {source!r} (sim/traces_data/README.md: source and licence)")
    elif not Path(source).exists():
        raise FileNotFoundError(f"{source}: neither a preset ({', '.join(preset_names())}), a built-in trace "
                                f"({', '.join(BUILTIN_TRACES)}) nor an existing file. "
                                "Fix: name a preset or built-in trace, or give the path of a spec or trace file")
    else:
        wl = load_trace(source, opts.trace_format, lenient=opts.lenient,
                        hash_block_size=opts.hash_block_size, keep_failed=opts.keep_failed)
    if opts.spread:
        wl = spread_ties(wl, seed=opts.seed or 0)
    if opts.start_s is not None or opts.end_s is not None:
        wl = wl.window(opts.start_s, opts.end_s)
    if opts.first is not None:
        wl = wl.head(opts.first)
    if opts.speedup is not None and opts.rate_rps is not None:
        raise ValueError("give either a speed-up factor or a target rate, not both")
    if opts.speedup is not None:
        wl = wl.scaled(opts.speedup)
    if opts.rate_rps is not None:
        wl = wl.at_rate(opts.rate_rps)
    check_arrival_times(wl, source, opts)
    return wl


def check_arrival_times(wl: Workload, source: str, opts: SourceOptions) -> None:
    """Every arrival a finite time in [0, MAX_ARRIVAL_S]: a generated spec at a rate of one
    request a century, or `--speedup 1e-300`, would otherwise simulate on a clock that rounds
    step times away (or never advances)."""
    t = wl.arrival_s
    if t.size == 0 or (np.isfinite(t).all() and t.min() >= 0 and t.max() <= MAX_ARRIVAL_S):
        return
    bad = np.flatnonzero(~(np.isfinite(t) & (t >= 0) & (t <= MAX_ARRIVAL_S)))
    k = int(bad[0])
    what = f"request {k} arrives at {t[k]:.3g} s, beyond the {MAX_ARRIVAL_S:.0e} s (~31 years) a simulation " \
        "clock keeps exact"
    if opts.speedup is not None:
        raise FlagError("speedup", f"{opts.speedup:g}", f"{what}; use a larger {{speedup}}")
    if opts.rate_rps is not None:
        raise FlagError("rate_rps", f"{opts.rate_rps:g}", f"{what}; use a higher {{rate_rps}}")
    if opts.start_s is not None and opts.start_s < 0:
        raise FlagError("start_s", f"{opts.start_s:g}", f"{what} (a negative start delays every arrival); "
                        "use {start_s} >= 0")
    raise SpecFileError(f"{source}: {what}. Fix: raise the spec's arrival rate or lower num_requests")


def cap_prompt_lengths(requests: Sequence[Request], max_prompt_len: int | None) -> list[Request]:
    """`requests` with every prompt longer than `max_prompt_len` cut to it, its hash ids with it
    (the blocks that still hold prompt tokens), so the engine and the simulator replay the same
    shortened prompts. None keeps them whole."""
    if max_prompt_len is None:
        return list(requests)
    if max_prompt_len < 1:
        raise ValueError(f"--max-prompt-len {max_prompt_len}: must be an integer >= 1")
    return [r if r.prompt_len <= max_prompt_len else dataclasses.replace(
        r, prompt_len=max_prompt_len, hash_ids=r.hash_ids[: -(-max_prompt_len // r.hash_block_size)],
        prompt_token_ids=None) for r in requests]


def all_at_time_zero(requests: Sequence[Request]) -> list[Request]:
    """`requests` all arriving at t = 0 (an offline run: `--no-arrivals`), order kept."""
    return [r if r.arrival_s == 0.0 else dataclasses.replace(r, arrival_s=0.0) for r in requests]
