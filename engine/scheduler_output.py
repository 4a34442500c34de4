"""What the scheduler hands back: per-step decisions, finished requests and counters. Plain
data (no scheduler internals to reach into), shared by the simulator's cost model and the
engine's GPU runner. `engine.scheduler` re-exports every name here."""

from __future__ import annotations

from dataclasses import dataclass, field

_EMPTY: tuple[int, ...] = ()


@dataclass(slots=True)
class ScheduledRequest:
    """What one request computes in one step. Plain data.

    `block_ids` is the request's live block table (read only; valid until the next
    `schedule()`/`update_from_output()`; copy it to keep it). `new_block_ids` are the
    blocks allocated to it in this step (prefix-cache hits not included).
    """

    request_id: int
    num_new_tokens: int  # tokens computed this step: a prefill chunk, 1, or 1 + num_spec_tokens
    num_computed_tokens: int  # tokens already in KV before this step (prefix hits included)
    num_cached_tokens: int  # prefix-cache hit tokens; non-zero only on an admission step
    num_spec_tokens: int  # draft tokens among num_new_tokens (verified this step)
    is_prefill: bool  # still computing prompt (or, after preemption, recomputing) tokens
    samples: bool  # produces output token(s) this step: must appear in `sampled`
    block_ids: list[int]
    new_block_ids: tuple[int, ...]


@dataclass(slots=True)
class RequestResult:
    """A request leaving the scheduler: `status` is "finished" or "rejected"."""

    request_id: int
    status: str
    reason: str  # finished: "length" (output_len reached) or "stop" (EOS); rejected: why
    num_generated: int
    num_preemptions: int
    num_cached_tokens: int  # prefix-cache hit tokens at first admission


@dataclass(slots=True)
class SchedulerOutput:
    """One step's decisions, plain data for a cost model or a GPU runner.

    `scheduled` (a list of `ScheduledRequest`, in batch order: running requests first,
    then new admissions) is built on first access, so a cost model that reads only the
    totals below never pays for per-request objects. Read it before the next `schedule()`.
    Context sums count each request's KV length after this step (`num_computed_tokens +
    num_new_tokens`). `num_blocks_freed` is final only after `update_from_output` (which
    adds the blocks that finishing requests and rejected drafts release).
    """

    step_id: int
    num_batched_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_prefill_seqs: int = 0
    num_decode_seqs: int = 0
    sum_prefill_context: int = 0
    sum_decode_context: int = 0
    # prefill attention work: sum over prefill entries of q*c + q*(q+1)/2 (q new tokens over
    # c already in KV), the query-key pairs of causal attention; the cost model's FLOP term
    prefill_attn_pairs: int = 0
    num_spec_tokens: int = 0
    preempted_ids: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    num_blocks_allocated: int = 0
    num_blocks_freed: int = 0
    num_blocks_hashed: int = 0
    # Compact per-request records (batch order). A plain decode (1 token, no new block) is
    # just (state, table), its computed count being state.num_computed_tokens - 1 until the next
    # schedule(); anything else also has an `_extra` entry keyed by request id:
    # (num_new, num_cached, num_spec, is_prefill, samples, new_block_ids, num_computed).
    _states: list = field(default_factory=list, repr=False)
    _tables: list = field(default_factory=list, repr=False)
    _extra: dict = field(default_factory=dict, repr=False)
    _nonsampling: set = field(default_factory=set, repr=False)  # ids of partial prefill chunks
    _scheduled: list | None = field(default=None, repr=False)
    _updated: bool = field(default=False, repr=False)

    @property
    def scheduled(self) -> list[ScheduledRequest]:
        if self._scheduled is None:
            extra = self._extra
            out = []
            for r, table in zip(self._states, self._tables):
                rid = r.request_id
                e = extra.get(rid)
                if e is None:
                    out.append(ScheduledRequest(rid, 1, r.num_computed_tokens - 1, 0, 0, False, True,
                                                table, _EMPTY))
                else:
                    out.append(ScheduledRequest(rid, e[0], e[6], e[1], e[2], e[3], e[4], table, e[5]))
            self._scheduled = out
        return self._scheduled

    @property
    def num_scheduled(self) -> int:
        return len(self._states)

    def _sampling(self) -> list:
        """States that produce tokens this step, in batch order."""
        if not self._nonsampling:
            return self._states
        skip = self._nonsampling
        return [r for r in self._states if r.request_id not in skip]


@dataclass(slots=True)
class SchedulerStats:
    """Cumulative counters and current gauges (a snapshot)."""

    num_steps: int
    num_running: int
    num_waiting: int
    num_finished: int
    num_rejected: int
    num_preemptions: int
    prefix_cache_queries_tokens: int  # vLLM's vllm:prefix_cache_queries (first admissions)
    prefix_cache_hits_tokens: int  # vLLM's vllm:prefix_cache_hits
    prefix_cache_preempted_queries_tokens: int  # re-admissions after preemption
    prefix_cache_preempted_hits_tokens: int
    num_evictions: int
    num_blocks_allocated: int
    num_blocks_freed: int
    num_blocks_revived: int  # free cached blocks taken back by prefix hits
    num_blocks_hashed: int
    num_cached_blocks: int  # blocks in the prefix-cache table (owned or free)
    num_free_blocks: int
    num_gpu_blocks: int
    kv_usage: float  # fraction of blocks owned by requests (vllm:kv_cache_usage_perc)
    fragmentation_slots: int  # allocated slots not holding a computed token
    num_prompt_tokens_computed: int
    num_generated_tokens: int
    num_spec_drafts: int
    num_spec_draft_tokens: int
    num_spec_accepted_tokens: int
    external_computed_tokens: int = 0  # prompt tokens admitted with KV from elsewhere (P/D)
    num_held_requests: int = 0  # finished, blocks kept for a KV transfer (hold_blocks_on_finish)
    num_held_blocks: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """vLLM's hit rate: hits / queries over first admissions."""
        q = self.prefix_cache_queries_tokens
        return self.prefix_cache_hits_tokens / q if q else 0.0

    @property
    def prefix_cache_queries_tokens_incl_preempted(self) -> int:
        """Queries as vLLM counted them before vllm#25787 (re-admissions included)."""
        return self.prefix_cache_queries_tokens + self.prefix_cache_preempted_queries_tokens

    @property
    def prefix_cache_hits_tokens_incl_preempted(self) -> int:
        """Hits as vLLM counted them before vllm#25787: a preempted request re-finding its
        own blocks counts as a hit, which inflates the rate under preemption (vllm#25780)."""
        return self.prefix_cache_hits_tokens + self.prefix_cache_preempted_hits_tokens
