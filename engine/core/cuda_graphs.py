"""Which CUDA graphs the engine captures, and which one a step replays: vLLM's capture sizes.

The engine's runner captures a graph per size listed here (`decode_graph_buckets`,
`mixed_graph_buckets`); the simulator's cost model prices a step at the size it pads to
(`decode_graph_bucket`, `mixed_graph_bucket`). One definition for both, so the simulator pads
exactly as the engine does. Torch-free.
"""

from __future__ import annotations

from bisect import bisect_left
from functools import cache

# vLLM's default largest CUDA-graph capture size, in tokens (max_cudagraph_capture_size)
VERIFY_GRAPH_MAX_TOKENS = 512


def mixed_graph_buckets(max_tokens: int) -> list[int]:
    """Token counts that get a mixed CUDA graph: vLLM's capture sizes (1, 2, 4, 8, then steps
    of 8 to 256 and of 16 to 512), up to `max_tokens`, which is always one; past 512 (a capture
    size above vLLM's default) 16 sizes per doubling (steps of 32 to 1024, 64 to 2048, ...), so
    no step pads more than 1/16 of itself past 256 tokens and a budget of 8,192 tokens adds 64
    graphs, not 480. A step pads to the next size: at most 7 tokens (15 to 512), under 6.3% of
    the step from 128 tokens on; a chunk of a few hundred tokens costs far more than that."""
    return list(_mixed_sizes(max_tokens))


def decode_graph_buckets(max_num_seqs: int) -> list[int]:
    """Decode batch sizes that get a CUDA graph (vLLM's pattern: 1, 2, 4, then steps of 8),
    up to `max_num_seqs`, which is always one."""
    return list(_decode_sizes(max_num_seqs))


def decode_graph_bucket(num_seqs: int, max_num_seqs: int) -> int:
    """The decode CUDA graph a batch of `num_seqs` sequences replays: the next of
    `decode_graph_buckets(max_num_seqs)`. Beyond the largest: eager (`num_seqs` itself)."""
    if num_seqs > max_num_seqs:
        return num_seqs
    sizes = _decode_sizes(max_num_seqs)
    return sizes[bisect_left(sizes, num_seqs)]


def mixed_graph_bucket(num_tokens: int, max_tokens: int) -> int | None:
    """The mixed CUDA graph a step of `num_tokens` tokens replays: the next of
    `mixed_graph_buckets(max_tokens)`; None above `max_tokens` (eager)."""
    if num_tokens > max_tokens:
        return None
    sizes = _mixed_sizes(max_tokens)
    return sizes[bisect_left(sizes, num_tokens)]


@cache
def _mixed_sizes(max_tokens: int) -> tuple[int, ...]:
    sizes = [s for s in (1, 2, 4) if s <= max_tokens]
    sizes += list(range(8, min(max_tokens, 256) + 1, 8))
    sizes += list(range(272, min(max_tokens, 512) + 1, 16))
    lo = 512
    while lo < max_tokens:  # steps of lo / 16 from lo to 2 lo
        sizes += list(range(lo + lo // 16, min(max_tokens, 2 * lo) + 1, lo // 16))
        lo *= 2
    if not sizes or sizes[-1] != max_tokens:
        sizes.append(max_tokens)
    return tuple(sizes)


@cache
def _decode_sizes(max_num_seqs: int) -> tuple[int, ...]:
    sizes = [b for b in (1, 2, 4) if b <= max_num_seqs]
    sizes += list(range(8, max_num_seqs + 1, 8))
    if not sizes or sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return tuple(sizes)


__all__ = [
    "VERIFY_GRAPH_MAX_TOKENS",
    "decode_graph_bucket",
    "decode_graph_buckets",
    "mixed_graph_bucket",
    "mixed_graph_buckets",
]
