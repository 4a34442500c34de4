"""What the router (parent process) and the instances (worker processes) tell each other.

Every message is a small slotted record sent over a torch.multiprocessing queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.request import Request


# ---------------------------------------------------------------- router -> instance
@dataclass(slots=True)
class Start:
    epoch: float  # the shared clock's zero (perf_counter of the router)


@dataclass(slots=True)
class AddRequest:
    """A prefill (or aggregated) instance serves this request. `decode_replica`: the decode
    instance the router chose at arrival (as vLLM's proxy picks both instances up front), to
    which the prefill side sends the KV the moment the prompt is done; -1 = none (aggregated)."""

    request: Request
    prompt_token_ids: list[int]
    arrival_s: float
    decode_replica: int = -1


@dataclass(slots=True)
class RecvKV:
    """Decode side: receive `num_blocks` KV blocks from `peer_rank`, then admit the request
    with `num_external_computed_tokens = prompt_len - 1` (vLLM's connector convention)."""

    request: Request
    prompt_token_ids: list[int]
    arrival_s: float
    peer_rank: int
    peer_replica: int
    seq: int
    num_blocks: int


@dataclass(slots=True)
class PeerDead:
    """Fail every transfer with this rank: it is gone."""

    rank: int


@dataclass(slots=True)
class Stop:
    """End the replay: finish what is in flight (or, `abandon`, abort the unfinished requests
    and let only the transfers end), report Done, wait for the next Start."""

    abandon: bool = False


@dataclass(slots=True)
class Exit:
    """End the process."""


# ---------------------------------------------------------------- instance -> router
@dataclass(slots=True)
class Ready:
    replica: int
    num_gpu_blocks: int
    block_bytes: int
    num_layers: int
    device: str


@dataclass(slots=True)
class Prefilled:
    replica: int
    request_id: int
    first_token_id: int
    ready_s: float  # the first token's time: the prompt's KV is complete
    scheduled_s: float
    num_cached_tokens: int
    num_preemptions: int
    num_blocks: int
    # where the KV went: sent at once, in the same loop turn as the prompt finished, to the
    # chosen decode instance (or another live one if it died); -1 = no live decode instance
    # (the held blocks are already released)
    dst_replica: int = -1
    seq: int = -1  # this transfer's position among the pair's transfers (message matching)


@dataclass(slots=True)
class TransferDone:
    replica: int
    request_id: int
    side: str  # "send" or "recv"
    start_s: float
    end_s: float
    status: str = "done"  # or "failed"
    reason: str = ""


@dataclass(slots=True)
class Finished:
    """A request left an instance's scheduler for good: finished (decode) or rejected (either)."""

    replica: int
    request_id: int
    status: str
    finish_reason: str
    output_token_ids: list[int] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)
    scheduled_s: float = float("nan")
    first_step_s: float = float("nan")  # decode side: its first step's start
    num_cached_tokens: int = 0
    num_preemptions: int = 0


@dataclass(slots=True)
class PoolReport:
    """An instance's KV pool when it stopped: every block free, none owned or held."""

    replica: int
    num_gpu_blocks: int
    num_free_blocks: int
    num_owned_blocks: int  # blocks with a nonzero refcount
    num_held_requests: int
    invariant_error: str = ""
    kernels_compiled: int = 0  # Triton variants compiled during the session (0 after a full warm-up)

    @property
    def intact(self) -> bool:
        return (self.num_free_blocks == self.num_gpu_blocks and self.num_owned_blocks == 0
                and self.num_held_requests == 0 and not self.invariant_error)


@dataclass(slots=True)
class Done:
    replica: int
    steps: list  # StepRecords
    scheduler_stats: dict
    pool: PoolReport


@dataclass(slots=True)
class WorkerError:
    replica: int
    error: str
