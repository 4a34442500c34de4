"""Moving a request's KV blocks between two engine processes.

The runner's cache is one tensor `[num_layers, 2 (K, V), num_blocks, block_size, kv_heads,
head_dim]` (engine/runner.py); a request's blocks are gathered into a contiguous tensor
`[num_layers, 2, n, block_size, kv_heads, head_dim]` on the sending side and scattered into the
receiver's blocks. Sends and receives are posted asynchronously and polled, so an instance
keeps stepping while its transfers move, and every transfer has a deadline: a dead peer turns
into a failed transfer, never a hang.

Transports: torch.distributed point-to-point (gloo on CPU, NCCL on GPUs), message order per
peer pair is the order both sides post in (NCCL ignores tags; the router hands each pair's
transfers to both sides in one order); or "ipc": the sender puts the gathered tensor on a
torch.multiprocessing queue (CUDA IPC handle on a GPU, shared memory on CPU) and the receiver
copies it onto its own device (a peer copy), then acknowledges so the sender may drop it.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import torch
import torch.distributed as dist


def gather_blocks(kv_caches: torch.Tensor, block_ids: Sequence[int]) -> torch.Tensor:
    """The blocks `block_ids` of every layer, K and V, as one contiguous tensor."""
    idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=kv_caches.device)
    return kv_caches.index_select(2, idx)


def scatter_blocks(kv_caches: torch.Tensor, block_ids: Sequence[int], blocks: torch.Tensor) -> None:
    """Write `blocks` (as `gather_blocks` returns them) into `block_ids` of `kv_caches`."""
    idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=kv_caches.device)
    kv_caches.index_copy_(2, idx, blocks.to(kv_caches.device, non_blocking=True))


def staging_shape(kv_caches: torch.Tensor, num_blocks: int) -> tuple[int, ...]:
    s = kv_caches.shape
    return (s[0], s[1], num_blocks, *s[3:])


def num_descriptors(mode: str, num_layers: int) -> int:
    return 1 if mode == "whole" else num_layers


def _pieces(t: torch.Tensor, mode: str) -> list[torch.Tensor]:
    """The messages of one transfer: the whole tensor, or one contiguous view per layer."""
    return [t] if mode == "whole" else [t[i] for i in range(t.shape[0])]


def _tag(seq: int, piece: int) -> int:
    return (seq * 1024 + piece) % (2**31 - 1)


def wait_works(works: list, timeout_s: float) -> None:
    """Block until every posted message completed; raises on a transport error or timeout.
    gloo's point-to-point works only complete inside wait(), which takes a timeout; NCCL's
    complete on the device, so they are polled (their wait() would not block the host)."""
    deadline = time.perf_counter() + timeout_s
    for w in works:
        if w.is_completed():
            w.wait()
            continue
        try:
            w.wait(timeout=datetime.timedelta(seconds=max(deadline - time.perf_counter(), 1e-3)))
        except TypeError:  # a backend whose wait takes no timeout
            w.wait()
        while not w.is_completed():
            if time.perf_counter() > deadline:
                raise TimeoutError("transfer timed out")
            time.sleep(1e-4)


@dataclass
class Transfer:
    """One direction's half of a request's transfer. A waiter thread blocks on its messages
    (under the deadline) and stamps the end; the instance's loop polls `poll()`.

    gloo's messages complete only inside wait(). NCCL's complete on the device: their waiter
    makes a side stream wait on them and sleeps in a blocking-sync CUDA event, which holds no
    GIL. (It used to spin on is_completed() every 0.1 ms, and a spinning thread takes the GIL
    from the step loop: on the H200 a decode instance's host time per step rose from 0.3 to
    1-5 ms while receives were pending.)"""

    request_id: int
    peer_rank: int
    tensor: torch.Tensor  # the gathered blocks (send) or the staging buffer (recv)
    deadline_s: float  # perf_counter time
    works: list = field(default_factory=list)
    start_s: float = 0.0  # perf_counter time when posted
    end_s: float = 0.0  # perf_counter time when seen complete
    ipc_queue: object = None  # the pair's queue (ipc): tensors to the receiver, or acks back
    received: bool = False
    _status: str = "pending"
    _thread: threading.Thread | None = None

    def start_waiter(self) -> None:
        on_device = bool(self.works) and self.tensor.is_cuda
        self._thread = threading.Thread(target=self._wait_device if on_device else self._wait, daemon=True)
        self._thread.start()

    def _wait_device(self) -> None:
        """NCCL: the end stamped when the device finished the messages (past the deadline,
        poll() reports the transfer failed while this thread still sleeps)."""
        try:
            stream = _side_stream(self.tensor.device)
            done = torch.cuda.Event(blocking=True)
            with torch.cuda.device(self.tensor.device), torch.cuda.stream(stream):  # per-thread state
                for w in self.works:
                    w.wait()  # the side stream waits for the message, the host does not
                done.record(stream)
            done.synchronize()  # sleeps without the GIL
            status = "done"
        except Exception as e:  # noqa: BLE001 - any transport error fails this transfer only
            status = f"failed: {type(e).__name__}: {_first_sentence(str(e))}"
        self.end_s = time.perf_counter()
        self._status = status

    def _wait(self) -> None:
        try:
            wait_works(self.works, self.deadline_s - time.perf_counter())
            status = "done"
        except Exception as e:  # noqa: BLE001 - any transport error fails this transfer only
            status = f"failed: {type(e).__name__}: {_first_sentence(str(e))}"
        self.end_s = time.perf_counter()
        self._status = status

    def poll(self) -> str:
        """"done", "pending" or "failed: <why>" (a peer error, or the deadline passed)."""
        if self.ipc_queue is not None:
            status = self._poll_ipc()
            if status != "pending":
                self.end_s = time.perf_counter()
            return status
        if self._status == "pending" and time.perf_counter() > self.deadline_s + 1.0:
            return "failed: transfer timed out"  # the waiter is stuck past its own deadline
        return self._status

    def _poll_ipc(self) -> str:
        try:
            msg = self.ipc_queue.get_nowait()
        except queue.Empty:
            return "failed: transfer timed out" if time.perf_counter() > self.deadline_s else "pending"
        if isinstance(msg, tuple):  # receiver: (request_id, shared tensor)
            rid, shared = msg
            if rid != self.request_id:
                return f"failed: ipc order broken (got request {rid}, expected {self.request_id})"
            self.tensor.copy_(shared)  # the peer copy onto this device
            for dev in {self.tensor.device, shared.device}:  # either device's stream may run it
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
            del shared
            self.received = True
            return "done"
        return "done" if msg == self.request_id else f"failed: ipc ack for request {msg}"


@cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One stream per device for the waiters of NCCL transfers to wait on."""
    return torch.cuda.Stream(device)


def _first_sentence(text: str) -> str:
    line = text.splitlines()[0] if text else ""
    return line.split(". ")[0][:200]


def post_send(blocks: torch.Tensor, *, request_id: int, peer_rank: int, seq: int, mode: str,
              timeout_s: float, ipc_queue=None, num_pieces: int | None = None) -> Transfer:
    """Start sending `blocks`; `num_pieces` < all sends only that many (fault injection)."""
    t = Transfer(request_id, peer_rank, blocks, time.perf_counter() + timeout_s, start_s=time.perf_counter())
    if ipc_queue is not None:
        send_q, ack_q = ipc_queue
        send_q.put((request_id, blocks))
        t.ipc_queue = ack_q
        return t
    pieces = _pieces(blocks, mode)[:num_pieces]
    t.works = [dist.isend(p, dst=peer_rank, tag=_tag(seq, i)) for i, p in enumerate(pieces)]
    t.start_waiter()
    return t


def post_recv(staging: torch.Tensor, *, request_id: int, peer_rank: int, seq: int, mode: str,
              timeout_s: float, ipc_queue=None) -> Transfer:
    t = Transfer(request_id, peer_rank, staging, time.perf_counter() + timeout_s, start_s=time.perf_counter())
    if ipc_queue is not None:
        t.ipc_queue = ipc_queue
        return t
    t.works = [dist.irecv(p, src=peer_rank, tag=_tag(seq, i)) for i, p in enumerate(_pieces(staging, mode))]
    t.start_waiter()
    return t
