"""One step record and one request record: the columns of the engine's step trace and request
table AND of the simulator's, with one meaning and one unit per name (seconds, tokens, blocks).

Calibration fits the simulator's step times to the engine's steps and validation compares the
two runs request by request; both read these columns, so neither needs a mapping layer.
Torch-free: the simulator imports it.

A step-table row may stand for `n_steps` consecutive steps of the same batch (the simulator's
skip-ahead through a pure-decode stretch; engine rows always have n_steps = 1). In such a row the
batch-composition columns describe each one of its steps (they are equal), except
`sum_decode_context` and `max_decode_context`, which are the first step's (they grow by
`num_decode_seqs` and by 1 per step: every sequence of the batch decodes one token); the
additive columns are totals over the row: timings (`total_s`, `gpu_s`, `cpu_s`, `propose_s`),
outputs (`num_output_tokens`, `drafted`, `accepted`, `num_spec_accepted_tokens`) and block work (`num_blocks_allocated`,
`num_blocks_hashed`); the gauges (`num_running`, `num_waiting`, `kv_usage`) are those after its
last step. Step durations in a row grow linearly from `first_dt_s` to `last_dt_s`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

import numpy as np

NAN = math.nan


@dataclass(slots=True)
class StepRecord:
    """One engine step (or a run of `n_steps` equal decode steps, see the module docstring)."""

    replica: int = 0
    step_id: int = 0  # the scheduler's step counter (of the row's first step)
    n_steps: int = 1
    # timing, seconds
    t_start_s: float = 0.0
    total_s: float = 0.0  # wall (engine) or simulated (sim) duration of the step(s)
    first_dt_s: float = 0.0  # duration of the row's first step
    last_dt_s: float = 0.0  # duration of the row's last step
    gpu_s: float = 0.0  # forward pass(es) on the device, proposer included
    cpu_s: float = 0.0  # host: schedule + prepare inputs + sample/output processing
    schedule_s: float = NAN  # the engine's split of cpu_s; NaN in the simulator, which models the sum
    prepare_s: float = NAN
    sample_s: float = NAN
    # batch composition, as the scheduler's SchedulerOutput counted it (KV lengths after the step)
    num_batched_tokens: int = 0
    num_prefill_tokens: int = 0
    num_prefill_seqs: int = 0
    sum_prefill_context: int = 0
    prefill_attn_pairs: int = 0
    num_decode_tokens: int = 0
    num_decode_seqs: int = 0
    sum_decode_context: int = 0
    max_decode_context: int = 0  # the longest decoding sequence's KV (0 without decodes)
    num_spec_tokens: int = 0  # drafts verified (scheduled)
    num_spec_accepted_tokens: int = 0  # of which accepted
    propose_s: float = 0.0  # the proposer (draft model forwards / n-gram lookups), inside gpu_s
    num_blocks_allocated: int = 0  # scheduler blocks (the simulator's may be coarsened)
    num_blocks_hashed: int = 0
    num_preempted: int = 0
    # outputs
    num_output_tokens: int = 0  # tokens produced (visible to clients)
    drafted: int = 0  # speculative tokens verified
    accepted: int = 0  # of which accepted
    # gauges after the step
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0


@dataclass(slots=True)
class RequestRecord:
    """One request's outcome. Times are on the run's clock (seconds since its start); latencies
    are measured from `arrival_s`. NaN where a time does not apply (a rejected request's TTFT,
    an unfinished one's e2e, the engine's kv_transfer_s)."""

    request_id: int
    category: str = ""
    replica: int = 0
    status: str = "unfinished"  # finished / rejected / unfinished
    finish_reason: str = ""  # finished: length / stop; rejected: why
    arrival_s: float = NAN
    scheduled_s: float = NAN  # first scheduled
    first_token_s: float = NAN
    finish_s: float = NAN  # last token
    prompt_len: int = 0
    output_len: int = 0  # tokens asked for
    num_output_tokens: int = 0  # tokens produced
    num_cached_tokens: int = 0  # prefix-cache hit tokens at first admission
    num_preemptions: int = 0
    queue_s: float = NAN  # arrival to first scheduled
    ttft_s: float = NAN
    tpot_s: float = NAN  # (finish - first token) / (num_output_tokens - 1)
    e2e_s: float = NAN
    kv_transfer_s: float = NAN  # disaggregated prefill: prompt KV over the link
    num_spec_drafts: int = 0  # decode steps that verified drafts
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0


def with_step_composition(rec: StepRecord, out: Any, sched: Any) -> StepRecord:
    """`rec` with the StepRecord fields a step's scheduler output and the scheduler's gauges
    give, shared by the engine's and the simulator's rows (one place to add a column); set
    in place (a simulated step builds no dict of them)."""
    rec.step_id, rec.num_batched_tokens = out.step_id, out.num_batched_tokens
    rec.num_prefill_tokens, rec.num_prefill_seqs = out.num_prefill_tokens, out.num_prefill_seqs
    rec.sum_prefill_context, rec.prefill_attn_pairs = out.sum_prefill_context, out.prefill_attn_pairs
    rec.num_decode_tokens, rec.num_decode_seqs = out.num_decode_tokens, out.num_decode_seqs
    rec.sum_decode_context, rec.max_decode_context = out.sum_decode_context, out.max_decode_context
    rec.num_spec_tokens, rec.num_blocks_allocated = out.num_spec_tokens, out.num_blocks_allocated
    rec.num_blocks_hashed, rec.num_preempted = out.num_blocks_hashed, len(out.preempted_ids)
    # (the scheduler's num_running, num_waiting and kv_usage, read without their property calls)
    rec.num_running, rec.num_waiting = len(sched.running), len(sched.waiting.items)
    rec.kv_usage = sched.kv_cache_manager.usage()
    return rec


COMPOSITION_COLUMNS = ("step_id", "num_batched_tokens", "num_prefill_tokens", "num_prefill_seqs",
                       "sum_prefill_context", "prefill_attn_pairs", "num_decode_tokens", "num_decode_seqs",
                       "sum_decode_context", "max_decode_context", "num_spec_tokens", "num_blocks_allocated",
                       "num_blocks_hashed", "num_preempted", "num_running", "num_waiting", "kv_usage")


def step_composition(out: Any, sched: Any) -> dict[str, Any]:
    """`with_step_composition`'s fields as keyword arguments for a StepRecord."""
    rec = with_step_composition(StepRecord(), out, sched)
    return {name: getattr(rec, name) for name in COMPOSITION_COLUMNS}


STEP_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(StepRecord))
REQUEST_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))


def _dtype(cls: type, name: str) -> Any:
    kind = cls.__annotations__[name]
    return {"int": np.int64, "float": np.float64}.get(kind, object)


STEP_DTYPES: dict[str, Any] = {c: _dtype(StepRecord, c) for c in STEP_COLUMNS}
REQUEST_DTYPES: dict[str, Any] = {c: _dtype(RequestRecord, c) for c in REQUEST_COLUMNS}


def to_columns(records: Sequence[Any], cls: type[StepRecord | RequestRecord]) -> dict[str, np.ndarray]:
    """Records -> a column table (dict of numpy arrays, one per field, in field order)."""
    names = STEP_COLUMNS if cls is StepRecord else REQUEST_COLUMNS
    dtypes = STEP_DTYPES if cls is StepRecord else REQUEST_DTYPES
    if not records:
        return {n: np.zeros(0, dtype=dtypes[n]) for n in names}
    # one pass per column straight into its array: no row tuples, no transposition
    return {n: np.fromiter(map(attrgetter(n), records), dtype=dtypes[n], count=len(records)) for n in names}


__all__ = [
    "REQUEST_COLUMNS",
    "REQUEST_DTYPES",
    "STEP_COLUMNS",
    "STEP_DTYPES",
    "RequestRecord",
    "StepRecord",
    "step_composition",
    "to_columns",
    "with_step_composition",
]
