"""The request that workloads produce and that both the scheduler clocks consume.

A `Request` is an immutable description of one client call: when it arrives, how
long its prompt and output are, and which content its prompt shares with other
requests. It carries no scheduling state; the scheduler keeps that in its own
per-request record, so that one workload can be replayed by many simulations.

Prefix structure follows the Mooncake trace convention: the prompt is cut into
blocks of `hash_block_size` tokens and each block gets a hash id; requests
whose leading hash ids are equal share that prefix. The last block may be
partial, so `len(hash_ids) == ceil(prompt_len / hash_block_size)` always holds.
Content that no other request has gets a hash id nobody else uses.

Token ids are derived from hash ids by `materialize_prompt`, deterministically:
the token at offset `j` of a block with hash id `h` depends only on `(h, j)`.
So requests that share hash ids share identical token prefixes, and the real
engine's prefix cache sees exactly the sharing that the simulator models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Token ids below this are left free for special tokens (BOS/EOS/pad) so that a
# materialized prompt never contains an end-of-sequence token by accident.
FIRST_CONTENT_TOKEN_ID = 16


@dataclass(frozen=True, slots=True)
class Request:
    """One client request, as a workload generator or trace loader yields it."""

    request_id: int
    arrival_s: float
    prompt_len: int
    output_len: int  # tokens to generate (vLLM's max_tokens; ignore_eos semantics in the sim)
    hash_ids: tuple[int, ...]  # prefix structure, one id per hash_block_size tokens
    hash_block_size: int = 16
    category: str = "default"  # task category (chat, code, ...); drives spec-decode acceptance
    session_id: int | None = None  # multi-turn conversation this request belongs to
    priority: int = 0  # lower value = scheduled first under scheduling_policy="priority"
    prompt_token_ids: tuple[int, ...] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"request {self.request_id}: prompt_len must be >= 1, got {self.prompt_len}")
        if self.output_len < 1:
            raise ValueError(f"request {self.request_id}: output_len must be >= 1, got {self.output_len}")
        if self.hash_block_size < 1:
            raise ValueError(f"request {self.request_id}: hash_block_size must be >= 1")
        want = -(-self.prompt_len // self.hash_block_size)
        if len(self.hash_ids) != want:
            raise ValueError(
                f"request {self.request_id}: {len(self.hash_ids)} hash ids for a "
                f"{self.prompt_len}-token prompt at {self.hash_block_size} tokens per hash block; "
                f"expected ceil({self.prompt_len}/{self.hash_block_size}) = {want}"
            )
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise ValueError(
                f"request {self.request_id}: prompt_token_ids has {len(self.prompt_token_ids)} "
                f"tokens but prompt_len is {self.prompt_len}"
            )


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a cheap, well-mixed, platform-independent integer hash."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def materialize_prompt(request: Request, vocab_size: int) -> list[int]:
    """Token ids for `request`'s prompt, a pure function of its hash ids.

    Token `j` of the block with hash id `h` is `mix(h, j) mod (vocab - 16) + 16`,
    so equal leading hash ids give equal leading tokens, whatever the request.
    """
    if vocab_size <= FIRST_CONTENT_TOKEN_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_CONTENT_TOKEN_ID}, got {vocab_size}")
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids)
    pos = np.arange(request.prompt_len, dtype=np.uint64)
    block = pos // np.uint64(request.hash_block_size)
    offset = pos % np.uint64(request.hash_block_size)
    ids = np.asarray(request.hash_ids, dtype=np.int64).astype(np.uint64)[block.astype(np.int64)]
    with np.errstate(over="ignore"):
        key = _mix64(ids) ^ (offset * np.uint64(0x9E3779B97F4A7C15))
    tok = _mix64(key) % np.uint64(vocab_size - FIRST_CONTENT_TOKEN_ID) + np.uint64(FIRST_CONTENT_TOKEN_ID)
    return tok.astype(np.int64).tolist()
