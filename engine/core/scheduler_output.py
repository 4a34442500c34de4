"""What the scheduler hands back: per-step decisions, finished requests and counters. Plain
data (the scheduler fills it and hands it over), shared by the simulator's cost model and the
engine's GPU runner. `engine.core.scheduler` re-exports every name here."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

NO_BLOCKS: tuple[int, ...] = ()  # new_block_ids of an entry that allocated none (one shared tuple)
# one C-level call per entry / record for the columns a runner reads
_ENTRY_COLUMNS = operator.attrgetter("request_id", "num_new_tokens", "num_computed_tokens", "samples",
                                     "block_ids", "num_spec_tokens")


@dataclass(slots=True)
class ScheduledRequest:
    """What one request computes in one step. Plain data.

    `block_ids` is the request's live block table (read only; valid until
    `update_from_output()`; copy it to keep it). `new_block_ids` are the
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


@dataclass(frozen=True, slots=True)
class StepColumns:
    """The scheduled requests as columns, in batch order: what a GPU runner reads of each
    (`ScheduledRequest`'s fields of the same names), without building the per-request
    objects. `block_ids[i]` is request i's live block table, as in `ScheduledRequest`."""

    request_ids: tuple[int, ...]
    num_new_tokens: tuple[int, ...]
    num_computed_tokens: tuple[int, ...]
    samples: tuple[bool, ...]
    block_ids: tuple[list[int], ...]
    num_spec_tokens: tuple[int, ...]

    @classmethod
    def of(cls, scheduled) -> StepColumns:
        """Columns of a list of `ScheduledRequest`s (or objects with those fields)."""
        if not scheduled:
            return cls((), (), (), (), (), ())
        return cls(*zip(*map(_ENTRY_COLUMNS, scheduled)))

    def __len__(self) -> int:
        return len(self.request_ids)


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
    then new admissions) is completed on first access, so a cost model that reads only the
    totals below never pays for per-request objects. Read it before `update_from_output`.
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
    max_decode_context: int = 0  # KV tokens after the step of the longest decoding sequence
    # prefill attention work: sum over prefill entries of q*c + q*(q+1)/2 (q new tokens over
    # c already in KV), the query-key pairs of causal attention; the cost model's FLOP term
    prefill_attn_pairs: int = 0
    num_spec_tokens: int = 0
    preempted_ids: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    num_blocks_allocated: int = 0
    num_blocks_freed: int = 0
    num_blocks_hashed: int = 0
    # Filled by the scheduler while it builds the step (read only for everyone else): the
    # scheduled requests' scheduler records, in batch order, and an entry for each of them
    # except plain decodes (one token into a block the request holds: the bulk of a busy
    # step), whose entries `scheduled` builds from the record on first access.
    batch_records: list = field(default_factory=list, repr=False)
    entries: dict[int, ScheduledRequest] = field(default_factory=dict, repr=False)
    num_silent: int = field(default=0, repr=False)  # entries that do not sample
    # the entries of the requests admitted this step (from the waiting queue: first
    # admissions and re-admissions after preemption), in batch order
    admitted: list[ScheduledRequest] = field(default_factory=list, repr=False)
    applied: bool = field(default=False, repr=False)  # update_from_output() has run on it
    _scheduled: list[ScheduledRequest] | None = field(default=None, repr=False)

    @property
    def scheduled(self) -> list[ScheduledRequest]:
        if self._scheduled is None:
            get = self.entries.get
            self._scheduled = [
                get(r.request_id) or ScheduledRequest(r.request_id, 1, r.num_computed_tokens - 1, 0, 0,
                                                      False, True, r.block_ids, NO_BLOCKS)
                for r in self.batch_records]
        return self._scheduled

    def count_totals(self) -> tuple[int, int, int]:
        """Fill the step's totals from its records and entries, once (the scheduler calls it
        when the step is built). Returns (prompt tokens computed, drafts, draft tokens)."""
        entries = self.entries
        num_plain = len(self.batch_records) - len(entries)  # one decode token each
        kv = [r.num_computed_tokens for r in self.batch_records]  # (faster than list(map(attrgetter)))
        kv_after, kv_max = sum(kv), (max(kv) if kv else 0)  # (a keyword to max() costs more than the test)
        pre_tokens = pre_seqs = pre_ctx = pairs = dec_tokens = dec_seqs = spec = drafts = 0
        pre_kv = []
        for e in entries.values():
            q = e.num_new_tokens
            self.num_silent += not e.samples
            if e.is_prefill:
                c = e.num_computed_tokens
                pre_tokens += q
                pre_seqs += 1
                pre_ctx += c + q
                pre_kv.append(c + q)
                pairs += q * c + q * (q + 1) // 2
            else:
                dec_tokens += q
                dec_seqs += 1
                if e.num_spec_tokens:
                    spec += e.num_spec_tokens
                    drafts += 1
        self.num_batched_tokens = pre_tokens + dec_tokens + num_plain
        self.num_prefill_tokens = pre_tokens
        self.num_prefill_seqs = pre_seqs
        self.sum_prefill_context = pre_ctx
        self.prefill_attn_pairs = pairs
        self.num_decode_tokens = dec_tokens + num_plain
        self.num_decode_seqs = dec_seqs + num_plain
        self.sum_decode_context = kv_after - pre_ctx
        if pre_kv and max(pre_kv) >= kv_max:  # a prefill may hold the longest KV: take the prefills out
            for c in pre_kv:
                kv.remove(c)
            kv_max = max(kv) if kv else 0
        self.max_decode_context = kv_max
        self.num_spec_tokens = spec
        return pre_tokens, drafts, spec

    @property
    def num_scheduled(self) -> int:
        return len(self.batch_records)

    @property
    def only_plain_decodes(self) -> bool:
        """Every scheduled request is a plain decode (one token into a block it holds, no
        drafts): nothing in the batch is newly admitted, chunked or verified."""
        return not self.entries

    def columns(self) -> StepColumns:
        """`scheduled` as columns, read from the scheduler's records (whose token counts already
        include this step's) without building a `ScheduledRequest` per plain decode: every row
        is taken for a one-token decode that samples, then the few entries that are not (chunks,
        admissions, drafts) are patched in by position."""
        if self._scheduled is not None or not self.batch_records or len(self.entries) * 8 > len(self.batch_records):
            return StepColumns.of(self.scheduled)  # built already, or mostly entries anyway
        return self.record_columns()

    def record_columns(self) -> StepColumns:
        """columns() from the records and the entries that are not one-token sampling decodes
        (a list comprehension per column: a specialised attribute read per record, cheaper
        than a C-level attrgetter call)."""
        batch = self.batch_records
        rids = tuple([r.request_id for r in batch])
        computed = [r.num_computed_tokens - 1 for r in batch]  # before the step's one token
        n = len(rids)
        new, samples, spec = [1] * n, [True] * n, [0] * n
        for rid, e in self.entries.items():
            if e.num_new_tokens != 1 or not e.samples or e.num_spec_tokens:
                i = rids.index(rid)  # C-level scan; entries of this kind are few in such a batch
                new[i], samples[i], spec[i] = e.num_new_tokens, e.samples, e.num_spec_tokens
                computed[i] += 1 - e.num_new_tokens
        return StepColumns(rids, tuple(new), tuple(computed), tuple(samples),
                           tuple([r.block_ids for r in batch]), tuple(spec))

    def sampling_records(self) -> list:
        """Records of the requests that produce tokens this step, in batch order."""
        if not self.num_silent:
            return self.batch_records
        entries = self.entries
        return [r for r in self.batch_records if (e := entries.get(r.request_id)) is None or e.samples]

    def num_tokens_so_far(self) -> int:
        """Tokens scheduled so far (while schedule() runs, before the totals are set)."""
        entries = self.entries
        return len(self.batch_records) - len(entries) + sum(e.num_new_tokens for e in entries.values())


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
