"""Model and GPU specs: pinned textbook figures and parameter counts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.core.model_spec import MODEL_PRESETS, ModelSpec, blocks_for_tokens, get_model
from engine.core.request import Request, materialize_prompt
from sim.hardware import GPU_PRESETS, get_gpu, kv_capacity_tokens, transfer_time_s


def test_textbook_kv_bytes():
    # 32 layers x 32 KV heads x 128 dim x 32,768 tokens in fp16 (a Llama-2-7B-like MHA model)
    m = ModelSpec(name="mha", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
                  head_dim=128, intermediate_size=11008, vocab_size=32000, dtype="float16")
    assert m.kv_bytes_per_token() * 32768 == 17_179_869_184
    assert m.kv_bytes_per_token("fp8") * 32768 == 17_179_869_184 // 2


def test_textbook_blocks_and_transfer():
    assert blocks_for_tokens(32768, 16) == 2048
    assert blocks_for_tokens(32769, 16) == 2049
    assert transfer_time_s(17.2e9, 900) == pytest.approx(0.01911, abs=1e-4)


@pytest.mark.parametrize(
    "name, billions",
    [("llama-3.2-1b", 1.236), ("llama-3.1-8b", 8.030), ("llama-3.1-70b", 70.554),
     ("qwen2.5-7b", 7.616), ("mistral-7b", 7.248)],
)
def test_parameter_counts_match_published(name, billions):
    # published counts (HF model cards / safetensors metadata), within 0.1%
    assert get_model(name).num_params / 1e9 == pytest.approx(billions, rel=1e-3)


def test_kv_capacity_h200_llama8b():
    m, g = get_model("llama-3.1-8b"), get_gpu("h200")
    free = 141e9 * 0.9 - m.num_params * 2
    assert kv_capacity_tokens(m, g, gpu_memory_utilization=0.9) == int(free // (2 * 32 * 8 * 128 * 2))
    # fp8 KV doubles the tokens; two GPUs more than double them (weights are paid once)
    one = kv_capacity_tokens(m, g, gpu_memory_utilization=0.9)
    assert kv_capacity_tokens(m, g, gpu_memory_utilization=0.9, kv_cache_dtype="fp8") in (2 * one, 2 * one + 1)
    assert kv_capacity_tokens(m, g, num_gpus=2, gpu_memory_utilization=0.9) > 2 * one
    # a 70B model in bf16 does not fit one 80 GB GPU
    assert kv_capacity_tokens(get_model("llama-3.1-70b"), get_gpu("h100-sxm")) == 0


def test_presets_and_errors():
    assert {"llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "mistral-7b"} <= set(MODEL_PRESETS)
    assert {"t4", "l4", "a100-80gb", "h100-sxm", "h200", "b200"} <= set(GPU_PRESETS)
    with pytest.raises(ValueError, match="choose one of"):
        get_model("gpt-5")
    with pytest.raises(ValidationError, match="multiple of num_kv_heads"):
        ModelSpec(name="x", num_layers=1, hidden_size=8, num_heads=3, num_kv_heads=2, head_dim=4,
                  intermediate_size=8, vocab_size=64)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_capacity_tokens(get_model("tiny"), get_gpu("t4"), gpu_memory_utilization=1.5)


def test_request_checks_hash_ids():
    with pytest.raises(ValueError, match=r"expected ceil\(100/16\) = 7"):
        Request(request_id=1, arrival_s=0.0, prompt_len=100, output_len=5, hash_ids=(1, 2, 3))


def test_materialize_shares_exactly_the_shared_prefix():
    a = Request(0, 0.0, 40, 4, hash_ids=(7, 8, 9), hash_block_size=16)
    b = Request(1, 0.0, 48, 4, hash_ids=(7, 8, 10), hash_block_size=16)
    ta, tb = materialize_prompt(a, 1000), materialize_prompt(b, 1000)
    assert len(ta) == 40 and len(tb) == 48
    assert ta[:32] == tb[:32]
    assert sum(x == y for x, y in zip(ta[32:], tb[32:])) < 4  # different content after the shared blocks
    assert min(ta) >= 16 and max(ta) < 1000
    assert materialize_prompt(a, 1000) == ta  # deterministic
    assert len(set(ta[:16])) > 10
