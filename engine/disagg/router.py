"""`replay_disagg`: a workload through P prefill and D decode instances, each its own process.

The router (this process) submits each request at its arrival to the least-loaded live prefill
instance; when that instance reports the first token, the router names a decode instance (least
loaded) and tells both sides, in one order per pair, to move the KV. The decode instance
produces the client-visible tokens (TTFT is measured there, as behind vLLM's P/D proxy). Every
wait has a timeout, and a dead instance is noticed by its exit code: its requests are retried
on another prefill instance (prefill died before the hand-off) or reported failed with the
reason, and the survivors fail their transfers with it (releasing held blocks), so nothing is
lost or hangs.
"""

from __future__ import annotations

import json
import queue
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.core.config import EngineArgs
from engine.core.disagg_records import TRANSFER_MODES, TRANSPORTS, DisaggSplit, TransferRecord
from engine.core.model_spec import get_model
from engine.core.request import Request, materialize_prompt
from engine.disagg import messages as m
from engine.disagg.kv_transfer import num_descriptors
from engine.disagg.result import DisaggResult, RoutedRequest, build_result
from engine.disagg.worker import WorkerConfig, worker_main

MAX_PREFILL_ATTEMPTS = 2  # a request whose prefill instance died is retried once elsewhere
IDLE_TIMEOUT_S = 3600.0  # an instance waiting for its next replay this long ends itself


@dataclass(frozen=True, slots=True)
class Fault:
    """Kill instance `replica` mid-transfer: a prefill instance after it posted `after_pieces`
    messages of its first send, a decode instance after it posted its first receive."""

    replica: int
    after_pieces: int


@dataclass
class _Instance:
    replica: int
    role: str
    proc: object
    inbox: object
    ready: m.Ready | None = None
    done: m.Done | None = None
    alive: bool = True
    load: int = 0  # requests routed here and not yet past this instance


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _devices(engine: EngineArgs, n: int, devices: Sequence[str] | None = None) -> list[str]:
    """One device per instance: `devices` as given, else cuda:0..n-1 on a GPU host, else all CPU."""
    if devices is not None:
        if len(devices) != n:
            raise ValueError(f"devices: {len(devices)} given for {n} instances; give one per instance")
        return list(devices)
    dev = engine.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda"):
        if torch.cuda.device_count() < n:
            raise ValueError(f"--disagg needs {n} GPUs (one per instance), this host has {torch.cuda.device_count()}")
        return [f"cuda:{i}" for i in range(n)]
    return ["cpu"] * n


def replay_disagg(engine: EngineArgs, requests: Sequence[Request], *, split: DisaggSplit | str = "1:1",
                  transport: str = "auto", mode: str = "whole", honor_arrivals: bool = True,
                  time_scale: float = 1.0, warm_up: bool = True, timeout_s: float = 600.0,
                  transfer_timeout_s: float = 10.0, max_wall_s: float | None = None,
                  fault: Fault | None = None, devices: Sequence[str] | None = None) -> DisaggResult:
    """Replay `requests` (their arrival times) through a P:D deployment; the tables are an
    aggregated replay's (engine/replay.py) plus one TransferRecord per handed-off request.
    One-shot `Deployment` (see it for the arguments)."""
    with Deployment(engine, split=split, transport=transport, mode=mode, warm_up=warm_up, timeout_s=timeout_s,
                    transfer_timeout_s=transfer_timeout_s, fault=fault, devices=devices) as dep:
        return dep.replay(requests, honor_arrivals=honor_arrivals, time_scale=time_scale, max_wall_s=max_wall_s)


class Deployment:
    """P prefill + D decode instance processes (or, with `split=None`, `num_replicas`
    aggregated ones: the comparison), started once, for several replays.

    `transport`: "gloo", "nccl", "ipc", or "auto" (NCCL on GPUs, gloo on CPU). `mode`: "whole"
    (one message per request) or "layer" (one per layer). `timeout_s` bounds every wait on an
    instance (start-up included); `transfer_timeout_s` each transfer. Instances use cuda:0..N-1
    on a GPU host (one each), else the CPU; `devices` (one per instance) overrides that, e.g.
    both instances on one GPU (IPC or gloo only: NCCL refuses two ranks on one device) to
    check the GPU paths where only one GPU is lent.
    """

    def __init__(self, engine: EngineArgs, *, split: DisaggSplit | str | None = "1:1", num_replicas: int = 1,
                 transport: str = "auto", mode: str = "whole", warm_up: bool = True, timeout_s: float = 600.0,
                 transfer_timeout_s: float = 10.0, fault: Fault | None = None,
                 devices: Sequence[str] | None = None) -> None:
        if split is not None and not isinstance(split, DisaggSplit):
            split = DisaggSplit.parse(split)
        roles = (["mixed"] * num_replicas if split is None
                 else [split.role_of(r) for r in range(split.num_instances)])
        devices = _devices(engine, len(roles), devices)
        cuda = devices[0].startswith("cuda")
        shared = len(set(devices)) < len(devices)
        transport = ("ipc" if cuda and shared else "nccl" if cuda else "gloo") if transport == "auto" else transport
        if transport == "nccl" and shared:
            raise ValueError(f"transport nccl: instances share a GPU ({devices}); NCCL needs one GPU per "
                             "rank: use transport ipc or gloo, or one device per instance")
        if transport not in TRANSPORTS or (transport == "nccl" and not cuda):
            raise ValueError(f"transport {transport!r}: use one of {TRANSPORTS} (nccl needs GPUs)")
        if mode not in TRANSFER_MODES:
            raise ValueError(f"mode {mode!r}: use one of {TRANSFER_MODES}")
        self.engine, self.split, self.roles = engine, split, roles
        self._router = Router(engine, split, roles, devices, transport, mode, timeout_s, transfer_timeout_s,
                               warm_up, fault)

    def __enter__(self) -> Self:
        try:
            self._router.start()
        except BaseException:
            self._router.shutdown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._router.shutdown()

    def replay(self, requests: Sequence[Request], *, honor_arrivals: bool = True, time_scale: float = 1.0,
               max_wall_s: float | None = None) -> DisaggResult:
        r = self._router
        if not all(i.alive for i in r.instances):
            raise RuntimeError("an instance of this deployment died; start a new Deployment")
        r.new_session()
        cut = r.serve(requests, honor_arrivals, time_scale, max_wall_s)
        r.stop(abandon=cut)
        return build_result(r, self.engine)


class Router:
    """The parent process of a deployment: starts the instances, routes each request to a prefill
    and then a decode instance, and follows it to the end (`reqs`, `transfers`, `instances`)."""

    def __init__(self, engine: EngineArgs, split: DisaggSplit | None, roles: list[str], devices: list[str],
                 transport: str, mode: str, timeout_s: float, transfer_timeout_s: float, warm_up: bool,
                 fault: Fault | None) -> None:
        self.engine, self.split, self.transport, self.mode = engine, split, transport, mode
        self.timeout_s, self.devices = timeout_s, devices
        self.ctx = mp.get_context("spawn")
        self.outbox = self.ctx.Queue()
        port = _free_port()
        world = len(roles)
        # the router owns the rendezvous store, so it outlives any instance
        self.store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=True, wait_for_workers=False)
        pre = [r for r in range(world) if roles[r] == "prefill"]
        dec = [r for r in range(world) if roles[r] == "decode"]
        # kept on self: a queue the parent dropped before the children start cannot be rebuilt there
        self.ipc_pairs = pairs = ({(p, d): (self.ctx.Queue(), self.ctx.Queue()) for p in pre for d in dec}
                                  if transport == "ipc" else {})
        self.instances: list[_Instance] = []
        for r, role in enumerate(roles):
            peers = tuple(dec if role == "prefill" else pre if role == "decode" else ())
            cfg = WorkerConfig(
                replica=r, role=role, rank=r, world_size=world,
                engine=engine.model_copy(update={"device": devices[r]}), store_host="127.0.0.1", store_port=port,
                backend="nccl" if transport == "nccl" else "gloo", transport=transport, mode=mode,
                peer_ranks=peers, timeout_s=timeout_s, transfer_timeout_s=transfer_timeout_s, warm_up=warm_up,
                idle_timeout_s=IDLE_TIMEOUT_S, die_after_pieces=fault.after_pieces if fault and fault.replica == r else None)
            ipc = {q: pairs[(r, q) if role == "prefill" else (q, r)] for q in peers} if transport == "ipc" else {}
            inbox = self.ctx.Queue()
            proc = self.ctx.Process(target=worker_main, args=(cfg, inbox, self.outbox, ipc), daemon=True)
            self.instances.append(_Instance(r, role, proc, inbox))
        self.errors: list[str] = []
        self.new_session()

    def new_session(self) -> None:
        """Forget the previous replay's requests; instances start over at the next Start."""
        self.reqs: dict[int, RoutedRequest] = {}
        self.transfers: dict[int, TransferRecord] = {}
        self.open_sides: set[tuple[int, str]] = set()  # (request, "send"/"recv") not yet reported
        self.epoch = 0.0
        self.wall_s = 0.0
        self.stopping = False
        for inst in self.instances:
            inst.done, inst.load = None, 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for inst in self.instances:
            inst.proc.start()
        deadline = time.perf_counter() + self.timeout_s
        while any(i.ready is None for i in self.instances):
            self._receive(deadline - time.perf_counter(), what="instances to start")
            if any(not i.alive for i in self.instances):
                raise RuntimeError("an instance died while starting: " + "; ".join(self.errors))

    def now(self) -> float:
        return time.perf_counter() - self.epoch

    def serve(self, requests: Sequence[Request], honor_arrivals: bool, time_scale: float,
              max_wall_s: float | None) -> bool:
        """Submit at arrival times and handle events until every request settled; True when
        `max_wall_s` cut it off first."""
        reqs = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        vocab = _vocab_of(self.engine.model)
        for r in reqs:
            a = r.arrival_s * time_scale if honor_arrivals else 0.0
            self.reqs[r.request_id] = RoutedRequest(r, materialize_prompt(r, vocab), a)
        order = list(self.reqs.values())
        self.epoch = time.perf_counter()  # prompts are built before the clock starts
        for inst in self.instances:
            inst.inbox.put(m.Start(self.epoch))
        i = 0
        while i < len(order) or not self._all_settled():
            now = self.now()
            if max_wall_s is not None and now > max_wall_s:
                self.wall_s = now
                return True
            while i < len(order) and order[i].arrival_s <= now:
                self._submit(order[i])
                i += 1
            wait = 0.005 if i >= len(order) else min(0.005, max(order[i].arrival_s - self.now(), 0.0))
            self._receive(wait, what="instance events", quiet=True)
        self.wall_s = self.now()
        return False

    def stop(self, abandon: bool = False) -> None:
        """Stop the prefill side first: a prompt it finishes meanwhile is sent at once, so the
        decode side stays in the session (receiving) until every prefill instance is done."""
        self.stopping = True
        for roles in (("prefill",), ("decode", "mixed")):
            live = [i for i in self.instances if i.alive and i.role in roles]
            for inst in live:
                inst.inbox.put(m.Stop(abandon))
            deadline = time.perf_counter() + self.timeout_s
            while any(i.alive and i.done is None for i in live):
                self._receive(deadline - time.perf_counter(), what="instances to stop")

    def shutdown(self) -> None:
        for inst in self.instances:
            if inst.alive and inst.proc.pid is not None:
                inst.inbox.put(m.Exit())
        for inst in self.instances:
            if inst.proc.pid is None:
                continue
            inst.proc.join(timeout=5.0)
            if inst.proc.is_alive():
                inst.proc.kill()
                inst.proc.join(timeout=5.0)

    # ------------------------------------------------------------------ events
    def _receive(self, timeout_s: float, *, what: str, quiet: bool = False) -> None:
        """Handle the next instance message (or none within timeout_s), then check liveness."""
        if timeout_s <= 0 and not quiet:
            raise TimeoutError(f"waited {self.timeout_s} s for {what}; errors: {self.errors}")
        try:
            msg = self.outbox.get(timeout=max(timeout_s, 0.0005))
        except queue.Empty:
            msg = None
        if msg is not None:
            self._handle(msg)
        self._check_alive()

    def _handle(self, msg) -> None:
        if isinstance(msg, m.Ready):
            self.instances[msg.replica].ready = msg
        elif isinstance(msg, m.Prefilled):
            self._on_prefilled(msg)
        elif isinstance(msg, m.TransferDone):
            self._on_transfer(msg)
        elif isinstance(msg, m.Finished):
            self._on_finished(msg)
        elif isinstance(msg, m.Done):
            self.instances[msg.replica].done = msg
        elif isinstance(msg, m.WorkerError):
            self.errors.append(f"instance {msg.replica}: {msg.error}")
        else:
            raise TypeError(f"unexpected message from an instance: {msg!r}")

    def _least_loaded(self, role: str) -> _Instance | None:
        live = [i for i in self.instances if i.role == role and i.alive]
        return min(live, key=lambda i: (i.load, i.replica)) if live else None

    def _submit(self, st: RoutedRequest) -> None:
        """To the least-loaded prefill (or aggregated) instance; a split deployment also picks
        the decode instance now, so the prefill side can send the KV without a round trip."""
        front = "mixed" if self.split is None else "prefill"
        inst = self._least_loaded(front)
        if inst is None:
            return self._fail(st, f"no live {front} instance")
        st.stage, st.prefill_replica, st.attempts = "prefill", inst.replica, st.attempts + 1
        inst.load += 1
        if front == "prefill":
            dst = self._least_loaded("decode")
            if dst is None:
                inst.load -= 1
                return self._fail(st, "no live decode instance")
            if st.decode_replica >= 0:  # a retried prefill: its first pick is counted already
                self.instances[st.decode_replica].load -= 1
            st.decode_replica = dst.replica
            dst.load += 1
        inst.inbox.put(m.AddRequest(st.request, st.prompt, st.arrival_s, st.decode_replica))

    def _on_prefilled(self, msg: m.Prefilled) -> None:
        """The prefill side has already posted the send (or found no live decode instance and
        released the blocks): record the transfer and have the decode side receive it."""
        st = self.reqs[msg.request_id]
        st.prefilled = msg
        src = self.instances[msg.replica]
        src.load -= 1
        ready = src.ready
        bb = ready.block_bytes
        rec = TransferRecord(msg.request_id, src.replica, msg.dst_replica, self.transport, self.mode, msg.num_blocks,
                             bb, msg.num_blocks * bb,
                             (1 if self.transport == "ipc" else num_descriptors(self.mode, ready.num_layers)),
                             ready_s=msg.ready_s)
        self.transfers[msg.request_id] = rec
        if msg.dst_replica != st.decode_replica:  # the pick died: the prefill side chose again
            if st.decode_replica >= 0:
                self.instances[st.decode_replica].load -= 1
            if msg.dst_replica >= 0:
                self.instances[msg.dst_replica].load += 1
            st.decode_replica = msg.dst_replica
        if msg.dst_replica < 0:
            rec.status, rec.reason = "failed", "no live decode instance"
            return self._fail(st, "no live decode instance")
        self.open_sides.add((msg.request_id, "send"))
        st.stage = "transfer"
        dst = self.instances[msg.dst_replica]
        if not dst.alive:  # the send fails through PeerDead; nothing will receive it
            rec.status, rec.reason = "failed", f"recv: instance {dst.replica} died"
            return self._fail(st, f"decode instance {dst.replica} died before the kv transfer")
        self.open_sides.add((msg.request_id, "recv"))
        dst.inbox.put(m.RecvKV(st.request, st.prompt, st.arrival_s, src.replica, src.replica, msg.seq, msg.num_blocks))

    def _on_transfer(self, msg: m.TransferDone) -> None:
        rec = self.transfers[msg.request_id]
        self.open_sides.discard((msg.request_id, msg.side))
        if msg.side == "send":
            rec.send_start_s, rec.send_end_s = msg.start_s, msg.end_s
        else:
            rec.recv_start_s, rec.recv_end_s = msg.start_s, msg.end_s
        if msg.status != "done" and rec.status == "done":
            rec.status, rec.reason = "failed", f"{msg.side}: {msg.reason}"
        st = self.reqs[msg.request_id]
        if msg.side == "recv" and st.stage == "transfer":
            if msg.status == "done":
                st.stage = "decode"
            else:
                self.instances[st.decode_replica].load -= 1
                self._fail(st, f"kv transfer failed ({rec.reason})")

    def _on_finished(self, msg: m.Finished) -> None:
        st = self.reqs[msg.request_id]
        inst = self.instances[msg.replica]
        inst.load -= 1
        if inst.role == "prefill":  # rejected before any token
            st.prefilled = None
        else:
            rec = self.transfers.get(msg.request_id)
            if rec is not None:
                rec.first_step_s = msg.first_step_s
        st.finished, st.stage = msg, "done"

    def _fail(self, st: RoutedRequest, reason: str) -> None:
        st.stage, st.failure = "done", reason

    # ------------------------------------------------------------------ failures
    def _check_alive(self) -> None:
        for inst in self.instances:
            if inst.alive and inst.proc.pid is not None and inst.proc.exitcode is not None and inst.done is None:
                self._on_death(inst)

    def _on_death(self, dead: _Instance) -> None:
        dead.alive = False
        self.errors.append(f"instance {dead.replica} ({dead.role}) exited with code {dead.proc.exitcode}")
        for inst in self.instances:
            if inst.alive:
                inst.inbox.put(m.PeerDead(dead.replica))
        for rid, side in list(self.open_sides):
            rec = self.transfers[rid]
            mine = rec.src_replica if side == "send" else rec.dst_replica
            if mine == dead.replica:
                self.open_sides.discard((rid, side))
                if rec.status == "done":  # its side never completed
                    rec.status, rec.reason = "failed", f"{side}: instance {dead.replica} died"
        for st in self.reqs.values():
            if st.stage == "prefill" and st.prefill_replica == dead.replica and dead.role == "mixed":
                self._fail(st, f"instance {dead.replica} died")
            elif st.stage == "prefill" and st.prefill_replica == dead.replica:
                if st.attempts < MAX_PREFILL_ATTEMPTS and self._least_loaded("prefill") is not None:
                    self._submit(st)
                else:
                    self._fail(st, f"prefill instance {dead.replica} died")
            elif st.stage in ("transfer", "decode") and st.decode_replica == dead.replica:
                # (a dead prefill side fails its transfers through the decode side's receive)
                self._fail(st, f"decode instance {dead.replica} died during the "
                           f"{'kv transfer' if st.stage == 'transfer' else 'decode'}")

    def _all_settled(self) -> bool:
        return all(st.stage == "done" for st in self.reqs.values()) and not self.open_sides


def _vocab_of(model: str) -> int:
    """The vocabulary prompts are drawn from: a preset's, or a checkpoint's config.json."""
    path = Path(model)
    if path.is_dir():
        return int(json.loads((path / "config.json").read_text())["vocab_size"])
    return get_model(model).vocab_size


__all__ = ["Deployment", "Fault", "replay_disagg"]
