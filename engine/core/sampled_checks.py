"""Checks of what a caller hands `Scheduler.update_from_output`: the sampled tokens (ids or
counts) and the stopped requests, validated against the step before anything changes."""

from __future__ import annotations

import operator

from engine.core.request_state import SchedulerRequest
from engine.core.scheduler_output import SchedulerOutput

_request_id = operator.attrgetter("request_id")


def check_sampled(out: SchedulerOutput, sampling: list, sampled: dict | None,
                  any_token_ids: bool) -> str | None:
    """Validate `sampled` against the step before anything changes. Returns what it
    found when each sampling request has exactly one token: "none" (sampled None), "ids"
    (a one-id list each) or "counts" (a count of 1 each); else None."""
    if sampled is None:
        if any_token_ids:
            for r in sampling:
                if r.token_ids is not None:
                    raise ValueError(
                        f"request {r.request_id} was added with prompt_token_ids, so "
                        f"update_from_output needs its sampled token ids (sampled=None given)")
        return "none"
    if not out.num_spec_tokens and len(sampled) == len(sampling):
        # the common shapes, checked at C speed: one token (id list or count) each
        try:
            vals = list(map(sampled.__getitem__, map(_request_id, sampling)))
            if not any_token_ids and vals.count(1) == len(vals):
                return "counts"  # async scheduling's counts (a list never equals 1)
            if list(map(len, vals)).count(1) == len(vals):
                return "ids"
        except (KeyError, TypeError):  # a missing entry or a count: the full check says
            pass
    for r in sampling:
        _check_one_sampled(out, r, sampled.get(r.request_id))
    if len(sampled) != len(sampling):
        stray = sorted(set(sampled) - set(map(_request_id, sampling)))
        raise ValueError(
            f"step {out.step_id}: sampled has entries for requests {stray} that do not "
            f"sample this step (samples=False or not scheduled)")
    return None

def _check_one_sampled(out: SchedulerOutput, r: SchedulerRequest, v) -> None:
    rid = r.request_id
    if v is None:
        raise ValueError(f"step {out.step_id}: no sampled entry for request {rid}, "
                         f"which was scheduled with samples=True")
    n = v if isinstance(v, int) else len(v)
    e = out.entries.get(rid)
    spec = e.num_spec_tokens if e is not None else 0
    if not 1 <= n <= 1 + spec:
        raise ValueError(f"step {out.step_id}: request {rid} sampled {n} tokens; expected "
                         f"1..{1 + spec} (1 + accepted drafts of {spec})")
    if r.token_ids is not None and isinstance(v, int):
        raise ValueError(f"request {rid} was added with prompt_token_ids, so "
                         f"update_from_output needs its sampled token ids, not a count")

def check_stopped(out: SchedulerOutput, sampling: list, stopped) -> frozenset[int] | set[int]:
    """Validate `update_from_output`'s `stopped`: only requests that sample this step."""
    if not stopped:
        return stopped
    stray = set(stopped).difference(map(_request_id, sampling))
    if stray:
        raise ValueError(
            f"step {out.step_id}: stopped names requests {sorted(stray)} that do not "
            f"sample this step; end those with finish_requests() between steps")
    return stopped


def counts_and_token_ids(sampled: dict | None) -> tuple[dict[int, int] | None, dict | None]:
    """`update_from_output`'s `sampled` as counts (None: one token each) and the token id
    lists where it carries them (None for counts)."""
    if sampled is None:
        return None, None
    values = sampled.values()
    if all(isinstance(v, int) for v in values):
        return sampled, None
    return {rid: v if isinstance(v, int) else len(v) for rid, v in sampled.items()}, sampled
