"""Engine arguments, with vLLM's names (`--max-num-seqs` -> `max_num_seqs`, ...).

`SchedulingArgs` holds vLLM's scheduling and KV-cache flags; both the real engine's
`EngineArgs` (here) and the simulated instance's `sim.config.EngineConfig` extend it, and
`scheduler_config` turns either into the `SchedulerConfig` the shared scheduler runs with.
No torch here: the simulator imports this module.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.scheduler import SchedulerConfig


class SchedulingArgs(BaseModel):
    """vLLM's scheduling and KV-cache engine arguments.

    `max_num_batched_tokens`, `max_num_seqs` and `max_model_len` may be None here: each
    subclass says how it resolves them (the engine has concrete defaults, the simulator
    resolves them per GPU as vLLM does).
    """

    model_config = ConfigDict(extra="forbid")

    max_num_batched_tokens: int | None = Field(None, ge=1, description="token budget per step")
    max_num_seqs: int | None = Field(None, ge=1, description="cap on running requests")
    max_model_len: int | None = Field(None, ge=1, description="prompt + output cap per request")
    block_size: int = Field(16, ge=1, description="tokens per KV block")
    gpu_memory_utilization: float = Field(0.92, gt=0.0, le=1.0, description="vLLM 0.33's default")
    num_gpu_blocks_override: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: Literal["builtin", "xxhash", "sha256"] = "builtin"
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0, description="0 = no per-request cap per step")
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    async_scheduling: bool = Field(
        False, description="schedule step N+1 on the host while the GPU runs step N "
        "(vLLM's --async-scheduling); a stop token is seen one step late, so that step's "
        "token for the stopped request is computed and discarded, as in vLLM")


def scheduler_config(args: SchedulingArgs, *, num_gpu_blocks: int, max_model_len: int | None = None,
                     block_size: int | None = None, num_speculative_tokens: int = 0) -> SchedulerConfig:
    """The scheduler's configuration for `args`, with the KV pool size known at start-up.

    `max_model_len` / `block_size` override the args' values (a resolved length, a coarsened
    block); the budgets must be resolved by then.
    """
    mml = max_model_len or args.max_model_len
    if args.max_num_batched_tokens is None or args.max_num_seqs is None or mml is None:
        raise ValueError("scheduler_config: resolve max_num_batched_tokens, max_num_seqs and "
                         "max_model_len first (e.g. sim EngineConfig.resolved_for(gpu, model))")
    return SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=mml,
        block_size=block_size or args.block_size,
        num_gpu_blocks=num_gpu_blocks,
        enable_prefix_caching=args.enable_prefix_caching,
        prefix_caching_hash_algo=args.prefix_caching_hash_algo,
        enable_chunked_prefill=args.enable_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        scheduling_policy=args.scheduling_policy,
        num_speculative_tokens=num_speculative_tokens,
    )


class EngineArgs(SchedulingArgs):
    """What the real engine (`engine.core.EngineCore`, `engine.llm.LLM`) is started with."""

    model: str = Field("tiny", description="model preset name or a Hugging Face-style directory")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    seed: int = 0
    device: str = Field("auto", description="'auto' = cuda when available, else cpu")
    max_num_batched_tokens: int = Field(8192, ge=1, description="token budget per step")
    max_num_seqs: int = Field(256, ge=1, description="cap on running requests")
    max_model_len: int | None = Field(None, description="None = min(model max positions, 8192)")
    # 0.9 (vLLM's default before 0.33) has been the engine's default: kept, so runs stay comparable.
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    cpu_kv_cache_bytes: int = Field(256 << 20, ge=1, description="KV cache size on the CPU")
    enforce_eager: bool = Field(False, description="no CUDA graphs")
    attention_backend: Literal["auto", "torch", "triton"] = Field(
        "auto", description="'auto' = triton on the GPU, the torch reference on the CPU")
