"""An engine's start-up: its phases and their seconds, said as they happen, and when it was ready.

`EngineCore` and its warm-up time each phase (model, KV cache, CUDA graphs, warm-up batches,
attention launches) with a `StartupLog`; every phase and, during a long capture, its progress
goes to the `progress` callable (the command line prints it on standard error; a library user
gets the `costline.engine` logger at INFO). `ready_s` is the time from the process's start to
the engine's first accepted request, vLLM's "time to ready" as a user feels it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

_log = logging.getLogger("costline.engine")
_IMPORTED_AT = time.monotonic()
# a long phase reports its progress at most this often
PROGRESS_EVERY_S = 5.0


def process_age_s() -> float:
    """Seconds since this process started: from /proc on Linux, else since this module was
    imported (close to the start of any engine process)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return max(uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED_AT


def log_progress(line: str) -> None:
    _log.info(line)


@dataclass(frozen=True, slots=True)
class StartupPhase:
    name: str
    seconds: float
    detail: str = ""


@dataclass
class StartupLog:
    """The phases of one engine's start-up, in order; each is reported when it ends."""

    progress: Callable[[str], None] = log_progress
    phases: list[StartupPhase] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str) -> Iterator[list[str]]:
        """Time the block as phase `name`; the block may append a detail (what it built)."""
        detail: list[str] = []
        t0 = time.perf_counter()
        yield detail
        p = StartupPhase(name, time.perf_counter() - t0, "; ".join(detail))
        self.phases.append(p)
        self.progress(f"engine: {name}: {p.seconds:.1f} s" + (f" ({p.detail})" if p.detail else ""))

    def counter(self, what: str, total: int) -> Callable[[int], None]:
        """A callback for a long loop over `total` items: says how far it is every few seconds."""
        t0 = last = time.perf_counter()

        def step(done: int) -> None:
            nonlocal last
            now = time.perf_counter()
            if now - last >= PROGRESS_EVERY_S and done < total:
                last = now
                self.progress(f"engine: {what}: {done}/{total} after {now - t0:.0f} s")

        return step

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "phases": [asdict(p) for p in self.phases]}


__all__ = ["PROGRESS_EVERY_S", "StartupLog", "StartupPhase", "log_progress", "process_age_s"]
