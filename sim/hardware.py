"""GPU specs and the memory arithmetic that sizes a deployment's KV cache."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from engine.core.model_spec import ModelSpec, blocks_for_tokens, dtype_bytes

GB = 1e9


class GPUSpec(BaseModel):
    """One accelerator, from its vendor datasheet (dense rates, no sparsity)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    hbm_bytes: float = Field(gt=0)
    hbm_gb_per_s: float = Field(gt=0)  # GB/s (1e9 bytes/s)
    bf16_tflops: float = Field(gt=0)  # dense
    fp8_tflops: float | None = None  # dense; None where the chip has no FP8 tensor cores
    nvlink_gb_per_s: float = 0.0  # per-GPU NVLink bandwidth, GB/s, one direction; 0 = none (PCIe)
    pcie_gb_per_s: float = 32.0
    network_gb_per_s: float = 25.0  # per-GPU scale-out NIC, GB/s
    source: str = ""

    @property
    def interconnect_gb_per_s(self) -> float:
        """Bandwidth between GPUs of one host: NVLink if present, else PCIe."""
        return self.nvlink_gb_per_s or self.pcie_gb_per_s

    def tflops(self, dtype: str) -> float:
        """Dense matmul rate for `dtype`; FP8 falls back to bf16 where the chip lacks it."""
        if dtype_bytes(dtype) == 1 and self.fp8_tflops:
            return self.fp8_tflops
        return self.bf16_tflops


GPU_PRESETS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        # NVIDIA T4 datasheet: 16 GB GDDR6, 320 GB/s, 65 TFLOPS FP16 mixed precision (no bf16, no fp8).
        GPUSpec(name="t4", hbm_bytes=16 * GB, hbm_gb_per_s=320, bf16_tflops=65, pcie_gb_per_s=16,
                network_gb_per_s=3.125, source="NVIDIA T4 datasheet"),
        # NVIDIA L4 datasheet: 24 GB, 300 GB/s, BF16 242 / FP8 485 TFLOPS with sparsity -> half dense.
        GPUSpec(name="l4", hbm_bytes=24 * GB, hbm_gb_per_s=300, bf16_tflops=121, fp8_tflops=242.5,
                pcie_gb_per_s=32, network_gb_per_s=12.5, source="NVIDIA L4 datasheet"),
        # NVIDIA A100 datasheet (80GB SXM): 2,039 GB/s, BF16 312 TFLOPS dense, NVLink 600 GB/s.
        GPUSpec(name="a100-80gb", hbm_bytes=80 * GB, hbm_gb_per_s=2039, bf16_tflops=312,
                nvlink_gb_per_s=300, pcie_gb_per_s=32, network_gb_per_s=25, source="NVIDIA A100 datasheet"),
        # NVIDIA H100 datasheet (SXM): 80 GB, 3.35 TB/s, BF16 989 / FP8 1,979 TFLOPS dense, NVLink 900 GB/s.
        GPUSpec(name="h100-sxm", hbm_bytes=80 * GB, hbm_gb_per_s=3350, bf16_tflops=989.5,
                fp8_tflops=1979, nvlink_gb_per_s=450, pcie_gb_per_s=64, network_gb_per_s=50,
                source="NVIDIA H100 datasheet"),
        # NVIDIA H200 datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, compute as H100, NVLink 900 GB/s.
        GPUSpec(name="h200", hbm_bytes=141 * GB, hbm_gb_per_s=4800, bf16_tflops=989.5,
                fp8_tflops=1979, nvlink_gb_per_s=450, pcie_gb_per_s=64, network_gb_per_s=50,
                source="NVIDIA H200 datasheet"),
        # NVIDIA HGX B200 datasheet: 180 GB HBM3e and 8 TB/s per GPU, FP16/BF16 2.25 / FP8 4.5
        # PFLOPS dense per GPU, NVLink 5 at 1.8 TB/s.
        GPUSpec(name="b200", hbm_bytes=180 * GB, hbm_gb_per_s=8000, bf16_tflops=2250, fp8_tflops=4500,
                nvlink_gb_per_s=900, pcie_gb_per_s=64, network_gb_per_s=50, source="NVIDIA HGX B200 datasheet"),
    ]
}
# NVLink figures above are per direction (the datasheets quote the bidirectional total).


# short names people type for a preset
GPU_ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb"}


def get_gpu(name: str) -> GPUSpec:
    """A GPU preset by name (case-insensitive; `h100` and `a100` for the SXM 80 GB parts)."""
    key = name.strip().lower()
    try:
        return GPU_PRESETS[GPU_ALIASES.get(key, key)]
    except KeyError:
        raise ValueError(f"unknown GPU preset {name!r}; choose one of {sorted(GPU_PRESETS)}") from None


def _model_preset(name: str) -> str:
    """A preset alias or its Hugging Face id, as the alias; an unknown name is refused naming both."""
    from sim.models import preset_of

    return preset_of(name)


def _model_name(name: str) -> str:
    """A preset alias or Hugging Face id kept as typed (the `vllm serve` line prints the id)."""
    _model_preset(name)
    return name


def _gpu_preset(name: str) -> str:
    return get_gpu(name).name


# A record's field that names a preset: refused at validation, before any work, naming the presets
ModelPreset = Annotated[str, AfterValidator(_model_preset)]
ModelName = Annotated[str, AfterValidator(_model_name)]
GpuPreset = Annotated[str, AfterValidator(_gpu_preset)]


def kv_capacity_tokens(
    model: ModelSpec,
    gpu: GPUSpec,
    num_gpus: int = 1,
    gpu_memory_utilization: float = 0.92,
    kv_cache_dtype: str = "auto",
    weight_dtype: str | None = None,
    extra_weight_bytes: float = 0.0,
    activation_reserve_bytes: float = 0.0,
    extra_kv_bytes_per_token: float = 0.0,
) -> int:
    """Tokens of KV cache that fit once weights and reserves are taken out.

    Weights and KV are sharded across `num_gpus` (tensor parallelism); the budget is
    `gpu_memory_utilization` of each GPU's HBM, as in vLLM. `extra_kv_bytes_per_token`: KV a
    speculative proposer keeps per token beside the target's.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    budget = num_gpus * gpu.hbm_bytes * gpu_memory_utilization
    free = budget - model.weight_bytes(weight_dtype) - extra_weight_bytes - activation_reserve_bytes
    if free <= 0:
        return 0
    return int(free // (model.kv_bytes_per_token(kv_cache_dtype) + extra_kv_bytes_per_token))


def kv_capacity_blocks(capacity_tokens: int, block_size: int) -> int:
    """Whole KV blocks that fit in `capacity_tokens` slots."""
    return capacity_tokens // block_size


def transfer_time_s(num_bytes: float, link_gb_per_s: float, latency_s: float = 0.0) -> float:
    """Seconds to move `num_bytes` over a link of `link_gb_per_s` GB/s plus a fixed latency."""
    return num_bytes / (link_gb_per_s * GB) + latency_s


__all__ = [
    "GPU_PRESETS",
    "GPUSpec",
    "blocks_for_tokens",
    "get_gpu",
    "kv_capacity_blocks",
    "kv_capacity_tokens",
    "transfer_time_s",
]
