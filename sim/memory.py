"""GPU memory plan of one replica: weights, draft weights, activation reserve, KV blocks.

vLLM sizes its KV cache as `gpu_memory_utilization x HBM` minus what the model run
needs: weights, the peak activations of a profiling forward pass at
`max_num_batched_tokens`, and non-torch memory (CUDA context, NCCL buffers, CUDA
graphs). Whatever is left becomes `num_gpu_blocks` blocks of `block_size` tokens.
A draft model or EAGLE head is loaded on the same GPUs, so its weights come out of
the KV budget (the "10-15% of memory" cost line of speculative decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.flags import FlagError
from engine.core.model_spec import ModelSpec, dtype_bytes, get_model
from sim.config import EngineConfig, SpeculativeConfig
from sim.cost_model import CostProfile, MemoryTerms
from sim.hardware import GPUSpec, kv_capacity_blocks, kv_capacity_tokens

# CUDA context + cuBLAS workspaces + CUDA graphs + NCCL buffers per GPU, outside torch's
# allocator; vLLM's profiler counts it against gpu_memory_utilization. ~1.5 GiB is what
# vLLM start-up logs typically report as "non-torch memory" on Hopper-class GPUs.
NON_TORCH_BYTES_PER_GPU = 1.5 * 2**30


def draft_spec(target: ModelSpec, spec: SpeculativeConfig | None) -> ModelSpec | None:
    """The model the proposer runs on the GPU, or None for proposers without one (n-gram).

    EAGLE / MTP heads are one decoder layer of the target's shape (plus an input
    projection of 2h x h) that reuse the target's embedding and LM head; a mixture of experts'
    head is a dense layer of the config's dense width (`intermediate_size`), as the public
    EAGLE heads of MoE targets are.
    """
    if spec is None or spec.method == "ngram":
        return None
    if spec.method == "draft_model":
        return get_model(spec.model or "")
    dense = {"num_experts": 0, "experts_per_token": 0, "moe_intermediate_size": 0}
    return target.model_copy(update={"name": f"{target.name}-{spec.method}-head", "num_layers": 1, **dense})


def draft_weight_bytes(target: ModelSpec, spec: SpeculativeConfig | None, weight_dtype: str | None) -> float:
    """Extra weight bytes the proposer puts on the replica's GPUs (all of them together)."""
    d = draft_spec(target, spec)
    if d is None:
        return 0.0
    if spec is not None and spec.method == "draft_model":
        return d.weight_bytes(weight_dtype)
    # a head: one layer + the fusion projection; embedding and LM head are shared
    per_elem = dtype_bytes(weight_dtype or target.dtype)
    return (d.params_per_layer + 2 * target.hidden_size**2) * per_elem


def activation_reserve_bytes(model: ModelSpec, engine: EngineConfig) -> float:
    """Peak activations of vLLM's profiling run plus non-torch memory, all GPUs together.

    The profiling forward runs `max_num_batched_tokens` tokens: the widest live tensors
    are the MLP's gate/up outputs (2 x intermediate) and a few hidden-size buffers per
    token, sharded by TP; the sampler holds fp32 logits for up to `max_num_seqs` rows.
    A mixture of experts holds, per token, its k experts' activations (k x expert width) and
    their k weighted outputs (k x hidden) until they are summed (kernels/fused_moe.py).
    """
    tp = engine.tensor_parallel_size
    tokens = engine.max_num_batched_tokens or 8192
    act_elem = dtype_bytes(model.dtype)
    if model.is_moe:
        k = model.experts_per_token
        per_token = (k * model.moe_intermediate_size / tp + k * model.hidden_size + 4 * model.hidden_size) * act_elem
    else:
        per_token = (2 * model.intermediate_size / tp + 4 * model.hidden_size) * act_elem
    logits = min(engine.max_num_seqs or 256, tokens) * model.vocab_size * 4
    return tp * (tokens * per_token + logits + NON_TORCH_BYTES_PER_GPU)


def _does_not_fit(model: ModelSpec, gpu: GPUSpec, engine: EngineConfig, budget: float, weights: float,
                  draft: float, reserve: float) -> str:
    """vLLM's "No available memory for the cache blocks", with the figures and the fix."""
    tp = engine.tensor_parallel_size
    parts = f"weights {weights / 1e9:.1f} GB" + (f" + draft {draft / 1e9:.1f} GB" if draft else "")
    parts += f" + activations at --max-num-batched-tokens {engine.max_num_batched_tokens} {reserve / 1e9:.1f} GB"
    fixes = "raise --tensor-parallel-size, use --quantization fp8, or a bigger GPU"
    if reserve > weights:  # the profiling run's budget, not the model, is what does not fit
        fixes = "lower --max-num-batched-tokens, or " + fixes
    return (f"{model.name} does not fit on {tp}x {gpu.name} at --gpu-memory-utilization "
            f"{engine.gpu_memory_utilization}: {parts} = {(weights + draft + reserve) / 1e9:.1f} GB of "
            f"{budget / 1e9:.1f} GB leave no room for the KV cache; {fixes}")


def check_one_request_fits(capacity_tokens: int, max_model_len: int, kv_bytes_per_token: float, *,
                           where: str) -> None:
    """vLLM refuses to start when the KV cache cannot hold one request of max_model_len tokens
    (vllm/v1/core/kv_cache_utils.py `check_enough_kv_cache_memory`), naming the length that fits."""
    if capacity_tokens >= max_model_len:
        return
    need_gib = max_model_len * kv_bytes_per_token / 2**30
    have_gib = capacity_tokens * kv_bytes_per_token / 2**30
    raise FlagError("max_model_len", max_model_len,
                    f"one request of this length needs {need_gib:.2f} GiB of KV cache, more than the "
                    f"{have_gib:.2f} GiB left on {where}; the estimated maximum model length is "
                    f"{capacity_tokens}: lower {{max_model_len}} to {capacity_tokens} or less, raise "
                    "{gpu_memory_utilization} or {tensor_parallel_size}, or use {kv_cache_dtype} fp8")


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per replica (summed over its TP GPUs) and the resulting KV blocks."""

    budget_bytes: float
    weight_bytes: float
    draft_weight_bytes: float
    activation_reserve_bytes: float
    kv_bytes_per_token: float
    kv_capacity_tokens: int
    num_gpu_blocks: int
    block_size: int

    @property
    def kv_bytes(self) -> float:
        return self.kv_capacity_tokens * self.kv_bytes_per_token

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"kv_bytes": self.kv_bytes}


def measured_memory(profile: CostProfile | None, model: ModelSpec, gpu: GPUSpec) -> MemoryTerms | None:
    """The profile's measured memory terms when they describe this model (its weights and
    activations; on another GPU the datasheet memory size stands in for the measured one)."""
    if profile is None or profile.memory is None or profile.model != model.name:
        return None
    if profile.hardware != gpu.name and profile.memory.total_bytes is not None:
        return profile.memory.model_copy(update={"total_bytes": None})
    return profile.memory


def fitted_kv_blocks(mem: MemoryTerms, gpu: GPUSpec, engine: EngineConfig, weight_bytes: float,
                     draft_bytes: float, kv_bytes_per_token: float) -> tuple[int, float]:
    """(blocks, reserve bytes of all GPUs) by the engine's own sizing rule (engine/runner.py
    allocate_kv_cache) with the profile's measured terms: per GPU, blocks = (total x utilization
    - weights - profiling activations - non-torch memory) // block bytes."""
    tp = engine.tensor_parallel_size
    total = mem.total_bytes or gpu.hbm_bytes
    act = mem.activation_bytes + mem.activation_bytes_per_batched_token * (engine.max_num_batched_tokens or 8192)
    free = total * engine.gpu_memory_utilization - (weight_bytes + draft_bytes) / tp - act - mem.non_torch_bytes
    block_bytes = kv_bytes_per_token * engine.block_size / tp
    return max(int(free // block_bytes), 0), tp * (act + mem.non_torch_bytes)


def plan_memory(model: ModelSpec, gpu: GPUSpec, engine: EngineConfig,
                profile: CostProfile | None = None) -> MemoryPlan:
    """Size one replica's KV cache; raises with the fix when the model does not fit. A profile
    with measured memory terms for this model (`CostProfile.memory`) replaces the estimates of
    the activation reserve and non-torch memory, so the block count is the engine's."""
    tp = engine.tensor_parallel_size
    wdt = engine.weight_dtype
    draft = draft_weight_bytes(model, engine.speculative_config, wdt)
    reserve = activation_reserve_bytes(model, engine)
    # the proposer keeps KV for its own layers too: each token costs target + draft KV bytes
    d = draft_spec(model, engine.speculative_config)
    draft_kv = d.kv_bytes_per_token(engine.kv_cache_dtype) if d is not None else 0.0
    kv_tok = model.kv_bytes_per_token(engine.kv_cache_dtype) + draft_kv
    mem = measured_memory(profile, model, gpu)
    weights = model.weight_bytes(wdt)
    if mem is not None:
        if wdt is None:  # the measured weights are the model's own dtype's
            weights = mem.weights_bytes
        blocks, reserve = fitted_kv_blocks(mem, gpu, engine, weights, draft, kv_tok)
        tokens = blocks * engine.block_size
    else:
        tokens = kv_capacity_tokens(model, gpu, num_gpus=tp, gpu_memory_utilization=engine.gpu_memory_utilization,
                                    kv_cache_dtype=engine.kv_cache_dtype, weight_dtype=wdt,
                                    extra_weight_bytes=draft, activation_reserve_bytes=reserve,
                                    extra_kv_bytes_per_token=draft_kv)
        blocks = kv_capacity_blocks(tokens, engine.block_size)
    if engine.num_gpu_blocks_override is not None:
        blocks = engine.num_gpu_blocks_override
        tokens = blocks * engine.block_size
    total = (mem.total_bytes if mem is not None else None) or gpu.hbm_bytes
    budget = tp * total * engine.gpu_memory_utilization
    if blocks < 1:
        raise ValueError(_does_not_fit(model, gpu, engine, budget, weights, draft, reserve))
    if engine.num_gpu_blocks_override is None and engine.max_model_len is not None:
        check_one_request_fits(tokens, engine.max_model_len, kv_tok, where=f"{tp}x {gpu.name}")
    return MemoryPlan(budget_bytes=budget, weight_bytes=weights,
                      draft_weight_bytes=draft, activation_reserve_bytes=reserve,
                      kv_bytes_per_token=kv_tok,
                      kv_capacity_tokens=tokens, num_gpu_blocks=blocks, block_size=engine.block_size)


__all__ = [
    "NON_TORCH_BYTES_PER_GPU",
    "MemoryPlan",
    "activation_reserve_bytes",
    "check_one_request_fits",
    "draft_spec",
    "draft_weight_bytes",
    "fitted_kv_blocks",
    "measured_memory",
    "plan_memory",
]
