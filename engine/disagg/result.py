"""A disaggregated replay's tables: the aggregated replay's request and step tables (the
`replica` column tells the instances apart: 0..P-1 prefill, P..P+D-1 decode, as in the
simulator), plus one transfer record per handed-off request and each instance's final pool."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.core.config import EngineArgs
from engine.core.disagg_records import TransferRecord
from engine.core.records import RequestRecord, StepRecord, to_columns
from engine.core.request import Request
from engine.disagg.messages import Finished, PoolReport, Prefilled
from engine.replay import ReplayResult

if TYPE_CHECKING:
    from engine.disagg.router import Router

NAN = math.nan
FAILED_PREFIX = "failed: "  # finish_reason of a request lost to a dead instance or a failed transfer


@dataclass
class RoutedRequest:
    """One request as the router follows it: written by the router, read by `build_result`."""

    request: Request
    prompt: list[int]
    arrival_s: float
    stage: str = "pending"  # pending / prefill / transfer / decode / done
    prefill_replica: int = -1
    decode_replica: int = -1
    attempts: int = 0
    prefilled: Prefilled | None = None
    finished: Finished | None = None
    failure: str = ""


@dataclass
class DisaggResult(ReplayResult):
    transfers: list[TransferRecord] = field(default_factory=list)
    pools: dict[int, PoolReport] = field(default_factory=dict)  # replica -> its pool at the end
    output_token_ids: dict[int, list[int]] = field(default_factory=dict)
    first_token_ids: dict[int, int] = field(default_factory=dict)  # what each prefill side sampled
    errors: list[str] = field(default_factory=list)

    def transfer_rows(self) -> list[dict]:
        return [t.row() for t in self.transfers]

    def write_files(self, out: Path) -> dict:
        """The aggregated replay's files, plus transfers.jsonl and pools.json."""
        summary = super().write_files(out)
        with open(out / "transfers.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in self.transfer_rows())
        pools = {str(r): {"intact": p.intact, "num_gpu_blocks": p.num_gpu_blocks, "num_free_blocks": p.num_free_blocks,
                          "num_owned_blocks": p.num_owned_blocks, "num_held_requests": p.num_held_requests,
                          "invariant_error": p.invariant_error, "kernels_compiled": p.kernels_compiled}
                 for r, p in self.pools.items()}
        (out / "pools.json").write_text(json.dumps(pools, indent=2) + "\n")
        return summary


def request_record(st: RoutedRequest) -> RequestRecord:
    """The client's view: arrival at the router, first scheduled on the prefill side, tokens
    from the decode side (TTFT included), prefix hits of the prefill side."""
    r, p, f = st.request, st.prefilled, st.finished
    base = RequestRecord(request_id=r.request_id, category=r.category, arrival_s=st.arrival_s,
                         prompt_len=r.prompt_len, output_len=r.output_len)
    if st.failure:
        base.finish_reason = FAILED_PREFIX + st.failure
        return base
    if f is None:
        return base  # cut off by max_wall_s
    base.replica, base.status, base.finish_reason = f.replica, f.status, f.finish_reason
    base.scheduled_s = p.scheduled_s if p is not None else f.scheduled_s
    base.queue_s = base.scheduled_s - st.arrival_s
    base.num_cached_tokens = p.num_cached_tokens if p is not None else f.num_cached_tokens
    base.num_preemptions = (p.num_preemptions if p is not None else 0) + f.num_preemptions
    times = f.token_times_s
    base.num_output_tokens = len(f.output_token_ids)
    if f.status == "finished" and times:
        base.first_token_s, base.finish_s = times[0], times[-1]
        base.ttft_s = times[0] - st.arrival_s
        base.tpot_s = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else NAN
        base.e2e_s = times[-1] - st.arrival_s
    return base


def build_result(router: Router, engine: EngineArgs) -> DisaggResult:
    states = sorted(router.reqs.values(), key=lambda s: (s.arrival_s, s.request.request_id))
    records = [request_record(st) for st in states]
    for rec in records:
        t = router.transfers.get(rec.request_id)
        if t is not None and t.status == "done" and p_ready(t):
            rec.kv_transfer_s = t.recv_end_s - t.ready_s
    done = [i.done for i in router.instances if i.done is not None]
    steps: list[StepRecord] = sorted((s for d in done for s in d.steps), key=lambda s: (s.t_start_s, s.replica))
    gaps = [g for st in states if st.finished is not None and st.finished.status == "finished"
            for g in np.diff(st.finished.token_times_s).tolist()]
    split, n = router.split, len(router.instances)
    arrivals = [st.arrival_s for st in states]
    span = arrivals[-1] - arrivals[0] if arrivals else 0.0
    ready = router.instances[0].ready
    meta = {"endpoint_type": "engine", "backend": "costline-engine", "model": engine.model,
            "gpu": ready.device if ready else "", "num_gpus": n, "num_replicas": n,
            "disaggregation": str(split) if split else None,
            "kv_transport": router.transport if split else None, "kv_transfer_mode": router.mode if split else None,
            "deployment": (f"{engine.model} {split} P:D over {router.transport} ({router.mode})" if split
                           else f"{engine.model} x {n} aggregated replicas"),
            "request_rate": (len(arrivals) - 1) / span if span > 0 else "inf",
            "num_gpu_blocks": ready.num_gpu_blocks if ready else 0}
    stats = {str(d.replica): d.scheduler_stats for d in done}
    return DisaggResult(
        requests=to_columns(records, RequestRecord), steps=to_columns(steps, StepRecord), meta=meta,
        counters=_counters(router), wall_s=router.wall_s, itl_gaps_s=np.asarray(gaps, dtype=np.float64),
        scheduler_stats=stats, unfinished_ids=[r.request_id for r in records if r.status == "unfinished"],
        transfers=[router.transfers[k] for k in sorted(router.transfers)],
        pools={d.replica: d.pool for d in done},
        output_token_ids={st.request.request_id: list(st.finished.output_token_ids) for st in states
                          if st.finished is not None and st.finished.status == "finished"},
        first_token_ids={st.request.request_id: st.prefilled.first_token_id for st in states
                         if st.prefilled is not None},
        errors=list(router.errors))


def p_ready(t: TransferRecord) -> bool:
    return not (math.isnan(t.ready_s) or math.isnan(t.recv_end_s))


def _counters(router: Router) -> dict[str, float]:
    """Prefix-cache lookups of the prefill (or mixed) side (transferred prompts are not lookups
    on the decode side, as in the simulator); speculative counters of the decode (or mixed) side."""
    out = dict.fromkeys(("prefix_cache_queries_tokens", "prefix_cache_hits_tokens", "spec_num_drafts",
                         "spec_draft_tokens", "spec_accepted_tokens"), 0.0)
    for inst in router.instances:
        if inst.done is None:
            continue
        s = inst.done.scheduler_stats
        if inst.role != "decode":
            out["prefix_cache_queries_tokens"] += s.get("prefix_cache_queries_tokens", 0)
            out["prefix_cache_hits_tokens"] += s.get("prefix_cache_hits_tokens", 0)
        if inst.role != "prefill":
            out["spec_num_drafts"] += s.get("num_spec_drafts", 0)
            out["spec_draft_tokens"] += s.get("num_spec_draft_tokens", 0)
            out["spec_accepted_tokens"] += s.get("num_spec_accepted_tokens", 0)
    return out
