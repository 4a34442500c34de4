"""Engine arguments, with vLLM's names (`--max-num-seqs` -> `max_num_seqs`, ...).

`SchedulingArgs` holds vLLM's scheduling and KV-cache flags; both the real engine's
`EngineArgs` (here) and the simulated instance's `sim.config.EngineConfig` extend it, so the two
resolve their GPU-dependent defaults with the same `resolve_limits`. Fields come from the flag
records of `engine.core.flags`. `scheduler_config` turns either into the `SchedulerConfig` the shared
scheduler runs with. No torch here: the simulator imports this module.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.core.flags import (
    ENGINE_ONLY_FLAGS,
    SCHEDULING_FLAGS,
    FlagError,
    UsageContext,
    batch_defaults,
    check_batch,
    check_max_model_len,
    default_max_model_len,
    flag_model,
    resolve_batch,
)
from engine.core.scheduler_config import SchedulerConfig
from engine.core.speculative_config import parse_speculative_config


class _SchedulingRules(BaseModel):
    """vLLM's cross-flag rules that need neither the GPU nor the model."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _batch_rules(self) -> Any:
        budget, seqs = self.max_num_batched_tokens, self.max_num_seqs  # type: ignore[attr-defined]
        if budget is not None:
            check_batch(budget, seqs, max_model_len=self.max_model_len,  # type: ignore[attr-defined]
                        enable_chunked_prefill=self.enable_chunked_prefill)  # type: ignore[attr-defined]
        return self

    def resolve_limits(self, *, device_name: str, device_memory_bytes: float,
                       max_position_embeddings: int, usage: UsageContext) -> Any:
        """A copy with `max_model_len`, `max_num_batched_tokens` and `max_num_seqs` filled as vLLM
        fills them for this device and entry point, after its start-up checks."""
        f: Any = self
        mml = f.max_model_len or default_max_model_len(max_position_embeddings)
        check_max_model_len(mml, max_position_embeddings)
        limits = resolve_batch(f.max_num_batched_tokens, f.max_num_seqs, max_model_len=mml,
                               enable_chunked_prefill=f.enable_chunked_prefill,
                               defaults=batch_defaults(device_name, device_memory_bytes, usage))
        return self.model_copy(update={"max_model_len": mml, "max_num_seqs": limits.max_num_seqs,
                                       "max_num_batched_tokens": limits.max_num_batched_tokens})


class SchedulingArgs(flag_model("_SchedulingFields", SCHEDULING_FLAGS, _SchedulingRules)):  # type: ignore[misc]
    """vLLM's scheduling and KV-cache engine arguments (`engine.core.flags.SCHEDULING_FLAGS`).

    `max_num_batched_tokens`, `max_num_seqs` and `max_model_len` may be None: `resolve_limits`
    fills them for the device, the model and the entry point, as vLLM does at start-up.
    """


def scheduler_config(args: SchedulingArgs, *, num_gpu_blocks: int, max_model_len: int | None = None,
                     block_size: int | None = None, num_speculative_tokens: int = 0) -> SchedulerConfig:
    """The scheduler's configuration for `args`, with the KV pool size known at start-up.

    `max_model_len` / `block_size` override the args' values (a coarsened block in the
    simulator); the budgets must be resolved by then.
    """
    a: Any = args
    fields = a.model_dump(include=set(SchedulerConfig.model_fields))
    fields["max_model_len"] = max_model_len or a.max_model_len
    if None in (fields["max_model_len"], a.max_num_batched_tokens, a.max_num_seqs):
        raise ValueError("scheduler_config: max_num_batched_tokens, max_num_seqs and max_model_len are "
                         "unresolved; call resolve_limits (or EngineArgs.resolved) first")
    fields["block_size"] = block_size or a.block_size
    return SchedulerConfig(num_gpu_blocks=num_gpu_blocks, num_speculative_tokens=num_speculative_tokens,
                           **fields)


class EngineArgs(flag_model("_EngineFields", ENGINE_ONLY_FLAGS, SchedulingArgs)):  # type: ignore[misc]
    """What the real engine (`engine.engine_loop.EngineCore`, `engine.llm.LLM`) is started with.

    `usage_context` picks vLLM's defaults: "api_server" models `vllm serve` (`costline engine
    run`), "offline" the `LLM` class (`engine.llm.LLM`, `costline engine bench`).
    """

    usage_context: UsageContext = Field("api_server", description="vllm serve or the offline LLM class")

    @field_validator("speculative_config", mode="before")
    @classmethod
    def _parse_spec(cls, v: Any) -> Any:
        return parse_speculative_config(v)

    @field_validator("device")
    @classmethod
    def _device_name(cls, v: str) -> str:
        # whether the device is there is engine/preflight.py's to say (it needs torch)
        if not re.fullmatch(r"auto|cpu|cuda(:\d{1,3})?", v):
            raise FlagError("device", repr(v), "must be auto, cpu, cuda or cuda:N (N: the GPU's index)")
        return v

    @property
    def num_speculative_tokens(self) -> int:
        return self.speculative_config.num_speculative_tokens if self.speculative_config else 0

    def resolved(self, *, device_name: str, device_memory_bytes: float,
                 max_position_embeddings: int, moe: bool = False) -> EngineArgs:
        """vLLM's start-up values for this device; speculative decoding runs synchronously
        (async scheduling with drafts is out of scope), so async_scheduling resolves to False.

        `moe` (a mixture-of-experts model): unless --max-cudagraph-capture-size was given, mixed
        CUDA graphs are captured up to the token budget. An eager MoE step launches ~1,500 kernels
        from Python (46-85 ms on the H200 whatever the step's size, docs/validation.md), so with
        the dense default every step above 2,048 tokens would wait on its launches."""
        args = self.with_effective_async()
        args = args.resolve_limits(device_name=device_name, device_memory_bytes=device_memory_bytes,
                                   max_position_embeddings=max_position_embeddings,
                                   usage=self.usage_context)
        if moe and "max_cudagraph_capture_size" not in self.model_fields_set:
            args = args.model_copy(update={"max_cudagraph_capture_size": args.max_num_batched_tokens})
        return args

    def with_effective_async(self) -> EngineArgs:
        """This config with async_scheduling as the engine runs it (False with drafts)."""
        if self.speculative_config is not None and self.async_scheduling:
            return self.model_copy(update={"async_scheduling": False})
        return self


__all__ = ["EngineArgs", "SchedulingArgs", "scheduler_config"]
