"""Continuous-batching scheduler with vLLM V1 semantics, shared by the simulator and the engine.

One `Scheduler` per replica. Each step: `schedule()` decides which requests compute how
many tokens and hands back a plain `SchedulerOutput`; the caller runs the step (a cost
model or a GPU forward) and calls `update_from_output(out, sampled)`. No torch here.

Semantics (vLLM V1, `vllm/v1/core/sched/scheduler.py`, re-derived, not copied):
- Token budget `max_num_batched_tokens` per step, at most `max_num_seqs` running.
- Running requests first, in running order: a decode computes 1 token (1 + k with
  `num_speculative_tokens`), a partially prefilled request continues its prompt.
  `num_computed_tokens` advances when a step is scheduled, like vLLM.
- Then waiting requests, FCFS (arrival order) or `priority` (lower value first, then
  arrival), head-of-line blocking: the first one that does not fit stops admission.
  Its longest cached prefix (full blocks, never the whole prompt: one token must be
  computed to produce logits) is skipped from compute.
- No waiting request is admitted in a step that preempted (vLLM V1 does the same).
- Chunked prefill off: whole prompts only, and a step that admits prompts does prefill
  only (vLLM V0's prefill-first order; this is what chunking is compared against). As in
  vLLM, `max_num_batched_tokens` is raised to `max_model_len` then, so every prompt fits.
  `long_prefill_token_threshold` only applies with chunking on.
- Preemption by recompute when a running request needs a block and none is free. Victim:
  largest (priority value under "priority", then) arrival time. vLLM's FCFS pops the tail
  of its running list, which is the latest arrival except after resumes; we use the
  arrival rule always, so the choice does not depend on resume history. The victim's
  blocks are freed (its cached full blocks stay findable until evicted), its computed
  tokens reset to 0, and it goes back to the front of the waiting queue.
- Disaggregated prefill (`add_request` keywords): `num_external_computed_tokens` admits a
  request whose first prompt tokens' KV arrived from a prefill replica (blocks taken, not
  computed); `hold_blocks_on_finish` keeps a finished request's blocks until
  `release_held(request_id)` (its KV transfer is done).
- Rejection at `add_request` of a request that can never fit: prompt + output longer
  than `max_model_len`, or more blocks than the pool has. Reported as a `RequestResult`
  with a reason, never dropped.

Driving it (simulator; the engine passes token ids to `add_request` and sampled token ids
to `update_from_output`, and reads `out.scheduled`):

    sched = Scheduler(SchedulerConfig(num_gpu_blocks=40_000))
    sched.add_request(req)                        # at its arrival
    n = uniform_decode_steps(sched)               # engine/decode_skip.py: skip ahead while
    if n > 1:                                     # nothing else can happen
        adv = advance_decode(sched, min(n, steps_until_next_arrival))
    else:
        out = sched.schedule()                    # cost model reads out.num_batched_tokens, ...
        done = sched.update_from_output(out)      # or {request_id: 1 + accepted drafts}

Prefix-cache counters follow vLLM >= 0.11 (vllm#25787, fixing vllm#25780): `queries`
and `hits` (tokens) are recorded once per request, at admission (vllm#48860), and
exclude re-admissions after preemption, whose lookups mostly re-find the request's own
blocks and would inflate the hit rate; those go to `prefix_cache_preempted_*`.
"""

from __future__ import annotations

import heapq
import operator
from collections import deque
from collections.abc import Hashable
from functools import partial
from itertools import islice, takewhile
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.block_keys import GEN_TAG, BlockKeyer
from engine.block_pool import (
    BlockPool,
    make_block_hasher,
    make_bytes_hasher,
    root_hash,
)
from engine.request import Request
from engine.scheduler_output import (
    _EMPTY,
    RequestResult,
    ScheduledRequest,
    SchedulerOutput,
    SchedulerStats,
)

WAITING = "waiting"
RUNNING = "running"
PREEMPTED = "preempted"  # waiting again, after preemption
FINISHED = "finished"
REJECTED = "rejected"

_not_none = partial(operator.is_not, None)
_request_id = operator.attrgetter("request_id")
_NO_IDS: frozenset[int] = frozenset()


class SchedulerConfig(BaseModel):
    """Scheduler and KV-cache knobs, with vLLM's names and meanings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_num_batched_tokens: int = Field(8192, ge=1, description="token budget per step")
    max_num_seqs: int = Field(256, ge=1, description="cap on running requests")
    max_model_len: int = Field(32768, ge=1, description="prompt + output cap per request")
    block_size: int = Field(16, ge=1, description="tokens per KV block")
    num_gpu_blocks: int = Field(ge=1, description="KV blocks in the pool (--num-gpu-blocks-override)")
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: Literal["builtin", "xxhash", "sha256"] = "builtin"
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0, description="0 = no per-request cap per step")
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    num_speculative_tokens: int = Field(0, ge=0, description="k draft tokens per decode per step")

    @model_validator(mode="after")
    def _vllm_budget_without_chunking(self) -> SchedulerConfig:
        # vLLM raises the budget to max_model_len when chunked prefill is off, so that any
        # admissible prompt fits in one step; do the same (visibly: the field changes).
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            object.__setattr__(self, "max_num_batched_tokens", self.max_model_len)
        return self


class _ReqState:
    """The scheduler's mutable record of one request."""

    __slots__ = (
        "arrival_s",
        "block_hashes",
        "block_ids",
        "decoding",
        "ext_tokens",
        "extra",
        "hash_block_size",
        "hash_chain",
        "hash_ids",
        "hold",
        "last_hits",
        "last_hits_evictions",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_generated",
        "num_preemptions",
        "num_tokens",
        "output_len",
        "priority",
        "prompt_len",
        "req",
        "request_id",
        "seq",
        "status",
        "token_ids",
    )

    def __init__(self, req: Request, token_ids: list[int] | None, extra: tuple, seq: int) -> None:
        self.req = req
        self.request_id = req.request_id
        self.arrival_s = req.arrival_s
        self.priority = req.priority
        self.prompt_len = req.prompt_len
        self.output_len = req.output_len
        self.hash_ids = req.hash_ids
        self.hash_block_size = req.hash_block_size
        self.token_ids = token_ids
        self.extra = extra
        self.num_tokens = req.prompt_len  # prompt + generated so far
        self.num_computed_tokens = 0  # tokens whose KV is (being) computed
        self.num_generated = 0
        self.block_ids: list[int] = []  # the block table
        self.block_hashes: list[Hashable] = []  # keys of full blocks, kept on preemption
        self.hash_chain: list[Hashable] = []  # simulator: chained hash per hash block
        self.num_cached_blocks = 0  # leading blocks already registered in the prefix cache
        self.last_hits: list[int] | None = None  # prefix hits of a failed admission
        self.last_hits_evictions = -1  # the pool's eviction count when they were found
        self.status = WAITING
        self.decoding = False  # produced a token since its last admission
        self.num_preemptions = 0
        self.num_cached_tokens = 0
        self.seq = seq  # add order, the FCFS tie-break
        self.ext_tokens = 0  # prompt tokens whose KV arrived by transfer (until admitted)
        self.hold = False  # keep blocks after finishing until release_held()


def _retire(r: _ReqState) -> None:
    """Drop a finished request's bulky state (block keys, token ids); counters stay."""
    r.block_hashes = []
    r.hash_chain = []
    r.token_ids = None


class Scheduler(BlockKeyer):
    """vLLM-V1-style scheduler over a `BlockPool`. See the module docstring."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.pool = BlockPool(config.num_gpu_blocks, config.block_size)
        self.caching = config.enable_prefix_caching
        self._hasher = make_block_hasher(config.prefix_caching_hash_algo)
        self._builtin_hash = config.prefix_caching_hash_algo == "builtin"  # inlined: no call
        self._int_chain = config.prefix_caching_hash_algo != "sha256"  # chain hashes are ints
        self._bytes_hasher = (None if self._builtin_hash
                              else make_bytes_hasher(config.prefix_caching_hash_algo))
        self._root = root_hash(config.prefix_caching_hash_algo)
        self.requests: dict[int, _ReqState] = {}
        self.running: list[_ReqState] = []
        self._priority = config.scheduling_policy == "priority"
        self._fcfs_waiting: deque[_ReqState] = deque()
        self._heap_waiting: list[tuple[int, float, int, _ReqState]] = []
        self._pending_rejected: list[RequestResult] = []  # reported in the next step
        self._last_out: SchedulerOutput | None = None
        self._any_token_ids = False  # some request was added with token ids (engine)
        self._seq = 0
        self.step_id = 0
        # counters
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_finished = 0
        self.num_rejected = 0
        self.num_blocks_hashed = 0
        self.pc_queries = 0
        self.pc_hits = 0
        self.pc_preempted_queries = 0
        self.pc_preempted_hits = 0
        self.num_prompt_tokens_computed = 0
        self.num_generated_tokens = 0
        self.num_spec_drafts = 0
        self.num_spec_draft_tokens = 0
        self.num_spec_accepted_tokens = 0
        self.external_computed_tokens = 0  # KV tokens admitted from a transfer, not computed
        self._held: dict[int, _ReqState] = {}  # finished, blocks kept until release_held()

    # ------------------------------------------------------------------ intake

    def add_request(
        self,
        req: Request,
        prompt_token_ids: list[int] | None = None,
        extra_keys: tuple[int, ...] = (),
        *,
        num_external_computed_tokens: int = 0,
        hold_blocks_on_finish: bool = False,
    ) -> None:
        """Queue `req`. `prompt_token_ids` (engine) key the prefix cache by real tokens;
        without them (simulator) block content comes from `req.hash_ids`. `extra_keys`
        (ints, e.g. a LoRA id) enter every block hash.

        Disaggregated prefill (vLLM's KV-connector notions):
        - `num_external_computed_tokens=N`: the KV of the first N prompt tokens arrived from
          elsewhere (a prefill replica). At admission their blocks are allocated (and, with
          prefix caching, registered) without computing them; local prefix-cache hits are
          looked up first and only the rest counts as external (`external_computed_tokens`).
          They are neither hits nor computed tokens of the step, and cost no token budget.
          N = prompt_len - 1 is what vLLM's connectors do (the decode side recomputes the
          last prompt token to get its logits: the first output token comes from that step).
          N = prompt_len models a decode side that starts with decode: the first output
          token came with the KV (it counts as generated, output_len must be >= 2) and the
          first step computes that token's KV and samples the 2nd output token.
          After a preemption the request recomputes everything locally (the transfer is
          spent), as in vLLM.
        - `hold_blocks_on_finish=True` (the prefill side): when the request finishes it is
          returned as usual but its blocks stay allocated until `release_held(request_id)`
          (the KV transfer is done)."""
        rid = req.request_id
        if rid in self.requests:
            raise ValueError(f"request_id {rid} was already added to this scheduler")
        ext = num_external_computed_tokens
        if not isinstance(ext, int) or not 0 <= ext <= req.prompt_len:
            raise ValueError(
                f"request {rid}: num_external_computed_tokens = {ext!r} must be an int in "
                f"0..prompt_len ({req.prompt_len})")
        if ext == req.prompt_len and ext:
            if req.output_len < 2:
                raise ValueError(
                    f"request {rid}: num_external_computed_tokens = prompt_len means the first "
                    f"output token came with the KV, so output_len must be >= 2 "
                    f"(got {req.output_len}); pass prompt_len - 1 to recompute the last token")
            if prompt_token_ids is not None or req.prompt_token_ids is not None:
                raise ValueError(
                    f"request {rid}: num_external_computed_tokens = prompt_len needs the first "
                    f"output token's id, which add_request cannot take; pass prompt_len - 1")
        if prompt_token_ids is None and req.prompt_token_ids is not None:
            prompt_token_ids = list(req.prompt_token_ids)
        if prompt_token_ids is not None:
            prompt_token_ids = list(prompt_token_ids)
            if len(prompt_token_ids) != req.prompt_len:
                raise ValueError(
                    f"request {rid}: {len(prompt_token_ids)} prompt_token_ids for prompt_len "
                    f"{req.prompt_len}; pass exactly the prompt's token ids"
                )
        if prompt_token_ids is not None:
            self._any_token_ids = True
        r = _ReqState(req, prompt_token_ids, tuple(extra_keys), self._seq)
        self._seq += 1
        r.hold = bool(hold_blocks_on_finish)
        if ext:
            r.ext_tokens = ext
            if ext == req.prompt_len:  # the first output token came with the KV
                r.num_generated = 1
                r.num_tokens += 1
        self.requests[rid] = r
        cfg = self.config
        total = req.prompt_len + req.output_len
        reason = None
        if total > cfg.max_model_len:
            reason = (
                f"prompt_len + output_len = {total} tokens exceeds max_model_len = "
                f"{cfg.max_model_len}"
            )
        else:
            # The last sampled token is never written to KV: a request holds at most
            # total - 1 tokens (drafts are capped by the remaining output, so no more).
            need = -(-(total - 1) // self.block_size)
            if need > cfg.num_gpu_blocks:
                reason = (
                    f"needs {need} KV blocks of {self.block_size} tokens for {total - 1} tokens "
                    f"but num_gpu_blocks = {cfg.num_gpu_blocks}"
                )
        if reason is not None:
            r.status = REJECTED
            self.num_rejected += 1
            self._pending_rejected.append(RequestResult(rid, REJECTED, reason, 0, 0, 0))
            return
        if self._priority:
            heapq.heappush(self._heap_waiting, (r.priority, r.arrival_s, r.seq, r))
        else:
            self._fcfs_waiting.append(r)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self._heap_waiting) if self._priority else len(self._fcfs_waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks owned by requests (vllm:kv_cache_usage_perc); O(1)."""
        return self.pool.usage()

    def running_context_lens(self) -> list[int]:
        """KV tokens each running request holds (its num_computed_tokens), in batch order:
        what a cost model needs before a skip-ahead."""
        return [r.num_computed_tokens for r in self.running]

    def between_steps(self) -> bool:
        """Whether the latest schedule() output has been applied (or none was made)."""
        return self._last_out is None or self._last_out._updated

    def has_unfinished(self) -> bool:
        return bool(self.running) or self.num_waiting > 0 or bool(self._pending_rejected)

    def _peek_waiting(self) -> _ReqState | None:
        if self._priority:
            return self._heap_waiting[0][3] if self._heap_waiting else None
        return self._fcfs_waiting[0] if self._fcfs_waiting else None

    def _pop_waiting(self) -> None:
        if self._priority:
            heapq.heappop(self._heap_waiting)
        else:
            self._fcfs_waiting.popleft()

    def _requeue_preempted(self, r: _ReqState) -> None:
        if self._priority:
            heapq.heappush(self._heap_waiting, (r.priority, r.arrival_s, r.seq, r))
        else:
            self._fcfs_waiting.appendleft(r)

    # ------------------------------------------------------------------ hashing

    def _lookup(self, r: _ReqState) -> tuple[list[int], int]:
        """Longest cached prefix of `r` in full blocks, leaving at least one token to compute.
        Returns (hit blocks, blocks hashed now). Like vLLM, all full blocks up to that
        limit are hashed on the first lookup (later lookups reuse the hashes)."""
        m = (r.num_tokens - 1) // self.block_size
        if m <= 0:
            return [], 0
        hashed = self._hash_upto(r, m)
        keys = r.block_hashes
        get = self.pool.cached.get
        prev = r.last_hits
        if prev is not None:
            # A queue head that could not be admitted is looked up again every step. If
            # its previous hits are all still registered under their keys, the scan would
            # return them again: check that (3x cheaper than probing the table; free when
            # nothing was evicted since, as only an eviction unregisters a key) and scan
            # only past them.
            n = len(prev)
            if n <= m and (r.last_hits_evictions == self.pool.num_evictions
                           or self.pool.keys_of(prev) == keys[:n]):
                return prev + list(takewhile(_not_none, map(get, islice(keys, n, m)))), hashed
        # C-level scan: stop at the first key not in the cache
        return list(takewhile(_not_none, map(get, islice(keys, m)))), hashed

    def _cache_full(self, r: _ReqState, num_full: int) -> int:
        """Register blocks [r.num_cached_blocks, num_full) of `r`; returns blocks hashed.
        First writer wins: a block whose content is already cached stays unregistered."""
        start = r.num_cached_blocks
        hashed = self._hash_upto(r, num_full)
        # blocks past num_cached_blocks are never registered yet (fresh allocations)
        if num_full - start == 1:
            self.pool.cache_block(r.block_ids[start], r.block_hashes[start])
        else:
            self.pool.cache_blocks(r.block_ids[start:num_full], r.block_hashes[start:num_full])
        r.num_cached_blocks = num_full
        return hashed

    # ------------------------------------------------------------------ allocation

    def _allocate(
        self, r: _ReqState, num_new: int, num_spec: int, hits: list[int], out: SchedulerOutput,
        num_external: int = 0,
    ) -> list[int] | None:
        """Give `r` the slots for `num_new` more tokens (after its prefix hits `hits` and
        `num_external` tokens whose KV was transferred in); None if the pool cannot. Caches
        the blocks this step fills with known tokens."""
        bs = self.block_size
        pool = self.pool
        computed = r.num_computed_tokens + len(hits) * bs + num_external
        need = -(-(computed + num_new) // bs) - len(r.block_ids) - len(hits)
        need = max(need, 0)
        free = pool.num_free
        if need > free:
            return None
        # hits that sit free in the queue leave it too; count them only when it matters
        if hits and need + len(hits) > free and need + pool.num_unowned(hits) > free:
            return None
        if hits:
            pool.touch(hits)
            r.block_ids.extend(hits)
            r.num_cached_blocks = len(r.block_ids)
        new = pool.allocate(need) if need else []
        if need:
            r.block_ids.extend(new)
            out.num_blocks_allocated += need
        if self.caching:
            num_full = (computed + num_new - num_spec) // bs
            if num_full > r.num_cached_blocks:
                out.num_blocks_hashed += self._cache_full(r, num_full)
        return new

    def _free_all(self, r: _ReqState) -> int:
        freed = self.pool.free_tail_first(r.block_ids)
        r.block_ids = []  # a new list: earlier outputs keep the table they were given
        r.num_cached_blocks = 0
        return freed

    def _free_finished(self, r: _ReqState) -> int:
        """Free a finishing request's blocks, or hold them for its KV transfer."""
        if r.hold:
            self._held[r.request_id] = r
            return 0
        return self._free_all(r)

    def _finish(self, r: _ReqState, reason: str) -> RequestResult:
        """Mark `r` finished (its blocks already freed or held by the caller) and count it."""
        r.status = FINISHED
        _retire(r)
        self.num_finished += 1
        return RequestResult(r.request_id, FINISHED, reason, r.num_generated, r.num_preemptions,
                             r.num_cached_tokens)

    def release_held(self, request_id: int) -> int:
        """Free the blocks of a finished request added with `hold_blocks_on_finish=True`
        (its KV transfer is done); returns how many blocks became free. Tail first, like any
        free, and its cached blocks stay findable until evicted."""
        r = self._held.pop(request_id, None)
        if r is None:
            st = self.requests[request_id].status if request_id in self.requests else "unknown"
            raise ValueError(
                f"release_held({request_id}): no held blocks for that request (status {st}); "
                f"only finished requests added with hold_blocks_on_finish=True hold blocks, "
                f"and only until their first release")
        return self._free_all(r)

    @property
    def num_held(self) -> int:
        """Finished requests whose blocks are held for a KV transfer."""
        return len(self._held)

    def _pick_victim(self) -> _ReqState:
        if self._priority:
            return max(self.running, key=lambda x: (x.priority, x.arrival_s, x.seq))
        return max(self.running, key=lambda x: (x.arrival_s, x.seq))

    def _preempt(self, v: _ReqState, out: SchedulerOutput) -> None:
        self.running.remove(v)
        out.num_blocks_freed += self._free_all(v)
        v.num_computed_tokens = 0
        v.decoding = False
        v.status = PREEMPTED
        v.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted_ids.append(v.request_id)
        self._requeue_preempted(v)

    def _unschedule(self, v: _ReqState, out: SchedulerOutput) -> None:
        """Drop `v`'s entry from this step (it was preempted after being scheduled). The
        caller has flushed its running totals into `out` and recomputes its budget."""
        idx = next(j for j, st in enumerate(out._states) if st is v)
        out._states.pop(idx)
        out._tables.pop(idx)
        out._scheduled = None
        out._nonsampling.discard(v.request_id)
        e = out._extra.pop(v.request_id, None)
        n, spec, is_prefill, c = (e[0], e[2], e[3], e[6]) if e is not None else (
            1, 0, False, v.num_computed_tokens - 1)
        out.num_batched_tokens -= n
        if is_prefill:
            out.num_prefill_tokens -= n
            out.num_prefill_seqs -= 1
            out.sum_prefill_context -= c + n
            out.prefill_attn_pairs -= n * c + n * (n + 1) // 2
            self.num_prompt_tokens_computed -= n
        else:
            out.num_decode_tokens -= n
            out.num_decode_seqs -= 1
            out.sum_decode_context -= c + n
            out.num_spec_tokens -= spec
            if spec:
                self.num_spec_drafts -= 1
                self.num_spec_draft_tokens -= spec

    # ------------------------------------------------------------------ schedule

    def schedule(self) -> SchedulerOutput:
        """Decide one step. See the module docstring for the rules."""
        if self._last_out is not None and not self._last_out._updated:
            raise RuntimeError(
                f"schedule() called again before update_from_output() for step "
                f"{self._last_out.step_id}"
            )
        self.step_id += 1
        self.num_steps += 1
        out = SchedulerOutput(self.step_id)
        if self._pending_rejected:
            out.rejected = [(x.request_id, x.reason) for x in self._pending_rejected]
        budget = self.config.max_num_batched_tokens
        if self.config.enable_chunked_prefill:
            budget = self._schedule_running(out, budget)
            if not out.preempted_ids:
                self._schedule_waiting(out, budget)
        else:
            if not self._schedule_waiting(out, budget):
                self._schedule_running(out, budget)
        self._last_out = out
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        running = self.running
        pool = self.pool
        bs = self.block_size
        bs1 = bs - 1
        caching = self.caching
        k = self.config.num_speculative_tokens
        plain = k == 0
        thr = self.config.long_prefill_token_threshold if self.config.enable_chunked_prefill else 0
        states_append = out._states.append
        tables_append = out._tables.append
        extra = out._extra
        max_tokens = self.config.max_num_batched_tokens
        # plain-decode totals kept in locals (the hot loop), flushed into `out` before any
        # preemption and at the end
        n_dec = sum_dec = 0
        n_run = len(running)
        i = 0
        while i < n_run and budget > 0:
            r = running[i]
            if plain and r.decoding:
                # Fast path: one decode token; a block only at a boundary.
                c = r.num_computed_tokens
                table = r.block_ids
                if c >= len(table) * bs:
                    if pool.num_free == 0:
                        out.num_decode_seqs += n_dec
                        out.num_decode_tokens += n_dec
                        out.num_batched_tokens += n_dec
                        out.sum_decode_context += sum_dec + n_dec
                        n_dec = sum_dec = 0
                        ok = self._make_room(r, out)
                        n_run = len(running)
                        budget = max_tokens - out.num_batched_tokens
                        if not ok:
                            break
                        i = running.index(r)
                    b = pool.allocate_one()
                    table.append(b)
                    out.num_blocks_allocated += 1
                    extra[r.request_id] = (1, 0, 0, False, True, (b,), c)
                r.num_computed_tokens = c + 1
                if caching and c % bs == bs1 and c // bs >= r.num_cached_blocks:
                    out.num_blocks_hashed += self._cache_full(r, c // bs + 1)
                states_append(r)
                tables_append(table)
                n_dec += 1
                sum_dec += c
                budget -= 1
                i += 1
                continue
            # General path: spec decode or a continuing prefill chunk.
            c = r.num_computed_tokens
            if r.decoding:
                spec = min(k, r.output_len - r.num_generated - 1)
                num_new = min(1 + spec, budget)
                spec = num_new - 1
            else:
                spec = 0
                num_new = r.num_tokens - c
                if 0 < thr < num_new:
                    num_new = thr
                num_new = min(num_new, budget)
            while True:
                new = self._allocate(r, num_new, spec, [], out)
                if new is not None:
                    break
                out.num_decode_seqs += n_dec
                out.num_decode_tokens += n_dec
                out.num_batched_tokens += n_dec
                out.sum_decode_context += sum_dec + n_dec
                n_dec = sum_dec = 0
                ok = self._make_room(r, out, allocate=False)
                n_run = len(running)
                budget = max_tokens - out.num_batched_tokens
                if not ok:
                    break
                i = running.index(r)  # victims before r may have left the list
            if new is None:
                break
            r.num_computed_tokens = c + num_new
            new_ids = tuple(new) if new else _EMPTY
            if r.decoding:
                extra[r.request_id] = (num_new, 0, spec, False, True, new_ids, c)
                out.num_decode_seqs += 1
                out.num_decode_tokens += num_new
                out.sum_decode_context += c + num_new
                out.num_spec_tokens += spec
                out.num_batched_tokens += num_new
                if spec:
                    self.num_spec_drafts += 1
                    self.num_spec_draft_tokens += spec
            else:
                samples = c + num_new >= r.num_tokens
                extra[r.request_id] = (num_new, 0, 0, True, samples, new_ids, c)
                if not samples:
                    out._nonsampling.add(r.request_id)
                out.num_prefill_tokens += num_new
                out.num_prefill_seqs += 1
                out.sum_prefill_context += c + num_new
                out.prefill_attn_pairs += num_new * c + num_new * (num_new + 1) // 2
                out.num_batched_tokens += num_new
                self.num_prompt_tokens_computed += num_new
            states_append(r)
            tables_append(r.block_ids)
            budget -= num_new
            i += 1
        out.num_decode_seqs += n_dec
        out.num_decode_tokens += n_dec
        out.num_batched_tokens += n_dec
        out.sum_decode_context += sum_dec + n_dec
        return budget

    def _make_room(self, r: _ReqState, out: SchedulerOutput, allocate: bool = True) -> bool:
        """Preempt victims until one block is free for `r` (decode fast path) or until the
        caller may retry its allocation (`allocate=False`). False if `r` itself was the victim."""
        while True:
            v = self._pick_victim()
            if any(st is v for st in out._states):
                self._unschedule(v, out)
            self._preempt(v, out)
            if v is r:
                return False
            if not allocate or self.pool.num_free > 0:
                return True

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> bool:
        """Admit waiting requests in policy order; returns whether any was admitted."""
        cfg = self.config
        bs = self.block_size
        chunked = cfg.enable_chunked_prefill
        thr = cfg.long_prefill_token_threshold if chunked else 0
        running = self.running
        admitted = False
        while budget > 0 and len(running) < cfg.max_num_seqs:
            r = self._peek_waiting()
            if r is None:
                break
            hashed = 0
            if self.caching:
                hits, hashed = self._lookup(r)
            else:
                hits = []
            out.num_blocks_hashed += hashed
            num_hit = len(hits) * bs
            # KV transferred in (P/D) beyond the local hits: present, not computed
            num_ext = r.ext_tokens - num_hit if r.ext_tokens > num_hit else 0
            base = num_hit + num_ext  # tokens in KV before this step
            num_new = r.num_tokens - base
            if 0 < thr < num_new:
                num_new = thr
            if num_new > budget:
                if not chunked:
                    break
                num_new = budget
            new = self._allocate(r, num_new, 0, hits, out, num_ext)
            if new is None:
                r.last_hits = hits
                r.last_hits_evictions = self.pool.num_evictions
                break
            r.last_hits = None
            self._pop_waiting()
            if r.ext_tokens:
                r.ext_tokens = 0  # spent: a preempted request recomputes locally
                self.external_computed_tokens += num_ext
            if r.num_preemptions == 0:
                self.pc_queries += r.num_tokens
                self.pc_hits += num_hit
                r.num_cached_tokens = num_hit
            else:
                self.pc_preempted_queries += r.num_tokens
                self.pc_preempted_hits += num_hit
            r.status = RUNNING
            running.append(r)
            r.num_computed_tokens = base + num_new
            samples = r.num_computed_tokens >= r.num_tokens
            # decode from the start: the whole prompt's KV and the first token arrived (P/D)
            is_decode = r.num_generated > 0 and not r.num_preemptions
            out._extra[r.request_id] = (num_new, num_hit, 0, not is_decode, samples,
                                        tuple(new) if new else _EMPTY, base)
            out._states.append(r)
            out._tables.append(r.block_ids)
            if not samples:
                out._nonsampling.add(r.request_id)
            out.num_batched_tokens += num_new
            budget -= num_new
            admitted = True
            if is_decode:
                out.num_decode_tokens += num_new
                out.num_decode_seqs += 1
                out.sum_decode_context += base + num_new
                continue
            out.num_prefill_tokens += num_new
            out.num_prefill_seqs += 1
            out.sum_prefill_context += base + num_new
            out.prefill_attn_pairs += num_new * base + num_new * (num_new + 1) // 2
            self.num_prompt_tokens_computed += num_new
        return admitted

    # ------------------------------------------------------------------ update

    def update_from_output(
        self,
        out: SchedulerOutput,
        sampled: dict[int, list[int]] | dict[int, int] | None = None,
        eos_ids: set[int] | frozenset[int] | None = None,
        stopped: set[int] | frozenset[int] | None = None,
    ) -> list[RequestResult]:
        """Apply the step's sampled tokens; return requests that finished or were rejected.

        `sampled[request_id]`: the token ids produced (engine) or their count (simulator),
        for every scheduled request with `samples=True`; `None` means 1 token each. With
        speculation the count is 1 + accepted drafts; the rejected drafts' slots (and any
        block they alone occupied) are released.

        Stops (reason "stop"): `stopped` holds the ids of sampling requests whose last token
        this step ends them, as their caller decided from each request's own sampling
        params (EOS unless ignore_eos, stop token ids); their tokens are all kept. `eos_ids`
        is the older whole-step form: any request sampling one of these ids stops at it.
        """
        if out is not self._last_out or out._updated:
            raise RuntimeError(
                f"update_from_output() must be called once, for the latest schedule() output "
                f"(got step {out.step_id}, latest {self._last_out.step_id if self._last_out else None})"
            )
        one_each = None  # engine fast case: one token id per sampling request, no drafts
        sampling = out._sampling()
        if sampled is not None:
            one_each = self._one_token_each(out, sampling, sampled)
            if one_each is None:
                self._check_sampled(out, sampling, sampled)
        elif self._any_token_ids:
            for r in sampling:
                if r.token_ids is not None:
                    raise ValueError(
                        f"request {r.request_id} was added with prompt_token_ids, so "
                        f"update_from_output needs its sampled token ids (sampled=None given)"
                    )
        if stopped:
            stray = set(stopped).difference(map(_request_id, sampling))
            if stray:
                raise ValueError(
                    f"step {out.step_id}: stopped names requests {sorted(stray)} that do not "
                    f"sample this step; end those with finish_requests() between steps"
                )
        else:
            stopped = _NO_IDS
        out._updated = True
        results = self._pending_rejected
        self._pending_rejected = []
        if len(results) > len(out.rejected):  # rejected by add_request() during the step
            out.rejected += [(x.request_id, x.reason) for x in results[len(out.rejected):]]
        bs = self.block_size
        pool = self.pool
        any_finished = False
        n_gen_total = 0
        extra = out._extra
        hot = sampled is None and not out.num_spec_tokens and not stopped
        if hot:
            # Hot path (simulator): one token for every sampling request.
            for r in sampling:
                g = r.num_generated + 1
                r.num_generated = g
                r.num_tokens += 1
                r.decoding = True
                if g >= r.output_len:
                    out.num_blocks_freed += self._free_finished(r)
                    results.append(self._finish(r, "length"))
                    any_finished = True
            n_gen_total = len(sampling)
        elif one_each is not None:
            # Hot path (engine): one sampled token id each, no drafts.
            hot = True
            for r, v in zip(sampling, one_each):
                g = r.num_generated + 1
                r.num_generated = g
                r.num_tokens += 1
                r.decoding = True
                if r.token_ids is not None:
                    r.token_ids.append(v[0])
                stop = r.request_id in stopped or (bool(eos_ids) and v[0] in eos_ids)
                if stop or g >= r.output_len:
                    out.num_blocks_freed += self._free_finished(r)
                    results.append(self._finish(r, "stop" if stop else "length"))
                    any_finished = True
            n_gen_total = len(sampling)
        for r in (() if hot else sampling):
            rid = r.request_id
            toks = None
            if sampled is None:
                n = 1
            else:
                v = sampled[rid]
                if isinstance(v, int):
                    n = v
                else:
                    toks = v
                    n = len(v)
            e = extra.get(rid)
            spec = e[2] if e is not None else 0
            if spec:
                rejected = spec - (n - 1)
                self.num_spec_accepted_tokens += n - 1
                if rejected:
                    r.num_computed_tokens -= rejected
                    keep = -(-r.num_computed_tokens // bs)
                    if len(r.block_ids) > keep:
                        tail = r.block_ids[keep:]
                        del r.block_ids[keep:]
                        out.num_blocks_freed += pool.free_tail_first(tail)
            remaining = r.output_len - r.num_generated
            reason = None
            if n >= remaining:
                n = remaining
                reason = "length"
            if toks is not None and eos_ids:
                for j in range(n):
                    if toks[j] in eos_ids:
                        n = j + 1
                        reason = "stop"
                        break
            if rid in stopped:
                reason = "stop"
            r.num_generated += n
            r.num_tokens += n
            n_gen_total += n
            if r.token_ids is not None:  # validated above: toks is a list here
                r.token_ids.extend(toks[:n])
            r.decoding = True
            if reason is not None:
                out.num_blocks_freed += self._free_finished(r)
                results.append(self._finish(r, reason))
                any_finished = True
        self.num_generated_tokens += n_gen_total
        if any_finished:
            self.running = [x for x in self.running if x.status == RUNNING]
        return results

    def finish_requests(self, request_ids, reason: str = "stop") -> list[RequestResult]:
        """End requests between steps, whatever their state: the engine's stop a step late
        under async scheduling (the stop token was still on the device when the next step
        was scheduled, so that step's token for it is discarded), or an abort. A running
        request's blocks are freed (its full cached blocks stay findable); a waiting or
        preempted one leaves the queue. Already finished or rejected ids are skipped.
        Returns a `RequestResult` per request ended now, in the order given."""
        if self._last_out is not None and not self._last_out._updated:
            raise RuntimeError(
                f"finish_requests() between schedule() and update_from_output() of step "
                f"{self._last_out.step_id}: call it after update_from_output()"
            )
        unknown = [rid for rid in request_ids if rid not in self.requests]
        if unknown:
            raise ValueError(f"finish_requests: unknown request ids {unknown}")
        results = []
        any_running = False
        for rid in request_ids:
            r = self.requests[rid]
            if r.status in (FINISHED, REJECTED):
                continue
            if r.status == RUNNING:
                self._free_all(r)
                any_running = True
            else:  # waiting or preempted: holds no blocks
                if self._priority:
                    self._heap_waiting = [e for e in self._heap_waiting if e[3] is not r]
                    heapq.heapify(self._heap_waiting)
                else:
                    self._fcfs_waiting.remove(r)
                r.last_hits = None
            results.append(self._finish(r, reason))
        if any_running:
            self.running = [x for x in self.running if x.status == RUNNING]
        return results

    @staticmethod
    def _one_token_each(out: SchedulerOutput, sampling: list, sampled: dict) -> list | None:
        """The sampled lists in batch order when every sampling request got exactly one
        token id and there were no drafts (checked at C speed); else None."""
        if out.num_spec_tokens or len(sampled) != len(sampling):
            return None
        try:
            vals = list(map(sampled.__getitem__, map(_request_id, sampling)))
            if list(map(len, vals)).count(1) == len(vals):
                return vals
        except (KeyError, TypeError):
            pass
        return None

    @staticmethod
    def _check_sampled(out: SchedulerOutput, sampling: list, sampled: dict) -> None:
        """Validate `sampled` against the step before anything changes."""
        extra = out._extra
        for r in sampling:
            rid = r.request_id
            v = sampled.get(rid)
            if v is None:
                raise ValueError(
                    f"step {out.step_id}: no sampled entry for request {rid}, "
                    f"which was scheduled with samples=True"
                )
            n = v if isinstance(v, int) else len(v)
            e = extra.get(rid)
            spec = e[2] if e is not None else 0
            if not 1 <= n <= 1 + spec:
                raise ValueError(
                    f"step {out.step_id}: request {rid} sampled {n} tokens; expected "
                    f"1..{1 + spec} (1 + accepted drafts of {spec})"
                )
            if r.token_ids is not None and isinstance(v, int):
                raise ValueError(
                    f"request {rid} was added with prompt_token_ids, so "
                    f"update_from_output needs its sampled token ids, not a count"
                )
        if len(sampled) != len(sampling):
            want = {r.request_id for r in sampling}
            extra_ids = sorted(set(sampled) - want)
            raise ValueError(
                f"step {out.step_id}: sampled has entries for requests {extra_ids} that do not "
                f"sample this step (samples=False or not scheduled)"
            )

    # ------------------------------------------------------------------ stats, checks

    @property
    def stats(self) -> SchedulerStats:
        pool = self.pool
        bs = self.block_size
        frag = 0
        for r in self.running:
            frag += len(r.block_ids) * bs - r.num_computed_tokens
        return SchedulerStats(
            num_steps=self.num_steps,
            num_running=len(self.running),
            num_waiting=self.num_waiting,
            num_finished=self.num_finished,
            num_rejected=self.num_rejected,
            num_preemptions=self.num_preemptions,
            prefix_cache_queries_tokens=self.pc_queries,
            prefix_cache_hits_tokens=self.pc_hits,
            prefix_cache_preempted_queries_tokens=self.pc_preempted_queries,
            prefix_cache_preempted_hits_tokens=self.pc_preempted_hits,
            num_evictions=pool.num_evictions,
            num_blocks_allocated=pool.num_allocated,
            num_blocks_freed=pool.num_freed,
            num_blocks_revived=pool.num_revived,
            num_blocks_hashed=self.num_blocks_hashed,
            num_cached_blocks=len(pool.cached),
            num_free_blocks=pool.num_free,
            num_gpu_blocks=pool.num_blocks,
            kv_usage=pool.usage(),
            fragmentation_slots=frag,
            num_prompt_tokens_computed=self.num_prompt_tokens_computed,
            num_generated_tokens=self.num_generated_tokens,
            num_spec_drafts=self.num_spec_drafts,
            num_spec_draft_tokens=self.num_spec_draft_tokens,
            num_spec_accepted_tokens=self.num_spec_accepted_tokens,
            external_computed_tokens=self.external_computed_tokens,
            num_held_requests=len(self._held),
            num_held_blocks=sum(len(r.block_ids) for r in self._held.values()),
        )

    def num_preemptions_of(self, request_id: int) -> int:
        return self.requests[request_id].num_preemptions

    def status_of(self, request_id: int) -> str:
        return self.requests[request_id].status

    def block_ids_of(self, request_id: int) -> list[int]:
        return list(self.requests[request_id].block_ids)

    def check_invariants(self) -> None:
        """AssertionError unless every block's refcount equals its owners and each request's
        bookkeeping is consistent. O(all blocks): for tests."""
        owners: dict[int, int] = {}
        bs = self.block_size
        for r in self.running:
            assert r.status == RUNNING, f"request {r.request_id} in running with status {r.status}"
            assert r.num_computed_tokens <= len(r.block_ids) * bs, f"request {r.request_id}: KV overflow"
            assert len(r.block_ids) == -(-r.num_computed_tokens // bs), (
                f"request {r.request_id}: {len(r.block_ids)} blocks for {r.num_computed_tokens} tokens")
            assert r.num_cached_blocks <= len(r.block_ids)
            assert len(set(r.block_ids)) == len(r.block_ids), f"request {r.request_id}: dup block"
            for bid in r.block_ids:
                owners[bid] = owners.get(bid, 0) + 1
        for r in self._held.values():
            assert r.status == FINISHED, f"held request {r.request_id} has status {r.status}"
            for bid in r.block_ids:
                owners[bid] = owners.get(bid, 0) + 1
        assert len(self.running) <= self.config.max_num_seqs, "max_num_seqs exceeded"
        waiting = ([x[3] for x in self._heap_waiting] if self._priority else list(self._fcfs_waiting))
        for r in waiting:
            assert not r.block_ids and r.num_computed_tokens == 0, f"waiting request {r.request_id} holds KV"
            assert r.status in (WAITING, PREEMPTED)
        self.pool.check_invariants(owners)


# what other layers import from here (records live in engine/scheduler_output.py, keys in
# engine/block_keys.py)
__all__ = [
    "FINISHED",
    "GEN_TAG",
    "PREEMPTED",
    "REJECTED",
    "RUNNING",
    "WAITING",
    "RequestResult",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SchedulerStats",
]
