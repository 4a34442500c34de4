"""Load and save Hugging Face-style model directories: `config.json` plus safetensors.

Reads Llama-family configs (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM), single-file
(`model.safetensors`) or sharded (`model.safetensors.index.json` + shards). HF keeps q/k/v and
gate/up as separate matrices; the engine fuses them at load and splits them again at save.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.core.input_files import InputFileError, expect, expect_object, read_json
from engine.core.model_spec import ModelSpec
from engine.hf_config import SUPPORTED_ARCHS, spec_from_hf_config, spec_of_folder
from engine.model import TORCH_DTYPES, LlamaModel
from engine.tensor_parallel import TPGroup


def hf_config_from_spec(spec: ModelSpec) -> dict:
    arch = "Qwen2ForCausalLM" if spec.qkv_bias else "LlamaForCausalLM"
    cfg = {
        "architectures": [arch],
        "model_type": "qwen2" if spec.qkv_bias else "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": spec.dtype,
    }
    if spec.is_moe:  # Qwen3-MoE's names (what _hf_tensors writes); loading one back is not supported yet
        cfg |= {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                "num_experts": spec.num_experts, "num_experts_per_tok": spec.experts_per_token,
                "moe_intermediate_size": spec.moe_intermediate_size, "norm_topk_prob": spec.norm_topk_prob,
                "decoder_sparse_step": 1, "mlp_only_layers": []}
    if spec.rope_scaling is not None:
        rs = spec.rope_scaling
        cfg["rope_scaling"] = {
            "rope_type": "llama3", "factor": rs.factor, "low_freq_factor": rs.low_freq_factor,
            "high_freq_factor": rs.high_freq_factor,
            "original_max_position_embeddings": rs.original_max_position_embeddings,
        }
    return cfg


def _hf_names(model: LlamaModel) -> set[str]:
    """The HF tensor names a checkpoint of this model holds (a sharded model's too)."""
    names = {"model.embed_tokens.weight", "model.norm.weight"} | ({"lm_head.weight"} if model.lm_head is not None
                                                                 else set())
    per_layer = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight"]
    if model.spec.qkv_bias:
        per_layer += ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]
    if model.spec.qk_norm:
        per_layer += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    if model.spec.is_moe:  # Qwen3-MoE names: the router is `mlp.gate`, experts under `mlp.experts.{e}`
        per_layer = [n for n in per_layer if not n.startswith("mlp.")] + ["mlp.gate.weight"] + [
            f"mlp.experts.{e}.{w}_proj.weight" for e in range(model.spec.num_experts) for w in ("gate", "up", "down")]
    return names | {f"model.layers.{i}.{n}" for i in range(len(model.layers)) for n in per_layer}


def _hf_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The model's weights under HF names, q/k/v and gate/up split apart."""
    s = model.spec
    out = {"model.embed_tokens.weight": model.embed_tokens, "model.norm.weight": model.norm.weight}
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head
    q_n, kv_n = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.qkv_proj.weight.split([q_n, kv_n, kv_n])
        out |= {p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v}
        if layer.qkv_proj.bias is not None:
            qb, kb, vb = layer.qkv_proj.bias.split([q_n, kv_n, kv_n])
            out |= {p + "self_attn.q_proj.bias": qb, p + "self_attn.k_proj.bias": kb,
                    p + "self_attn.v_proj.bias": vb}
        out |= {
            p + "self_attn.o_proj.weight": layer.o_proj.weight,
            p + "input_layernorm.weight": layer.input_layernorm.weight,
            p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
        }
        if layer.q_norm is not None:
            out |= {p + "self_attn.q_norm.weight": layer.q_norm.weight, p + "self_attn.k_norm.weight": layer.k_norm.weight}
        out |= _hf_mlp(layer, p, s)
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def _hf_mlp(layer, p: str, s) -> dict[str, torch.Tensor]:
    """A layer's MLP under HF names: Llama's gate/up/down, or Qwen3-MoE's router (`mlp.gate`) and
    `mlp.experts.{e}.{gate,up,down}_proj`."""
    if not s.is_moe:
        gate, up = layer.gate_up_proj.weight.chunk(2)
        return {p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": layer.down_proj.weight}
    out = {p + "mlp.gate.weight": layer.router.weight}
    for e in range(s.num_experts):
        gate, up = layer.w13[e].chunk(2)
        q = f"{p}mlp.experts.{e}."
        out |= {q + "gate_proj.weight": gate, q + "up_proj.weight": up, q + "down_proj.weight": layer.w2[e]}
    return out


def save_model(model: LlamaModel, path: str | Path, max_shard_bytes: int | None = None) -> None:
    """Write config.json and safetensors; sharded with an index when over `max_shard_bytes`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config_from_spec(model.spec), indent=2))
    tensors = _hf_tensors(model)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        weight_map |= {name: fname for name in shard}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _load_file(file: Path) -> dict[str, torch.Tensor]:
    """One safetensors file; a damaged one (header, offsets) is named, not a library error."""
    if not file.is_file():
        raise InputFileError(f"{file}: no such weights file (the index names it); the checkpoint is incomplete")
    try:
        return load_file(str(file))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError for damage
        raise InputFileError(f"{file}: not a readable safetensors file ({str(exc).splitlines()[0]}); the "
                             "checkpoint is damaged: download or save it again") from None


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.exists():
        return _load_file(single)
    if index.exists():
        data = read_json(index, what="safetensors index", fix="save the checkpoint again")
        weight_map = expect_object(index, ["weight_map"], data.get("weight_map"))
        files = set()
        for name, f in weight_map.items():
            expect(index, ["weight_map", name], f, str, "a file name")
            if Path(f).name != f or f in (".", ".."):  # a shard lives in the model folder, nowhere else
                raise InputFileError(f"{index}: key 'weight_map.{name}' names {f!r}, not a file in {path}; "
                                     "a shard must be a plain file name")
            files.add(f)
        out: dict[str, torch.Tensor] = {}
        for f in sorted(files):
            out |= _load_file(path / f)
        return out
    raise FileNotFoundError(f"{path}: neither model.safetensors nor model.safetensors.index.json found")


# Mixtral's names of its MoE tensors -> the Qwen3-MoE names the engine reads and writes
_MIXTRAL_NAMES = ((".block_sparse_moe.gate.", ".mlp.gate."), (".block_sparse_moe.experts.", ".mlp.experts."),
                  (".w1.weight", ".gate_proj.weight"), (".w3.weight", ".up_proj.weight"), (".w2.weight", ".down_proj.weight"))


def _qwen3_moe_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors with Mixtral's MoE names rewritten to Qwen3-MoE's (others unchanged)."""
    if not any(".block_sparse_moe." in k for k in tensors):
        return tensors
    out = {}
    for k, v in tensors.items():
        if ".block_sparse_moe." in k:
            for old, new in _MIXTRAL_NAMES:
                k = k.replace(old, new)
        out[k] = v
    return out


def load_model(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
               attention_backend: str = "torch", max_positions: int | None = None,
               tp: TPGroup | None = None) -> LlamaModel:
    """Build the model a HF-style directory describes and copy its weights in (under tensor
    parallelism, `tp`, this rank's shard of each)."""
    path = Path(path)
    spec = spec_of_folder(path)  # checked, and sized against the device before LlamaModel allocates

    model = LlamaModel(spec, max_positions=max_positions or min(spec.max_position_embeddings, 8192),
                       device=device, dtype=dtype, attention_backend=attention_backend, seed=None, tp=tp)
    tensors = _qwen3_moe_names(_read_tensors(path))
    want = _hf_names(model)
    if spec.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    extra = [e for e in extra if not e.endswith("rotary_emb.inv_freq")]
    if missing or extra:
        raise ValueError(f"{path}: checkpoint does not match the config: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}")
    model.load_full_state_dict(_engine_state(tensors, model))
    return model


def _engine_state(tensors: dict[str, torch.Tensor], model: LlamaModel) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the engine's parameter names, q/k/v and gate/up fused."""
    full = {"embed_tokens": tensors["model.embed_tokens.weight"], "norm.weight": tensors["model.norm.weight"]}
    if model.lm_head is not None:
        full["lm_head"] = tensors["lm_head.weight"]
    for i, layer in enumerate(model.layers):
        p, e = f"model.layers.{i}.", f"layers.{i}."
        g = lambda n, p=p: tensors[p + n]
        full[e + "qkv_proj.weight"] = torch.cat([g("self_attn.q_proj.weight"), g("self_attn.k_proj.weight"),
                                                 g("self_attn.v_proj.weight")])
        if layer.qkv_proj.bias is not None:
            full[e + "qkv_proj.bias"] = torch.cat([g("self_attn.q_proj.bias"), g("self_attn.k_proj.bias"),
                                                   g("self_attn.v_proj.bias")])
        full[e + "o_proj.weight"] = g("self_attn.o_proj.weight")
        if layer.q_norm is not None:
            full[e + "q_norm.weight"], full[e + "k_norm.weight"] = g("self_attn.q_norm.weight"), g("self_attn.k_norm.weight")
        full |= _engine_mlp(g, e, model.spec)
        full[e + "input_layernorm.weight"] = g("input_layernorm.weight")
        full[e + "post_attention_layernorm.weight"] = g("post_attention_layernorm.weight")
    return full


def _engine_mlp(g, e: str, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """A layer's MLP under the engine's names: Llama's fused gate/up and down, or the router and
    each expert's gate/up stacked into `w13` [E, 2N, H] and down into `w2` [E, H, N]."""
    if not spec.is_moe:
        return {e + "gate_up_proj.weight": torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")]),
                e + "down_proj.weight": g("mlp.down_proj.weight")}
    experts = [f"mlp.experts.{x}." for x in range(spec.num_experts)]
    return {e + "router.weight": g("mlp.gate.weight"),
            e + "w13": torch.stack([torch.cat([g(q + "gate_proj.weight"), g(q + "up_proj.weight")]) for q in experts]),
            e + "w2": torch.stack([g(q + "down_proj.weight") for q in experts])}


__all__ = ["SUPPORTED_ARCHS", "TORCH_DTYPES", "hf_config_from_spec", "load_model", "save_model", "spec_from_hf_config"]
