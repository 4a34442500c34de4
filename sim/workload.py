"""`Workload`: a column store of requests that hands out `engine.core.request.Request` objects.

A million frozen dataclasses, each with a tuple of hash ids, take seconds and
gigabytes to build, so a workload keeps its requests as numpy columns and builds
`Request` objects only when asked (`wl[i]`, `iter(wl)`, `wl.requests`).

Hash ids are stored as runs of consecutive ids: request i's ids are the
concatenation of `range(run_start[r], run_start[r] + run_len[r])` for r in
`run_offsets[i]:run_offsets[i+1]`. Generated prefixes are runs by construction
(a system prompt's blocks, a turn's fresh blocks) and traces compress well, so
this costs a few runs per request instead of one integer per block.

Requests are sorted by arrival and `request_id` equals the position, as
docs/interfaces.md requires.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.core.request import Request
from sim.workload_spec import MAX_ARRIVAL_S


def segment_arange(counts: np.ndarray) -> np.ndarray:
    """[0..c0-1, 0..c1-1, ...] for counts [c0, c1, ...]."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts, counts)


def runs_from_flat(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compress flat per-request id lists (CSR `ids`, `offsets`) into runs of consecutive ids."""
    ids = np.asarray(ids, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n_ids = ids.size
    breaks = np.ones(n_ids, dtype=bool)
    if n_ids > 1:
        breaks[1:] = np.diff(ids) != 1
    breaks[offsets[:-1][offsets[:-1] < n_ids]] = True  # a run never crosses a request boundary
    starts_at = np.flatnonzero(breaks)
    run_start = ids[starts_at]
    run_len = np.diff(np.append(starts_at, n_ids))
    run_offsets = np.searchsorted(starts_at, offsets, side="left").astype(np.int64)
    return run_start, run_len.astype(np.int64), run_offsets


@dataclass(eq=False)
class Workload:
    """Requests as columns; see the module docstring for the hash-id layout."""

    arrival_s: np.ndarray  # float64 [n], sorted
    prompt_len: np.ndarray  # int64 [n]
    output_len: np.ndarray  # int64 [n]
    run_start: np.ndarray  # int64 [runs]
    run_len: np.ndarray  # int64 [runs]
    run_offsets: np.ndarray  # int64 [n + 1]
    hash_block_size: int
    category_code: np.ndarray  # int32 [n], index into `categories`
    categories: tuple[str, ...]
    session_id: np.ndarray  # int64 [n], -1 = not part of a multi-turn session
    name: str = "workload"
    notes: list[str] = field(default_factory=list)  # how it was made: spreading, scaling, windows
    skipped_rows: dict[str, int] = field(default_factory=dict)  # reason -> rows a lenient load skipped
    _requests: list[Request] | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_columns(
        cls,
        arrival_s: np.ndarray,
        prompt_len: np.ndarray,
        output_len: np.ndarray,
        hash_ids: np.ndarray,
        hash_offsets: np.ndarray,
        hash_block_size: int,
        category: Sequence[str] | str = "default",
        session_id: np.ndarray | None = None,
        name: str = "workload",
    ) -> Workload:
        """From flat hash ids (CSR). Rows are sorted by arrival (stably) if they are not already."""
        n = len(arrival_s)
        if isinstance(category, str):
            categories, codes = (category,), np.zeros(n, dtype=np.int32)
        else:
            categories_arr, codes = np.unique(np.asarray(category, dtype=object).astype(str), return_inverse=True)
            categories = tuple(str(c) for c in categories_arr)
        run_start, run_len, run_offsets = runs_from_flat(hash_ids, hash_offsets)
        wl = cls(
            arrival_s=np.asarray(arrival_s, dtype=np.float64),
            prompt_len=np.asarray(prompt_len, dtype=np.int64),
            output_len=np.asarray(output_len, dtype=np.int64),
            run_start=run_start,
            run_len=run_len,
            run_offsets=run_offsets,
            hash_block_size=int(hash_block_size),
            category_code=np.asarray(codes, dtype=np.int32),
            categories=categories,
            session_id=np.full(n, -1, dtype=np.int64) if session_id is None else np.asarray(session_id, np.int64),
            name=name,
        )
        if n > 1 and np.any(np.diff(wl.arrival_s) < 0):
            wl = wl.take(np.argsort(wl.arrival_s, kind="stable"))
        return wl

    @classmethod
    def from_requests(cls, requests: Sequence[Request], name: str = "workload") -> Workload:
        if not requests:
            raise ValueError("a workload needs at least one request")
        sizes = {r.hash_block_size for r in requests}
        if len(sizes) != 1:
            raise ValueError(f"requests mix hash block sizes {sorted(sizes)}; a workload has one")
        lens = np.array([len(r.hash_ids) for r in requests], dtype=np.int64)
        arrival = np.array([r.arrival_s for r in requests], dtype=np.float64)
        ok = np.isfinite(arrival) & (arrival >= 0) & (arrival <= MAX_ARRIVAL_S)
        if not ok.all():  # finite times only: a NaN would poison every statistic, inf never arrive
            i = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"request {requests[i].request_id} (item {i}): arrival_s {requests[i].arrival_s!r} is "
                             f"not a finite time from 0 to {MAX_ARRIVAL_S:.0e} s")
        return cls.from_columns(
            arrival_s=arrival,
            prompt_len=np.array([r.prompt_len for r in requests]),
            output_len=np.array([r.output_len for r in requests]),
            hash_ids=np.fromiter((h for r in requests for h in r.hash_ids), dtype=np.int64, count=int(lens.sum())),
            hash_offsets=np.concatenate([[0], np.cumsum(lens)]),
            hash_block_size=sizes.pop(),
            category=[r.category for r in requests],
            session_id=np.array([-1 if r.session_id is None else r.session_id for r in requests]),
            name=name,
        )

    # ------------------------------------------------------------------ access

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def num_requests(self) -> int:
        return len(self)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def category(self) -> np.ndarray:
        """Per-request category names (object array)."""
        return np.asarray(self.categories, dtype=object)[self.category_code]

    def hash_ids(self, i: int) -> np.ndarray:
        lo, hi = self.run_offsets[i], self.run_offsets[i + 1]
        starts, lens = self.run_start[lo:hi], self.run_len[lo:hi]
        return np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()), dtype=np.int64)

    def flat_hash_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """All hash ids in request order (CSR): `ids[offsets[i]:offsets[i+1]]` belong to request i."""
        run_pos = np.cumsum(self.run_len) - self.run_len  # where each run starts in the flat array
        ids = np.repeat(self.run_start - run_pos, self.run_len) + np.arange(int(self.run_len.sum()), dtype=np.int64)
        cum = np.concatenate([[0], np.cumsum(self.run_len)])
        return ids, cum[self.run_offsets]

    def __getitem__(self, i: int) -> Request:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"request {i} out of range for a workload of {len(self)}")
        sid = int(self.session_id[i])
        return Request(
            request_id=i,
            arrival_s=float(self.arrival_s[i]),
            prompt_len=int(self.prompt_len[i]),
            output_len=int(self.output_len[i]),
            hash_ids=tuple(self.hash_ids(i).tolist()),
            hash_block_size=self.hash_block_size,
            category=self.categories[int(self.category_code[i])],
            session_id=None if sid < 0 else sid,
        )

    def __iter__(self) -> Iterator[Request]:
        """Requests in arrival order, built in bulk (much faster than indexing one by one)."""
        ids, offs = self.flat_hash_ids()
        ids_list = ids.tolist()
        offs_list = offs.tolist()
        cats = [self.categories[c] for c in range(len(self.categories))]
        rows = zip(
            self.arrival_s.tolist(), self.prompt_len.tolist(), self.output_len.tolist(),
            self.category_code.tolist(), self.session_id.tolist(), strict=True,
        )
        bs = self.hash_block_size
        for i, (t, p, o, c, s) in enumerate(rows):
            yield Request(i, t, p, o, tuple(ids_list[offs_list[i]:offs_list[i + 1]]), bs, cats[c],
                          None if s < 0 else s)

    @property
    def requests(self) -> list[Request]:
        """All requests as `Request` objects (built once, then cached)."""
        if self._requests is None:
            self._requests = list(self)
        return self._requests

    # ------------------------------------------------------------------ derived workloads

    def take(self, idx: np.ndarray) -> Workload:
        """The requests at positions `idx` (in that order; callers keep it sorted by arrival)."""
        idx = np.asarray(idx, dtype=np.int64)
        counts = np.diff(self.run_offsets)[idx]
        new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        run_idx = np.repeat(self.run_offsets[idx], counts) + segment_arange(counts)
        return Workload(
            arrival_s=self.arrival_s[idx],
            prompt_len=self.prompt_len[idx],
            output_len=self.output_len[idx],
            run_start=self.run_start[run_idx],
            run_len=self.run_len[run_idx],
            run_offsets=new_offsets,
            hash_block_size=self.hash_block_size,
            category_code=self.category_code[idx],
            categories=self.categories,
            session_id=self.session_id[idx],
            name=self.name,
            notes=list(self.notes),
            skipped_rows=dict(self.skipped_rows),
        )

    def _with(self, **changes: object) -> Workload:
        kw = {f: getattr(self, f) for f in (
            "arrival_s", "prompt_len", "output_len", "run_start", "run_len", "run_offsets",
            "hash_block_size", "category_code", "categories", "session_id", "name")}
        kw.update(changes)
        kw["notes"] = list(self.notes)
        kw["skipped_rows"] = dict(self.skipped_rows)
        return Workload(**kw)  # type: ignore[arg-type]

    def head(self, n: int) -> Workload:
        """The first `n` requests."""
        if n < 1:
            raise ValueError(f"first N must be >= 1, got {n}")
        wl = self.take(np.arange(min(n, len(self))))
        wl.notes.append(f"kept the first {len(wl)} of {len(self)} requests")
        return wl

    def window(self, start_s: float | None = None, end_s: float | None = None) -> Workload:
        """Requests with start_s <= arrival < end_s (times as in this workload), shifted so that
        start_s becomes 0 (the gap before the first request in the window is kept)."""
        lo = self.arrival_s[0] if start_s is None else start_s
        hi = np.inf if end_s is None else end_s
        if hi <= lo:
            raise ValueError(f"time window end ({end_s}) must be after its start ({lo})")
        keep = np.flatnonzero((self.arrival_s >= lo) & (self.arrival_s < hi))
        if keep.size == 0:
            raise ValueError(f"no request arrives in the window [{lo}, {hi}) s; "
                             f"this workload spans {self.arrival_s[0]:.3f} .. {self.arrival_s[-1]:.3f} s")
        wl = self.take(keep)
        wl.arrival_s = wl.arrival_s - lo
        wl.notes.append(f"kept {keep.size} of {len(self)} requests arriving in [{lo:g}, {hi:g}) s")
        return wl

    def scaled(self, speedup: float) -> Workload:
        """Time compressed by `speedup` (2 = twice the rate; lengths and prefixes unchanged)."""
        if not speedup > 0:
            raise ValueError(f"speed-up factor must be > 0, got {speedup}")
        wl = self._with(arrival_s=self.arrival_s / speedup)
        wl.notes.append(f"arrival times divided by {speedup:g}")
        return wl

    def at_rate(self, rate_rps: float) -> Workload:
        """Time scaled so that the mean rate (requests / span) becomes `rate_rps`."""
        if not rate_rps > 0:
            raise ValueError(f"target rate must be > 0 req/s, got {rate_rps}")
        if len(self) < 2 or self.duration_s <= 0:
            raise ValueError("a target rate needs at least two requests at different times")
        return self.scaled(rate_rps / (len(self) / self.duration_s))
