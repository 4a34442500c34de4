"""A Hugging Face-style model folder's config.json as a `ModelSpec`, checked, without torch.

`read_hf_config(folder)` reads config.json through the bounded reader (a folder without it, a JSON
list, a string where a count belongs, a count beyond `MAX_DIM`: each named with its key) and
`spec_from_hf_config(cfg)` maps it to the engine's `ModelSpec`. The engine's loader and the
pre-flight checks (engine/preflight.py, which must size a model before anything is allocated)
share them; engine/loader.py re-exports `spec_from_hf_config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.core.input_files import InputFileError, expect, read_json, validation_lines
from engine.core.model_spec import ModelSpec, RopeScaling

SUPPORTED_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3MoeForCausalLM",
                   "MixtralForCausalLM")
# mixture-of-experts architectures: HF key of the expert count, and of the expert width
_MOE_KEYS = {"Qwen3MoeForCausalLM": ("num_experts", "moe_intermediate_size"),
             "MixtralForCausalLM": ("num_local_experts", "intermediate_size")}
MAX_DIM = 1 << 24  # any width, count or length above 16M is a damaged config, not a model
MAX_CONFIG_BYTES = 1 << 20
_COUNTS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
_OPTIONAL_COUNTS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
_NUMBERS = ("rope_theta", "rms_norm_eps")


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    """config.json of a model folder, as an object; InputFileError naming what is wrong."""
    path = Path(folder) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{folder}: no config.json (expected a Hugging Face-style model folder: "
                             "config.json + model.safetensors); give a model preset or such a folder")
    return read_json(path, what="model config.json", max_bytes=MAX_CONFIG_BYTES,
                     fix="give the config.json of a Llama-family model")


def _count(path: Path, cfg: dict[str, Any], key: str, required: bool) -> int | None:
    if key not in cfg or (cfg[key] is None and not required):
        if required:
            raise InputFileError(f"{path}: key '{key}' is missing; a Llama-family config.json has it")
        return None
    v = expect(path, [key], cfg[key], int, f"an integer from 1 to {MAX_DIM:,}")
    if not 1 <= v <= MAX_DIM:
        raise InputFileError(f"{path}: key '{key}' is {v:,}; it must be from 1 to {MAX_DIM:,}")
    return v


def spec_from_hf_config(cfg: dict, name: str = "hf", path: str | Path = "config.json") -> ModelSpec:
    """A ModelSpec from a parsed HF config.json; clear errors (file, key, expected) for what the
    engine lacks or what is malformed."""
    path = Path(path)
    if not isinstance(cfg, dict):
        raise InputFileError(f"{path}: must be a JSON object ({{...}}), not {type(cfg).__name__}")
    archs = cfg.get("architectures") or ["LlamaForCausalLM"]
    expect(path, ["architectures"], archs, list, "a list of architecture names")
    arch = expect(path, ["architectures", 0], archs[0], str, "an architecture name")
    if arch not in SUPPORTED_ARCHS:
        raise InputFileError(f"{path}: architectures={arch!r} is not supported; use one of {SUPPORTED_ARCHS}")
    if cfg.get("attention_bias") and arch != "Qwen2ForCausalLM":
        raise InputFileError(f"{path}: attention_bias=true (a bias on o_proj too) is not supported")
    counts = {k: _count(path, cfg, k, True) for k in _COUNTS}
    optional = {k: _count(path, cfg, k, False) for k in _OPTIONAL_COUNTS}
    for key in _NUMBERS:
        if cfg.get(key) is not None:
            expect(path, [key], cfg[key], (int, float), "a finite number")
    for key in ("tie_word_embeddings",):
        if cfg.get(key) is not None:
            expect(path, [key], cfg[key], bool, "true or false")
    # transformers 5 nests rope settings in rope_parameters; older configs use rope_theta/rope_scaling.
    rope: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        if cfg.get(key) is not None:
            rope.update(expect(path, [key], cfg[key], dict, "an object ({...}) or null"))
    theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
    expect(path, ["rope_theta"], theta, (int, float), "a finite number")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type == "llama3":
        try:
            scaling = RopeScaling(factor=rope["factor"], low_freq_factor=rope["low_freq_factor"],
                                  high_freq_factor=rope["high_freq_factor"],
                                  original_max_position_embeddings=rope["original_max_position_embeddings"])
        except KeyError as exc:
            raise InputFileError(f"{path}: key 'rope_scaling.{exc.args[0]}' is missing (llama3 rope needs "
                                 "factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)") from None
        except ValidationError as exc:
            raise InputFileError("\n".join(validation_lines(path, exc, prefix=["rope_scaling"]))) from None
    elif rope_type != "default":
        raise InputFileError(f"{path}: rope type {rope_type!r} is not supported (only 'llama3' or none)")
    heads = counts["num_attention_heads"]
    dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    moe = _moe_fields(path, cfg, arch)
    try:
        return ModelSpec(**moe,
            name=name, num_layers=counts["num_hidden_layers"], hidden_size=counts["hidden_size"], num_heads=heads,
            num_kv_heads=optional["num_key_value_heads"] or heads,
            head_dim=optional["head_dim"] or counts["hidden_size"] // heads,  # type: ignore[operator]
            intermediate_size=counts["intermediate_size"], vocab_size=counts["vocab_size"],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), qkv_bias=arch == "Qwen2ForCausalLM",
            rope_theta=theta, rope_scaling=scaling, rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            max_position_embeddings=optional["max_position_embeddings"] or 8192,
            dtype=dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16",
        )
    except ValidationError as exc:  # e.g. heads not a multiple of the KV heads, a vocabulary of 16
        lines = [str(e["msg"]).removeprefix("Value error, ") + f" ({'.'.join(map(str, e['loc'])) or 'config'})"
                 for e in exc.errors()]
        raise InputFileError(f"{path}: not a model the engine can build: {'; '.join(lines)}") from None


def _moe_fields(path: Path, cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """A mixture of experts' ModelSpec fields (none for a dense architecture); what the engine lacks
    (shared experts, dense layers between MoE layers) is refused by key."""
    if arch not in _MOE_KEYS:
        return {}
    n_key, width_key = _MOE_KEYS[arch]
    for key, ok in (("decoder_sparse_step", (None, 1)), ("mlp_only_layers", (None, [])),
                    ("shared_expert_intermediate_size", (None, 0))):
        if cfg.get(key) not in ok:
            raise InputFileError(f"{path}: key '{key}' is {cfg.get(key)!r}; the engine runs every layer as "
                                 f"mixture of experts without shared experts ({key} {ok[1]!r})")
    if cfg.get("norm_topk_prob") is not None:
        expect(path, ["norm_topk_prob"], cfg["norm_topk_prob"], bool, "true or false")
    return {"num_experts": _count(path, cfg, n_key, True), "experts_per_token": _count(path, cfg, "num_experts_per_tok", True),
            "moe_intermediate_size": _count(path, cfg, width_key, True),
            # Mixtral always renormalises its top-k weights; Qwen3-MoE says so in norm_topk_prob
            "norm_topk_prob": arch == "MixtralForCausalLM" or bool(cfg.get("norm_topk_prob", False)),
            "qk_norm": arch == "Qwen3MoeForCausalLM"}


def spec_of_folder(folder: str | Path) -> ModelSpec:
    """The checked ModelSpec of a model folder's config.json."""
    folder = Path(folder)
    return spec_from_hf_config(read_hf_config(folder), name=folder.name, path=folder / "config.json")


__all__ = ["MAX_DIM", "SUPPORTED_ARCHS", "read_hf_config", "spec_from_hf_config", "spec_of_folder"]
