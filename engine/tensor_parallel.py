"""Tensor parallelism: one engine's ranks, their collectives, and how each weight is sharded.

Megatron's split of a Llama layer: q/k/v and gate/up are column-parallel (each rank holds its
heads' rows of the fused qkv matrix and its slice of the intermediate dimension), o and down are
row-parallel (each rank holds the matching input columns), so each block ends in ONE all-reduce of
the [tokens, hidden] partial sums. The embedding and the LM head are vocab-parallel: each rank
holds a contiguous 1/tp of the vocabulary's rows (the last shard zero-padded when tp does not
divide it); the embedding's masked lookups are summed by one all-reduce, the LM head's partial
logits are all-gathered into the full [tokens, vocab] row on every rank.

Why an all-gather of the logits and not a distributed argmax: the sampler (temperature, top-k/p,
per-request seeds, logprobs, speculative verification) needs the whole distribution, and a
distributed argmax serves greedy decoding only. The gather moves tokens x vocab x bytes / tp per
rank (a batch of 64 at a 128k vocab in bf16: 8 MiB per rank, ~20 us over NVLink), once per step.

A world of one rank (tp = 1) runs no collective at all: the layers call `all_reduce` and get
their input back, so the TP code path costs nothing there (benchmarks may force the collectives
on to measure them alone: `force_collectives`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from engine.core.flags import FlagError
from engine.core.model_spec import ModelSpec


def check_tp_shape(spec: ModelSpec, tp: int) -> None:
    """tp a power of two that splits the heads, the KV heads and the MLP evenly."""
    if tp < 1 or tp & (tp - 1):
        raise FlagError("tensor_parallel_size", tp, "must be a power of two (1, 2, 4, 8)")
    if tp > 1 and spec.is_moe:  # experts are not sharded (neither TP nor EP) in the engine yet
        raise FlagError("tensor_parallel_size", tp, f"{spec.name} is a mixture of experts, which the engine "
                        "runs on one GPU only for now; use 1")
    for what, n in (("attention heads", spec.num_heads), ("KV heads", spec.num_kv_heads),
                    ("MLP intermediate size", spec.intermediate_size)):
        if n % tp:
            raise FlagError("tensor_parallel_size", tp,
                            f"must divide the model's {n} {what} ({spec.name}); use a divisor of {n}")


def vocab_shard_rows(vocab_size: int, tp: int) -> int:
    """Rows of each rank's vocabulary shard (the last one zero-padded)."""
    return -(-vocab_size // tp)


@dataclass
class TPGroup:
    """One rank's view of its tensor-parallel group.

    `device_group` runs the model's collectives (NCCL on GPUs, gloo on the CPU); `control_group`
    (gloo, host memory) carries rank 0's step messages to the workers, so they never touch the
    GPU stream. `counts` tallies the collectives issued (eager calls and captures, not replays).
    """

    rank: int
    world_size: int
    device_group: Any = None
    control_group: Any = None
    force_collectives: bool = False
    closed: bool = False  # rank 0 told the workers to stop (engine/tp_worker.py stop_workers)
    counts: dict[str, int] = field(default_factory=lambda: {"all_reduce": 0, "all_gather": 0, "broadcast": 0})

    @property
    def active(self) -> bool:
        return self.world_size > 1 or self.force_collectives

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's `x`, in place (the identity with one rank)."""
        if not self.active:
            return x
        self.counts["all_reduce"] += 1
        dist.all_reduce(x, group=self.device_group)
        return x

    def gather_vocab(self, local: torch.Tensor, vocab_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Each rank's logits [T, V/tp] -> the full [T, vocab] on every rank (`out` if given)."""
        if not self.active:
            return local if out is None else out.copy_(local)
        self.counts["all_gather"] += 1
        t, vs = local.shape
        stacked = torch.empty((self.world_size * t, vs), dtype=local.dtype, device=local.device)
        local = local.contiguous()
        if local.is_cuda and dist.get_backend(self.device_group) == "nccl":
            dist.all_gather_into_tensor(stacked, local, group=self.device_group)
        elif local.is_cuda:  # gloo gathers host tensors only (a GPU shared by the ranks: a test hook)
            host = stacked.cpu()
            dist.all_gather(list(host.chunk(self.world_size)), local.cpu(), group=self.device_group)
            stacked.copy_(host)
        else:  # gloo: the list form
            dist.all_gather(list(stacked.chunk(self.world_size)), local, group=self.device_group)
        full = stacked.view(self.world_size, t, vs).transpose(0, 1).reshape(t, self.world_size * vs)
        if out is None:
            return full[:, :vocab_size]
        return out.copy_(full[:, :vocab_size])

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` into every rank's, in place (device group)."""
        if self.active:
            self.counts["broadcast"] += 1
            dist.broadcast(x, src=0, group=self.device_group)
        return x

    def send(self, message: Any) -> None:
        """Rank 0: one pickled message to every worker (control group)."""
        dist.broadcast_object_list([message], src=0, group=self.control_group)

    def receive(self) -> Any:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]

    def min_int(self, n: int) -> int:
        """The smallest of every rank's `n` (the KV block count all ranks can hold)."""
        if self.world_size == 1:
            return n
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control_group)
        return int(t.item())


# --------------------------------------------------------------------------- weight sharding
def _heads_rows(spec: ModelSpec, tp: int, rank: int) -> list[tuple[int, int]]:
    """Row ranges of the fused qkv matrix [q heads | k heads | v heads] a rank holds."""
    d, hq, hkv = spec.head_dim, spec.num_heads, spec.num_kv_heads
    q, kv = hq // tp * d, hkv // tp * d
    return [(rank * q, (rank + 1) * q), (hq * d + rank * kv, hq * d + (rank + 1) * kv),
            ((hq + hkv) * d + rank * kv, (hq + hkv) * d + (rank + 1) * kv)]


def _gate_up_rows(spec: ModelSpec, tp: int, rank: int) -> list[tuple[int, int]]:
    i = spec.intermediate_size
    n = i // tp
    return [(rank * n, (rank + 1) * n), (i + rank * n, i + (rank + 1) * n)]


def _rows(full: torch.Tensor, ranges: list[tuple[int, int]], dim: int = 0) -> torch.Tensor:
    return torch.cat([full.narrow(dim, a, b - a) for a, b in ranges], dim=dim)


def _vocab_rows(full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    n = vocab_shard_rows(full.shape[0], tp)
    part = full[rank * n: (rank + 1) * n]
    if part.shape[0] == n:
        return part
    pad = full.new_zeros((n - part.shape[0], *full.shape[1:]))
    return torch.cat([part, pad])


def shard_param(name: str, full: torch.Tensor, spec: ModelSpec, tp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s shard of the full parameter `name` (the engine's parameter names)."""
    if tp == 1:
        return full
    leaf = name.rsplit(".", 2)[-2:]
    if name in ("embed_tokens", "lm_head"):
        return _vocab_rows(full, tp, rank)
    if leaf[0] == "qkv_proj":  # column-parallel, per head: weight rows and bias alike
        return _rows(full, _heads_rows(spec, tp, rank))
    if leaf[0] == "gate_up_proj":
        return _rows(full, _gate_up_rows(spec, tp, rank))
    if leaf[0] == "o_proj":  # row-parallel: the input columns of this rank's heads
        n = spec.num_heads // tp * spec.head_dim
        return full[:, rank * n: (rank + 1) * n]
    if leaf[0] == "down_proj":
        n = spec.intermediate_size // tp
        return full[:, rank * n: (rank + 1) * n]
    return full  # norms: replicated


def full_param_shape(name: str, spec: ModelSpec) -> tuple[int, ...]:
    """The unsharded shape of parameter `name`."""
    h, d, i = spec.hidden_size, spec.head_dim, spec.intermediate_size
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * d
    if name in ("embed_tokens", "lm_head"):
        return (spec.vocab_size, h)
    shapes = {"qkv_proj.weight": (qkv, h), "qkv_proj.bias": (qkv,), "o_proj.weight": (h, spec.num_heads * d),
              "gate_up_proj.weight": (2 * i, h), "down_proj.weight": (h, i)}
    leaf = ".".join(name.rsplit(".", 2)[-2:])
    return shapes.get(leaf, (h,))


__all__ = ["TPGroup", "check_tp_shape", "full_param_shape", "shard_param", "vocab_shard_rows"]
