"""Engine and deployment configuration, spelled with vLLM's flag names.

`EngineConfig` holds what one `vllm serve` instance is started with; `DeploymentConfig`
adds the model, the GPU, how many replicas and how requests are routed, and the
disaggregated prefill/decode split. Every field name is the vLLM engine argument
with dashes turned to underscores, so that a configuration prints as a runnable
`vllm serve` command (`EngineConfig.to_vllm_args`).

Defaults that vLLM resolves at start-up from the GPU and model (`max_num_batched_tokens`,
`max_num_seqs`, `max_model_len`) are `None` here and resolved by `resolved_for` with the
engine's own rules (`engine.core.flags`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.core.config import SchedulingArgs
from engine.core.flags import (
    SCHEDULING_FLAGS,
    Flag,
    check_block_size,
    check_tensor_parallel,
    flag_model,
)
from engine.core.model_spec import ModelSpec
from engine.core.speculative_config import SpeculativeConfig as EngineSpeculativeConfig
from sim.expert_parallel import check_expert_parallel
from sim.hardware import GB, GPUSpec
from sim.links import DEFAULT_LINK_LATENCY_S, measured_link

SpecMethod = Literal["draft_model", "ngram", "eagle", "eagle3", "mtp"]
RouterPolicy = Literal["round_robin", "least_loaded", "prefix_aware"]


class SpeculativeConfig(EngineSpeculativeConfig):
    """vLLM's `--speculative-config` JSON: the engine's keys (engine/core/speculative_config.py), more
    methods, and the simulator's acceptance model."""

    method: SpecMethod | None = None  # type: ignore[assignment]
    model: str | None = None  # draft model preset name (draft_model) / head repo (ignored)
    draft_tensor_parallel_size: int | None = None
    # Not vLLM keys: the acceptance model of the simulated workload. Per task category,
    # (a, b) of the Beta distribution each request's per-token acceptance alpha is drawn from.
    # None = the built-in table for the method (sim/speculative.py).
    acceptance_beta: dict[str, tuple[float, float]] | None = None
    acceptance_drift_per_s: float = 0.0  # alpha changes by this much per simulated second

    @model_validator(mode="after")
    def _check(self) -> SpeculativeConfig:
        if self.method is None:
            raise ValueError('speculative_config: needs "method" (e.g. "ngram") or a draft "model"')
        if self.method == "draft_model" and not self.model:
            raise ValueError('speculative_config: method "draft_model" needs "model" (a model preset name)')
        return self

    def vllm_json(self) -> str:
        """The JSON to paste after `--speculative-config` (simulator-only keys left out)."""
        keep = self.model_dump(exclude_none=True, exclude={"acceptance_beta", "acceptance_drift_per_s"})
        return json.dumps(keep, separators=(",", ":"))


class DisaggConfig(BaseModel):
    """Disaggregated prefill: P prefill replicas feed D decode replicas over a KV link.

    vLLM configures each instance with `--kv-transfer-config` (a connector and a role);
    the pool sizes and the link are deployment facts, named here.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_prefill_replicas: int = Field(ge=1)
    num_decode_replicas: int = Field(ge=1)
    kv_connector: str = "NixlConnector"
    link: Literal["nvlink", "network"] = "network"
    # per GPU; None = measured for this GPU and link (sim.links), else the GPU spec's bandwidth
    link_gb_per_s: float | None = Field(default=None, gt=0)
    # per transfer (hand-shake, RDMA set-up); None = measured (sim.links), else 0.5 ms
    link_latency_s: float | None = Field(default=None, ge=0)
    prefill_max_num_batched_tokens: int | None = None  # per-role budgets (vllm PR #6170)
    decode_max_num_batched_tokens: int | None = None

    def link_bandwidth_gb_per_s(self, gpu: GPUSpec) -> float:
        if self.link_gb_per_s is not None:
            return self.link_gb_per_s
        if (m := measured_link(gpu.name, self.link)) is not None:
            return m.gb_per_s
        return gpu.interconnect_gb_per_s if self.link == "nvlink" else gpu.network_gb_per_s

    def link_latency(self, gpu: GPUSpec) -> float:
        """Seconds of fixed cost per transfer: as given, else measured, else 0.5 ms."""
        if self.link_latency_s is not None:
            return self.link_latency_s
        m = measured_link(gpu.name, self.link)
        return DEFAULT_LINK_LATENCY_S if m is None else m.latency_s


SIM_ONLY_FLAGS: tuple[Flag, ...] = (
    Flag("kv_cache_dtype", str, "auto", "KV cache element type (auto = the model's dtype)",
         choices=("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")),
    Flag("quantization", str, None, "fp8 = dynamic FP8 weights (W8A8) on a BF16 checkpoint",
         choices=("fp8",), aliases=("-q",)),
    Flag("tensor_parallel_size", int, 1, "GPUs per replica (must divide the attention heads)", ge=1,
         aliases=("-tp",)),
    # vLLM derives the EP size (TP x DP); the simulator's replica is one TP group, so EP = TP.
    # Priced from first principles, not yet validated (sim/expert_parallel.py).
    Flag("enable_expert_parallel", bool, False,
         "MoE: whole experts per GPU (E / TP each), all-to-all",
         negatives=("--no-enable-expert-parallel",)),
    Flag("speculative_config", str, None, 'JSON, e.g. \'{"method":"ngram","num_speculative_tokens":4}\'',
         aliases=("-sc",), annotation=SpeculativeConfig | None),
    # Only the block-size rule depends on it: simulating costline's own engine (calibration,
    # the engine-vs-simulator cross-check) needs the block sizes its kernels accept.
    Flag("attention_backend", str, "flash_attn",
         "vLLM's flash_attn or flashinfer (block size a multiple of 16), or costline's engine (any)",
         choices=("flash_attn", "flashinfer", "costline"), in_vllm=False),
)
# Every flag of a simulated `vllm serve` instance, in `to_vllm_args` order; the dashboard's controls.
ENGINE_CONFIG_FLAGS: tuple[Flag, ...] = SCHEDULING_FLAGS + SIM_ONLY_FLAGS
class EngineConfig(flag_model("_EngineConfigFields", SIM_ONLY_FLAGS, SchedulingArgs)):  # type: ignore[misc]
    """One simulated `vllm serve` instance's engine arguments (`ENGINE_CONFIG_FLAGS`).

    `max_num_batched_tokens`, `max_num_seqs` and `max_model_len` left None are resolved for
    the GPU and model by `resolved_for`, with the same rules as the real engine.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("speculative_config", mode="before")
    @classmethod
    def _parse_spec(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return json.loads(v)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON ({e.msg}); "
                                 """e.g. '{"method":"ngram","num_speculative_tokens":4}'""") from None
            except (RecursionError, ValueError) as e:  # absurd nesting, a 4,300-digit number
                raise ValueError(f"speculative_config is not usable JSON ({e or 'nested too deeply'}); "
                                 """e.g. '{"method":"ngram","num_speculative_tokens":4}'""") from None
        return v

    @model_validator(mode="after")
    def _block_size_rule(self) -> EngineConfig:
        check_block_size(self.block_size, self.attention_backend)
        return self

    def resolved_for(self, gpu: GPUSpec, model: ModelSpec) -> EngineConfig:
        """Fill the GPU-dependent defaults as `vllm serve` does, after vLLM's start-up checks."""
        check_tensor_parallel(model.num_heads, self.tensor_parallel_size)
        check_expert_parallel(model, self.expert_parallel_size)
        return self.resolve_limits(device_name=gpu.name, device_memory_bytes=gpu.hbm_bytes,
                                   max_position_embeddings=model.max_position_embeddings,
                                   usage="api_server")

    @property
    def weight_dtype(self) -> str | None:
        return "fp8" if self.quantization == "fp8" else None

    @property
    def expert_parallel_size(self) -> int:
        """GPUs the experts are spread over whole: the replica's TP size with EP on, else 1."""
        return self.tensor_parallel_size if self.enable_expert_parallel else 1

    @property
    def num_speculative_tokens(self) -> int:
        return self.speculative_config.num_speculative_tokens if self.speculative_config else 0

    def to_vllm_args(self, baseline: EngineConfig | None = None) -> list[str]:
        """Flags that differ from vLLM's defaults, as `vllm serve` arguments.

        `baseline`: the defaults to compare with, e.g. `EngineConfig().resolved_for(gpu, model)`
        when this config was resolved too (vLLM's defaults depend on the GPU).
        """
        base = baseline or EngineConfig()
        args: list[str] = []
        for flag in ENGINE_CONFIG_FLAGS:
            value = getattr(self, flag.name)
            if value != getattr(base, flag.name):
                args += flag.vllm_args(value)
        return args


class DeploymentConfig(BaseModel):
    """What runs where: model, GPU, engine flags, replica count, routing, P/D split."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    model: ModelSpec
    gpu: GPUSpec
    engine: EngineConfig = EngineConfig()
    num_replicas: int = Field(default=1, ge=1)  # data-parallel replicas (aggregated serving)
    router: RouterPolicy = "least_loaded"
    disaggregation: DisaggConfig | None = None

    @property
    def num_gpus(self) -> int:
        tp = self.engine.tensor_parallel_size
        if self.disaggregation:
            d = self.disaggregation
            return (d.num_prefill_replicas + d.num_decode_replicas) * tp
        return self.num_replicas * tp

    def describe(self) -> str:
        pd = self.disaggregation
        layout = (f"{pd.num_prefill_replicas}P+{pd.num_decode_replicas}D" if pd
                  else f"{self.num_replicas} replica(s)")
        return (f"{self.model.name} on {self.num_gpus}x {self.gpu.name} "
                f"(TP{self.engine.tensor_parallel_size}, {layout}, router {self.router})")


__all__ = ["ENGINE_CONFIG_FLAGS", "GB", "SIM_ONLY_FLAGS", "DeploymentConfig", "DisaggConfig", "EngineConfig",
           "SpeculativeConfig"]
