"""Engine run folders as inputs (calibration and validation): their files read through the bounded
reader and checked before a fit or a replay starts, so that a damaged or mismatched run is named
(file, line, key, what was expected) instead of failing inside numpy or being fitted as if right.

- `read_run_json(folder)`: run.json as an object (None when the folder has none: `costline engine
  run --out` writes none; the GPU script does);
- `check_run_target(folder, info, model, gpu)`: the run's recorded model and GPU against the ones
  the command was told (a profile fitted for one model from another model's steps is wrong);
- `check_run_for_fit(run, model, gpu)`: all of the above a fit needs, before `costline calibrate` fits;
- `check_steps_file(path)`: every row of a steps.jsonl[.gz] an object whose step columns are
  finite numbers (or null), streamed, at most `MAX_STEPS_BYTES` of text;
- `check_engine_summary(path, summary, num_requests)`: an engine summary.json that is possible
  (counts add up to the requests replayed, percentiles ordered, throughputs equal to their
  counts over the duration, hits within queries): a summary edited by hand never "validates".
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import zlib
from pathlib import Path
from typing import Any

from engine.core.input_files import (
    InputFileError,
    check_regular_file,
    expect,
    expect_object,
    json_type,
    read_json,
)
from sim.calibrate import RECONSTRUCTED_STEPS_FILE, REQUIRED_COLUMNS

MAX_RUN_JSON_BYTES = 4 << 20
MAX_STEPS_BYTES = 2 << 30  # decompressed: a 20-minute H200 run writes ~100 MB


class EngineRunError(ValueError):
    """An engine run folder or file that cannot be used; names the file, the key or line, the fix."""


def read_run_json(folder: Path) -> dict[str, Any] | None:
    """The folder's run.json as an object, or None when there is none."""
    path = folder / "run.json"
    if not path.exists():
        return None
    try:
        return read_json(path, what="run.json", max_bytes=MAX_RUN_JSON_BYTES,
                         fix="rerun the engine run (the GPU script writes run.json)")
    except InputFileError as exc:
        raise EngineRunError(str(exc)) from None


def check_run_target(folder: Path, info: dict[str, Any], model: str, gpu: str) -> None:
    """The model and GPU run.json records must be the ones given (a fit or a check is for one)."""
    for key, given, flag in (("model", model, "--model"), ("gpu", gpu, "--gpu")):
        recorded = info.get(key)
        if recorded is None:
            continue
        if not isinstance(recorded, str):
            raise EngineRunError(f"{folder / 'run.json'}: key '{key}' must be a string, not {json_type(recorded)}")
        if recorded.lower() != given.lower():
            raise EngineRunError(f"{folder}: run.json says the run served {key} {recorded!r}, not {flag} {given}; "
                                 f"give {flag} {recorded} (or leave this run out): a profile is fitted for "
                                 "the engine that ran")


# run.json's engine_args a fit reads, with the JSON types they must have
FIT_ENGINE_ARGS = {"async_scheduling": (bool, "true or false"), "enforce_eager": (bool, "true or false"),
                   "max_num_seqs": (int, "an integer"), "max_num_batched_tokens": (int, "an integer"),
                   "max_cudagraph_capture_size": (int, "an integer"), "cudagraph_mode": (str, "a string")}


def check_run_for_fit(run: Path, model: str, gpu: str) -> None:
    """An engine run folder or steps file a fit can use: run.json (when there) an object for this
    model and GPU with well-typed engine_args, every step row usable (`check_steps_file`)."""
    if not run.exists():
        raise EngineRunError(f"{run}: no such file or folder; give engine run folders or steps.jsonl files")
    if not run.is_dir():
        check_steps_file(run)
        return
    info = read_run_json(run)
    if info is not None:
        check_run_target(run, info, model, gpu)
        args = info.get("engine_args")
        if args is not None:
            expect_object(run / "run.json", ["engine_args"], args)
            for key, (typ, words) in FIT_ENGINE_ARGS.items():
                if args.get(key) is not None:
                    expect(run / "run.json", ["engine_args", key], args[key], typ, words)
    steps = next((run / n for n in ("steps.jsonl", "steps.jsonl.gz") if (run / n).is_file()), None)
    if steps is not None:  # the fit names a folder without one
        check_steps_file(steps)
    if (run / RECONSTRUCTED_STEPS_FILE).is_file():
        check_steps_file(run / RECONSTRUCTED_STEPS_FILE)


def _open(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def check_steps_file(path: Path) -> None:
    """Every row of an engine step trace usable by a fit (see the module's docstring)."""
    check_regular_file(path, "step trace")
    total, rows = 0, 0
    try:
        with _open(path) as f:
            for lineno, line in enumerate(f, start=1):
                total += len(line)
                if total > MAX_STEPS_BYTES:
                    raise EngineRunError(f"{path}: more than {MAX_STEPS_BYTES >> 30} GiB of steps; fit on "
                                         "shorter runs")
                if not line.strip():
                    continue
                rows += 1
                _check_step_row(path, lineno, line)
    except (UnicodeDecodeError, OSError, EOFError, zlib.error) as exc:
        raise EngineRunError(f"{path}: cannot be read as a JSON-lines step trace ({exc}); rerun the engine run "
                             "(a .gz file must be a complete gzip archive, the text UTF-8)") from None
    if rows == 0:
        raise EngineRunError(f"{path}: no steps in the file; record a run with `costline engine run --out DIR`")


def _check_step_row(path: Path, lineno: int, line: str) -> None:
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise EngineRunError(f"{path}, line {lineno}: not valid JSON ({getattr(exc, 'msg', exc)}); the trace is "
                             "damaged: rerun the engine run") from None
    if not isinstance(row, dict):
        raise EngineRunError(f"{path}, line {lineno}: a step must be a JSON object, not {json_type(row)}")
    for col in REQUIRED_COLUMNS:
        v = row.get(col)
        if v is None:
            continue  # a missing column is named by the reader; null is NaN there
        if isinstance(v, bool) or not isinstance(v, int | float) or not _finite(v) or v < 0:
            raise EngineRunError(f"{path}, line {lineno}: key '{col}' must be a finite number >= 0, not "
                                 f"{json_type(v)} ({str(v)[:40]}); the trace is damaged: rerun the engine run")


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


# --------------------------------------------------------------------------- engine summaries
LATENCY_KEYS = ("ttft", "tpot", "itl", "e2el")
CHECKED_KEYS = ("num_prompts", "completed", "rejected", "unfinished", "duration", "request_throughput",
                "output_throughput", "total_output_tokens", "prefix_cache_hits_tokens", "prefix_cache_queries_tokens",
                "prefix_cache_hit_rate", "num_preemptions", "num_engine_steps", "num_gpu_blocks",
                "mean_queue_time_ms", "p99_queue_time_ms", "gpu_busy_share",
                *(f"{s}_{m}_ms" for m in LATENCY_KEYS for s in ("mean", "median", "p90", "p99")))
REL = 1e-6  # rounding in the file


def _num(summary: dict[str, Any], key: str, path: Path) -> float | None:
    v = summary.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):  # NaN: no value (as null)
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not _finite(v):
        raise EngineRunError(f"{path}: key '{key}' must be a finite number or null, not {json_type(v)} ({v!r})")
    if v < 0:
        raise EngineRunError(f"{path}: key '{key}' is {v!r}: a count, time or rate is never negative; the "
                             "summary is damaged or edited: rerun the engine run")
    return float(v)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b), 1.0)


def check_engine_summary(path: Path, summary: dict[str, Any], num_requests: int | None = None) -> None:
    """Refuse an engine summary whose figures cannot all be true (see the module's docstring)."""
    def impossible(what: str) -> EngineRunError:
        return EngineRunError(f"{path}: {what}: impossible for one run; the summary is damaged or edited: "
                              "rerun the engine run")

    nums = {k: _num(summary, k, path) for k in CHECKED_KEYS}
    n = nums.get("num_prompts")
    if num_requests is not None and n is not None and n != num_requests:
        raise impossible(f"num_prompts is {n:g} but workload.jsonl holds {num_requests} requests")
    parts = [nums.get(k) for k in ("completed", "rejected", "unfinished")]
    if n is not None and None not in parts and sum(parts) != n:  # type: ignore[arg-type]
        raise impossible(f"completed + rejected + unfinished = {sum(parts):g}, not num_prompts {n:g}")  # type: ignore[arg-type]
    for m in LATENCY_KEYS:
        chain = [(k, nums.get(k)) for k in (f"median_{m}_ms", f"p90_{m}_ms", f"p99_{m}_ms")]
        chain = [(k, v) for k, v in chain if v is not None]
        for (k1, v1), (k2, v2) in itertools.pairwise(chain):
            if v1 > v2 * (1 + REL) + 1e-9:
                raise impossible(f"{k1} {v1:g} is above {k2} {v2:g}")
    for stat in ("mean", "median", "p90", "p99"):
        ttft, e2e = nums.get(f"{stat}_ttft_ms"), nums.get(f"{stat}_e2el_ms")
        if ttft is not None and e2e is not None and ttft > e2e * (1 + REL) + 1e-9:
            raise impossible(f"{stat}_ttft_ms {ttft:g} is above {stat}_e2el_ms {e2e:g} (the first token comes "
                             "before the last)")
    duration = nums.get("duration")
    for rate, count in (("request_throughput", "completed"), ("output_throughput", "total_output_tokens")):
        r, c = nums.get(rate), nums.get(count)
        if r is not None and c is not None and duration and not _close(r, c / duration):
            raise impossible(f"{rate} {r:g} is not {count} / duration = {c / duration:g}")
    hits, queries, rate_ = (nums.get(k) for k in ("prefix_cache_hits_tokens", "prefix_cache_queries_tokens",
                                                   "prefix_cache_hit_rate"))
    if hits is not None and queries is not None and hits > queries:
        raise impossible(f"prefix_cache_hits_tokens {hits:g} exceeds prefix_cache_queries_tokens {queries:g}")
    if rate_ is not None and queries and hits is not None and not _close(rate_, hits / queries):
        raise impossible(f"prefix_cache_hit_rate {rate_:g} is not hits / queries = {hits / queries:g}")
    if rate_ is not None and rate_ > 1:
        raise impossible(f"prefix_cache_hit_rate {rate_:g} is above 1")
    done, out = nums.get("completed"), nums.get("total_output_tokens")
    if done is not None and out is not None and out < done:
        raise impossible(f"total_output_tokens {out:g} is below completed {done:g} (each finished request "
                         "produced a token)")


__all__ = ["EngineRunError", "check_engine_summary", "check_run_for_fit", "check_run_target", "check_steps_file",
           "read_run_json"]
