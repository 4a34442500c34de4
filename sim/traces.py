"""Real-trace loaders (Mooncake JSONL, Azure LLM inference CSV 2023/2024, BurstGPT CSV) and a
Mooncake JSONL exporter.

Every loader returns a `Workload` whose first request arrives at 0 s. A malformed row raises
`TraceFormatError` naming the file, line, field and fix; with `lenient=True` bad rows are skipped
and counted by reason in `Workload.skipped_rows` instead. Nothing is dropped silently.

Prefix information
- Mooncake: `hash_ids` at 512 tokens per block (inferred from the rows when they fit another
  size, e.g. a file our exporter wrote at 16).
- Azure and BurstGPT carry none: every block of every request gets a fresh id, so the
  workload shows no prefix reuse, which is what the trace can vouch for.

Limits, checked before any array is built: a request of more than `MAX_REQUEST_TOKENS` (10M,
the longest context any served model offers, Llama 4 Scout's) is refused with its line, so a
20-digit count never reaches numpy; hash ids must fit an int64. Only regular files are read (a
directory or a device such as /dev/zero is named as such), at most `MAX_TRACE_BYTES` of text,
and bytes that are not UTF-8 are reported with their line and column.

Mooncake's 3-second timestamp steps (sim/traces_data/README.md): the default replays them
as-is (bursts of simultaneous arrivals every ~3 s, as the trace records). `spread_ties` instead
spreads each group of equal timestamps uniformly over the gap to the next distinct timestamp,
with a seed; use it when the quantisation, not the traffic, would drive queueing.

BurstGPT failures (`Response tokens` = 0): such a request produced no output, and a `Request`
needs at least one output token; by default they are excluded and counted under
"failed request" in `skipped_rows` (also in strict mode: they are part of the format, not a
defect). `keep_failed=True` keeps them as requests with a 1-token output instead.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import math
import os
import re
import stat
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np

from sim.workload import Workload
from sim.workload_spec import MAX_ARRIVAL_S

TraceFormat = Literal["auto", "mooncake", "azure", "burstgpt"]
FORMATS = ("mooncake", "azure", "burstgpt")
MOONCAKE_BLOCK_TOKENS = 512
_BLOCK_SIZE_CANDIDATES = (512, 16, 32, 64, 128, 256, 1024, 8, 2048)
MAX_REQUEST_TOKENS = 10_000_000  # longest context of any served model (Llama 4 Scout: 10M)
MAX_TRACE_BYTES = 4 << 30  # decompressed text; the largest public traces are well under 1 GiB
_MAX_HASH_ID = 2**63 - 1

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")


class TraceFormatError(ValueError):
    """A trace that cannot be read as it is; says where, what and how to fix it."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, problem: str, fix: str) -> None:
        self.path, self.line, self.field, self.problem, self.fix = str(path), line, field, problem, fix
        where = self.path + (f", line {line}" if line is not None else "")
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{problem}. Fix: {fix}")


@dataclass
class _Rows:
    """Collects valid rows; in lenient mode turns row errors into counted skips."""

    path: Path
    lenient: bool
    skipped: Counter[str]

    def bad(self, line: int, field: str | None, problem: str, fix: str, reason: str) -> None:
        if not self.lenient:
            raise TraceFormatError(self.path, line, field, problem, fix)
        self.skipped[reason] += 1

    def short(self, line: int, header: list[str], row: list[str]) -> bool:
        """Whether a CSV row lacks some of the header's fields (then reported as bad)."""
        if len(row) >= len(header):
            return False
        self.bad(line, header[len(row)], f"missing (the row has {len(row)} of {len(header)} fields)",
                 "give every row all columns of the header", "short row")
        return True

    def count(self, line: int, field: str, raw: object, min_tokens: int, fix: str) -> int | None:
        """`raw` as a token count >= `min_tokens`, or None once reported as a bad `field`."""
        n = _as_count(raw)
        if n is None or n < min_tokens:
            self.bad(line, field, f"{raw!r} is not a whole number of tokens >= {min_tokens}", fix,
                     f"bad {field}")
            return None
        if n > MAX_REQUEST_TOKENS:
            self.bad(line, field, f"{str(raw).strip()} tokens is above the per-request limit of {MAX_REQUEST_TOKENS:,} "
                     "(the longest context any served model offers)",
                     "check this row: the count is likely corrupt (or pass --lenient to skip such rows)",
                     f"{field} above {MAX_REQUEST_TOKENS:,} tokens")
            return None
        return n


def _trace_workload(*, path: Path, fmt: str, arrival_s: list[float], prompt_len: list[int],
                    output_len: list[int], hash_block_size: int, skipped: Counter[str], bad_rows_total: int,
                    hash_ids: np.ndarray | None = None, hash_counts: list[int] | None = None,
                    category: list[str] | str = "default", session_id: list[int] | None = None,
                    lines: list[int] | None = None, time_field: str = "timestamp") -> Workload:
    """The Workload of a loaded trace's rows, with notes on what was skipped. Without `hash_ids`
    (no prefix information) every block gets a fresh id. `lines` are the rows' line numbers (to
    name the first one arriving later than MAX_ARRIVAL_S after the first)."""
    if not arrival_s:
        detail = f" ({bad_rows_total} rows skipped: {dict(skipped)})" if bad_rows_total else ""
        raise TraceFormatError(path, None, None, f"no usable requests in this {fmt} trace{detail}",
                               "check that the file is the trace you meant and is not truncated")
    t = np.asarray(arrival_s, dtype=np.float64)
    late = np.flatnonzero(t - t[0] > MAX_ARRIVAL_S)
    if late.size:
        k = int(late[0])
        raise TraceFormatError(path, lines[k] if lines else None, time_field,
                               f"this row arrives {t[k] - t[0]:.3g} s after the first, more than the "
                               f"{MAX_ARRIVAL_S:.0e} s (~31 years) a simulation clock keeps exact",
                               "check the timestamps' unit and this row (or cut the trace into windows)")
    p = np.asarray(prompt_len, dtype=np.int64)
    sessions = None if session_id is None else np.asarray(session_id, dtype=np.int64)
    if hash_ids is None:
        wl = _fresh_blocks_workload(t - t[0], p, np.asarray(output_len, dtype=np.int64), hash_block_size,
                                    category, sessions, path.name)
    else:
        offsets = np.concatenate([[0], np.cumsum(np.asarray(hash_counts, dtype=np.int64))]).astype(np.int64)
        wl = Workload.from_columns(
            arrival_s=t - t[0], prompt_len=p, output_len=np.asarray(output_len, dtype=np.int64),
            hash_ids=hash_ids, hash_offsets=offsets, hash_block_size=hash_block_size, category=category,
            session_id=sessions, name=path.name,
        )
    wl.skipped_rows = dict(skipped)
    wl.notes.append(f"loaded {len(wl)} requests from {path.name} ({fmt})")
    if skipped:
        wl.notes.append(f"skipped {sum(skipped.values())} rows: "
                        + "; ".join(f"{n} x {why}" for why, n in skipped.most_common()))
    return wl


def _fresh_blocks_workload(arrival_s: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray, bs: int,
                           category: list[str] | str, session_id: np.ndarray | None, name: str) -> Workload:
    """Rows with no prefix information: each request one run of fresh ids, built as runs
    directly (memory per request, not per block: a 10M-token row would be 625k ids at 16)."""
    n = arrival_s.size
    counts = -(-prompt_len // bs)
    if isinstance(category, str):
        categories, codes = (category,), np.zeros(n, dtype=np.int32)
    else:
        names, codes = np.unique(np.asarray(category, dtype=str), return_inverse=True)
        categories = tuple(str(c) for c in names)
    return Workload(
        arrival_s=arrival_s, prompt_len=prompt_len, output_len=output_len,
        run_start=(np.cumsum(counts) - counts).astype(np.int64), run_len=counts.astype(np.int64),
        run_offsets=np.arange(n + 1, dtype=np.int64), hash_block_size=int(bs),
        category_code=np.asarray(codes, dtype=np.int32), categories=categories,
        session_id=np.full(n, -1, dtype=np.int64) if session_id is None else session_id, name=name,
    )


def _finite(x: float) -> bool:
    """Whether `x` is a finite float (an int too large for a float is not)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _as_count(value: object) -> int | None:
    """A JSON/CSV token count as int, or None if it is not a whole number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        s = value.strip()
        if re.fullmatch(r"[+-]?\d{19,}", s):  # above every limit; int() refuses 4300+ digits
            return -1 if s[0] == "-" else 10**18
        if re.fullmatch(r"[+-]?\d+", s):
            return int(s)
        if re.fullmatch(r"[+-]?\d+\.0*", s):
            return int(float(s))
    return None


# --------------------------------------------------------------------------- Mooncake


def load_mooncake(path: str | Path, *, lenient: bool = False, hash_block_size: int | None = None) -> Workload:
    """Mooncake / `timed_trace` JSONL: timestamp (ms), input_length, output_length, hash_ids.

    `hash_block_size` None: 512 (Mooncake's) unless the rows fit another size and not 512."""
    path = Path(path)
    rows = _Rows(path, lenient, Counter())
    parsed = _json_lines(path, rows)
    bs = hash_block_size or _infer_block_size(parsed)
    kept: list[_MooncakeRow] = []
    for lineno, obj in parsed:
        row = _mooncake_row(lineno, obj, bs, rows)
        if row is None:
            continue
        if kept and (row.timestamp_ms < kept[-1].timestamp_ms or _exact_before(row, kept[-1])):
            prev = kept[-1]
            rows.bad(lineno, "timestamp", f"{row.timestamp_ms} ms is earlier than {prev.timestamp_ms} ms on line "
                     f"{prev.lineno} (timestamps go backwards)", "sort the file by timestamp (e.g. `sort` the "
                     "rows by that field) or pass --lenient to skip such rows", "timestamp going backwards")
            continue
        kept.append(row)
    counts = [len(r.hash_ids) for r in kept]
    flat = np.fromiter((h for r in kept for h in r.hash_ids), dtype=np.int64, count=sum(counts))
    # the exact arrival where our exporter wrote one (a burst within one ms), else the timestamp
    arrival = [r.timestamp_ms / 1000.0 if r.arrival_s is None else r.arrival_s for r in kept]
    tasks = [r.task or "default" for r in kept] if any(r.task for r in kept) else "default"
    sessions = [-1 if r.session_id is None else r.session_id for r in kept] \
        if any(r.session_id is not None for r in kept) else None
    return _trace_workload(path=path, fmt="mooncake", arrival_s=arrival,  # type: ignore[arg-type]
                           prompt_len=[r.input_length for r in kept], output_len=[r.output_length for r in kept],
                           hash_block_size=bs, hash_ids=flat, hash_counts=counts, skipped=rows.skipped,
                           bad_rows_total=sum(rows.skipped.values()), lines=[r.lineno for r in kept],
                           category=tasks, session_id=sessions)


def _exact_before(row: _MooncakeRow, prev: _MooncakeRow) -> bool:
    return row.arrival_s is not None and prev.arrival_s is not None and row.arrival_s < prev.arrival_s


@dataclass(frozen=True, slots=True)
class _MooncakeRow:
    lineno: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: list[int]
    # what costline's exporter adds (absent in Mooncake's own files)
    arrival_s: float | None = None
    task: str | None = None
    session_id: int | None = None


def _json_lines(path: Path, rows: _Rows) -> list[tuple[int, dict]]:
    """(line number, object) of every JSON-object line; bad lines go to `rows`."""
    parsed: list[tuple[int, dict]] = []
    for lineno, text in enumerate(read_text(path, "utf-8").split("\n"), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except RecursionError:
            rows.bad(lineno, None, "JSON nested too deeply", "each line must be one flat JSON object",
                     "bad JSON")
            continue
        except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
            where = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
            rows.bad(lineno, None, f"not valid JSON ({where})",
                     'each line must be one JSON object such as {"timestamp": 0, "input_length": 600, '
                     '"output_length": 20, "hash_ids": [0, 1]}', "bad JSON")
            continue
        if not isinstance(obj, dict):
            rows.bad(lineno, None, f"a JSON {type(obj).__name__}, not an object",
                     "each line must be one JSON object", "not a JSON object")
            continue
        parsed.append((lineno, obj))
    if not parsed and not rows.skipped:
        raise TraceFormatError(path, None, None, "the file is empty", "give a trace with one JSON request per line")
    return parsed


def _mooncake_row(lineno: int, obj: dict, bs: int, rows: _Rows) -> _MooncakeRow | None:
    """One row's fields checked (bs tokens per hash block); None, with the reason in `rows`, if bad."""
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj]
    if missing:
        rows.bad(lineno, missing[0], "missing", f"every row needs timestamp (ms), input_length, output_length "
                 f"and hash_ids; add '{missing[0]}'", f"missing field {missing[0]}")
        return None
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not _finite(ts) or ts < 0:
        rows.bad(lineno, "timestamp", f"{ts!r} is not a non-negative number of milliseconds",
                 "write the arrival time in ms since the trace start, e.g. 3000", "bad timestamp")
        return None
    n_in = rows.count(lineno, "input_length", obj["input_length"], 1,
                      "give the prompt length in tokens as a positive integer")
    if n_in is None:
        return None
    n_out = rows.count(lineno, "output_length", obj["output_length"], 1,
                       "give the output length in tokens as a positive integer (a request generates >= 1 token)")
    if n_out is None:
        return None
    hid = obj["hash_ids"]
    if not isinstance(hid, list) or not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h <= _MAX_HASH_ID
                                            for h in hid):
        rows.bad(lineno, "hash_ids", f"must be a list of integers from 0 to {_MAX_HASH_ID} (2^63 - 1)",
                 "write the prompt's block hash ids as a JSON list of integers", "bad hash_ids")
        return None
    want = -(-n_in // bs)
    if len(hid) != want:
        rows.bad(lineno, "hash_ids", f"{len(hid)} ids for input_length {n_in}, but at {bs} tokens per block "
                 f"there must be ceil({n_in}/{bs}) = {want}",
                 "fix input_length or hash_ids, or pass the block size the trace was made with "
                 "(--hash-block-size; Mooncake uses 512)", "hash_ids inconsistent with input_length")
        return None
    extras = _exporter_fields(lineno, obj, ts, rows)
    return None if extras is None else _MooncakeRow(lineno, ts, n_in, n_out, hid, *extras)


MAX_TASK_CHARS = 64


def _exporter_fields(lineno: int, obj: dict, ts_ms: float, rows: _Rows
                     ) -> tuple[float | None, str | None, int | None] | None:
    """`arrival_s`, `task` and `session_id` as `export_mooncake` writes them (each optional); the
    exact arrival must round to the row's own ms timestamp, so the two cannot disagree."""
    arrival = obj.get("arrival_s")
    if arrival is not None and (isinstance(arrival, bool) or not isinstance(arrival, int | float)
                                or not _finite(arrival) or abs(arrival * 1000.0 - ts_ms) > 0.5 + 1e-6):
        rows.bad(lineno, "arrival_s", f"{arrival!r} is not the row's timestamp {ts_ms!r} ms in seconds",
                 "drop arrival_s (the timestamp is used) or write the exact arrival in seconds", "bad arrival_s")
        return None
    task = obj.get("task")
    if task is not None and (not isinstance(task, str) or not 0 < len(task) <= MAX_TASK_CHARS):
        rows.bad(lineno, "task", f"{task!r} is not a task name of 1 to {MAX_TASK_CHARS} characters",
                 "write the task as a short string such as \"chat\", or drop the field", "bad task")
        return None
    sid = obj.get("session_id")
    if sid is not None and (isinstance(sid, bool) or not isinstance(sid, int) or not 0 <= sid <= _MAX_HASH_ID):
        rows.bad(lineno, "session_id", f"{sid!r} is not a non-negative integer",
                 "write the session as an integer id, or drop the field", "bad session_id")
        return None
    return (None if arrival is None else float(arrival)), task, sid


def _infer_block_size(parsed: list[tuple[int, dict]]) -> int:
    """512 if the first rows fit it; else the first candidate size that fits them all."""
    sample = []
    for _, obj in parsed[:200]:
        n_in, hid = _as_count(obj.get("input_length")), obj.get("hash_ids")
        if n_in is not None and n_in >= 1 and isinstance(hid, list):
            sample.append((n_in, len(hid)))
    for bs in _BLOCK_SIZE_CANDIDATES:
        if sample and all(-(-n // bs) == k for n, k in sample):
            return bs
    return MOONCAKE_BLOCK_TOKENS


# --------------------------------------------------------------------------- CSV traces

_TS_RE = re.compile(r"^\s*(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?\s*$")


def _parse_wallclock_ns(text: str) -> int | None:
    """`YYYY-MM-DD HH:MM:SS[.f{1,9}][Z|+HH:MM]` as ns since the epoch (UTC if an offset is given).

    Azure 2023 writes 7 fractional digits (100 ns), which many datetime parsers reject."""
    m = _TS_RE.match(text)
    if m is None:
        return None
    date, clock, frac, tz = m.groups()
    try:
        secs = int(np.datetime64(f"{date}T{clock}", "s").astype(np.int64))
    except ValueError:
        return None
    ns = secs * 1_000_000_000 + (int(frac.ljust(9, "0")) if frac else 0)
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        hh, mm = int(tz[1:3]), int(tz[-2:])
        ns -= sign * (hh * 3600 + mm * 60) * 1_000_000_000
    return ns


def _csv_rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    text = read_text(path, "utf-8-sig")
    if not text.strip():
        raise TraceFormatError(path, None, None, "the file is empty", "give a CSV trace with a header row and one row per request")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
        rows = [(reader.line_num, r) for r in reader if r and any(c.strip() for c in r)]
    except csv.Error as exc:  # a NUL byte, or a quoted field running past the size limit
        raise TraceFormatError(path, reader.line_num, None, f"not readable as CSV ({exc})",
                               "give a plain-text CSV file with a header row") from None
    return [h.strip() for h in header], rows


def _require_columns(path: Path, header: list[str], needed: tuple[str, ...], fmt: str) -> dict[str, int]:
    for col in needed:
        if col not in header:
            raise TraceFormatError(path, 1, col, f"missing column (header has {', '.join(header)})",
                                   f"a {fmt} trace needs the columns {', '.join(needed)}")
    return {c: header.index(c) for c in header}


def load_azure(path: str | Path, *, lenient: bool = False, hash_block_size: int = 16) -> Workload:
    """Azure LLM inference trace CSV (2023 Splitwise and 2024 DynamoLLM): TIMESTAMP,
    ContextTokens, GeneratedTokens. Arrival = TIMESTAMP - first TIMESTAMP. No prefix info."""
    path = Path(path)
    header, body = _csv_rows(path)
    col = _require_columns(path, header, AZURE_COLUMNS, "Azure LLM inference")
    rows = _Rows(path, lenient, Counter())
    t_ns: list[int] = []
    prompt: list[int] = []
    output: list[int] = []
    kept_lines: list[int] = []
    last: tuple[int, int] | None = None
    for lineno, r in body:
        if rows.short(lineno, header, r):
            continue
        ns = _parse_wallclock_ns(r[col["TIMESTAMP"]])
        if ns is None:
            rows.bad(lineno, "TIMESTAMP", f"{r[col['TIMESTAMP']]!r} is not a date-time",
                     "write it as YYYY-MM-DD HH:MM:SS.fffffff (an optional +HH:MM offset is allowed)", "bad TIMESTAMP")
            continue
        if not -(2**63) < ns < 2**63:
            rows.bad(lineno, "TIMESTAMP", f"{r[col['TIMESTAMP']].strip()} is outside the years 1678-2262 a "
                     "nanosecond clock holds", "check this row's date", "TIMESTAMP out of range")
            continue
        n_in = rows.count(lineno, "ContextTokens", r[col["ContextTokens"]], 1,
                          "give the prompt length as a positive integer")
        if n_in is None:
            continue
        n_out = rows.count(lineno, "GeneratedTokens", r[col["GeneratedTokens"]], 1,
                           "give the output length as a positive integer")
        if n_out is None:
            continue
        if last is not None and ns < last[0]:
            rows.bad(lineno, "TIMESTAMP", f"{r[col['TIMESTAMP']]} is earlier than the row on line {last[1]} "
                     "(timestamps go backwards)", "sort the file by TIMESTAMP or pass --lenient to skip such rows",
                     "timestamp going backwards")
            continue
        last = (ns, lineno)
        t_ns.append(ns)
        prompt.append(n_in)
        output.append(n_out)
        kept_lines.append(lineno)
    arrival = [] if not t_ns else ((np.asarray(t_ns, dtype=np.int64) - t_ns[0]) / 1e9).tolist()
    return _trace_workload(path=path, fmt="azure", arrival_s=arrival, prompt_len=prompt, output_len=output,
                           hash_block_size=hash_block_size, skipped=rows.skipped,
                           bad_rows_total=sum(rows.skipped.values()), lines=kept_lines, time_field="TIMESTAMP")


def load_burstgpt(path: str | Path, *, lenient: bool = False, hash_block_size: int = 16,
                  keep_failed: bool = False) -> Workload:
    """BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens, Log Type
    (and `Session ID` in later releases). Category = the log type ('conversation' or 'api')."""
    path = Path(path)
    header, body = _csv_rows(path)
    col = _require_columns(path, header, ("Timestamp", "Request tokens", "Response tokens"), "BurstGPT")
    rows = _Rows(path, lenient, Counter())
    arrival: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    category: list[str] = []
    session: list[int] = []
    kept_lines: list[int] = []
    has_session = "Session ID" in col
    last: tuple[float, int] | None = None
    for lineno, r in body:
        if rows.short(lineno, header, r):
            continue
        try:
            ts = float(r[col["Timestamp"]])
        except ValueError:
            ts = float("nan")
        if not math.isfinite(ts) or ts < 0:
            rows.bad(lineno, "Timestamp", f"{r[col['Timestamp']]!r} is not a non-negative number of seconds",
                     "write the arrival time in seconds since the trace start", "bad Timestamp")
            continue
        n_in = rows.count(lineno, "Request tokens", r[col["Request tokens"]], 1,
                          "give the prompt length as a positive integer")
        if n_in is None:
            continue
        n_out = rows.count(lineno, "Response tokens", r[col["Response tokens"]], 0,
                           "give the output length as a non-negative integer (0 marks a failed request)")
        if n_out is None:
            continue
        if n_out == 0 and not keep_failed:
            rows.skipped["failed request (Response tokens = 0), excluded"] += 1
            continue
        if last is not None and ts < last[0]:
            rows.bad(lineno, "Timestamp", f"{ts} s is earlier than {last[0]} s on line {last[1]} "
                     "(timestamps go backwards)", "sort the file by Timestamp or pass --lenient to skip such rows",
                     "timestamp going backwards")
            continue
        last = (ts, lineno)
        arrival.append(ts)
        prompt.append(n_in)
        output.append(max(n_out, 1))
        kept_lines.append(lineno)
        kind = r[col["Log Type"]].strip().lower() if "Log Type" in col else ""
        category.append("api" if kind.startswith("api") else "conversation" if kind.startswith("conv") else "default")
        if has_session:
            sid = _as_count(r[col["Session ID"]])
            session.append(-1 if sid is None else sid)
    return _trace_workload(path=path, fmt="burstgpt", arrival_s=arrival, prompt_len=prompt, output_len=output,
                           hash_block_size=hash_block_size, category=category,
                           session_id=session if has_session else None, skipped=rows.skipped,
                           bad_rows_total=sum(v for k, v in rows.skipped.items() if not k.startswith("failed")),
                           lines=kept_lines, time_field="Timestamp")


# --------------------------------------------------------------------------- detection, options


def open_text(path: Path, encoding: str, errors: str = "strict") -> TextIO:
    """A trace file as text; `.gz` files are decompressed on the fly (traces are often shipped so)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding=encoding, errors=errors)
    return path.open("r", encoding=encoding, errors=errors)


def check_input_file(path: str | Path) -> Path:
    """`path` if it is a regular file (or a link to one); TraceFormatError naming what it is otherwise.
    Devices and pipes are refused: /dev/zero would be read forever."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TraceFormatError(path, None, None, "no such file", "check the path (or name a preset: "
                               "`costline workload presets` lists them)") from None
    except OSError as exc:
        raise TraceFormatError(path, None, None, f"cannot be read ({exc.strerror})",
                               "check the path and its permissions") from None
    if stat.S_ISDIR(mode):
        raise TraceFormatError(path, None, None, "is a directory, not a trace or spec file",
                               "name a file inside it")
    if not stat.S_ISREG(mode):
        kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
                else "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise TraceFormatError(path, None, None, f"is {kind}, not a regular file",
                               "save the trace to a file and give its path")
    return path


# A .gz trace inflates ~4-15x (the shipped Mooncake trace: 3.8x); past this ratio, once some text
# is out, it is a compression bomb, refused while it is read instead of after gigabytes.
MAX_GZIP_RATIO = 200
_RATIO_AFTER_BYTES = 16 << 20
_CHUNK = 1 << 20


def read_text(path: Path, encoding: str) -> str:
    """The whole (decompressed) file as text, at most MAX_TRACE_BYTES, decoded as it is read: a
    byte that is not valid in `encoding` is reported with its line and column as soon as it is met
    (a large binary file is refused after its first megabyte, not after all of it), and a .gz file
    inflating more than MAX_GZIP_RATIO times is refused as a compression bomb."""
    check_input_file(path)
    decoder = codecs.getincrementaldecoder(encoding)()
    parts: list[str] = []
    total = lines = since_newline = 0
    try:
        with path.open("rb") as raw, (gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw) as f:
            while True:
                chunk = f.read(_CHUNK)
                total += len(chunk)
                if total > MAX_TRACE_BYTES:
                    raise TraceFormatError(path, None, None, f"is larger than {MAX_TRACE_BYTES >> 30} GiB of text",
                                           "cut it into parts (e.g. with `split -l`) or window it before loading")
                if f is not raw and total > _RATIO_AFTER_BYTES and total > MAX_GZIP_RATIO * max(raw.tell(), 1):
                    raise TraceFormatError(path, None, None, f"inflates more than {MAX_GZIP_RATIO} times ({raw.tell():,} "
                                           f"compressed bytes gave {total:,} so far): not a trace but a compression "
                                           "bomb", "give the trace itself")
                pending = decoder.getstate()[0]
                try:
                    parts.append(decoder.decode(chunk, final=not chunk))
                except UnicodeDecodeError as exc:
                    data = pending + chunk
                    line = lines + data.count(b"\n", 0, exc.start) + 1
                    nl = data.rfind(b"\n", 0, exc.start)
                    col = exc.start - nl if nl >= 0 else since_newline - len(pending) + exc.start + 1
                    raise TraceFormatError(path, line, None, f"byte 0x{data[exc.start]:02x} at column {col} is not "
                                           f"{exc.encoding}", "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 "
                                           "FILE > FILE.utf8`) or remove the stray bytes") from None
                if not chunk:
                    return "".join(parts)
                lines += chunk.count(b"\n")
                nl = chunk.rfind(b"\n")
                since_newline = len(chunk) - nl - 1 if nl >= 0 else since_newline + len(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(path, None, None, f"cannot be read ({exc})",
                               "check the file (a .gz file must be a complete gzip archive)") from None


def detect_format(path: str | Path) -> str:
    """'mooncake', 'azure' or 'burstgpt' from the first bytes; TraceFormatError otherwise."""
    path = check_input_file(path)
    try:
        with open_text(path, encoding="utf-8-sig", errors="replace") as f:
            head = f.read(4096)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(path, None, None, f"cannot be read ({exc})",
                               "check the file (a .gz file must be a complete gzip archive)") from None
    if not head.strip():
        raise TraceFormatError(path, None, None, "the file is empty", "give a non-empty trace file")
    if head.count("\ufffd") > max(8, len(head) // 100) or "\x00" in head:
        raise TraceFormatError(path, None, None, "is not UTF-8 text (a binary file?)",
                               "give a trace: Mooncake JSONL, an Azure or a BurstGPT CSV (plain or .gz)")
    first = head.lstrip().splitlines()[0]
    if first.startswith("{"):
        return "mooncake"
    cols = [c.strip() for c in next(csv.reader([first]))]
    if all(c in cols for c in AZURE_COLUMNS):
        return "azure"
    if "Timestamp" in cols and "Request tokens" in cols:
        return "burstgpt"
    raise TraceFormatError(
        path, 1, None, f"unknown trace format (first line: {first[:80]!r})",
        "use Mooncake JSONL (timestamp, input_length, output_length, hash_ids), an Azure CSV "
        f"({','.join(AZURE_COLUMNS)}) or a BurstGPT CSV ({','.join(BURSTGPT_COLUMNS)}), "
        "or name the format with --format")


def load_trace(path: str | Path, fmt: TraceFormat = "auto", *, lenient: bool = False,
               hash_block_size: int | None = None, keep_failed: bool = False) -> Workload:
    """Load a trace file in any supported format (auto-detected by default)."""
    kind = detect_format(path) if fmt == "auto" else fmt
    if kind == "mooncake":
        return load_mooncake(path, lenient=lenient, hash_block_size=hash_block_size)
    if kind == "azure":
        return load_azure(path, lenient=lenient, hash_block_size=hash_block_size or 16)
    if kind == "burstgpt":
        return load_burstgpt(path, lenient=lenient, hash_block_size=hash_block_size or 16, keep_failed=keep_failed)
    raise TraceFormatError(path, None, None, f"unknown format {fmt!r}", f"use one of auto, {', '.join(FORMATS)}")


def spread_ties(wl: Workload, seed: int = 0) -> Workload:
    """Spread requests that share a timestamp uniformly over [t, next distinct timestamp), seeded.

    For the last group the window is the median step between distinct timestamps. Requests are
    re-sorted by their new times (request ids follow the new order); the first no longer arrives
    exactly at 0."""
    t = wl.arrival_s
    distinct, inverse = np.unique(t, return_inverse=True)
    if distinct.size == t.size:
        return wl
    steps = np.diff(distinct)
    last_step = float(np.median(steps)) if steps.size else 1.0
    width = np.append(steps, last_step)[inverse]
    rng = np.random.default_rng(seed)
    new_t = t + rng.random(t.size) * width  # not re-zeroed: each request stays inside its own step
    order = np.argsort(new_t, kind="stable")
    out = wl.take(order)
    out.arrival_s = new_t[order]
    out.notes.append(f"spread {t.size} arrivals over {distinct.size} distinct timestamps uniformly within each "
                     f"step to the next (median step {last_step:.3f} s, seed {seed})")
    return out


# --------------------------------------------------------------------------- export


def export_mooncake(wl: Workload, path: str | Path | TextIO) -> Path | TextIO:
    """Write `wl` as Mooncake JSONL (timestamp in integer ms), replayable by
    `vllm bench serve --dataset-name timed_trace --dataset-path FILE
     --timed-trace-sec-multiplier 0.001 --timed-trace-chunk-hash-size <wl.hash_block_size>`.
    A row also carries what integer ms and the four Mooncake fields lose, read back by
    `load_mooncake` (replayers read only the fields they know): `arrival_s`, the exact arrival,
    where it is not a whole ms (bursts put several requests in one ms), and `task` and
    `session_id` where the workload has them; a Mooncake trace exports to its own rows.
    `path` may be an open text stream (standard output)."""
    ids, offs = wl.flat_hash_ids()
    rel = wl.arrival_s - wl.arrival_s[0]
    ts_ms = np.rint(rel * 1000.0).astype(np.int64).tolist()
    ids_l, offs_l, rel_l = ids.tolist(), offs.tolist(), rel.tolist()
    tasks = wl.category.tolist() if wl.categories != ("default",) else None
    sessions = wl.session_id.tolist()

    def row(i: int, t: int, p: int, o: int) -> str:
        obj: dict[str, Any] = {"timestamp": t, "input_length": p, "output_length": o,
                               "hash_ids": ids_l[offs_l[i]:offs_l[i + 1]]}
        if abs(rel_l[i] * 1000.0 - t) > 1e-6:  # a whole-ms arrival (a Mooncake source) needs none
            obj["arrival_s"] = rel_l[i]
        if tasks is not None:
            obj["task"] = tasks[i]
        if sessions[i] >= 0:
            obj["session_id"] = sessions[i]
        return json.dumps(obj, separators=(", ", ": ")) + "\n"

    def write(f: TextIO) -> None:
        f.writelines(row(i, t, p, o) for i, (t, p, o) in
                     enumerate(zip(ts_ms, wl.prompt_len.tolist(), wl.output_len.tolist(), strict=True)))

    if not isinstance(path, str | Path):
        write(path)
        return path
    with Path(path).open("w", encoding="utf-8") as f:
        write(f)
    return Path(path)
