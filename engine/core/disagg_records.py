"""Disaggregated prefill's own records: the P:D split, and one KV transfer per request.

Torch-free (the simulator's link fit reads transfer records). All times are seconds on the
run's shared clock: every process sets its engine clock to the parent's epoch
(`time.perf_counter` is CLOCK_MONOTONIC on Linux, one clock for every process of a host).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

NAN = math.nan

# How a request's KV crosses: one message per request ("whole") or one per layer ("layer").
TRANSFER_MODES = ("whole", "layer")
# The transport: torch.distributed send/recv ("gloo" on CPU, "nccl" on GPUs) or CUDA IPC peer
# copies ("ipc": the prefill side shares its gathered blocks, the decode side copies them).
TRANSPORTS = ("gloo", "nccl", "ipc")


@dataclass(frozen=True, slots=True)
class DisaggSplit:
    """P prefill instances feeding D decode instances (`--disagg P:D`)."""

    num_prefill: int
    num_decode: int

    @classmethod
    def parse(cls, text: str) -> DisaggSplit:
        parts = str(text).split(":")
        try:
            p, d = (int(x) for x in parts)
        except ValueError:
            p = d = 0
        if len(parts) != 2 or p < 1 or d < 1:
            raise ValueError(f"--disagg {text!r}: expected P:D with two integers >= 1, e.g. 1:1")
        return cls(p, d)

    @property
    def num_instances(self) -> int:
        return self.num_prefill + self.num_decode

    def role_of(self, replica: int) -> str:
        """Replicas 0..P-1 prefill, P..P+D-1 decode (the simulator's numbering)."""
        return "prefill" if replica < self.num_prefill else "decode"

    def __str__(self) -> str:
        return f"{self.num_prefill}:{self.num_decode}"


@dataclass(slots=True)
class TransferRecord:
    """One request's KV hand-off from a prefill instance to a decode instance.

    bytes = num_blocks x the KV bytes of one block over all layers (K and V);
    num_descriptors: messages the transfer took (1 whole, num_layers layer by layer).
    Prefill side: `ready_s` its first token (the KV is complete), `send_start_s`/`send_end_s`
    the send posted / seen complete (then its blocks are released). Decode side:
    `recv_start_s`/`recv_end_s` the receive posted / seen complete (then the request enters the
    decode scheduler), `first_step_s` the start of its first decode-side step (the KV is copied
    into its blocks just before). `handover_s` = first_step_s - recv_end_s: the decode side's
    admission (KV landed) to its first decode step.
    """

    request_id: int
    src_replica: int
    dst_replica: int
    transport: str
    mode: str
    num_blocks: int
    block_bytes: int
    bytes: int
    num_descriptors: int
    ready_s: float = NAN
    send_start_s: float = NAN
    send_end_s: float = NAN
    recv_start_s: float = NAN
    recv_end_s: float = NAN
    first_step_s: float = NAN
    status: str = "done"  # done / failed
    reason: str = ""

    @property
    def transfer_s(self) -> float:
        """Both sides posted (the later of send and receive) to the receive complete: the
        link's time, without the wait for the slower side to get to it."""
        return self.recv_end_s - max(self.send_start_s, self.recv_start_s)

    @property
    def handover_s(self) -> float:
        return self.first_step_s - self.recv_end_s

    def row(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["transfer_s"], d["handover_s"] = self.transfer_s, self.handover_s
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


TRANSFER_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TransferRecord)) + ("transfer_s", "handover_s")
