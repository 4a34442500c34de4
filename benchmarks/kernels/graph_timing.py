"""CUDA-graph timing shared by the small kernel probes (bench_split, bench_fp8_words).

bench_h200.py keeps its own do_bench-based timing (it parses its arguments at import).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def capture_graph(calls: list[Callable[[], object]]) -> torch.cuda.CUDAGraph:
    """`calls` captured as one CUDA graph, warmed up outside the capture (compiles, cuBLAS workspaces) and
    replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    return g


def time_calls_us(calls: list[Callable[[], object]], dry: bool, reps: int = 10) -> float:
    """Mean us per call: one CUDA graph holding all `calls` (distinct weights), replayed."""
    if dry:
        t0 = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t0) * 1e6 / len(calls)
    g = capture_graph(calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps / len(calls))
    del g
    return sorted(times)[len(times) // 2]
