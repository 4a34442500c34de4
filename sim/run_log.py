"""What the simulator's replicas write down as a run goes: a `RequestLog` (one row per request,
in arrival order) and a `StepLog` (one `StepRecord` per step or skipped stretch). They become the
result's request and step tables, with engine/core/records.py's columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from engine.core.records import REQUEST_COLUMNS, StepRecord, to_columns
from engine.core.request import Request
from engine.core.scheduler_output import RequestResult

NAN = math.nan


class RequestLog:
    """Per-request outcome arrays, indexed by arrival order; replicas report events by request id."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.requests = requests
        n = len(requests)
        self._pos = {r.request_id: i for i, r in enumerate(requests)}
        if len(self._pos) != n:
            raise ValueError("request_id values must be unique within a workload")
        # per-request columns as Python lists (an event stores into a list several times faster
        # than into a numpy array); table() makes the arrays
        self.replica = [-1] * n
        self.scheduled_s = [NAN] * n
        self.first_token_s = [NAN] * n
        self.finish_s = [NAN] * n
        self.kv_transfer_s = [NAN] * n
        self.num_output_tokens = [0] * n
        self.num_cached_tokens = [0] * n
        self.num_preemptions = [0] * n
        self.num_spec_drafts = [0] * n
        self.num_spec_draft_tokens = [0] * n
        self.num_spec_accepted_tokens = [0] * n
        self.status = ["unfinished"] * n
        self.finish_reason = [""] * n
        # flags read on every sampled token
        self._was_scheduled = [False] * n
        self._has_token = [False] * n
        # requests whose next token will come more than one step after their last (preempted,
        # or a running decoder a step left out): when that last token came
        self._gap_open_s: dict[int, float] = {}
        self.stall_gaps_s: list[float] = []  # those gaps, closed: weight-1 ITL samples

    def index(self, request_id: int) -> int:
        return self._pos[request_id]

    # --- events ----------------------------------------------------------------------
    def routed(self, request_id: int, replica: int) -> None:
        self.replica[self._pos[request_id]] = replica

    def scheduled(self, request_id: int, t: float) -> None:
        """A (prefill) step including this request started at t; the first one counts."""
        i = self._pos[request_id]
        if not self._was_scheduled[i]:
            self._was_scheduled[i] = True
            self.scheduled_s[i] = t

    def token(self, request_id: int, t: float) -> None:
        """A step whose tokens arrived at t gave this request a token: its first, or the first
        after a preemption (one long inter-token gap)."""
        i = self._pos[request_id]
        if not self._has_token[i]:
            self._has_token[i] = True
            self.first_token_s[i] = t
            return
        gaps_open = self._gap_open_s
        last = gaps_open.pop(request_id, None) if gaps_open else None
        if last is not None:
            self.stall_gaps_s.append(t - last)

    @property
    def gaps_open(self) -> bool:
        return bool(self._gap_open_s)

    def left_out(self, request_ids: Sequence[int], last_token_s: float) -> None:
        """Running decoders a step left out; their last token came at `last_token_s` (an earlier
        left-out step's time stays)."""
        for rid in request_ids:
            self._gap_open_s.setdefault(rid, last_token_s)

    def gaps(self, gap_s: float, count: int) -> None:
        """`count` decoders waited `gap_s` for a token (a gap no step's period measures)."""
        self.stall_gaps_s.extend([gap_s] * count)

    def decoded_after_gap(self, request_ids: Sequence[int], t: float) -> int:
        """Decodes of one step whose tokens arrived at t: those with an open gap close it (a
        weight-1 ITL sample); returns how many did, which the step's ITL weight excludes."""
        gaps_open = self._gap_open_s
        closed = 0
        for rid in request_ids:
            last = gaps_open.pop(rid, None)
            if last is not None:
                self.stall_gaps_s.append(t - last)
                closed += 1
        return closed

    def spec_counts(self, samplers, counts: dict[int, int]) -> None:
        """A speculative step: each verifying request's drafts and the tokens it kept."""
        for sr in samplers:
            if sr.num_spec_tokens:
                i = self._pos[sr.request_id]
                self.num_spec_drafts[i] += 1
                self.num_spec_draft_tokens[i] += sr.num_spec_tokens
                self.num_spec_accepted_tokens[i] += counts[sr.request_id] - 1

    def preempted(self, request_id: int, last_token_s: float) -> None:
        """Preempted after producing tokens, the last at `last_token_s` (its step's start)."""
        if self._has_token[self._pos[request_id]]:
            self._gap_open_s.setdefault(request_id, last_token_s)

    def rejected(self, request_id: int, reason: str) -> None:
        i = self._pos[request_id]
        self.status[i], self.finish_reason[i] = "rejected", reason

    def prefilled(self, res: RequestResult) -> None:
        """The prefill side of disaggregated serving is done with this request."""
        i = self._pos[res.request_id]
        self.num_cached_tokens[i] = res.num_cached_tokens
        self.num_preemptions[i] += res.num_preemptions

    def finished(self, res: RequestResult, t: float, *, cache_hits_here: bool = True) -> None:
        """The request left its (last) scheduler at t. `cache_hits_here`: its prefix-cache hits
        happened on this replica (not on a disaggregated prefill replica)."""
        i = self._pos[res.request_id]
        if res.status != "finished":
            self.status[i], self.finish_reason[i] = res.status, res.reason
            return
        self.finish_s[i] = t
        self.num_output_tokens[i] = res.num_generated
        self.num_preemptions[i] += res.num_preemptions
        if cache_hits_here:
            self.num_cached_tokens[i] = res.num_cached_tokens
        self.status[i], self.finish_reason[i] = "finished", res.reason

    def transferred(self, request_id: int, seconds: float) -> None:
        self.kv_transfer_s[self._pos[request_id]] = seconds

    # --- the table -------------------------------------------------------------------------
    def table(self) -> dict[str, np.ndarray]:
        reqs = self.requests
        arrival = np.array([r.arrival_s for r in reqs], dtype=np.float64)
        status = np.array(self.status, dtype=object)
        done = status == "finished"
        gen = np.array(self.num_output_tokens, dtype=np.int64)
        scheduled_s, first_token_s, finish_s = (np.array(x, dtype=np.float64) for x in (
            self.scheduled_s, self.first_token_s, self.finish_s))
        ints = {name: np.array(getattr(self, name), dtype=np.int64) for name in (
            "replica", "num_cached_tokens", "num_preemptions", "num_spec_drafts", "num_spec_draft_tokens",
            "num_spec_accepted_tokens")}
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(gen > 1, (finish_s - first_token_s) / (gen - 1), NAN)
        table = {
            "request_id": np.array([r.request_id for r in reqs], dtype=np.int64),
            "category": np.array([r.category for r in reqs], dtype=object),
            "status": status.astype(str),
            "finish_reason": np.array(self.finish_reason, dtype=object).astype(str), "arrival_s": arrival,
            "scheduled_s": scheduled_s, "first_token_s": first_token_s, "finish_s": finish_s,
            "prompt_len": np.array([r.prompt_len for r in reqs], dtype=np.int64),
            "output_len": np.array([r.output_len for r in reqs], dtype=np.int64),
            "num_output_tokens": gen, "queue_s": scheduled_s - arrival,
            "ttft_s": np.where(done, first_token_s - arrival, NAN), "tpot_s": np.where(done, tpot, NAN),
            "e2e_s": np.where(done, finish_s - arrival, NAN),
            "kv_transfer_s": np.array(self.kv_transfer_s, dtype=np.float64), **ints,
        }
        return {c: table[c] for c in REQUEST_COLUMNS}


class StepLog:
    """The step table's rows as they happen."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self._itl_cuts: dict[int, int] = {}  # row -> decoders whose token gap is a sample of its own

    def append(self, record: StepRecord, itl_cut: int = 0) -> None:
        if itl_cut:
            self._itl_cuts[len(self.records)] = itl_cut
        self.records.append(record)

    def table(self) -> dict[str, np.ndarray]:
        return to_columns(self.records, StepRecord)

    def itl_weight_cuts(self) -> np.ndarray | None:
        """Per row, the decoders the step-weighted ITL leaves to their own samples (None: none)."""
        if not self._itl_cuts:
            return None
        cuts = np.zeros(len(self.records))
        cuts[list(self._itl_cuts)] = list(self._itl_cuts.values())
        return cuts


__all__ = ["RequestLog", "StepLog"]
