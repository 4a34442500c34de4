"""Engine configuration, with vLLM's argument names (`--max-num-seqs` -> `max_num_seqs`, ...)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field("tiny", description="model preset name or a Hugging Face-style directory")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    seed: int = 0
    device: str = Field("auto", description="'auto' = cuda when available, else cpu")
    max_model_len: int | None = Field(None, description="None = min(model max positions, 8192)")
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    block_size: int = Field(16, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    num_gpu_blocks_override: int | None = Field(None, ge=1)
    cpu_kv_cache_bytes: int = Field(256 << 20, ge=1, description="KV cache size on the CPU")
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0)
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    enforce_eager: bool = Field(False, description="no CUDA graphs")
    async_scheduling: bool = Field(
        False, description="schedule step N+1 on the host while the GPU runs step N "
        "(vLLM's --async-scheduling); a stop token is seen one step late, so that step's "
        "token for the stopped request is computed and discarded, as in vLLM")
    attention_backend: Literal["auto", "torch", "triton"] = Field(
        "auto", description="'auto' = triton on the GPU, the torch reference on the CPU")
