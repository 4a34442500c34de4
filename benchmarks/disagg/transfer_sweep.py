"""KV transfer microbenchmark between two processes on two devices (issue 15, phase "sweep").

Each process holds a KV pool of the model's layout ([layers, K/V, blocks, block_size, kv_heads,
head_dim]); for every planned transfer the sender gathers the request's blocks (index_select),
the bytes cross, and the receiver scatters them into its pool (index_copy_), as engine/disagg
does. Timed on the receiver between a gloo barrier and the data landing (CUDA synchronised):
`transfer_s`; the gather and scatter are timed apart.

Transports: "nccl"/"gloo" (torch.distributed isend/irecv, one message per descriptor) and "ipc":
the sender's gather buffer is shared once through CUDA IPC (shared memory on CPU) and the
receiver copies from it (a peer copy over NVLink), one copy per descriptor.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


@dataclass(frozen=True, slots=True)
class Item:
    transport: str  # nccl / gloo / ipc
    block_size: int
    num_blocks: int
    num_descriptors: int  # 1 = whole request, layers = layer by layer, more = finer splits
    mode: str  # whole / layer / split
    rep: int


@dataclass(frozen=True, slots=True)
class Layout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # "bfloat16" / "float32"

    def block_bytes(self, block_size: int) -> int:
        return 2 * self.num_layers * block_size * self.num_kv_heads * self.head_dim * getattr(torch, self.dtype).itemsize


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _pieces(t: torch.Tensor, k: int) -> list[torch.Tensor]:
    """`k` contiguous messages: per layer when k = layers, else equal chunks of the flat buffer."""
    if k == 1:
        return [t]
    if k == t.shape[0]:
        return [t[i] for i in range(k)]
    return list(t.view(-1).chunk(k))


def _pool(layout: Layout, block_size: int, num_blocks: int, dev: torch.device) -> torch.Tensor:
    dt = getattr(torch, layout.dtype)
    return torch.randn((layout.num_layers, 2, num_blocks, block_size, layout.num_kv_heads, layout.head_dim),
                       dtype=dt, device=dev) if dev.type == "cpu" else torch.empty(
        (layout.num_layers, 2, num_blocks, block_size, layout.num_kv_heads, layout.head_dim), dtype=dt, device=dev)


def _worker(rank: int, port: int, devices: list[str], layout: Layout, plan: list[Item], ipc_q, out_q,
            timeout_s: float) -> None:
    dev = torch.device(devices[rank])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = "nccl" if any(i.transport == "nccl" for i in plan) else "gloo"
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=timeout_s))
    ctrl = dist.new_group(backend="gloo") if backend == "nccl" else dist.group.WORLD
    one = torch.ones(1, device=dev)  # NCCL builds the pair's communicator now, not in a measured transfer
    (dist.isend(one, dst=1) if rank == 0 else dist.irecv(one, src=0)).wait()
    _sync(dev)
    rows = []
    by_bs: dict[int, int] = {}
    for it in plan:
        by_bs[it.block_size] = max(by_bs.get(it.block_size, 0), it.num_blocks)
    for bs, n in sorted(by_bs.items()):
        pool = _pool(layout, bs, n + 1, dev)
        shared = None
        if any(i.transport == "ipc" and i.block_size == bs for i in plan):
            shared = _share_buffer(rank, pool, ipc_q)
        for it in (i for i in plan if i.block_size == bs):
            row = _one(rank, it, pool, shared, dev, ctrl)
            if rank == 1:
                rows.append(row)
        del pool, shared
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if rank == 1:
        out_q.put(rows)
    dist.barrier(group=ctrl)
    out_q.close()
    out_q.join_thread()
    os._exit(0)


def _share_buffer(rank: int, pool: torch.Tensor, ipc_q) -> torch.Tensor:
    """A gather buffer as large as the pool, owned by the sender, mapped once by the receiver."""
    to_receiver, to_sender = ipc_q  # one queue per direction: a process never reads its own message
    if rank == 0:
        buf = torch.empty_like(pool)
        if buf.device.type == "cpu":
            buf.share_memory_()
        to_receiver.put(buf)
        to_sender.get()  # the receiver has it mapped
        return buf
    buf = to_receiver.get()
    to_sender.put("mapped")
    return buf


def _head(shared: torch.Tensor, pool: torch.Tensor, n: int) -> torch.Tensor:
    """The first n blocks' worth of the shared buffer, as one contiguous gathered tensor."""
    shape = (*pool.shape[:2], n, *pool.shape[3:])
    return shared.view(-1)[: pool[:, :, :n].numel()].view(shape)


def _one(rank: int, it: Item, pool: torch.Tensor, shared, dev: torch.device, ctrl) -> dict:
    n = it.num_blocks
    src_ids = torch.arange(n, device=dev).flip(0)  # scattered order: a real gather, not a slice
    dist.barrier(group=ctrl)
    if rank == 0:
        out = _head(shared, pool, n) if it.transport == "ipc" else None
        blocks = pool.index_select(2, src_ids) if out is None else torch.index_select(pool, 2, src_ids, out=out)
        _sync(dev)
        dist.barrier(group=ctrl)
        if it.transport != "ipc":
            for w in [dist.isend(p, dst=1) for p in _pieces(blocks, it.num_descriptors)]:
                w.wait()
            _sync(dev)
        dist.barrier(group=ctrl)
        return {}
    staging = torch.empty(pool[:, :, :n].shape, dtype=pool.dtype, device=dev)
    dist.barrier(group=ctrl)  # the sender has gathered
    t1 = time.perf_counter()
    if it.transport == "ipc":
        for dst, src in zip(_pieces(staging, it.num_descriptors), _pieces(_head(shared, pool, n), it.num_descriptors)):
            dst.copy_(src, non_blocking=True)
        _sync(shared.device)  # the peer copy may run on the source device's stream
    else:
        for w in [dist.irecv(p, src=0) for p in _pieces(staging, it.num_descriptors)]:
            w.wait()
    _sync(dev)
    transfer_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    pool.index_copy_(2, src_ids, staging)
    _sync(dev)
    scatter_s = time.perf_counter() - t2
    dist.barrier(group=ctrl)
    return {**asdict(it), "bytes": staging.numel() * staging.element_size(), "transfer_s": transfer_s,
            "scatter_s": scatter_s}


def run_sweep(layout: Layout, plan: list[Item], devices: list[str], timeout_s: float = 300.0) -> list[dict]:
    """Run `plan` on two processes (`devices[0]` sends, `devices[1]` receives); the receiver's rows."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    ipc_q, out_q = (ctx.Queue(), ctx.Queue()), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, devices, layout, plan, ipc_q, out_q, timeout_s), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        rows = out_q.get(timeout=timeout_s)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return rows
