"""An independent dense reference for the engine's model: whole-sequence causal forward, no KV cache.

Written from the Llama papers/HF conventions, not from engine/model.py: per-frequency Python loop
for the Llama-3 rope scaling, explicit GQA by repeating K/V heads, a causal mask, fp64 math.
Qwen3's per-head q/k norms and a mixture-of-experts MLP (Qwen3-MoE's weight names) token by token:
softmax over the router logits, the k largest, renormalised when the spec says, each expert's
SwiGLU from its own gate/up/down matrices.
"""

from __future__ import annotations

import math

import torch

from engine.core.model_spec import ModelSpec


def _inv_freq(spec: ModelSpec) -> torch.Tensor:
    d = spec.head_dim
    freqs = []
    for i in range(0, d, 2):
        f = 1.0 / spec.rope_theta ** (i / d)
        rs = spec.rope_scaling
        if rs is not None:
            wavelen = 2 * math.pi / f
            lo = rs.original_max_position_embeddings / rs.low_freq_factor
            hi = rs.original_max_position_embeddings / rs.high_freq_factor
            if wavelen > lo:
                f = f / rs.factor
            elif wavelen >= hi:
                a = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
                    rs.high_freq_factor - rs.low_freq_factor)
                f = (1 - a) * f / rs.factor + a * f
        freqs.append(f)
    return torch.tensor(freqs, dtype=torch.float64)


def _swiglu(w: dict[str, torch.Tensor], p: str, h: torch.Tensor) -> torch.Tensor:
    g = h @ w[p + "gate_proj.weight"].T
    u = h @ w[p + "up_proj.weight"].T
    return (torch.nn.functional.silu(g) * u) @ w[p + "down_proj.weight"].T


def _moe(spec: ModelSpec, w: dict[str, torch.Tensor], p: str, h: torch.Tensor) -> torch.Tensor:
    """Each token through its top-k experts, one token at a time."""
    out = torch.zeros_like(h)
    for t in range(h.shape[0]):
        probs = torch.softmax(h[t] @ w[p + "mlp.gate.weight"].T, dim=-1)
        top = sorted(range(spec.num_experts), key=lambda e: -float(probs[e]))[: spec.experts_per_token]
        total = sum(float(probs[e]) for e in top) if spec.norm_topk_prob else 1.0
        for e in top:
            out[t] += float(probs[e]) / total * _swiglu(w, f"{p}mlp.experts.{e}.", h[t:t + 1])[0]
    return out


def dense_logits(spec: ModelSpec, w: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), vocab] of a plain causal forward over the whole sequence (fp64)."""
    w = {k: v.double() for k, v in w.items()}
    n = len(tokens)
    ids = torch.tensor(tokens)
    x = w["model.embed_tokens.weight"][ids]
    ang = torch.arange(n, dtype=torch.float64)[:, None] * _inv_freq(spec)[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]

    def rope(t):
        half = t.shape[-1] // 2
        rot = torch.cat([-t[..., half:], t[..., :half]], -1)
        return t * cos + rot * sin

    def norm(t, g):
        return g * t / torch.sqrt((t * t).mean(-1, keepdim=True) + spec.rms_norm_eps)

    hq, hkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if spec.qkv_bias:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q, k = q.view(n, hq, d), k.view(n, hkv, d)
        if spec.qk_norm:
            q, k = norm(q, w[p + "self_attn.q_norm.weight"]), norm(k, w[p + "self_attn.k_norm.weight"])
        q = rope(q)
        k = rope(k).repeat_interleave(hq // hkv, dim=1)
        v = v.view(n, hkv, d).repeat_interleave(hq // hkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        s = s.masked_fill(~mask, float("-inf"))
        o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(n, hq * d)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        x = x + (_moe(spec, w, p, h) if spec.is_moe else _swiglu(w, p + "mlp.", h))
    x = norm(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def greedy_reference(spec: ModelSpec, w: dict[str, torch.Tensor], prompt: list[int],
                     max_tokens: int) -> list[int]:
    """Greedy tokens, recomputing the whole sequence at every step."""
    seq = list(prompt)
    out = []
    for _ in range(max_tokens):
        nxt = int(dense_logits(spec, w, seq)[-1].argmax())
        out.append(nxt)
        seq.append(nxt)
    return out
