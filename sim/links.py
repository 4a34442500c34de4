"""KV links measured on real machines: what a disaggregated deployment's transfer costs when the
deployment names no bandwidth or latency of its own.

Each entry is a fit of sim/link_fit.py on a transfer sweep (benchmarks/disagg/bench_h200x2.py:
1 MiB to the largest KV one request can have, several block sizes and message counts), folded
into DisaggConfig's two numbers for whole-request transfers of 16-token blocks. Links nobody
measured fall back to the datasheet bandwidth (GPUSpec) and DEFAULT_LINK_LATENCY_S.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_LINK_LATENCY_S = 5e-4  # per transfer, where unmeasured (an RDMA set-up and hand-shake)


@dataclass(frozen=True, slots=True)
class MeasuredLink:
    gb_per_s: float  # achieved one-direction bandwidth, GB/s (1e9 bytes)
    latency_s: float  # fixed cost of one whole-request transfer
    source: str


MEASURED_LINKS: dict[tuple[str, str], MeasuredLink] = {
    # Two H200s of one host, NV18 (18 NVLink 4 links of 26.6 GB/s: 478 GB/s per direction), NCCL
    # send/recv between two processes, Llama-3.1-8B's KV layout in bf16: 384.9 GB/s, 92.6 us per
    # transfer + 37.8 us per message + 0.14 us per 2 MiB block (folded in: 375.3 GB/s, 130.4 us);
    # CUDA IPC peer copies reach 389.3 GB/s with 65 + 22 us. The datasheet's "900 GB/s" counts
    # both directions.
    ("h200", "nvlink"): MeasuredLink(375.3, 130.4e-6, "benchmarks/disagg/data/h200x2 (H200 pair, NCCL, 2026-12-01)"),
}


def measured_link(gpu: str, link: str) -> MeasuredLink | None:
    return MEASURED_LINKS.get((gpu, link))
