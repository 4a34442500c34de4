"""The scheduler's knobs (`SchedulerConfig`), with vLLM's names and meanings."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SchedulerConfig(BaseModel):
    """Scheduler and KV-cache knobs, with vLLM's names and meanings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_num_batched_tokens: int = Field(8192, ge=1, description="token budget per step")
    max_num_seqs: int = Field(256, ge=1, description="cap on running requests")
    max_model_len: int = Field(32768, ge=1, description="prompt + output cap per request")
    block_size: int = Field(16, ge=1, description="tokens per KV block")
    num_gpu_blocks: int = Field(ge=1, description="KV blocks in the pool (--num-gpu-blocks-override)")
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: Literal["builtin", "xxhash", "sha256"] = "builtin"
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0, description="0 = no per-request cap per step")
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    num_speculative_tokens: int = Field(0, ge=0, description="k draft tokens per decode per step")

    @model_validator(mode="after")
    def _vllm_budget_without_chunking(self) -> SchedulerConfig:
        # vLLM raises the budget to max_model_len when chunked prefill is off, so that any
        # admissible prompt fits in one step; do the same (visibly: the field changes).
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            object.__setattr__(self, "max_num_batched_tokens", self.max_model_len)
        return self
