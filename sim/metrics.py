"""What a simulation measured: the request and step tables (engine/core/records.py columns), the
summary and Prometheus text (engine/core/run_summary.py, shared with the engine's replay), and files.

Inter-token latency is not kept per token: in a busy engine every decoding sequence gets its
next token at the end of each step, so the ITL distribution is the step durations weighted by
the number of sequences decoding in them (skip-ahead rows expanded exactly; under async
scheduling a step's period weighted by the previous step's decoders, whose tokens it delivers).
A gap that spans more than one step is one sample of its own: a request resumed after a
preemption (the jitter preemption causes), or a decoder that steps left out (a prefill-only step
with chunked prefill off), which its resuming step's weight then excludes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.input_files import read_json
from engine.core.outputs import check_output_dir, staged_dir
from engine.core.records import REQUEST_COLUMNS, STEP_COLUMNS
from engine.core.run_summary import (
    SLO,
    SLO_KEYS,
    RunTables,
    jsonable,
    step_itl_samples,
    weighted_percentiles,
)


@dataclass
class SimResult(RunTables):
    """Everything one simulation produced; tables are column dicts of numpy arrays.
    `itl_gaps_s` holds the token gaps that span more than one step (a request resumed after a
    preemption, a decoder a step left out); `itl_weight_cuts` (per step row) the decoders of
    each row whose gap is among them; `pipelined`: the run scheduled asynchronously, so a step's
    tokens arrive one step later (engine/core/run_summary.step_itl_samples)."""

    itl_weight_cuts: np.ndarray | None = None
    pipelined: bool = False

    def itl_samples(self) -> tuple[np.ndarray, np.ndarray]:
        return step_itl_samples(self.steps, self.itl_gaps_s, weight_cuts=self.itl_weight_cuts,
                                pipelined=self.pipelined)

    @property
    def stall_itl_s(self) -> np.ndarray:
        return self.itl_gaps_s

    def save(self, out_dir: str | Path, fmt: str = "auto", *, force: bool = False) -> dict[str, Path]:
        """requests + steps tables (Parquet when pyarrow is there, else CSV), summary.json, metrics.prom.

        A folder already holding a run is refused unless `force` (engine/core/outputs.py); the files
        are written to a folder aside that then takes `out_dir`'s place, so an interrupted save
        leaves the previous run whole. Returns the final paths."""
        out = check_output_dir(out_dir, flag="out_dir", force=force, force_hint="force=True")
        with staged_dir(out) as tmp:
            names = self.write_files(tmp, fmt)
        return {key: out / name for key, name in names.items()}

    def write_files(self, folder: Path, fmt: str = "auto") -> dict[str, str]:
        """The run's files written straight into `folder` (no checks); their names by kind."""
        use_parquet = fmt == "parquet" or (fmt == "auto" and _have_pyarrow())
        names: dict[str, str] = {}
        for name, table in (("requests", self.requests), ("steps", self.steps)):
            names[name] = f"{name}.{'parquet' if use_parquet else 'csv'}"
            (_write_parquet if use_parquet else _write_csv)(folder / names[name], table)
        names["summary"], names["metrics"] = "summary.json", "metrics.prom"
        # the flags the run modelled ride along, so `simulate --compare` can name what differs
        flags = {k: self.meta[k] for k in ("vllm_args", "serve_command") if k in self.meta}
        (folder / "summary.json").write_text(json.dumps(jsonable(self.summary() | flags), indent=2) + "\n")
        (folder / "metrics.prom").write_text(self.prometheus_text())
        return names


def _have_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _write_parquet(path: Path, table: dict[str, np.ndarray]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({k: np.asarray(v) for k, v in table.items()}), path)


def _write_csv(path: Path, table: dict[str, np.ndarray]) -> None:
    cols = list(table)
    with path.open("w") as f:
        f.write(",".join(cols) + "\n")
        for row in zip(*(table[c].tolist() for c in cols)):
            f.write(",".join("" if (isinstance(x, float) and math.isnan(x)) else str(x) for x in row) + "\n")


# vllm/benchmarks/serve.py `_check_goodput_args`: only these keys, values in ms, never negative.


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    """The summary.json of a saved run (a directory or the file itself)."""
    p = Path(run_dir)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise ValueError(f"{run_dir}: no summary.json there; pass a directory written by "
                         "`costline simulate --out DIR`")
    # bounded, UTF-8 and syntax errors with line and column, an object: engine/core/input_files.py
    return read_json(p, what="run summary", allow_nan=True,
                     fix="the file is damaged or truncated: run the simulation again with --out")


__all__ = [
    "REQUEST_COLUMNS",
    "SLO",
    "SLO_KEYS",
    "STEP_COLUMNS",
    "SimResult",
    "jsonable",
    "load_summary",
    "weighted_percentiles",
]
