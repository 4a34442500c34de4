"""Hypothesis strategies shared by the scheduler's random-stream tests: small scheduler
configurations (budgets, sequence caps, pools and block sizes small enough that random streams
hit chunking, preemption, prefix hits and rejections within a few steps)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from engine.core.scheduler import SchedulerConfig


def scheduler_configs(block_sizes: Sequence[int] = (1, 2, 3, 4, 8), prefix_caching: bool | None = None,
                      spec_tokens: Sequence[int] = (0, 0, 1, 3)) -> st.SearchStrategy[SchedulerConfig]:
    """`prefix_caching` None: on or off at random; `spec_tokens`: drawn from (repeats weight 0)."""
    return st.builds(
        SchedulerConfig,
        max_num_batched_tokens=st.integers(1, 48),
        max_num_seqs=st.integers(1, 6),
        max_model_len=st.integers(8, 80),
        block_size=st.sampled_from(list(block_sizes)),
        num_gpu_blocks=st.integers(2, 40),
        enable_prefix_caching=st.booleans() if prefix_caching is None else st.just(prefix_caching),
        prefix_caching_hash_algo=st.sampled_from(["builtin", "xxhash", "sha256"]),
        enable_chunked_prefill=st.booleans(),
        long_prefill_token_threshold=st.sampled_from([0, 0, 3, 7]),
        scheduling_policy=st.sampled_from(["fcfs", "priority"]),
        num_speculative_tokens=st.sampled_from(list(spec_tokens)),
    )
