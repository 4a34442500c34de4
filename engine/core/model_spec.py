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
    """A Llama-family decoder-only transformer."""

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

    @model_validator(mode="after")
    def _check_gqa(self) -> ModelSpec:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        return self

    # --- parameter and byte counts -------------------------------------------------
    @property
    def params_per_layer(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q = h * self.num_heads * d
        kv = 2 * h * self.num_kv_heads * d
        o = self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size  # gate, up, down (SwiGLU)
        norms = 2 * h
        bias = (self.num_heads + 2 * self.num_kv_heads) * d if self.qkv_bias else 0
        return q + kv + o + mlp + norms + bias

    @property
    def num_params(self) -> int:
        """Total parameters, embeddings and LM head included."""
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else emb
        return emb + head + self.num_layers * self.params_per_layer + self.hidden_size

    @property
    def num_matmul_params_per_token(self) -> int:
        """Parameters touched by GEMMs per token (layers + LM head; not the embedding gather)."""
        return self.num_layers * self.params_per_layer + self.vocab_size * self.hidden_size

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
        # A tiny model for CPU tests of the engine.
        ModelSpec(
            name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=512, max_position_embeddings=4096, dtype="float32",
        ),
    ]
}


def get_model(name: str) -> ModelSpec:
    """A model preset by name (case-insensitive)."""
    try:
        return MODEL_PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(MODEL_PRESETS)}") from None
