"""The dashboard's computations, cached per scenario: a workload from what the user chose, a
simulation of a scenario, a recommendation. Everything goes through the public APIs the command
line uses (`sim.workload_source.load_workload`, `sim.run.run`), so a number on the page is the
number `costline simulate` prints for the same scenario.

`st.cache_data` keys each entry on the arguments (the scenario as canonical JSON, an upload's
bytes); a re-run of a scenario already seen returns at once.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st

from app.scenario import CUSTOM, DEFAULT_TRACE_REQUESTS, UPLOAD, Scenario
from sim.builtin_traces import BUILTIN_TRACES
from sim.generate import generate
from sim.metrics import jsonable
from sim.run import LoadedWorkload, run, summarize
from sim.workload import Workload
from sim.workload_source import SourceOptions, load_workload

MAX_CACHED_RUNS = 64


@dataclass(slots=True)
class Upload:
    """An uploaded trace or spec: its file name (the suffix tells the format) and bytes."""

    name: str
    data: bytes


@dataclass(slots=True)
class RunOutput:
    """What the pages show of one simulation: the summary and the two tables."""

    summary: dict[str, Any]
    requests: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    wall_s: float


def source_options(s: Scenario) -> SourceOptions:
    first = s.first
    if first is None and (s.workload in BUILTIN_TRACES or s.workload == UPLOAD):
        first = DEFAULT_TRACE_REQUESTS
    return SourceOptions(first=first, seed=s.seed)


@st.cache_data(max_entries=16, show_spinner=False)
def load_scenario_workload(workload: str, spec: str | None, first: int | None, seed: int,
                           upload_name: str | None = None, upload_data: bytes | None = None) -> Workload:
    """The workload a scenario names; an upload is read from a temporary file of the same name."""
    s = Scenario(workload=workload, spec=spec, first=first, seed=seed)
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
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(upload_name).name
            path.write_bytes(upload_data)
            wl = load_workload(str(path), opts)
        wl.name = Path(upload_name).stem
        return wl
    return load_workload(workload, opts)


def scenario_workload(s: Scenario, upload: Upload | None) -> Workload:
    return load_scenario_workload(s.workload, s.spec, s.first, s.seed,
                                  upload.name if upload else None, upload.data if upload else None)


@st.cache_data(max_entries=MAX_CACHED_RUNS, show_spinner=False)
def simulate(scenario_json: str, upload_name: str | None, upload_data: bytes | None,
             _progress: Callable[[float], None] | None = None) -> RunOutput:
    """One simulation of a scenario (cached on the scenario's JSON and the upload's bytes)."""
    s = Scenario.model_validate_json(scenario_json)
    upload = Upload(upload_name, upload_data) if upload_name and upload_data is not None else None
    wl = scenario_workload(s, upload)
    loaded = LoadedWorkload(list(wl.requests), wl.name, list(wl.notes))
    t0 = time.perf_counter()
    result = run(loaded, s.sim_config(), progress=_progress)
    wall_s = time.perf_counter() - t0
    return RunOutput(jsonable(summarize(result)), result.requests, result.steps, wall_s)


def run_scenario(s: Scenario, upload: Upload | None,
                 progress: Callable[[float], None] | None = None) -> RunOutput:
    return simulate(s.key(), upload.name if upload else None, upload.data if upload else None,
                    _progress=progress)


__all__ = ["RunOutput", "Upload", "load_scenario_workload", "run_scenario", "scenario_workload",
           "simulate", "source_options"]
