"""The scheduler's record of one request (`SchedulerRequest`) and the request statuses.

Shared by the scheduler (policy fields), the KV cache manager (block table and block keys)
and skip-ahead (engine/core/decode_skip.py), which read it; no logic here.
"""

from __future__ import annotations

from collections.abc import Hashable

from engine.core.block_keys import BlockKeys
from engine.core.request import Request

WAITING = "waiting"
RUNNING = "running"
PREEMPTED = "preempted"  # waiting again, after preemption
FINISHED = "finished"
REJECTED = "rejected"


class SchedulerRequest:
    """The scheduler's mutable record of one request; its KV fields (block table, block
    keys, cached-block count, a blocked admission's hits) are the KV cache manager's to change."""

    __slots__ = (
        "add_order",
        "arrival_s",
        "block_hashes",
        "block_ids",
        "extra_keys",
        "failed_admission_evictions",
        "failed_admission_hits",
        "gen_keys_from",
        "group_size",
        "hash_block_size",
        "hash_chain",
        "hash_ids",
        "hold_blocks_on_finish",
        "keys",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_drafts",
        "num_external_computed_tokens",
        "num_generated",
        "num_preemptions",
        "num_tokens",
        "output_len",
        "priority",
        "private_from",
        "prompt_len",
        "request_id",
        "sampled_since_admission",
        "status",
        "token_ids",
    )

    def __init__(self, req: Request, token_ids: list[int] | None, extra_keys: tuple,
                 add_order: int, keys: BlockKeys) -> None:
        self.request_id = req.request_id
        self.arrival_s = req.arrival_s
        self.priority = req.priority
        self.prompt_len = req.prompt_len
        self.output_len = req.output_len
        self.hash_ids = req.hash_ids
        self.hash_block_size = req.hash_block_size
        self.token_ids = token_ids
        self.extra_keys = extra_keys
        self.keys = keys  # how its blocks are keyed: by token ids or by hash ids
        self.group_size = keys.group_size(self)  # prompt blocks per prefix-cache group, 0: none
        self.gen_keys_from = keys.gen_keys_from(self)  # blocks from here keyed (GEN_TAG, id, index)
        self.num_tokens = req.prompt_len  # prompt + generated so far
        self.num_computed_tokens = 0  # tokens whose KV is (being) computed
        self.num_generated = 0
        self.block_ids: list[int] = []  # the block table
        self.block_hashes: list[Hashable] = []  # keys of full blocks, kept on preemption
        self.hash_chain: list[Hashable] = []  # HashIdKeys: chained hash per hash block
        self.num_cached_blocks = 0  # leading blocks already registered in the prefix cache
        # blocks from here are registered only on preemption (KVCacheManager.set_private_from)
        self.private_from: int | None = None
        self.failed_admission_hits: list[int] | None = None  # prefix hits of a failed admission
        self.failed_admission_evictions = -1  # the pool's eviction count when they were found
        self.status = WAITING
        self.sampled_since_admission = False  # decodes from its next step on
        self.num_preemptions = 0
        self.num_cached_tokens = 0  # prefix-cache hit tokens at first admission
        self.add_order = add_order  # the FCFS tie-break
        self.num_external_computed_tokens = 0  # prompt tokens whose KV arrives by transfer
        self.hold_blocks_on_finish = False  # keep blocks after finishing until release_held()
        self.num_drafts: int | None = None  # drafts per decode (set_num_drafts); None: the config's k

    def drop_bulky_state(self) -> None:
        """A finished request keeps its counters, not its block keys or token ids."""
        self.block_hashes = []
        self.hash_chain = []
        self.token_ids = None


def rejection_reason(req: Request, max_model_len: int, block_size: int, num_gpu_blocks: int) -> str | None:
    """Why `req` can never run with that context cap and KV pool, or None."""
    total = req.prompt_len + req.output_len
    if total > max_model_len:
        return f"prompt_len + output_len = {total} tokens exceeds max_model_len = {max_model_len}"
    # The last sampled token is never written to KV: a request holds at most total - 1
    # tokens (drafts are capped by the remaining output, so no more).
    need = -(-(total - 1) // block_size)
    if need > num_gpu_blocks:
        return (f"needs {need} KV blocks of {block_size} tokens for {total - 1} tokens "
                f"but num_gpu_blocks = {num_gpu_blocks}")
    return None


def check_external(req: Request, ext, prompt_token_ids) -> None:
    """Validate `add_request`'s num_external_computed_tokens (P/D) for `req`."""
    rid = req.request_id
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


def prompt_ids(req: Request, prompt_token_ids) -> list[int] | None:
    """The prompt's token ids as a fresh list (the request's own if none passed), or None."""
    if prompt_token_ids is None:
        prompt_token_ids = req.prompt_token_ids
    if prompt_token_ids is None:
        return None
    ids = list(prompt_token_ids)
    if len(ids) != req.prompt_len:
        raise ValueError(
            f"request {req.request_id}: {len(ids)} prompt_token_ids for prompt_len "
            f"{req.prompt_len}; pass exactly the prompt's token ids")
    return ids
