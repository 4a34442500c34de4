"""One instance of a disaggregated deployment, in its own process: an EngineCore on its own
device, prefill or decode, stepping while its KV transfers move.

Prefill: requests run with one output token and `hold_blocks_on_finish`; when the prompt is
done, the held blocks are gathered and sent at once to the decode instance the router chose at
arrival, and released only once the send completed (or failed: the blocks are freed either way,
never twice). Decode: the KV is
received into a staging buffer while the instance keeps stepping; then the request is admitted
with `num_external_computed_tokens = prompt_len - 1`, and the scheduler hook below copies the
staging buffer into the blocks the admission allocated, before that step's forward.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import queue
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.core.config import EngineArgs
from engine.disagg import messages as m
from engine.disagg.kv_transfer import (
    Transfer,
    gather_blocks,
    post_recv,
    post_send,
    scatter_blocks,
    staging_shape,
    wait_works,
)
from engine.engine_loop import EngineCore
from engine.sampling import SamplingParams
from kernels import compiled_kernel_count

HANDSHAKE_BYTES = 64 << 20  # the second handshake message: a request's KV of some size
IDLE_WAIT_S = 0.002  # how long an idle instance blocks on its inbox before polling again
TRANSFER_POLL_S = 0.0002  # the same with transfers in flight (their waiters stamp the end)
# The GIL switch interval of an instance process (CPython's default is 5 ms): the queue feeder
# and transfer waiter threads get the GIL this soon while the step loop runs Python
SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    replica: int
    role: str  # "prefill", "decode" or "mixed" (an aggregated replica, for comparisons)
    rank: int  # process-group rank (= replica)
    world_size: int
    engine: EngineArgs
    store_host: str
    store_port: int
    backend: str  # "gloo" or "nccl"
    transport: str  # "gloo", "nccl" or "ipc"
    mode: str  # "whole" or "layer"
    peer_ranks: tuple[int, ...]  # the other role's ranks
    timeout_s: float  # any wait on the router or a peer
    transfer_timeout_s: float
    warm_up: bool
    idle_timeout_s: float  # between replays: no word from the router this long ends the process
    # fault injection (tests, benchmarks): a prefill instance exits after posting this many
    # messages of its first transfer, a decode instance after posting its first receive: it
    # dies mid-transfer
    die_after_pieces: int | None = None


def worker_main(cfg: WorkerConfig, inbox, outbox, ipc_queues: dict) -> None:
    """Process entry point; always ends with os._exit so no transport teardown can hang."""
    code = 0
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        _Worker(cfg, inbox, outbox, ipc_queues).run()
    except BaseException:  # noqa: BLE001 - reported to the router, then the process ends
        outbox.put(m.WorkerError(cfg.replica, traceback.format_exc()))
        code = 1
    outbox.close()
    outbox.join_thread()
    os._exit(code)


class _Worker:
    def __init__(self, cfg: WorkerConfig, inbox, outbox, ipc_queues: dict) -> None:
        self.cfg, self.inbox, self.outbox, self.ipc_queues = cfg, inbox, outbox, ipc_queues
        if cfg.engine.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(cfg.engine.device))
        self._init_group()
        self.core = EngineCore(cfg.engine)
        if cfg.warm_up:
            self.core.warm_up()
        self.kv = self.core.runner.kv_caches
        self.steps: list = []
        self.held: dict[int, list[int]] = {}  # prefill: request -> its held block ids
        self.decode_pick: dict[int, int] = {}  # prefill: request -> the router's decode instance
        self.pair_seq: dict[int, int] = {}  # prefill: decode rank -> transfers posted to it
        self.sends: dict[int, Transfer] = {}
        self.recvs: dict[int, tuple[Transfer, m.RecvKV]] = {}
        self.kv_ready: dict[int, torch.Tensor] = {}  # decode: received, not yet admitted
        self.first_step_s: dict[int, float] = {}
        self.dead_ranks: set[int] = set()
        self.stopping = self.abandoning = False
        self.pieces_left = cfg.die_after_pieces

    def _init_group(self) -> None:
        c = self.cfg
        timeout = datetime.timedelta(seconds=c.timeout_s)
        store = dist.TCPStore(c.store_host, c.store_port, c.world_size + 1, is_master=False, timeout=timeout)
        dist.init_process_group(c.backend, store=store, rank=c.rank, world_size=c.world_size, timeout=timeout)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        """Ready, the pair handshake, then one session per Start (a replay) until Exit."""
        c = self.cfg
        self._handshake()  # before Ready: a replay must not start while the pairs still connect
        self.outbox.put(m.Ready(c.replica, self.core.num_gpu_blocks, self.core.runner.block_bytes(),
                                self.core.spec.num_layers, str(self.core.device)))
        while True:
            msg = self._get(c.idle_timeout_s)
            if isinstance(msg, m.Exit):
                return
            if not isinstance(msg, m.Start):
                raise TypeError(f"instance {c.replica}: expected Start or Exit from the router, got {msg!r}")
            self._session(msg.epoch)

    def _session(self, epoch: float) -> None:
        """Serve from an empty scheduler on the shared clock until Stop, then report."""
        c = self.cfg
        self.core.start_over()
        self.core.epoch = epoch
        self.steps, self.first_step_s, self.stopping, self.abandoning = [], {}, False, False
        self.kv_ready.clear()
        self.decode_pick.clear()
        self.compiled0 = compiled_kernel_count()
        if c.role == "decode":
            self._install_admission_hook()
        while True:
            computing = self.core.has_unfinished()
            moving = bool(self.sends or self.recvs)
            # Never spin: with only transfers in flight, block briefly on the inbox. A spinning
            # loop holds the GIL, so this process's queue feeder (the Prefilled message the
            # decode side waits for) and transfer waiters ran only at switch intervals: at
            # 1 request/s on the H200 pair, receives were posted 2-80 ms after the prompt.
            self._drain_inbox(wait_s=0.0 if computing else TRANSFER_POLL_S if moving else IDLE_WAIT_S)
            if self.stopping and not (computing or moving):
                break
            self._poll_transfers()
            if self.core.has_unfinished():
                self._on_step(self.core.step())
        self.outbox.put(m.Done(c.replica, self.steps, dataclasses.asdict(self.core.scheduler.stats),
                               self._pool_report()))

    def _handshake(self) -> None:
        """A tiny and a request-sized message per prefill-decode pair, so no measured transfer
        pays the connection set-up (NCCL builds a pair's communicator on its first send; on the
        H200 pair the first 128 MiB transfer of a replay took 11.6 ms, later ones about 1)."""
        c = self.cfg
        if c.transport == "ipc" or not c.peer_ranks:
            return
        dev = self.core.device
        for numel in (1, HANDSHAKE_BYTES // 4 if dev.type == "cuda" else 1):
            works = []
            for peer in c.peer_ranks:
                t = torch.ones(numel, device=dev)
                works.append(dist.isend(t, dst=peer) if c.role == "prefill" else dist.irecv(t, src=peer))
            wait_works(works, c.timeout_s)

    def _get(self, timeout_s: float):
        try:
            return self.inbox.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"instance {self.cfg.replica}: nothing from the router in {timeout_s} s") from None

    def _drain_inbox(self, wait_s: float) -> None:
        while True:
            try:
                msg = self.inbox.get(timeout=wait_s) if wait_s else self.inbox.get_nowait()
            except queue.Empty:
                return
            wait_s = 0.0
            self._handle(msg)

    def _handle(self, msg) -> None:
        if isinstance(msg, m.AddRequest):
            self._add(msg)
        elif isinstance(msg, m.RecvKV):
            self._start_recv(msg)
        elif isinstance(msg, m.PeerDead):
            self.dead_ranks.add(msg.rank)
        elif isinstance(msg, m.Stop):
            self.stopping = True
            if msg.abandon:
                self._abandon()
        else:
            raise TypeError(f"instance {self.cfg.replica}: unexpected message {msg!r}")

    def _abandon(self) -> None:
        """The replay was cut off: abort what is unfinished (not reported: the router counts
        it unfinished); transfers in flight still end (and release) under their deadlines."""
        self.abandoning = True
        self.core.abort_requests([rid for rid in self.core.requests if rid not in self.held])
        self.kv_ready.clear()
        for rid in [r for r in self.held if r not in self.sends]:  # prefilled, never to be sent
            self._release(rid)

    def _pool_report(self) -> m.PoolReport:
        s = self.core.scheduler
        err = ""
        try:
            s.check_invariants()
        except AssertionError as e:
            err = str(e) or "check_invariants failed"
        st = s.stats
        return m.PoolReport(self.cfg.replica, self.core.num_gpu_blocks, st.num_free_blocks,
                            sum(1 for r in s.kv_cache_manager.ref_counts if r), st.num_held_requests, err,
                            compiled_kernel_count() - self.compiled0)

    # ------------------------------------------------------------------ prefill side
    def _add(self, msg: m.AddRequest) -> None:
        """A prefill instance computes the prompt and one token, and holds the blocks; a
        mixed (aggregated) instance serves the whole request."""
        req = msg.request
        if self.cfg.role == "mixed":
            params = SamplingParams(max_tokens=req.output_len, ignore_eos=True)
            return self.core.add_request(req, params, msg.prompt_token_ids, arrival_s=msg.arrival_s)
        self.decode_pick[req.request_id] = msg.decode_replica
        self.core.add_request(dataclasses.replace(req, output_len=1), SamplingParams(max_tokens=1, ignore_eos=True),
                              msg.prompt_token_ids, arrival_s=msg.arrival_s, hold_blocks_on_finish=True)

    def _send_now(self, rid: int) -> tuple[int, int]:
        """Post the send of a just-finished prompt's held blocks to the router's decode pick
        (another live peer if it died); (decode replica, pair seq), or (-1, -1) when no peer is
        alive, the blocks then released at once. Sending here, in the loop turn that finished
        the prompt, keeps the transfer off the next prefill step: waiting for the router's
        word meant waiting for that step (up to 0.3 s of an 8B model's 8K-token chunk)."""
        pick = self.decode_pick.pop(rid, -1)
        live = [r for r in self.cfg.peer_ranks if r not in self.dead_ranks]
        if not live:
            self._release(rid)
            return -1, -1
        dst = pick if pick in live else live[0]  # rank = replica in a deployment
        seq = self.pair_seq.get(dst, 0)
        self.pair_seq[dst] = seq + 1
        self._start_send(rid, dst, dst, seq)
        return dst, seq

    def _start_send(self, rid: int, peer_rank: int, peer_replica: int, seq: int) -> None:
        c = self.cfg
        blocks = gather_blocks(self.kv, self.held[rid])
        ipc = None
        if c.transport == "ipc":
            if blocks.is_cuda:
                torch.cuda.current_stream().synchronize()  # the receiver reads it through IPC
            ipc = self.ipc_queues[peer_replica]
        pieces = self.pieces_left
        self.sends[rid] = post_send(
            blocks, request_id=rid, peer_rank=peer_rank, seq=seq, mode=c.mode,
            timeout_s=c.transfer_timeout_s, ipc_queue=ipc, num_pieces=pieces)

    # ------------------------------------------------------------------ decode side
    def _start_recv(self, msg: m.RecvKV) -> None:
        c = self.cfg
        if msg.peer_rank in self.dead_ranks:
            return self._report_failed(msg.request.request_id, "recv", "peer died before the transfer")
        staging = torch.empty(staging_shape(self.kv, msg.num_blocks), dtype=self.kv.dtype, device=self.kv.device)
        ipc = self.ipc_queues[msg.peer_replica][0] if c.transport == "ipc" else None
        t = post_recv(staging, request_id=msg.request.request_id, peer_rank=msg.peer_rank, seq=msg.seq,
                      mode=c.mode, timeout_s=c.transfer_timeout_s, ipc_queue=ipc)
        self.recvs[msg.request.request_id] = (t, msg)
        if self.pieces_left is not None:
            time.sleep(0.2)  # the sender has started: die mid-transfer
            os._exit(17)

    def _admit(self, msg: m.RecvKV, staging: torch.Tensor) -> None:
        req = msg.request
        self.kv_ready[req.request_id] = staging
        self.core.add_request(req, SamplingParams(max_tokens=req.output_len, ignore_eos=True),
                              msg.prompt_token_ids, arrival_s=msg.arrival_s,
                              num_external_computed_tokens=req.prompt_len - 1)

    def _install_admission_hook(self) -> None:
        """Wrap this instance's scheduler.schedule: a request admitted with transferred KV gets
        the staged blocks copied into its newly allocated blocks (prefix-cache hits already
        hold that KV) before the step's forward reads them."""
        sched = self.core.scheduler
        schedule = sched.schedule

        def schedule_with_kv():
            out = schedule()
            for s in out.scheduled:
                staging = self.kv_ready.pop(s.request_id, None)
                if staging is None:
                    continue
                self.first_step_s[s.request_id] = self.core.now()
                table = sched.block_ids_of(s.request_id)
                first_new = len(table) - len(s.new_block_ids)
                n = min(len(table), staging.shape[2])
                if n > first_new:
                    scatter_blocks(self.kv, table[first_new:n], staging[:, :, first_new:n])
            return out

        sched.schedule = schedule_with_kv

    # ------------------------------------------------------------------ both
    def _poll_transfers(self) -> None:
        send_ipc_peers: set[int] = set()
        for rid, t in list(self.sends.items()):
            if _skip_ipc(t, send_ipc_peers):
                continue
            status = self._status_of(t)
            if status != "pending":
                del self.sends[rid]
                self._release(rid)
                self._report_transfer(rid, "send", t, status)
        polled_ipc_peers: set[int] = set()
        for rid, (t, msg) in list(self.recvs.items()):
            if _skip_ipc(t, polled_ipc_peers):
                continue
            status = self._status_of(t)
            if status == "pending":
                continue
            del self.recvs[rid]
            if status == "done":
                if t.ipc_queue is not None:
                    self.ipc_queues[msg.peer_replica][1].put(rid)  # the sender may drop its copy
                if not self.abandoning:
                    self._admit(msg, t.tensor)
            self._report_transfer(rid, "recv", t, status)

    def _status_of(self, t: Transfer) -> str:
        status = t.poll()
        if status == "pending" and t.peer_rank in self.dead_ranks:
            t.end_s = time.perf_counter()
            return "failed: peer died"
        return status

    def _release(self, rid: int) -> None:
        """The transfer is over (done or failed): the held blocks go back, exactly once."""
        self.core.release_held(rid)
        del self.held[rid]

    def _report_failed(self, rid: int, side: str, reason: str) -> None:
        t = self.core.now()
        self.outbox.put(m.TransferDone(self.cfg.replica, rid, side, t, t, "failed", reason))

    def _report_transfer(self, rid: int, side: str, t: Transfer, status: str) -> None:
        epoch = self.core.epoch
        ok = status == "done"
        self.outbox.put(m.TransferDone(self.cfg.replica, rid, side, t.start_s - epoch, t.end_s - epoch,
                                       "done" if ok else "failed", "" if ok else status.removeprefix("failed: ")))

    def _on_step(self, res) -> None:
        if res.trace is not None:
            self.steps.append(dataclasses.replace(res.trace, replica=self.cfg.replica))
        for st in res.finished:
            rid = st.request.request_id
            self.core.requests.pop(rid, None)
            if self.cfg.role == "prefill" and st.status == "finished":
                self.held[rid] = self.core.scheduler.block_ids_of(rid)
                num_blocks = len(self.held[rid])
                dst, seq = self._send_now(rid)
                self.outbox.put(m.Prefilled(self.cfg.replica, rid, st.output_token_ids[0], st.token_times_s[0],
                                            _nan(st.first_scheduled_s), st.num_cached_tokens, st.num_preemptions,
                                            num_blocks, dst, seq))
                if self.pieces_left is not None and dst >= 0:
                    time.sleep(0.2)  # let the router and the peer see the transfer, then die mid-way
                    os._exit(17)
                continue
            self.outbox.put(m.Finished(
                self.cfg.replica, rid, st.status, st.finish_reason or "", list(st.output_token_ids),
                list(st.token_times_s), _nan(st.first_scheduled_s), self.first_step_s.pop(rid, float("nan")),
                st.num_cached_tokens, st.num_preemptions))


def _skip_ipc(t: Transfer, seen_peers: set[int]) -> bool:
    """IPC has one queue per pair and direction: only a pair's oldest pending transfer reads it."""
    if t.ipc_queue is None:
        return False
    if t.peer_rank in seen_peers:
        return True
    seen_peers.add(t.peer_rank)
    return False


def _nan(x: float | None) -> float:
    return float("nan") if x is None else x
