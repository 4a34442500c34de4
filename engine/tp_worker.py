"""Tensor-parallel processes: rank 0 (the engine's own process) drives, workers follow.

`start_workers` spawns ranks 1..tp-1 with torch.multiprocessing (spawn: CUDA cannot be forked),
joins rank 0 into the group and returns its `TPGroup`. A worker builds the same model (its
shard) and the same `ModelRunner` from rank 0's resolved config, then runs what rank 0 sends on
the control group: runner calls (`RunnerCall`: KV allocation, graph captures, warm-up
launches), steps (`StepMessage`), and `Stop`. Only rank 0 runs the scheduler and the sampler.

What a step costs beyond the model's collectives: one `broadcast_object_list` over gloo
(host memory, loopback TCP) of the pickled `StepMessage` (its StepInputs and the staging bytes
up to the step's copy end, tens of KiB at most), which rank 0 pays before it launches the
forward and each worker before it can; plus, under async scheduling, one device broadcast of
the sampled-token buffer (max_num_seqs x 8 bytes). benchmarks/tp/h200x2.py measures both.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.core.config import EngineArgs
from engine.core.model_spec import ModelSpec
from engine.tensor_parallel import TPGroup

# A rank that waits longer than this for its peers gives up (a crashed peer, not a slow step).
TP_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class BuildWorker:
    """Rank 0's resolved config: what a worker builds its model and runner from."""

    config: EngineArgs
    max_model_len: int
    spec: ModelSpec  # rank 0's architecture (a preset, or one a benchmark made up)


@dataclass(frozen=True, slots=True)
class Stop:
    """The engine is closing: workers leave their loop."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A test hook, inherited by the spawned workers: every rank on the ONE base GPU, the model's
# collectives over gloo (NCCL refuses two ranks on one GPU; gloo is not capturable, so the engine
# must run eagerly). Lets a one-GPU machine run the TP > 1 path (benchmarks/tp/one_gpu_shared.py).
SHARE_DEVICE_ENV = "COSTLINE_TP_SHARE_DEVICE"


def sharing_device() -> bool:
    return os.environ.get(SHARE_DEVICE_ENV) == "1"


def rank_device(base: torch.device, rank: int) -> torch.device:
    """Rank r's device: the r-th GPU after the base one (the base one when sharing it), or the CPU."""
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + (0 if sharing_device() else rank))


def init_group(rank: int, world_size: int, address: str, device: torch.device,
               force_collectives: bool = False) -> TPGroup:
    """Join the process group: NCCL (GPUs) or gloo (CPU, or GPUs shared) for the model, gloo for control."""
    if device.type == "cuda" and sharing_device():
        torch.cuda.set_device(device)
        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world_size,
                                timeout=TP_TIMEOUT)
    elif device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=address, rank=rank, world_size=world_size,
                                timeout=TP_TIMEOUT, device_id=device)
    else:
        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world_size,
                                timeout=TP_TIMEOUT)
    control = dist.new_group(backend="gloo", timeout=TP_TIMEOUT)
    tp = TPGroup(rank, world_size, dist.group.WORLD, control, force_collectives=force_collectives)
    if tp.active:  # NCCL builds its communicator at the first collective: before any capture
        tp.all_reduce(torch.zeros(1, device=device))
        tp.counts["all_reduce"] = 0
    return tp


def start_workers(world_size: int, device: torch.device, force_collectives: bool = False
                  ) -> tuple[TPGroup, list[Any]]:
    """Spawn ranks 1..world_size-1 (each waits for rank 0's `BuildWorker`) and join as rank 0."""
    address = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker_main, args=(r, world_size, address, str(device), force_collectives),
                         daemon=True, name=f"tp-rank{r}") for r in range(1, world_size)]
    for p in procs:
        p.start()
    tp = init_group(0, world_size, address, rank_device(device, 0), force_collectives)
    return tp, procs


def stop_workers(tp: TPGroup | None, procs: list[Any]) -> None:
    """Tell the workers to leave, wait for them, leave the group (safe to call twice)."""
    if tp is None or tp.closed or not dist.is_initialized():
        return
    tp.closed = True  # an explicit close and the exit hook both call this: the second does nothing
    if tp.world_size > 1:
        tp.send(Stop())
    for p in procs:
        p.join(timeout=60)
    leave_group()


def leave_group(timeout_s: float = 10.0) -> bool:
    """Leave the process group; True when it was destroyed. Over NCCL, after CUDA-graph captures of
    collectives, destroy_process_group can hang (pytorch issue 115388): it gets `timeout_s` in a
    daemon thread, past which the group is left to the process's exit."""
    if not dist.is_initialized():
        return True
    if dist.get_backend() == "gloo":
        dist.destroy_process_group()
        return True
    t = threading.Thread(target=dist.destroy_process_group, daemon=True, name="leave-tp-group")
    t.start()
    t.join(timeout_s)
    return not t.is_alive()


def worker_main(rank: int, world_size: int, address: str, device: str, force_collectives: bool = False) -> None:
    """A worker process: join, build from rank 0's config, follow its messages until Stop."""
    dev = rank_device(torch.device(device), rank)
    if dev.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    tp = init_group(rank, world_size, address, dev, force_collectives)
    build = tp.receive()
    runner = build_worker_runner(build, tp, dev)
    follow(runner, tp)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    leave_group()


def build_worker_runner(build: BuildWorker, tp: TPGroup, device: torch.device):
    """The same model shard and runner rank 0 builds (engine_loop.EngineCore)."""
    from engine.engine_loop import build_model, make_runner

    model = build_model(build.config, device, build.max_model_len, tp=tp, spec=build.spec)
    return make_runner(model, build.config, build.max_model_len)


def follow(runner, tp: TPGroup) -> int:
    """Run rank 0's messages until Stop; returns the steps run."""
    from engine.runner import RunnerCall, StepMessage

    steps = 0
    while True:
        msg = tp.receive()
        if isinstance(msg, Stop):
            return steps
        if isinstance(msg, StepMessage):
            runner.run_step_message(msg)
            steps += 1
        elif isinstance(msg, RunnerCall):
            getattr(runner, msg.name)(*msg.args, **msg.kwargs)
        else:
            raise TypeError(f"tensor-parallel worker {tp.rank}: unknown message {type(msg).__name__}")


def register_shutdown(tp: TPGroup, procs: list[Any]) -> None:
    atexit.register(stop_workers, tp, procs)


__all__ = ["BuildWorker", "Stop", "follow", "init_group", "rank_device", "start_workers", "stop_workers",
           "worker_main"]
