"""The dashboard's computations, cached per scenario: a workload from what the user chose, a
simulation of a scenario, a recommendation. Everything goes through the public APIs the command
line uses (`sim.workload_source.load_workload`, `sim.run.run`), so a number on the page is the
number `costline simulate` prints for the same scenario.

Workloads are cached with `st.cache_data` (keyed on the scenario's workload fields and an upload's
bytes), runs in a `RunCache` keyed on the scenario's canonical JSON: a scenario already seen
returns at once.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import streamlit as st

from app import MAX_UPLOAD_MB
from app.scenario import (
    APP_MAX_REQUESTS,
    CUSTOM,
    DEFAULT_TRACE_REQUESTS,
    UPLOAD,
    Scenario,
    check_budget,
)
from engine.core.summary_record import RunSummary
from sim.builtin_traces import BUILTIN_TRACES
from sim.generate import generate
from sim.run import LoadedWorkload, kv_block_coarsening_for, run
from sim.workload import Workload
from sim.workload_source import SourceOptions, load_workload

MAX_CACHED_RUNS = 32  # a run holds its two tables: ~1-4 MB for 2,000 requests
# An upload as sent (the uploader refuses larger; `costline app` tells Streamlit the same), and its
# text once a .gz is inflated: a small gzip bomb is refused while it is read, 1 MB at a time.
MAX_UPLOAD_BYTES = MAX_UPLOAD_MB << 20
MAX_UPLOAD_TEXT_BYTES = 64 << 20


class UploadError(ValueError):
    """An uploaded file that cannot be read; the message names it as uploaded and says the fix."""


@dataclass(slots=True)
class Upload:
    """An uploaded trace or spec: its file name (the suffix tells the format) and bytes."""

    name: str
    data: bytes


@dataclass(slots=True)
class RunOutput:
    """What the pages show of one simulation: the summary and the two tables."""

    summary: RunSummary
    requests: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    wall_s: float


def table_parquet(table: dict[str, np.ndarray]) -> bytes:
    """A run's table (engine/core/records.py columns) as Parquet bytes, for a download."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({k: np.asarray(v) for k, v in table.items()}), buf)
    return buf.getvalue()


# The trace loaders' fixes name command-line options; on the page they are controls.
_CONTROL_OF_OPTION = {"--format": "the 'trace format' control", "--lenient": "'skip bad rows'"}


def in_page_words(message: str) -> str:
    for option, control in _CONTROL_OF_OPTION.items():
        message = message.replace(option, control)
    return message


def check_upload(name: str, data: bytes) -> None:
    """Refuse an upload beyond the dashboard's limits before it is parsed: its size, and for a
    .gz file the size it inflates to (read in 1 MB pieces, so a bomb never lands in memory whole)."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise UploadError(f"{Path(name).name}: {len(data) / 2**20:,.1f} MB; the dashboard takes uploads of up to "
                          f"{MAX_UPLOAD_MB} MB (`costline simulate -w FILE` takes any size)")
    if not name.lower().endswith(".gz"):
        return
    inflate, total, rest = zlib.decompressobj(16 + zlib.MAX_WBITS), 0, data
    try:
        while rest and not inflate.eof:
            total += len(inflate.decompress(rest, 1 << 20))
            rest = inflate.unconsumed_tail
            if total > MAX_UPLOAD_TEXT_BYTES:
                raise UploadError(f"{Path(name).name}: inflates to more than {MAX_UPLOAD_TEXT_BYTES >> 20} MB of "
                                  "text; the dashboard takes less (cut the trace, or use `costline simulate`)")
    except zlib.error as exc:
        raise UploadError(f"{Path(name).name}: not a complete gzip file ({exc}); upload it again, or "
                          "uncompressed") from None


def source_options(s: Scenario) -> SourceOptions:
    first = s.first
    if first is None and (s.workload in BUILTIN_TRACES or s.workload == UPLOAD):
        first = DEFAULT_TRACE_REQUESTS
    return SourceOptions(first=first, seed=s.seed, trace_format=s.trace_format, lenient=s.lenient)


@st.cache_data(max_entries=16, show_spinner=False)
def load_scenario_workload(workload: str, spec: str | None, first: int | None, seed: int,
                           upload_name: str | None = None, upload_data: bytes | None = None,
                           trace_format: str = "auto", lenient: bool = False) -> Workload:
    """The workload a scenario names; an upload is read from a temporary file of the same name."""
    s = Scenario(workload=workload, spec=spec, first=first, seed=seed, trace_format=trace_format, lenient=lenient)
    opts = source_options(s)
    if workload == CUSTOM:
        from sim.workload_spec import WorkloadSpec

        spec_obj = WorkloadSpec.model_validate_json(spec or "")
        wl = generate(spec_obj.with_overrides(seed=seed))
        wl.notes.append(f"generated from the spec edited on the Workload page (seed {seed})")
        return wl
    if workload == UPLOAD:
        if upload_name is None or upload_data is None:
            raise ValueError("no file uploaded: upload a trace or spec on the Workload page")
        check_upload(upload_name, upload_data)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(upload_name).name
            path.write_bytes(upload_data)
            try:
                wl = load_workload(str(path), opts)
            except (ValueError, OSError) as exc:  # name the file as uploaded, not the temporary copy
                raise UploadError(in_page_words(str(exc).replace(str(path), path.name))) from None
        wl.name = Path(upload_name).stem
        return wl
    return load_workload(workload, opts)


def scenario_workload(s: Scenario, upload: Upload | None) -> Workload:
    return load_scenario_workload(s.workload, s.spec, s.first, s.seed,
                                  upload.name if upload else None, upload.data if upload else None,
                                  s.trace_format, s.lenient)


def simulate(s: Scenario, upload: Upload | None, progress: Callable[[float], None] | None = None) -> RunOutput:
    """One simulation of a scenario, uncached."""
    wl = scenario_workload(s, upload)
    if len(wl) > APP_MAX_REQUESTS:
        raise ValueError(f"{len(wl):,} requests: the dashboard simulates at most {APP_MAX_REQUESTS:,} (set 'the "
                         "first N requests' lower, or use `costline simulate`)")
    loaded = LoadedWorkload(list(wl.requests), wl.name, list(wl.notes))
    # the simulation budget, with the workload's own block coarsening now that it is known
    check_budget(s, kv_block_coarsening_for("auto", s.engine().block_size, loaded.requests))
    t0 = time.perf_counter()
    result = run(loaded, s.sim_config(), progress=progress)
    wall_s = time.perf_counter() - t0
    return RunOutput(result.summary(), result.requests, result.steps, wall_s)


class RunCache:
    """Runs by scenario, least recently used dropped first, shared by every session.

    Not `st.cache_data`: a run reports progress to a bar the page created, and cache_data refuses
    (CacheReplayClosureError) elements touched inside a cached function that it did not create.
    The entries are never mutated by the pages, so sharing them is safe."""

    def __init__(self, max_entries: int = MAX_CACHED_RUNS) -> None:
        self.max_entries = max_entries
        self._runs: OrderedDict[tuple[str, str | None, str | None], RunOutput] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(s: Scenario, upload: Upload | None) -> tuple[str, str | None, str | None]:
        digest = hashlib.sha256(upload.data).hexdigest() if upload else None
        return s.key(), upload.name if upload else None, digest

    def get(self, s: Scenario, upload: Upload | None) -> RunOutput | None:
        with self._lock:
            out = self._runs.get(self.key(s, upload))
            if out is not None:
                self._runs.move_to_end(self.key(s, upload))
            return out

    def put(self, s: Scenario, upload: Upload | None, out: RunOutput) -> None:
        with self._lock:
            self._runs[self.key(s, upload)] = out
            while len(self._runs) > self.max_entries:
                self._runs.popitem(last=False)


@st.cache_resource
def run_cache() -> RunCache:
    return RunCache()


def run_scenario(s: Scenario, upload: Upload | None,
                 progress: Callable[[float], None] | None = None) -> RunOutput:
    """The scenario's run: from the cache when it ran before (in any session), else simulated."""
    cache = run_cache()
    out = cache.get(s, upload)
    if out is None:
        out = simulate(s, upload, progress)
        cache.put(s, upload, out)
    return out


__all__ = [
    "MAX_UPLOAD_BYTES",
    "MAX_UPLOAD_MB",
    "RunCache",
    "RunOutput",
    "Upload",
    "UploadError",
    "check_upload",
    "load_scenario_workload",
    "run_cache",
    "run_scenario",
    "scenario_workload",
    "simulate",
    "source_options",
    "table_parquet",
]
