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

The KV blocks are the `KVCacheManager`'s (engine/core/kv_cache_manager.py): this module
asks it for prefix hits and slots and tells it what to free; it keeps the policy. Driving
it, with skip-ahead (engine/core/decode_skip.py): docs/interfaces.md.

Prefix-cache counters follow vLLM >= 0.11 (vllm#25787, fixing vllm#25780): `queries`
and `hits` (tokens) are recorded once per request, at admission (vllm#48860), and
exclude re-admissions after preemption, whose lookups mostly re-find the request's own
blocks and would inflate the hit rate; those go to `prefix_cache_preempted_*`.
"""

from __future__ import annotations

from itertools import islice

from engine.core.block_keys import GEN_TAG
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request
from engine.core.request_queue import WaitingQueue
from engine.core.request_state import (
    FINISHED,
    PREEMPTED,
    REJECTED,
    RUNNING,
    WAITING,
    SchedulerRequest,
    check_external,
    prompt_ids,
    rejection_reason,
)
from engine.core.sampled_checks import check_sampled, check_stopped, counts_and_token_ids
from engine.core.scheduler_config import SchedulerConfig
from engine.core.scheduler_hooks import SchedulerHooks
from engine.core.scheduler_output import (
    NO_BLOCKS,
    RequestResult,
    ScheduledRequest,
    SchedulerOutput,
    SchedulerStats,
)


class Scheduler(SchedulerHooks):
    """vLLM-V1-style scheduler over a `KVCacheManager`. See the module docstring."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.kv_cache_manager = KVCacheManager(config.num_gpu_blocks, config.block_size,
                                               config.enable_prefix_caching,
                                               config.prefix_caching_hash_algo)
        self.caching = config.enable_prefix_caching
        self.requests: dict[int, SchedulerRequest] = {}
        self.running: list[SchedulerRequest] = []
        self._priority = config.scheduling_policy == "priority"
        self.waiting = WaitingQueue(self._priority)
        self._pending_rejected: list[RequestResult] = []  # reported in the next step
        self._last_out: SchedulerOutput | None = None
        self._any_token_ids = False  # some request was added with token ids (engine)
        self.num_added = 0
        self.step_id = 0
        # counters
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_finished = 0
        self.num_rejected = 0
        self.prefix_cache_queries_tokens = 0
        self.prefix_cache_hits_tokens = 0
        self.prefix_cache_preempted_queries_tokens = 0
        self.prefix_cache_preempted_hits_tokens = 0
        self.num_prompt_tokens_computed = 0
        self.num_generated_tokens = 0
        self.num_spec_drafts = 0
        self.num_spec_draft_tokens = 0
        self.num_spec_accepted_tokens = 0
        # accepted drafts by position in the draft (vLLM's num_accepted_tokens_per_pos)
        self.num_spec_accepted_per_pos = [0] * config.num_speculative_tokens
        self.external_computed_tokens = 0  # KV tokens admitted from a transfer, not computed

    # ------------------------------------------------------------------ intake

    def add_request(
        self,
        req: Request,
        prompt_token_ids: list[int] | None = None,
        extra_keys: tuple[int, ...] = (),
        *,
        num_external_computed_tokens: int = 0,
        hold_blocks_on_finish: bool = False,
        unshared_from_block: int | None = None,
    ) -> None:
        """Queue `req`. `prompt_token_ids` (engine) key the prefix cache by real tokens;
        without them (simulator) block content comes from `req.hash_ids`. `extra_keys`
        (ints, e.g. a LoRA id) enter every block hash.

        Disaggregated prefill (vLLM's KV-connector notions; details in docs/interfaces.md):
        `num_external_computed_tokens=N`: the KV of the first N prompt tokens arrived from a
        prefill replica; at admission their blocks are taken (after local prefix hits), not
        computed, at no token budget. N = prompt_len - 1 is vLLM's connectors' choice; N =
        prompt_len starts with decode (the first output token came with the KV, so
        output_len must be >= 2). A preempted request recomputes everything locally.
        `hold_blocks_on_finish=True` (the prefill side): a finished request's blocks stay
        allocated until `release_held(request_id)`. `unshared_from_block` (a simulator that
        knows its workload): see KVCacheManager.set_private_from."""
        rid = req.request_id
        if rid in self.requests:
            raise ValueError(f"request_id {rid} was already added to this scheduler")
        ext = num_external_computed_tokens
        check_external(req, ext, prompt_token_ids)
        token_ids = prompt_ids(req, prompt_token_ids)
        self._any_token_ids |= token_ids is not None
        keys = self.kv_cache_manager.key_strategy(token_ids is not None)
        r = SchedulerRequest(req, token_ids, tuple(extra_keys), self.num_added, keys)
        self.num_added += 1
        r.hold_blocks_on_finish = bool(hold_blocks_on_finish)
        r.num_external_computed_tokens = ext
        self.kv_cache_manager.set_private_from(r, unshared_from_block)
        if ext and ext == req.prompt_len:  # the first output token came with the KV
            r.num_generated = 1
            r.num_tokens += 1
        self.requests[rid] = r
        cfg = self.config
        reason = rejection_reason(req, cfg.max_model_len, cfg.block_size, cfg.num_gpu_blocks)
        if reason is not None:
            r.status = REJECTED
            self.num_rejected += 1
            self._pending_rejected.append(RequestResult(rid, REJECTED, reason, 0, 0, 0))
        else:
            self.waiting.add(r)

    def set_num_drafts(self, request_id: int, n: int) -> None:
        """Draft tokens `request_id` verifies at its next decodes (until set again): 0..k, where
        k is the config's `num_speculative_tokens` (the default). The engine's n-gram proposer
        finds fewer than k, or none, for some requests."""
        k = self.config.num_speculative_tokens
        if not 0 <= n <= k:
            raise ValueError(f"set_num_drafts({request_id}, {n}): must be 0..{k} (num_speculative_tokens)")
        self.requests[request_id].num_drafts = n

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting.items)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks owned by requests (vllm:kv_cache_usage_perc); O(1)."""
        return self.kv_cache_manager.usage()

    def running_context_lens(self) -> list[int]:
        """KV tokens each running request holds (its num_computed_tokens), in batch order:
        what a cost model needs before a skip-ahead."""
        return [r.num_computed_tokens for r in self.running]

    def unscheduled_decoders(self, out: SchedulerOutput) -> list[int]:
        """Running requests that have produced tokens but that `out` (the latest schedule,
        before its update) left out: with chunked prefill off, every decode during a step that
        admits prompts; with it on, decodes behind a token budget spent on earlier running
        prompts. Each such request's next token comes more than one step after its last."""
        running = self.running
        if out.num_scheduled >= len(running):
            return []
        ids = {r.request_id for r in out.batch_records}
        return [r.request_id for r in running if r.num_generated and r.request_id not in ids]

    def between_steps(self) -> bool:
        """Whether the latest schedule() output has been applied (or none was made)."""
        return self._last_out is None or self._last_out.applied

    def has_unfinished(self) -> bool:
        return bool(self.running) or self.num_waiting > 0 or bool(self._pending_rejected)

    def has_pending_rejections(self) -> bool:
        """Whether rejections wait to be reported with the next step."""
        return bool(self._pending_rejected)

    def block_ids_of(self, request_id: int) -> list[int]:
        """A copy of the request's block table: what a KV connector sends for a held request."""
        return list(self.requests[request_id].block_ids)

    def _remove_waiting(self, r: SchedulerRequest) -> None:
        self.waiting.remove(r)
        self.kv_cache_manager.note_blocked(r, None)

    # ------------------------------------------------------------------ blocks

    def _allocate_or_preempt(self, r: SchedulerRequest, num_new: int, num_spec: int,
                             out: SchedulerOutput) -> list[int] | None:
        """`allocate_slots` for a running request, preempting victims one at a time until it fits;
        None if `r` itself had to be preempted."""
        while True:
            new = self.kv_cache_manager.allocate_slots(r, num_new, out, num_spec)
            if new is not None:
                return new
            victim = self._pick_victim()
            self._preempt(victim, out)
            if victim is r:
                return None

    def mark_finished(self, r: SchedulerRequest, reason: str) -> RequestResult:
        """Mark `r` finished (its blocks already freed or held by the caller) and count it."""
        r.status = FINISHED
        r.drop_bulky_state()
        self.num_finished += 1
        return RequestResult(r.request_id, FINISHED, reason, r.num_generated, r.num_preemptions,
                             r.num_cached_tokens)

    def release_held(self, request_id: int) -> int:
        """Free the blocks of a finished request added with `hold_blocks_on_finish=True`
        (its KV transfer is done); returns how many blocks became free. Tail first, like any
        free, and its cached blocks stay findable until evicted."""
        freed = self.kv_cache_manager.release(request_id)
        if freed is None:
            st = self.requests[request_id].status if request_id in self.requests else "unknown"
            raise ValueError(
                f"release_held({request_id}): no held blocks for that request (status {st}); "
                f"only finished requests added with hold_blocks_on_finish=True hold blocks, "
                f"and only until their first release")
        return freed

    def _pick_victim(self) -> SchedulerRequest:
        if self._priority:
            return max(self.running, key=lambda x: (x.priority, x.arrival_s, x.add_order))
        return max(self.running, key=lambda x: (x.arrival_s, x.add_order))

    def _preempt(self, v: SchedulerRequest, out: SchedulerOutput) -> None:
        """Preempt `v` by recompute: drop it from this step if it was scheduled already, free
        its blocks and requeue it at the front."""
        if v in out.batch_records:
            out.batch_records.remove(v)
            out.entries.pop(v.request_id, None)
        self.running.remove(v)
        out.num_blocks_freed += self.kv_cache_manager.free(v)
        v.num_computed_tokens = 0
        v.sampled_since_admission = False
        v.status = PREEMPTED
        v.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted_ids.append(v.request_id)
        self.waiting.add_preempted(v)

    # ------------------------------------------------------------------ schedule

    def schedule(self) -> SchedulerOutput:
        """Decide one step. See the module docstring for the rules."""
        if self._last_out is not None and not self._last_out.applied:  # (between_steps(), inlined)
            raise RuntimeError(
                f"schedule() called again before update_from_output() for step "
                f"{self._last_out.step_id}")
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
        elif not self._schedule_waiting(out, budget):
            self._schedule_running(out, budget)
        pre_tokens, drafts, spec = out.count_totals()
        self.num_prompt_tokens_computed += pre_tokens
        self.num_spec_drafts += drafts
        self.num_spec_draft_tokens += spec
        self._last_out = out
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Running requests in order until the budget runs out; returns the budget left."""
        running = self.running
        batch = out.batch_records
        bs = self.block_size
        plain = not self.config.num_speculative_tokens
        caching = self.caching
        cache_full_blocks = self.kv_cache_manager.cache_full_blocks
        last = bs - 1
        i = 0
        num_running = len(running)
        while i < num_running and budget > 0:
            if plain:
                # The bulk of a busy step, kept inline: a run of plain decodes (one token each,
                # into a block the request holds or, at a block boundary, a free one), up to
                # the first request that is not one (or the budget's end)
                k = i  # running[i:k] are scheduled (one slice into the batch after the run)
                for r in islice(running, i, i + budget):
                    c = r.num_computed_tokens
                    if not r.sampled_since_admission:
                        break
                    x = c % bs
                    if x and x != last:  # inside a block its table holds (it covers c): the token only
                        r.num_computed_tokens = c + 1
                    else:  # a block's first position (it may need one) or last (it completes one)
                        if c >= len(r.block_ids) * bs and not self._open_block(r, out):
                            break
                        r.num_computed_tokens = c + 1
                        if caching and x == last and c // bs >= r.num_cached_blocks:
                            out.num_blocks_hashed += cache_full_blocks(r, c // bs + 1)
                    k += 1
                batch += running[i:k]
                budget -= k - i
                i = k
                if i >= num_running or budget <= 0:
                    break
            r = running[i]
            num_preempted = len(out.preempted_ids)
            if not self._schedule_chunk(r, budget, out):
                break  # r itself was preempted: nothing after it fits either
            if len(out.preempted_ids) == num_preempted:
                budget -= out.entries[r.request_id].num_new_tokens
                i += 1
            else:  # victims scheduled before r gave their tokens back and left the list
                budget = self.config.max_num_batched_tokens - out.num_tokens_so_far()
                i = running.index(r) + 1
                num_running = len(running)
        return budget

    def _open_block(self, r: SchedulerRequest, out: SchedulerOutput) -> bool:
        """A plain decode at a block boundary: give `r` a free block for its token; False if
        none is free (the general path then preempts)."""
        b = self.kv_cache_manager.allocate_decode_block(r)
        if b is None:
            return False
        out.num_blocks_allocated += 1
        out.entries[r.request_id] = ScheduledRequest(
            r.request_id, 1, r.num_computed_tokens, 0, 0, False, True, r.block_ids, (b,))
        return True

    def _schedule_chunk(self, r: SchedulerRequest, budget: int, out: SchedulerOutput) -> bool:
        """A running request's step other than a plain decode that fits: a decode with
        drafts or that must preempt for a block, or a continuing prefill chunk. False if no
        room could be made (`r` was preempted)."""
        c = r.num_computed_tokens
        decoding = r.sampled_since_admission
        if decoding:
            k = self.config.num_speculative_tokens if r.num_drafts is None else r.num_drafts
            spec = min(k, r.output_len - r.num_generated - 1)
            num_new = min(1 + spec, budget)
            spec = num_new - 1
        else:
            spec = 0
            num_new = min(self._prefill_cap(r.num_tokens - c), budget)
        new = self._allocate_or_preempt(r, num_new, spec, out)
        if new is None:
            return False
        r.num_computed_tokens = c + num_new
        samples = decoding or c + num_new >= r.num_tokens
        out.entries[r.request_id] = ScheduledRequest(
            r.request_id, num_new, c, 0, spec, not decoding, samples, r.block_ids,
            tuple(new) if new else NO_BLOCKS)
        out.batch_records.append(r)
        return True

    def _prefill_cap(self, num_tokens: int) -> int:
        """Prompt tokens one request may compute in a step (long_prefill_token_threshold)."""
        thr = self.config.long_prefill_token_threshold if self.config.enable_chunked_prefill else 0
        return thr if 0 < thr < num_tokens else num_tokens

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> bool:
        """Admit waiting requests in policy order; returns whether any was admitted."""
        admitted = False
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            r = self.waiting.peek()
            num_new = 0 if r is None else self._admit(r, budget, out)
            if not num_new:
                break  # head-of-line blocking: the first that does not fit stops admission
            budget -= num_new
            admitted = True
        return admitted

    def _admit(self, r: SchedulerRequest, budget: int, out: SchedulerOutput) -> int:
        """Admit the waiting queue's head if it fits: its prefix hits, external KV and the
        tokens it computes now. Returns those tokens, or 0 if it does not fit."""
        bs = self.block_size
        hits, hashed = self.kv_cache_manager.get_computed_blocks(r)
        out.num_blocks_hashed += hashed
        num_hit = len(hits) * bs
        # KV transferred in (P/D) beyond the local hits: present, not computed
        num_ext = max(r.num_external_computed_tokens - num_hit, 0)
        base = num_hit + num_ext  # tokens in KV before this step
        num_new = self._prefill_cap(r.num_tokens - base)
        if num_new > budget:
            if not self.config.enable_chunked_prefill:
                return 0
            num_new = budget
        new = self.kv_cache_manager.allocate_slots(r, num_new, out, 0, hits, num_ext)
        if new is None:
            self.kv_cache_manager.note_blocked(r, hits)
            return 0
        self.kv_cache_manager.note_blocked(r, None)
        self.waiting.pop()
        self._count_admission(r, num_hit, num_ext)
        r.status = RUNNING
        self.running.append(r)
        r.num_computed_tokens = base + num_new
        # decode from the start: the whole prompt's KV and the first token arrived (P/D)
        is_prefill = not (r.num_generated > 0 and not r.num_preemptions)
        e = out.entries[r.request_id] = ScheduledRequest(
            r.request_id, num_new, base, num_hit, 0, is_prefill, r.num_computed_tokens >= r.num_tokens,
            r.block_ids, tuple(new) if new else NO_BLOCKS)
        out.admitted.append(e)
        out.batch_records.append(r)
        return num_new

    def _count_admission(self, r: SchedulerRequest, num_hit: int, num_ext: int) -> None:
        if r.num_external_computed_tokens:
            r.num_external_computed_tokens = 0  # spent: a preempted request recomputes locally
            self.external_computed_tokens += num_ext
        if r.num_preemptions == 0:
            self.prefix_cache_queries_tokens += r.num_tokens
            self.prefix_cache_hits_tokens += num_hit
            r.num_cached_tokens = num_hit
        else:
            self.prefix_cache_preempted_queries_tokens += r.num_tokens
            self.prefix_cache_preempted_hits_tokens += num_hit

    # ------------------------------------------------------------------ update

    def update_from_output(
        self,
        out: SchedulerOutput,
        sampled: dict[int, list[int]] | dict[int, int] | None = None,
        stopped: set[int] | frozenset[int] | None = None,
    ) -> list[RequestResult]:
        """Apply the step's sampled tokens; return requests that finished or were rejected.

        `sampled[request_id]`: the token ids produced (engine) or their count (simulator),
        for every scheduled request with `samples=True`; `None` means 1 token each. With
        speculation the count is 1 + accepted drafts; the rejected drafts' slots (and any
        block they alone occupied) are released.

        Stops (reason "stop"): `stopped` holds the ids of sampling requests whose last token
        this step ends them, as their caller decided from each request's own sampling
        params (EOS unless ignore_eos, stop token ids); their tokens are all kept.
        """
        if out is not self._last_out or out.applied:
            raise RuntimeError(
                f"update_from_output() must be called once, for the latest schedule() output "
                f"(got step {out.step_id}, latest {self._last_out.step_id if self._last_out else None})")
        sampling = out.sampling_records()
        one_each = ("none" if sampled is None and not self._any_token_ids  # (check_sampled's answer)
                    else check_sampled(out, sampling, sampled, self._any_token_ids))
        stopped = check_stopped(out, sampling, stopped) if stopped else stopped  # (none: nothing to check)
        out.applied = True
        # (none pending, none reported: nothing to take, the usual step)
        results = self._take_rejected(out) if self._pending_rejected or out.rejected else []
        if one_each:  # one token per request: no counts to build (ids, if given, are lists)
            counts, token_ids = None, (None if one_each == "counts" else sampled)
        else:
            counts, token_ids = counts_and_token_ids(sampled)
        drafts = out.entries if out.num_spec_tokens else None
        num_generated = len(sampling) if counts is None else sum(counts.values())
        any_finished = False
        for r in sampling:
            n = 1 if counts is None else counts[r.request_id]
            if drafts is not None:
                self._release_rejected_drafts(r, drafts[r.request_id].num_spec_tokens, n, out)
            r.sampled_since_admission = True
            g = r.num_generated + n
            if g < r.output_len and not (stopped and r.request_id in stopped):
                r.num_generated = g
                r.num_tokens += n
                if token_ids is not None and r.token_ids is not None:
                    r.token_ids += token_ids[r.request_id]
                continue
            num_generated -= self._finish_sampled(r, n, bool(stopped) and r.request_id in stopped,
                                                  token_ids, out, results)
            any_finished = True
        self.num_generated_tokens += num_generated
        if any_finished:
            self.running = [x for x in self.running if x.status == RUNNING]
        return results

    def _finish_sampled(self, r: SchedulerRequest, n: int, stop: bool, token_ids: dict | None,
                        out: SchedulerOutput, results: list[RequestResult]) -> int:
        """The end of `update_from_output` for a request that reached its output length or
        stops: keep its tokens up to output_len, free (or hold) its blocks, report it.
        Returns how many sampled tokens were dropped past output_len."""
        dropped = max(r.num_generated + n - r.output_len, 0)
        n -= dropped
        r.num_generated += n
        r.num_tokens += n
        if token_ids is not None and r.token_ids is not None:
            r.token_ids += token_ids[r.request_id][:n]
        out.num_blocks_freed += self.kv_cache_manager.free_or_hold(r)
        results.append(self.mark_finished(r, "stop" if stop else "length"))
        return dropped

    def _take_rejected(self, out: SchedulerOutput) -> list[RequestResult]:
        """The rejections to report with this step (some may be added during the step)."""
        results = self._pending_rejected
        self._pending_rejected = []
        if len(results) > len(out.rejected):  # rejected by add_request() during the step
            out.rejected += [(x.request_id, x.reason) for x in results[len(out.rejected):]]
        return results

    def _release_rejected_drafts(self, r: SchedulerRequest, spec: int, n: int, out: SchedulerOutput) -> None:
        """`r` verified `spec` drafts and kept n - 1: give back the rejected ones' slots, and
        any block only they occupied."""
        if not spec:
            return
        self.num_spec_accepted_tokens += n - 1
        per_pos = self.num_spec_accepted_per_pos
        for i in range(n - 1):
            per_pos[i] += 1
        rejected = spec - (n - 1)
        if rejected:
            r.num_computed_tokens -= rejected
            keep = -(-r.num_computed_tokens // self.block_size)
            out.num_blocks_freed += self.kv_cache_manager.free_tail(r, keep)

    def finish_requests(self, request_ids, reason: str = "stop") -> list[RequestResult]:
        """End requests between steps, whatever their state: the engine's stop a step late
        under async scheduling (the stop token was still on the device when the next step
        was scheduled, so that step's token for it is discarded), or an abort. A running
        request's blocks are freed (its full cached blocks stay findable); a waiting or
        preempted one leaves the queue. Already finished or rejected ids are skipped.
        Returns a `RequestResult` per request ended now, in the order given."""
        if not self.between_steps():
            raise RuntimeError(
                f"finish_requests() between schedule() and update_from_output() of step "
                f"{self._last_out.step_id}: call it after update_from_output()")
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
                self.kv_cache_manager.free(r)
                any_running = True
            else:  # waiting or preempted: holds no blocks
                self._remove_waiting(r)
            results.append(self.mark_finished(r, reason))
        if any_running:
            self.running = [x for x in self.running if x.status == RUNNING]
        return results

    def forget_finished(self, request_ids) -> int:
        """Drop finished or rejected requests from the request table (a long-running server ends
        millions; a replay keeps them). Unfinished ids are left alone; returns how many went."""
        n = 0
        for rid in request_ids:
            r = self.requests.get(rid)
            if r is not None and r.status in (FINISHED, REJECTED) and rid not in self.kv_cache_manager.held:
                del self.requests[rid]
                n += 1
        return n


# what other layers import from here (records live in engine/core/scheduler_output.py, keys in
# engine/core/block_keys.py)
__all__ = [
    "FINISHED", "GEN_TAG", "PREEMPTED", "REJECTED", "RUNNING", "WAITING", "RequestResult",
    "ScheduledRequest", "Scheduler", "SchedulerConfig", "SchedulerOutput", "SchedulerStats",
]
