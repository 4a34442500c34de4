"""Mixture-of-experts model specs: counts against the published totals and a hand count."""

import pytest

from engine.core.model_spec import ModelSpec, get_model
from sim.models import hf_model_id, preset_of


@pytest.mark.parametrize(("name", "total_b", "active_b"), [
    ("qwen3-30b-a3b", 30.5, 3.3),  # Qwen3-30B-A3B model card: 30.5 B total, 3.3 B activated
    ("mixtral-8x7b", 46.7, 12.9),  # Mistral's Mixtral announcement: 46.7 B total, 12.9 B per token
])
def test_published_parameter_counts(name, total_b, active_b):
    m = get_model(name)
    assert m.is_moe
    assert m.num_params / 1e9 == pytest.approx(total_b, abs=0.06)
    assert m.num_active_params / 1e9 == pytest.approx(active_b, abs=0.06)


def test_mixtral_hand_count():
    m = get_model("mixtral-8x7b")
    h, inter, E, L, V = 4096, 14336, 8, 32, 32000
    attn = h * 4096 + 2 * h * 1024 + 4096 * h + 2 * h
    expert = 3 * h * inter
    assert m.params_per_layer == attn + E * expert + h * E
    assert m.num_params == 2 * V * h + L * (attn + E * expert + h * E) + h
    assert m.num_matmul_params_per_token == L * (attn + 2 * expert + h * E) + V * h
    assert m.ffn_width_per_token == 2 * inter


def test_dense_counts_unchanged():
    m = get_model("llama-3.1-8b")
    assert not m.is_moe
    assert m.num_active_params == m.num_params
    assert m.num_matmul_params_per_token == m.num_layers * m.params_per_layer + m.vocab_size * m.hidden_size


def test_hf_ids_resolve():
    assert preset_of("Qwen/Qwen3-30B-A3B") == "qwen3-30b-a3b"
    assert hf_model_id("mixtral-8x7b") == "mistralai/Mixtral-8x7B-Instruct-v0.1"


@pytest.mark.parametrize(("kw", "msg"), [
    ({"num_experts": 8, "experts_per_token": 9, "moe_intermediate_size": 8}, "experts_per_token"),
    ({"num_experts": 8, "experts_per_token": 2}, "moe_intermediate_size"),
    ({"experts_per_token": 2}, "num_experts"),
])
def test_bad_moe_fields_named(kw, msg):
    base = {"name": "x", "num_layers": 1, "hidden_size": 8, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4,
                "intermediate_size": 8, "vocab_size": 32}
    with pytest.raises(ValueError, match=msg):
        ModelSpec(**base, **kw)


QWEN3_CONFIG = {  # Qwen/Qwen3-30B-A3B's config.json (the keys the spec reads)
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": False, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "torch_dtype": "bfloat16"}
MIXTRAL_CONFIG = {  # mistralai/Mixtral-8x7B-v0.1's config.json
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(("cfg", "preset"), [(QWEN3_CONFIG, "qwen3-30b-a3b"), (MIXTRAL_CONFIG, "mixtral-8x7b")])
def test_hf_configs_give_the_presets(cfg, preset):
    from engine.hf_config import spec_from_hf_config

    assert spec_from_hf_config(cfg, name=preset) == get_model(preset)


def test_shared_experts_and_dense_layers_are_refused_by_key():
    from engine.core.input_files import InputFileError
    from engine.hf_config import spec_from_hf_config

    with pytest.raises(InputFileError, match="shared_expert_intermediate_size"):
        spec_from_hf_config(QWEN3_CONFIG | {"shared_expert_intermediate_size": 5632})
    with pytest.raises(InputFileError, match="mlp_only_layers"):
        spec_from_hf_config(QWEN3_CONFIG | {"mlp_only_layers": [0]})
