"""A Llama-family decoder that runs one flattened mixed batch per call over a paged KV cache.

Built from a `ModelSpec`: RMSNorm, rotary embeddings (with Llama-3 frequency scaling when the
spec says so), grouped-query attention, SwiGLU MLP, tied or untied embeddings, optional q/k/v
biases (Qwen2), optional per-head q/k RMSNorm (Qwen3), and a mixture-of-experts MLP where the spec
has experts (router linear -> softmax -> top-k -> renormalised as the model does -> the backend's
`fused_moe`: the per-expert loop or the Triton grouped GEMMs). Q, K and V share one fused
projection and gate/up another, so a dense layer issues four GEMMs; every other step (rotary +
KV-cache store, paged attention, residual add + RMSNorm, SiLU * up) is an entry of the model's `kernels.Backend`: the plain-PyTorch references ("torch")
or the Triton kernels ("triton"), one code path either way. Weights are seeded random unless a
checkpoint is loaded (`engine.loader`).

The batch is flat: `input_ids[T]` and `positions[T]` for all tokens of all sequences of the
step, prefill chunks and decodes together; `AttentionMetadata` says which tokens belong to
which sequence and where their K/V live.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.core.model_spec import ModelSpec
from engine.preflight import check_weights_fit
from engine.tensor_parallel import (
    TPGroup,
    check_tp_shape,
    full_param_shape,
    shard_param,
    vocab_shard_rows,
)
from kernels import Backend, get_backend
from kernels.moe_reference import route_ref

if TYPE_CHECKING:
    from engine.quant import Fp8Weight

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}

INIT_STD = 0.02  # Hugging Face's initializer_range default for Llama


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Inverse rotary frequencies [head_dim/2] in float64, Llama-3 scaled when the spec asks."""
    d = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = spec.rope_scaling
    if rs is None:
        return inv
    # Llama 3: long wavelengths are slowed by `factor`, short ones kept, the band between
    # interpolated linearly in 1/wavelength.
    low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
    high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
    wavelen = 2 * math.pi / inv
    smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    mid = (1 - smooth) * inv / rs.factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / rs.factor, inv)
    return torch.where((wavelen <= low_wavelen) & (wavelen >= high_wavelen), mid, out)


class Rotary(nn.Module):
    """fp32 cos/sin tables [max_positions, head_dim/2] that the backend's `rope_store_kv` indexes
    by position (rotate-half convention)."""

    def __init__(self, spec: ModelSpec, max_positions: int, device: torch.device) -> None:
        super().__init__()
        inv = rope_inv_freq(spec).to(device)
        t = torch.arange(max_positions, dtype=torch.float64, device=device)
        freqs = torch.outer(t, inv)
        self.register_buffer("cos", freqs.cos().float(), persistent=False)  # [P, D/2]
        self.register_buffer("sin", freqs.sin().float(), persistent=False)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, device, dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's fused RMSNorm (accumulates in fp32 for half types).
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class DecoderLayer(nn.Module):
    """One layer; under tensor parallelism (`tp` ranks) its heads and MLP slice of this rank."""

    def __init__(self, spec: ModelSpec, device, dtype, tp: int = 1) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.hq, self.hkv, self.d = spec.num_heads // tp, spec.num_kv_heads // tp, d
        inter = spec.intermediate_size // tp
        self.scale = d**-0.5
        kw = {"device": device, "dtype": dtype}
        self.input_layernorm = RMSNorm(h, spec.rms_norm_eps, **kw)
        self.qkv_proj = nn.Linear(h, (self.hq + 2 * self.hkv) * d, bias=spec.qkv_bias, **kw)
        self.o_proj = nn.Linear(self.hq * d, h, bias=False, **kw)
        self.post_attention_layernorm = RMSNorm(h, spec.rms_norm_eps, **kw)
        # Qwen3: RMSNorm over each q and k head (weights [head_dim]) before RoPE
        self.q_norm = RMSNorm(d, spec.rms_norm_eps, **kw) if spec.qk_norm else None
        self.k_norm = RMSNorm(d, spec.rms_norm_eps, **kw) if spec.qk_norm else None
        self.is_moe, self.top_k, self.renormalize = spec.is_moe, spec.experts_per_token, spec.norm_topk_prob
        if spec.is_moe:  # router + experts (kernels/moe_reference.py: w13 [E, 2N, H], w2 [E, H, N])
            e, n = spec.num_experts, spec.moe_intermediate_size
            self.router = nn.Linear(h, e, bias=False, **kw)
            self.w13 = nn.Parameter(torch.empty(e, 2 * n, h, **kw))
            self.w2 = nn.Parameter(torch.empty(e, h, n, **kw))
        else:
            self.gate_up_proj = nn.Linear(h, 2 * inter, bias=False, **kw)
            self.down_proj = nn.Linear(inter, h, bias=False, **kw)
        # FP8 KV-cache scales (stored = fp8(x / scale)); 1.0 is vLLM's default when the
        # checkpoint carries none. A 16-bit cache ignores them.
        self.register_buffer("k_scale", torch.ones(1, device=device, dtype=torch.float32),
                             persistent=False)
        self.register_buffer("v_scale", torch.ones(1, device=device, dtype=torch.float32),
                             persistent=False)
        # --quantization fp8: projection name -> its FP8 weight (engine/quant.py), used in place
        # of the 16-bit one
        self.fp8: dict[str, Fp8Weight] = {}

    def project(self, backend: Backend, name: str, x: torch.Tensor) -> torch.Tensor:
        """`x` through the projection `name` (qkv_proj, o_proj, gate_up_proj, down_proj)."""
        lin, q = getattr(self, name), self.fp8.get(name)
        if q is None:
            return backend.linear(x, lin.weight, lin.bias)
        return backend.linear_fp8(x, q.weight, q.scale, lin.bias)

    def forward(self, x: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, rotary: Rotary,
                backend: Backend, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, tp: TPGroup | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer. `h` is input_layernorm(x), computed by the caller together with the previous
        residual add; returns (x after attention, MLP output), whose sum (and the next norm) the
        caller computes in one `add_rms_norm`. Under tensor parallelism the o projection's
        partial sums are all-reduced here, the MLP's by the caller."""
        t, hq, hkv, d = x.shape[0], self.hq, self.hkv, self.d
        qkv = self.project(backend, "qkv_proj", h)
        if self.q_norm is not None:
            qkv = self.norm_qk(qkv)
        q = backend.rope_store_kv(qkv, positions, rotary.cos, rotary.sin, k_cache,
                                  v_cache, meta.slot_mapping, hq, hkv, d, self.k_scale,
                                  self.v_scale)
        o = backend.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                    meta.query_start_loc, self.scale, meta.max_query_len,
                                    meta.max_seq_len, k_scale=self.k_scale, v_scale=self.v_scale,
                                    num_decode_seqs=meta.num_decode_seqs, work=meta.work)
        attn = self.project(backend, "o_proj", o.reshape(t, hq * d))
        if tp is not None:
            attn = tp.all_reduce(attn)
        x, h = backend.add_rms_norm(x, attn, self.post_attention_layernorm.weight,
                                    self.post_attention_layernorm.eps)
        if self.is_moe:
            return x, self.moe(backend, h)
        gate_up = self.project(backend, "gate_up_proj", h)
        return x, self.project(backend, "down_proj", backend.silu_mul(gate_up))

    def norm_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        """qkv with every q and k head RMS-normalised over head_dim (Qwen3's q_norm / k_norm)."""
        t, q_n, kv_n = qkv.shape[0], self.hq * self.d, self.hkv * self.d
        q = self.q_norm(qkv[:, :q_n].reshape(t, self.hq, self.d)).reshape(t, q_n)
        k = self.k_norm(qkv[:, q_n:q_n + kv_n].reshape(t, self.hkv, self.d)).reshape(t, kv_n)
        return torch.cat([q, k, qkv[:, q_n + kv_n:]], dim=1)

    def moe(self, backend: Backend, h: torch.Tensor) -> torch.Tensor:
        """The mixture-of-experts MLP: route each token to its top-k experts, run them, sum."""
        weights, ids = route_ref(backend.linear(h, self.router.weight), self.top_k, self.renormalize)
        return backend.fused_moe(h, self.w13, self.w2, weights, ids)


class LlamaModel(nn.Module):
    """Decoder + LM head. `forward` gives hidden states; `compute_logits` the logits.

    `attention_backend` names the `kernels.Backend` every kernel call goes to ("torch" or
    "triton"; the engine config's field of the same name). `tp`: this rank's tensor-parallel
    group (engine/tensor_parallel.py); the model then holds this rank's shard of every weight,
    drawn from the same seeded full tensors as the unsharded model, so every tp computes the
    same function.
    """

    def __init__(self, spec: ModelSpec, *, max_positions: int, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, attention_backend: str = "torch",
                 seed: int | None = 0, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.spec = spec
        device = torch.device(device)
        dtype = dtype or TORCH_DTYPES[spec.dtype]
        world = 1 if tp is None else tp.world_size
        check_tp_shape(spec, world)
        check_weights_fit(spec, dtype.itemsize / world, device)  # before a byte is allocated
        self.dtype = dtype
        self.tp_group = tp  # this rank's group, as given (the runner pages and mirrors by it)
        self.tp = tp if tp is not None and tp.active else None  # None: no collective anywhere
        self.tp_size, self.tp_rank = world, 0 if tp is None else tp.rank
        self.vocab_rows = vocab_shard_rows(spec.vocab_size, world)  # this rank's vocabulary rows
        kw = {"device": device, "dtype": dtype}
        self.embed_tokens = nn.Parameter(torch.empty(self.vocab_rows, spec.hidden_size, **kw))
        self.layers = nn.ModuleList(DecoderLayer(spec, device, dtype, world) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **kw)
        self.lm_head = (
            None if spec.tie_word_embeddings
            else nn.Parameter(torch.empty(self.vocab_rows, spec.hidden_size, **kw))
        )
        self.rotary = Rotary(spec, max_positions, device)
        self.backend = get_backend(attention_backend)
        # EAGLE-3 (engine/spec_decode/eagle.py): layer index -> column slot of `aux_hidden`, the
        # residual stream after those layers for every token of the last forward. Empty (no copy,
        # one dict test per layer) unless a proposer asks for them.
        self._aux_at: dict[int, list[int]] = {}
        self.aux_hidden = torch.empty(0)
        if seed is not None:
            self.init_random(seed)

    def enable_aux_hidden(self, layers: tuple[int, ...], max_tokens: int) -> None:
        """Keep the residual stream after each of `layers` (in that order, side by side) in the
        persistent buffer `aux_hidden` [max_tokens, len(layers) x hidden] on every forward:
        written in place, so CUDA graphs captured afterwards write it too."""
        n = len(self.layers)
        if not layers or any(not 0 <= i < n for i in layers):
            raise ValueError(f"aux hidden-state layers {layers} must be 0..{n - 1} (the model has {n} layers)")
        self._aux_at = {}
        for slot, i in enumerate(layers):
            self._aux_at.setdefault(i, []).append(slot)
        self.aux_hidden = torch.zeros(max_tokens, len(layers) * self.spec.hidden_size, dtype=self.dtype,
                                      device=self.embed_tokens.device)

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded random weights: N(0, 0.02) for matrices and biases, ones for norms. Under
        tensor parallelism each full tensor is drawn (one at a time, in the same order) and this
        rank's shard kept, so the shards are those of the unsharded model's weights."""
        g = torch.Generator(device=self.embed_tokens.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):  # input/post-attention, q/k and the final norm
                p.fill_(1.0)
            elif self.tp_size == 1:
                p.normal_(0.0, INIT_STD, generator=g)
            else:
                full = torch.empty(full_param_shape(name, self.spec), device=p.device, dtype=p.dtype)
                p.copy_(shard_param(name, full.normal_(0.0, INIT_STD, generator=g), self.spec,
                                    self.tp_size, self.tp_rank))

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy in the unsharded weights `state` (this model's parameter names), keeping this
        rank's shard of each."""
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        if missing:
            raise ValueError(f"load_full_state_dict: missing {missing[:5]}")
        for name, p in params.items():
            p.copy_(shard_param(name, state[name].to(p.device), self.spec, self.tp_size, self.tp_rank))

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens if self.lm_head is None else self.lm_head

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [T, hidden]; vocab-parallel: each rank looks up the ids of its rows
        (zeros for the others) and one all-reduce sums them."""
        if self.tp is None:
            return F.embedding(input_ids, self.embed_tokens)
        lo = self.tp_rank * self.vocab_rows
        local = input_ids - lo
        mine = (local >= 0) & (local < self.vocab_rows)
        x = F.embedding(local.clamp(0, self.vocab_rows - 1), self.embed_tokens)
        return self.tp.all_reduce(x * mine.unsqueeze(1).to(x.dtype))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm.

        kv_caches: [num_layers, 2, num_blocks, block_size, num_kv_heads / tp, head_dim].
        """
        x = self.embed(input_ids)
        h = self.layers[0].input_layernorm(x)
        n, tp = len(self.layers), self.tp
        aux_at = self._aux_at
        for i, layer in enumerate(self.layers):
            x, delta = layer(x, h, positions, self.rotary, self.backend, kv_caches[i, 0],
                             kv_caches[i, 1], meta, tp)
            if tp is not None:
                delta = tp.all_reduce(delta)
            norm = self.layers[i + 1].input_layernorm if i + 1 < n else self.norm
            x, h = self.backend.add_rms_norm(x, delta, norm.weight, norm.eps)
            if aux_at and i in aux_at:
                self._keep_aux(i, x)
        return h

    def disable_aux_hidden(self) -> None:
        """Stop keeping aux hidden states (a model shared by engines built one after another)."""
        self._aux_at = {}
        self.aux_hidden = torch.empty(0)

    def _keep_aux(self, layer: int, x: torch.Tensor) -> None:
        t, w = x.shape[0], self.spec.hidden_size
        if t > self.aux_hidden.shape[0]:
            raise RuntimeError(f"a forward of {t} tokens exceeds the aux hidden-state buffer "
                               f"({self.aux_hidden.shape[0]} rows): enable_aux_hidden with a larger max_tokens")
        for slot in self._aux_at[layer]:
            self.aux_hidden[:t, slot * w:(slot + 1) * w].copy_(x)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Logits in the model dtype. Not upcast here: a greedy argmax over bf16 logits picks
        what it would over their exact fp32 copies, and at batch 128 x 128k vocab the upcast
        is a 64 MB write per step; the sampler upcasts only the rows it samples at random.
        Vocab-parallel: each rank's [T, vocab / tp] all-gathered into every rank's full row."""
        if self.tp is not None:
            local = self.backend.linear(hidden, self.lm_head_weight)
            return self.tp.gather_vocab(local, self.spec.vocab_size, out)
        if out is not None:  # into a caller's buffer (the CUDA graphs share one)
            return self.backend.linear(hidden, self.lm_head_weight, out=out)
        return self.backend.linear(hidden, self.lm_head_weight)
