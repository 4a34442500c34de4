"""Progress of an advise run: per phase, simulations finished of those it will run, and an ETA.

One callback interface serves the command line (rich bars on a terminal, a plain line on stderr
otherwise) and the dashboard (st.progress): `advise(..., progress=callback)` calls
`callback(ProgressEvent)`. The callback is always called on the thread that called `advise`:
the phases that run side by side in worker threads (cost lines, gap, robustness) are held and
handed over when that thread next `flush`es, so a UI that is not thread-safe (Streamlit) can
draw from it.

A phase's total is an estimate while it runs (the search does not know how many combinations
survive screening until it has screened): it is raised when more simulations are submitted and
set to the number done when the phase ends, so the last event of every phase reads done == total.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, Self

# share of an advise run's wall time each phase takes (measured on the quick budget, issue 28:
# cost lines 53 of 76 s before they ran beside the search's tail), for one overall bar
PHASE_WEIGHTS = {"search": 0.45, "ladder": 0.10, "cost lines": 0.25, "lab -> production gap": 0.07,
                 "robustness": 0.10, "GPUs to meet the SLO": 0.03}


def duration_text(seconds: float) -> str:
    """`40 s`, `3 min 05 s`: an ETA a person reads at a glance."""
    s = max(0, round(seconds))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    phase: str
    done: int  # simulations of this phase finished
    total: int  # simulations this phase runs (an estimate until `finished`)
    elapsed_s: float  # since the phase started
    eta_s: float | None  # remaining time of this phase; None before the first simulation ends
    fraction: float  # of the whole run, for a single bar (PHASE_WEIGHTS)
    finished: bool = False
    detail: str = ""  # what the phase is doing now (e.g. the search's rung)

    def text(self) -> str:
        """`cost lines: 34/120 simulations, ETA 40 s` (or `..., done in 12 s` at its end)."""
        head = f"{self.phase}: {self.done}/{self.total} simulations"
        if self.finished:
            return f"{head}, done in {duration_text(self.elapsed_s)}"
        return head + (", ETA ..." if self.eta_s is None else f", ETA {duration_text(self.eta_s)}")


ProgressCallback = Callable[[ProgressEvent], None]
Clock = Callable[[], float]


class Phase:
    """The counts of one phase; the evaluator reports submitted and finished simulations here."""

    def __init__(self, tracker: Tracker, name: str, expected: int) -> None:
        self.tracker, self.name = tracker, name
        self.expected, self.submitted, self.done = max(expected, 0), 0, 0
        self.started = tracker.clock()
        self.finished = False
        self.detail = ""

    @property
    def total(self) -> int:
        return self.done if self.finished else max(self.expected, self.submitted, self.done)

    def expect(self, total: int) -> None:
        """A better estimate of the phase's simulations (the search, once it has screened)."""
        with self.tracker.lock:
            self.expected = total
        self.tracker.emit(self)

    def note(self, detail: str) -> None:
        with self.tracker.lock:
            self.detail = detail
        self.tracker.emit(self)

    def submit(self, n: int) -> None:
        with self.tracker.lock:
            self.submitted += n
        self.tracker.emit(self)

    def finish(self, n: int = 1) -> None:
        with self.tracker.lock:
            self.done += n
        self.tracker.emit(self)

    def end(self) -> None:
        with self.tracker.lock:
            self.finished = True
        self.tracker.emit(self)

    def event(self) -> ProgressEvent:
        elapsed = self.tracker.clock() - self.started
        total = self.total
        eta = elapsed / self.done * (total - self.done) if self.done else None
        return ProgressEvent(phase=self.name, done=self.done, total=total, elapsed_s=elapsed, eta_s=eta,
                             fraction=self.tracker.fraction(), finished=self.finished, detail=self.detail)

    def __enter__(self) -> Self:
        self.tracker.emit(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


class Tracker:
    """The phases of one run and the callback they report to (on the owner thread only)."""

    def __init__(self, callback: ProgressCallback | None = None, clock: Clock = time.monotonic) -> None:
        self.callback, self.clock = callback, clock
        self.lock = threading.RLock()
        self.owner = threading.get_ident()
        self.phases: dict[str, Phase] = {}
        self.pending: dict[str, ProgressEvent] = {}

    def phase(self, name: str, expected: int = 0) -> Phase:
        p = Phase(self, name, expected)
        with self.lock:
            self.phases[name] = p
        return p

    def fraction(self) -> float:
        with self.lock:
            parts = [(PHASE_WEIGHTS.get(p.name, 0.0), 1.0 if p.finished else p.done / max(p.total, 1))
                     for p in self.phases.values()]
        return min(1.0, sum(w * f for w, f in parts))

    def emit(self, phase: Phase) -> None:
        if self.callback is None:
            return
        with self.lock:
            ev = phase.event()
            self.pending[phase.name] = ev  # the latest state of a phase is all a display needs
        if threading.get_ident() == self.owner:
            self.flush()

    def flush(self) -> None:
        """Hand the held events to the callback (call on the owner thread)."""
        with self.lock:
            events, self.pending = list(self.pending.values()), {}
        for ev in events:
            self.callback(ev)  # type: ignore[misc]


class Counted:
    """An evaluator whose simulations count toward one phase (same `map` as `Evaluator`)."""

    def __init__(self, ev: Any, phase: Phase) -> None:
        self.ev, self.phase = ev, phase

    @property
    def parallel(self) -> bool:
        return bool(self.ev.parallel)

    @property
    def count(self) -> int:
        return int(self.ev.count)

    def expect(self, total: int) -> None:
        self.phase.expect(total)

    def map(self, tasks: Sequence[Any]) -> list[Any]:
        # counts what the evaluator runs: a simulation another phase already ran is not this one's
        return self.ev.map(tasks, on_done=self.phase.finish, on_submit=self.phase.submit)


class PlainLines:
    """Progress as plain lines on a stream that is not a terminal (a pipe, a CI log): the first
    and last event of each phase, and at most one line per phase every `every_s` seconds."""

    def __init__(self, stream: IO[str], every_s: float = 5.0, clock: Clock = time.monotonic) -> None:
        self.stream, self.every_s, self.clock = stream, every_s, clock
        self.last: dict[str, float] = {}

    def __call__(self, ev: ProgressEvent) -> None:
        now = self.clock()
        seen = self.last.get(ev.phase)
        if seen is not None and not ev.finished and now - seen < self.every_s:
            return
        if seen is not None and math.isinf(seen):  # the phase already printed its last line
            return
        self.last[ev.phase] = math.inf if ev.finished else now
        print(ev.text(), file=self.stream, flush=True)


__all__ = ["PHASE_WEIGHTS", "Counted", "Phase", "PlainLines", "ProgressCallback", "ProgressEvent", "Tracker",
           "duration_text"]
