"""The engine behind the HTTP server: its step loop in one background thread, tokens handed to
per-request asyncio queues on the server's event loop.

Why a thread and not an asyncio task: a step holds the GIL only while Python runs; the forward's
kernels and the wait for sampled tokens release it, so the event loop parses requests and
writes SSE frames while the GPU computes. The engine's own scheduling (sync or async, its
`Scheduler`) is unchanged: the thread only feeds it new requests and aborts between steps,
exactly where `replay` feeds a workload.

Thread hand-off: the loop side appends to `_inbox` / `_aborts` under a condition variable the
engine thread sleeps on when idle; the engine thread sends each step's tokens back in one
`loop.call_soon_threadsafe` call (one wake-up per step, not per token).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass

import numpy as np

from engine.core.request import Request
from engine.engine_loop import EngineCore, RequestState, content_hash_ids
from engine.metrics import EngineMetrics
from engine.replay import request_record
from engine.sampling import SamplingParams


class Overloaded(Exception):
    """More requests in flight than --max-num-queued-reqs: the server answers 503 + Retry-After."""


class EngineDead(Exception):
    """The engine thread stopped on an error; every request gets a 500 naming it."""


@dataclass(frozen=True, slots=True)
class Delta:
    """What one engine step produced for one request."""

    token_ids: list[int]
    finish_reason: str | None = None  # "length", "stop", "abort", or a rejection reason
    rejected: bool = False
    error: str | None = None  # the engine died


@dataclass
class _Submission:
    request: Request
    params: SamplingParams
    prompt_ids: list[int]
    arrival_s: float


class AsyncEngine:
    def __init__(self, core: EngineCore, *, metrics: EngineMetrics | None = None,
                 max_num_queued_reqs: int | None = None) -> None:
        self.core = core
        self.metrics = metrics
        self.max_num_queued_reqs = max_num_queued_reqs
        self._cv = threading.Condition()
        self._inbox: list[_Submission] = []
        self._aborts: list[int] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        # loop side only: the queue of each request not yet finished or aborted
        self._streams: dict[int, asyncio.Queue[Delta]] = {}
        # engine side only: ended requests whose state may still be read by an in-flight step
        self._ended_recent: list[int] = []
        self._ended_older: list[int] = []
        self.error: BaseException | None = None
        self.num_steps = 0

    # ------------------------------------------------------------------ loop side
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="costline-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def add(self, prompt_ids: list[int], params: SamplingParams) -> tuple[int, asyncio.Queue[Delta]]:
        """Queue one request (called on the event loop); its deltas arrive on the returned queue."""
        if self.error is not None:
            raise EngineDead(f"the engine stopped: {self.error!r}")
        cap = self.max_num_queued_reqs
        if cap is not None and len(self._streams) >= cap:
            raise Overloaded(f"{len(self._streams)} requests in flight, the limit --max-num-queued-reqs is {cap}")
        rid = next(self._ids)
        queue: asyncio.Queue[Delta] = asyncio.Queue()
        self._streams[rid] = queue
        req = Request(request_id=rid, arrival_s=0.0, prompt_len=len(prompt_ids), output_len=params.max_tokens,
                      hash_ids=content_hash_ids(prompt_ids, self.core.config.block_size),
                      hash_block_size=self.core.config.block_size, prompt_token_ids=tuple(prompt_ids))
        sub = _Submission(req, params, prompt_ids, time.perf_counter() - self.core.epoch)
        with self._cv:
            self._inbox.append(sub)
            self._cv.notify()
        return rid, queue

    def abort(self, request_id: int) -> None:
        """End a request the client no longer wants (disconnect, stop string); idempotent."""
        if self._streams.pop(request_id, None) is None:
            return
        with self._cv:
            self._aborts.append(request_id)
            self._cv.notify()

    def _deliver(self, batch: list[tuple[int, Delta]]) -> None:
        streams = self._streams
        for rid, delta in batch:
            q = streams.get(rid)
            if q is None:  # aborted meanwhile: its last tokens are dropped
                continue
            q.put_nowait(delta)
            if delta.finish_reason is not None or delta.error is not None:
                del streams[rid]

    def _fail_all(self, message: str) -> None:
        for q in self._streams.values():
            q.put_nowait(Delta([], error=message))
        self._streams.clear()

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._inbox or self._aborts or self._stopping or self.core.has_unfinished()):
                        self._cv.wait()
                    if self._stopping:
                        return
                    new, self._inbox = self._inbox, []
                    aborts, self._aborts = self._aborts, []
                batch = self._admit(new, aborts)
                if self.core.has_unfinished():
                    batch += self._step()
                if batch:
                    self._loop.call_soon_threadsafe(self._deliver, batch)
        except BaseException as exc:
            self.error = exc
            self._loop.call_soon_threadsafe(self._fail_all, f"the engine stopped: {exc!r}")
            raise

    def _admit(self, new: list[_Submission], aborts: list[int]) -> list[tuple[int, Delta]]:
        core = self.core
        for s in new:
            core.add_request(s.request, s.params, s.prompt_ids, arrival_s=s.arrival_s)
        if not aborts:
            return []
        live = [rid for rid in aborts if (st := core.requests.get(rid)) is not None and st.finished_s is None]
        for st in core.abort_requests(live):
            self._record(st)
        self._ended_recent.extend(aborts)
        return []

    def _step(self) -> list[tuple[int, Delta]]:
        core = self.core
        res = core.step()
        self.num_steps += 1
        if res.trace is not None and self.metrics is not None:
            self.metrics.observe_step(res.trace, core.scheduler)
        ended = {st.request.request_id: st for st in res.finished}
        batch = [(rid, Delta(toks)) for rid, toks in res.new_tokens.items() if rid not in ended]
        for rid, st in ended.items():
            self._record(st)
            batch.append((rid, Delta(res.new_tokens.get(rid, []), st.finish_reason or "length",
                                     rejected=st.status == "rejected")))
        self._forget(list(ended))
        return batch

    def _record(self, st: RequestState) -> None:
        if self.metrics is not None:
            gaps = np.diff(st.token_times_s).tolist() if st.status == "finished" else []
            self.metrics.observe_request(request_record(st), gaps)

    def _forget(self, ended_now: list[int]) -> None:
        """Drop ended requests' states one step after they ended: under async scheduling the step
        in flight when a request ended may still carry a token for it, read on collection."""
        self.core.forget(self._ended_older)
        self._ended_older = self._ended_recent + ended_now
        self._ended_recent = []
