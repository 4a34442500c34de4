"""The scheduler's waiting queue, in admission order (as vLLM's `v1/core/sched/request_queue.py`).

FCFS: arrival (add) order, and a preempted request goes back to the front. Priority: lower
`priority` value first, then arrival time, then add order (a heap; a preempted request
re-enters by the same key).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from engine.core.request_state import SchedulerRequest


class WaitingQueue:
    """Waiting (and preempted) requests; `peek()` is the next to admit."""

    def __init__(self, priority: bool) -> None:
        self.priority = priority
        self._fcfs: deque[SchedulerRequest] = deque()
        self._heap: list[tuple[int, float, int, SchedulerRequest]] = []
        # the container in use (read only), one entry per request: `len(q.items)` is a C-level
        # length where the scheduler asks it every step (`len(q)` runs __len__ below)
        self.items: deque | list = self._heap if priority else self._fcfs

    def __len__(self) -> int:
        return len(self._heap) if self.priority else len(self._fcfs)

    def __iter__(self) -> Iterator[SchedulerRequest]:
        """The requests, in no particular order."""
        return iter([e[3] for e in self._heap] if self.priority else list(self._fcfs))

    def add(self, r: SchedulerRequest) -> None:
        """A new request."""
        if self.priority:
            heapq.heappush(self._heap, (r.priority, r.arrival_s, r.add_order, r))
        else:
            self._fcfs.append(r)

    def add_preempted(self, r: SchedulerRequest) -> None:
        """A preempted request: at the front under FCFS, by its key under priority."""
        if self.priority:
            heapq.heappush(self._heap, (r.priority, r.arrival_s, r.add_order, r))
        else:
            self._fcfs.appendleft(r)

    def peek(self) -> SchedulerRequest | None:
        """The next request to admit, or None."""
        if self.priority:
            return self._heap[0][3] if self._heap else None
        return self._fcfs[0] if self._fcfs else None

    def pop(self) -> None:
        """Drop the request `peek()` returned (it was admitted)."""
        if self.priority:
            heapq.heappop(self._heap)
        else:
            self._fcfs.popleft()

    def remove(self, r: SchedulerRequest) -> None:
        """Take `r` out wherever it is (it finished or was aborted while waiting)."""
        if self.priority:
            self._heap[:] = [e for e in self._heap if e[3] is not r]  # (in place: `items` is it)
            heapq.heapify(self._heap)
        else:
            self._fcfs.remove(r)
