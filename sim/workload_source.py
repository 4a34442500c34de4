"""One entry point from "what the user named" to a `Workload`: a preset, a spec file or a trace.

Shared by the command line and the dashboard, so both read sources the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.builtin_traces import BUILTIN_TRACES, builtin_trace_path
from sim.generate import generate
from sim.traces import TraceFormat, load_trace, spread_ties
from sim.workload import Workload
from sim.workload_presets import get_preset, preset_names
from sim.workload_spec import WorkloadSpec


class SourceOptions(BaseModel):
    """How to read and reshape a source; every field maps to a `costline workload` option."""

    model_config = ConfigDict(extra="forbid")

    trace_format: TraceFormat = "auto"
    lenient: bool = False
    hash_block_size: int | None = Field(None, ge=1)
    keep_failed: bool = False
    spread: bool = False  # spread tied timestamps (Mooncake's 3-s steps) within each step
    seed: int | None = None  # spec seed override; also seeds `spread`
    num_requests: int | None = Field(None, ge=1)  # spec size override
    start_s: float | None = None
    end_s: float | None = None
    first: int | None = Field(None, ge=1)
    speedup: float | None = Field(None, gt=0)
    rate_rps: float | None = Field(None, gt=0)


class SpecFileError(ValueError):
    """A spec file that does not validate; the message lists each field path and problem."""


def _is_spec_file(path: Path) -> bool:
    if path.suffix.lower() in (".yaml", ".yml"):
        return True
    if path.suffix.lower() != ".json":
        return False
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False  # a .json trace (one object per line) is not a single document
    return isinstance(obj, dict) and "timestamp" not in obj


def load_spec(path: str | Path) -> WorkloadSpec:
    try:
        return WorkloadSpec.from_file(path)
    except ValidationError as exc:
        lines = [f"{path}: invalid workload spec ({exc.error_count()} problem(s))"]
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            lines.append(f"  field '{loc}': {err['msg']} (got {err.get('input')!r})")
        lines.append("Fix: correct those fields; `costline workload presets` shows valid examples")
        raise SpecFileError("\n".join(lines)) from None
    except json.JSONDecodeError as exc:
        raise SpecFileError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg}). "
                            "Fix: write the spec as one JSON object") from None


def resolve_spec(source: str, opts: SourceOptions) -> WorkloadSpec | None:
    """The spec `source` names (preset or spec file) with size/seed overrides, or None for a trace."""
    if source in preset_names():
        spec = get_preset(source)
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
        wl = generate(spec)
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
    return wl
