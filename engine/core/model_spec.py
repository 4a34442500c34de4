"""Model-architecture spec: what the engine builds and what the cost model counts.

It lives in `engine/` (not `sim/`) because the engine builds models from it and
`engine/` may not import `sim/` (docs/design.md, layers). No torch import here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
KVDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "float32"]


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (vLLM spellings)."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}") from None


class RopeScaling(BaseModel):
    """Llama-3 style frequency scaling (rope_type "llama3" in HF configs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


class ModelSpec(BaseModel):
    """A Llama-family decoder-only transformer, dense or mixture-of-experts.

    A mixture-of-experts model (`num_experts` > 0) replaces every layer's SwiGLU MLP by a router
    (a linear hidden -> num_experts, softmax, top `experts_per_token`, renormalised to sum 1 when
    `norm_topk_prob`) and `num_experts` SwiGLU experts of width `moe_intermediate_size`; each
    token runs through its top-k experts and sums their outputs weighted by the routing weights.
    `intermediate_size` is then the config's dense width, unused by an all-MoE model.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_heads: int = Field(gt=0)  # query heads
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=16)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has biases on q, k, v projections
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 131072
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    qk_norm: bool = False  # Qwen3: an RMSNorm over head_dim on every q and k head before RoPE
    # mixture of experts (0 experts: a dense MLP); HF names: num_experts / num_local_experts,
    # num_experts_per_tok, moe_intermediate_size, norm_topk_prob
    num_experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    moe_intermediate_size: int = Field(default=0, ge=0)
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum 1 (Mixtral, Qwen3)

    @model_validator(mode="after")
    def _check_gqa(self) -> ModelSpec:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        return self

    @model_validator(mode="after")
    def _check_moe(self) -> ModelSpec:
        if self.num_experts == 0:
            if self.experts_per_token or self.moe_intermediate_size:
                raise ValueError("experts_per_token and moe_intermediate_size need num_experts > 0; "
                                 "set num_experts or leave both at 0 for a dense model")
            return self
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) must be in 1..num_experts "
                             f"({self.num_experts})")
        if self.moe_intermediate_size <= 0:
            raise ValueError("moe_intermediate_size must be > 0 for a mixture-of-experts model")
        return self

    # --- parameter and byte counts -------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_params_per_layer(self) -> int:
        """q, k, v, o projections (+ biases, + q/k norms) and the layer's two RMSNorms."""
        h, d = self.hidden_size, self.head_dim
        q = h * self.num_heads * d
        kv = 2 * h * self.num_kv_heads * d
        o = self.num_heads * d * h
        norms = 2 * h + (2 * d if self.qk_norm else 0)
        bias = (self.num_heads + 2 * self.num_kv_heads) * d if self.qkv_bias else 0
        return q + kv + o + norms + bias

    @property
    def expert_params(self) -> int:
        """One SwiGLU expert: gate, up and down projections (0 for a dense model)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def mlp_params_per_layer(self) -> int:
        """All MLP weights of a layer: the dense SwiGLU, or the router and every expert."""
        if self.is_moe:
            return self.router_params + self.num_experts * self.expert_params
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down (SwiGLU)

    @property
    def active_mlp_params_per_layer(self) -> int:
        """MLP weights one token runs through: the dense SwiGLU, or the router and k experts."""
        if self.is_moe:
            return self.router_params + self.experts_per_token * self.expert_params
        return self.mlp_params_per_layer

    @property
    def params_per_layer(self) -> int:
        return self.attention_params_per_layer + self.mlp_params_per_layer

    @property
    def active_params_per_layer(self) -> int:
        return self.attention_params_per_layer + self.active_mlp_params_per_layer

    @property
    def ffn_width_per_token(self) -> int:
        """Intermediate activations one token makes per layer (SwiGLU's width x the experts it
        runs through): the element-wise and activation-memory terms scale with it."""
        if self.is_moe:
            return self.experts_per_token * self.moe_intermediate_size
        return self.intermediate_size

    @property
    def num_params(self) -> int:
        """Total parameters, embeddings and LM head included (every expert: all stay resident)."""
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else emb
        return emb + head + self.num_layers * self.params_per_layer + self.hidden_size

    @property
    def num_active_params(self) -> int:
        """Parameters one token's forward uses (embeddings and LM head included; MoE: k experts)."""
        return self.num_params - self.num_layers * (self.params_per_layer - self.active_params_per_layer)

    @property
    def num_matmul_params_per_token(self) -> int:
        """Parameters touched by GEMMs per token (layers + LM head; not the embedding gather); a
        mixture of experts counts the router and the token's k experts, the FLOPs it costs."""
        return self.num_layers * self.active_params_per_layer + self.vocab_size * self.hidden_size

    def weight_bytes(self, weight_dtype: str | None = None) -> float:
        """Bytes of all weights in `weight_dtype` (default: the model's dtype)."""
        return self.num_params * dtype_bytes(weight_dtype or self.dtype)

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> float:
        """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
        b = dtype_bytes(self.dtype if kv_dtype == "auto" else kv_dtype)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * b


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """KV blocks needed to hold `num_tokens` tokens at `block_size` tokens per block."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return -(-num_tokens // block_size)


_LLAMA31_ROPE = RopeScaling(factor=8.0)

MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # Numbers from each model's Hugging Face config.json.
        ModelSpec(
            name="llama-3.2-1b", num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=8,
            head_dim=64, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
            rope_scaling=RopeScaling(factor=32.0),
        ),
        ModelSpec(
            name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
            head_dim=128, intermediate_size=14336, vocab_size=128256, rope_scaling=_LLAMA31_ROPE,
        ),
        ModelSpec(
            name="llama-3.1-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
            head_dim=128, intermediate_size=28672, vocab_size=128256, rope_scaling=_LLAMA31_ROPE,
        ),
        ModelSpec(
            name="qwen2.5-7b", num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4,
            head_dim=128, intermediate_size=18944, vocab_size=152064, qkv_bias=True,
            rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
        ),
        ModelSpec(
            name="mistral-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
            head_dim=128, intermediate_size=14336, vocab_size=32768, rope_theta=1000000.0,
            max_position_embeddings=32768,
        ),  # Mistral-7B-v0.3
        # The byte-level target/draft pair benchmarks/spec_decode/train_pair.py trains (vocab: 16
        # special ids + 256 bytes, padded to 288), so the simulator can price the measured runs.
        ModelSpec(
            name="byte-lm-100m", num_layers=12, hidden_size=768, num_heads=12, num_kv_heads=4,
            head_dim=64, intermediate_size=3072, vocab_size=288, rope_theta=10000.0,
            max_position_embeddings=4096,
        ),
        ModelSpec(
            name="byte-lm-10m", num_layers=6, hidden_size=384, num_heads=6, num_kv_heads=2,
            head_dim=64, intermediate_size=1024, vocab_size=288, rope_theta=10000.0,
            max_position_embeddings=4096,
        ),
        # Mixtures of experts. Qwen/Qwen3-30B-A3B's config.json (model_type qwen3_moe): 48 layers,
        # hidden 2048, 32 q / 4 kv heads of 128, 128 experts, 8 per token, moe_intermediate_size
        # 768, norm_topk_prob true, no shared expert, qk-norm, rope_theta 1e6, 40960 positions,
        # rms_norm_eps 1e-6, untied (intermediate_size 6144 is the unused dense width); checked
        # 2026-12-02 against the Qwen3MoeForCausalLM configs on the HF hub and the MindSpeed-RL
        # qwen3_30b_a3b recipe. Its model card: 30.5 B parameters, 3.3 B active (these counts
        # give 30.53 B and 3.35 B).
        ModelSpec(
            name="qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4,
            head_dim=128, intermediate_size=6144, vocab_size=151936, rope_theta=1000000.0,
            rms_norm_eps=1e-6, max_position_embeddings=40960, qk_norm=True, num_experts=128,
            experts_per_token=8, moe_intermediate_size=768, norm_topk_prob=True,
        ),
        # mistralai/Mixtral-8x7B-v0.1 (and -Instruct-v0.1, config.json at eba9230 on the HF hub):
        # 32 layers, hidden 4096, 32 q / 8 kv heads of 128, num_local_experts 8, top 2, each
        # expert intermediate_size 14336, vocab 32000, rope_theta 1e6, 32768 positions; the
        # router's top-2 weights are renormalised (HF MixtralSparseMoeBlock). 46.7 B parameters,
        # 12.9 B active (Mistral's announcement; these counts agree).
        ModelSpec(
            name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
            head_dim=128, intermediate_size=14336, vocab_size=32000, rope_theta=1000000.0,
            max_position_embeddings=32768, num_experts=8, experts_per_token=2,
            moe_intermediate_size=14336, norm_topk_prob=True,
        ),
        # A tiny model for CPU tests of the engine.
        ModelSpec(
            name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=512, max_position_embeddings=4096, dtype="float32",
        ),
        # ...and its mixture-of-experts twin (Qwen3-style: qk-norm, renormalised top-k).
        ModelSpec(
            name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=512, max_position_embeddings=4096, dtype="float32",
            qk_norm=True, num_experts=8, experts_per_token=2, moe_intermediate_size=32,
        ),
    ]
}


def get_model(name: str) -> ModelSpec:
    """A model preset by name (case-insensitive)."""
    try:
        return MODEL_PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(MODEL_PRESETS)}") from None
