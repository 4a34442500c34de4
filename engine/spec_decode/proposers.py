"""Draft proposers: n-gram prompt lookup (host, numpy) and a draft model (a second LlamaModel).

The draft model's KV cache is paged with the target's block table: same block ids, its own KV
tensor (the draft's layers) with as many blocks, so the scheduler's allocation, prefix caching
and rollback cover both. Each step, after `schedule()`, the draft runs one catch-up forward over
the tokens it has not seen yet (prefill chunks, the last sampled token, and the last draft when
all drafts were accepted), then single-token forwards for the remaining drafts; every position
it writes lies inside the slots the scheduler allocated for this step's target tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from engine.core.scheduler_output import ScheduledRequest
from engine.model import LlamaModel
from engine.runner import ModelRunner
from engine.sampling import Sampler, SamplingParams


class NgramProposer:
    """Prompt lookup: the longest suffix n-gram (n from `lookup_max` down to `lookup_min`) that
    occurred earlier in the request's own tokens; propose up to k tokens that followed its most
    recent earlier occurrence."""

    def __init__(self, lookup_min: int, lookup_max: int) -> None:
        self.lookup_min, self.lookup_max = lookup_min, lookup_max

    def propose(self, token_ids: Sequence[int], k: int) -> list[int]:
        toks = np.asarray(token_ids, dtype=np.int64)
        total = toks.size
        for n in range(min(self.lookup_max, total - 1), self.lookup_min - 1, -1):
            # windows starting before the suffix itself: an earlier occurrence has a token after it
            windows = sliding_window_view(toks[:-1], n)
            hits = np.flatnonzero((windows == toks[total - n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return toks[start: start + k].tolist()
        return []


class WithDrafts:
    """A request's tokens followed by this step's drafts, read like one list (the runner
    indexes and slices it), without copying the request's tokens."""

    __slots__ = ("base", "drafts")

    def __init__(self, base: list[int], drafts: list[int]) -> None:
        self.base, self.drafts = base, drafts

    def __len__(self) -> int:
        return len(self.base) + len(self.drafts)

    def __getitem__(self, i):
        nb = len(self.base)
        if isinstance(i, slice):
            start, stop, _ = i.indices(len(self))
            if stop <= nb:
                return self.base[start:stop]
            if start >= nb:
                return self.drafts[start - nb: stop - nb]
            return self.base[start:] + self.drafts[: stop - nb]
        return self.base[i] if i < nb else self.drafts[i - nb]


def _two_token_catch_up(e: ScheduledRequest) -> ScheduledRequest:
    """A decode's catch-up of one or two tokens as exactly two (the last known position
    recomputed when only one is new: the same token at the same position rewrites the same
    KV), so that a batch of decodes is uniform (q = 2) and replays the draft's q = 2 graph
    instead of running eagerly whenever some request had all its drafts accepted. Marked as
    one "draft" so the runner gives both positions a logits row; longer catch-ups (prefill
    chunks) are left as they are."""
    c, q = e.num_computed_tokens, e.num_new_tokens
    if not e.samples or q > 2 or c + q < 2:
        return e
    return ScheduledRequest(e.request_id, 2, c + q - 2, 0, 1, False, True, e.block_ids, ())


@dataclass(slots=True)
class Proposal:
    """One request's drafts and the distributions they were drawn from (None: greedy or
    deterministic drafts, checked by exact match or as one-hot q)."""

    tokens: list[int]
    probs: list[torch.Tensor] | None = None


class DraftModelProposer:
    """Drafts from a smaller model sharing the target's vocabulary and block table."""

    def __init__(self, model: LlamaModel, *, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int) -> None:
        # catch-up steps hold at most the target's tokens plus one accepted draft per request
        self.runner = ModelRunner(model, block_size=block_size, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens + max_num_seqs,
                                  max_model_len=max_model_len)
        self.seen: dict[int, int] = {}  # per request: positions below this hold valid draft KV

    def weights_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.runner.model.parameters())

    def allocate_kv(self, num_blocks: int) -> None:
        """The draft's KV tensor: as many blocks as the target's, indexed by the same ids."""
        self.runner.kv_caches = self.runner.new_kv(num_blocks)
        self.runner.num_blocks = num_blocks

    def forget(self, request_id: int) -> None:
        """A preempted or finished request: its blocks (and the draft KV in them) are gone."""
        self.seen.pop(request_id, None)

    def reset(self) -> None:
        self.seen.clear()

    def propose(self, scheduled: Sequence[ScheduledRequest], token_ids: dict[int, list[int]],
                params: dict[int, SamplingParams], sampler: Sampler) -> dict[int, Proposal]:
        """Drafts for every scheduled decode with num_spec_tokens > 0; brings the draft KV of
        every scheduled request up to date."""
        entries, wanted = [], []
        for s in scheduled:
            c = s.num_computed_tokens
            start = min(self.seen.get(s.request_id, c), c)  # a new admission starts at its hits
            known = c + s.num_new_tokens - s.num_spec_tokens
            d = s.num_spec_tokens
            entries.append(ScheduledRequest(s.request_id, known - start, start, 0, 0, True, d > 0,
                                            s.block_ids, ()))
            self.seen[s.request_id] = known + max(d - 1, 0)
            if d:
                wanted.append(s)
        out = {s.request_id: Proposal([], None if params[s.request_id].greedy else []) for s in wanted}
        if wanted and all(params[s.request_id].greedy for s in wanted):
            self._propose_greedy_on_device([_two_token_catch_up(e) for e in entries], wanted, token_ids, out)
            return out
        self._draft_round(entries, token_ids, [s.request_id for s in wanted], params, sampler, out)
        for i in range(1, max((s.num_spec_tokens for s in wanted), default=0)):
            live = [s for s in wanted if s.num_spec_tokens > i]
            step = [ScheduledRequest(s.request_id, 1, s.num_computed_tokens + i, 0, 0, False, True,
                                     s.block_ids, ()) for s in live]
            views = {s.request_id: WithDrafts(token_ids[s.request_id], out[s.request_id].tokens)
                     for s in live}
            self._draft_round(step, views, [s.request_id for s in live], params, sampler, out)
            self.runner.lower_row_starts([s.num_computed_tokens for s in live])  # as below
        return out

    def _propose_greedy_on_device(self, entries: list[ScheduledRequest], wanted: list[ScheduledRequest],
                                  token_ids: dict[int, list[int]], out: dict[int, Proposal]) -> None:
        """Greedy drafts without a host round trip per draft: each round's argmax stays on the
        device and feeds the next round through the runner's in-flight gather (as async
        scheduling feeds a decode its previous token); one read-back at the end. The host
        only needs the drafts' count to lay out a round, never their values."""
        rounds: list[tuple[list[int], torch.Tensor]] = []
        verify = any(e.num_spec_tokens for e in entries)
        inp = self.runner.prepare(entries, token_ids, verify=verify)
        logits = self.runner.forward(inp)
        if verify:  # two logits rows per two-token catch-up: its draft comes from the last
            rows = [1 + e.num_spec_tokens for e in entries if e.samples]
            if all(r == 2 for r in rows):  # a uniform batch: a strided view, no index upload
                logits = logits[1::2]
            else:
                logits = logits[torch.as_tensor(np.cumsum(rows) - 1, device=logits.device)]
        tokens = logits.argmax(dim=-1)
        rounds.append(([s.request_id for s in wanted], tokens))
        for i in range(1, max(s.num_spec_tokens for s in wanted)):
            live = [s for s in wanted if s.num_spec_tokens > i]
            prev_rids, prev = rounds[-1]
            row_of = {rid: r for r, rid in enumerate(prev_rids)}
            step = [ScheduledRequest(s.request_id, 1, s.num_computed_tokens + i, 0, 0, False, True,
                                     s.block_ids, ()) for s in live]
            # i - 1 placeholders: the round's input (draft i) is the one token still in flight
            views = {s.request_id: WithDrafts(token_ids[s.request_id], [0] * (i - 1)) for s in live}
            inp = self.runner.prepare(step, views, (row_of, prev))
            # the round runs ahead of the committed tokens: the next step must rewrite any
            # block past the step's first position (verification may replace it)
            self.runner.lower_row_starts([s.num_computed_tokens for s in live])
            tokens = self.runner.forward(inp).argmax(dim=-1)
            rounds.append(([s.request_id for s in live], tokens))
        flat = torch.cat([t for _, t in rounds]).tolist()  # the proposal's one sync
        j = 0
        for rids, t in rounds:
            for rid, tok in zip(rids, flat[j: j + len(rids)]):
                out[rid].tokens.append(tok)
            j += len(rids)

    def _draft_round(self, entries: list[ScheduledRequest], token_ids, rids: list[int],
                     params: dict[int, SamplingParams], sampler: Sampler, out: dict[int, Proposal]) -> None:
        """One draft forward over `entries`; one more draft for each of `rids`."""
        inp = self.runner.prepare(entries, token_ids)
        logits = self.runner.forward(inp)
        if not rids:
            return
        tokens, qs = sampler.propose(logits, rids, [params[r] for r in rids])
        for rid, tok, q in zip(rids, tokens, qs):
            prop = out[rid]
            prop.tokens.append(tok)
            if prop.probs is not None:
                prop.probs.append(q)


__all__ = ["DraftModelProposer", "NgramProposer", "Proposal", "WithDrafts"]
