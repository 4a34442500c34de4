"""The model's forward over a paged KV cache equals an independent dense causal forward."""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from engine.core.model_spec import RopeScaling, get_model
from engine.dense_reference import dense_logits
from engine.loader import load_model, save_model
from engine.model import LlamaModel
from engine.paged_forward import new_kv, run_paged

TINY = get_model("tiny")
# Variants that exercise Llama-3 rope scaling (short original context so the scaled band is hit),
# Qwen-style q/k/v biases, tied embeddings and MHA (no GQA).
VARIANTS = {
    "tiny": TINY,
    "llama3-rope-tied": TINY.model_copy(update={
        "name": "t1", "tie_word_embeddings": True,
        "rope_scaling": RopeScaling(factor=8.0, original_max_position_embeddings=64)}),
    "qwen-bias-mha": TINY.model_copy(update={"name": "t2", "qkv_bias": True, "num_kv_heads": 4,
                                             "rope_theta": 10000.0, "rms_norm_eps": 1e-6}),
}
BS = 4  # small KV blocks so a short sequence spans several, scattered blocks


def hf_weights(model: LlamaModel, tmp_path) -> dict[str, torch.Tensor]:
    save_model(model, tmp_path)
    w = load_file(str(tmp_path / "model.safetensors"))
    return w


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_logits_match_dense(variant, tmp_path):
    spec = VARIANTS[variant]
    model = LlamaModel(spec, max_positions=256, seed=3)
    w = hf_weights(model, tmp_path)
    g = torch.Generator().manual_seed(1)
    toks = torch.randint(16, spec.vocab_size, (90,), generator=g).tolist()  # past original ctx 64
    logits, _ = run_paged(model, new_kv(spec), [(toks, 0, [7, 3, 30, 1, 12, 5, 9, 2, 11, 4, 6, 8, 10, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22])])
    ref = dense_logits(spec, w, toks)
    torch.testing.assert_close(logits.double(), ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_mixed_batch_chunk_and_decode_match_dense(tmp_path, backend):
    """A prefill continuing from cached context and a fresh prompt, flattened into one step,
    through either kernel backend (Triton on the CPU interpreter here)."""
    spec = VARIANTS["llama3-rope-tied"]
    model = LlamaModel(spec, max_positions=256, seed=5, attention_backend=backend)
    assert model.backend.name == backend
    w = hf_weights(model, tmp_path)
    g = torch.Generator().manual_seed(2)
    a = torch.randint(16, spec.vocab_size, (17,), generator=g).tolist()
    b = torch.randint(16, spec.vocab_size, (6,), generator=g).tolist()
    c = torch.randint(16, spec.vocab_size, (9,), generator=g).tolist()
    kv = new_kv(spec)
    blocks_a, blocks_b, blocks_c = [9, 2, 17, 4, 20], [1, 6], [0, 3, 5]
    run_paged(model, kv, [(a[:10], 0, blocks_a), (c[:8], 0, blocks_c)])  # first chunks
    logits, qsl = run_paged(model, kv, [(a, 10, blocks_a), (b, 0, blocks_b), (c, 8, blocks_c)])
    torch.testing.assert_close(logits[qsl[0]:qsl[1]].double(), dense_logits(spec, w, a)[10:], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(logits[qsl[1]:qsl[2]].double(), dense_logits(spec, w, b), atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(logits[qsl[2]:qsl[3]].double(), dense_logits(spec, w, c)[8:], atol=2e-4, rtol=1e-4)


def test_every_kernel_call_goes_through_the_backend():
    """With each backend entry recorded, one forward calls rotary + KV store, attention and
    SiLU * up once per layer, add + RMSNorm twice (after attention, after the MLP), the four
    projections, and the LM head once; the separate KV writer never (rope_store_kv stores K and V)."""
    model = LlamaModel(TINY, max_positions=64, seed=0)
    calls: collections.Counter[str] = collections.Counter()

    def recorded(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    entries = [f.name for f in dataclasses.fields(model.backend) if f.name != "name"]
    model.backend = dataclasses.replace(
        model.backend, **{e: recorded(e, getattr(model.backend, e)) for e in entries})
    run_paged(model, new_kv(TINY), [(list(range(20, 29)), 0, [3, 1, 0])])
    layers = TINY.num_layers
    assert calls == {"rope_store_kv": layers, "paged_attention": layers, "silu_mul": layers,
                     "add_rms_norm": 2 * layers, "linear": 4 * layers + 1}  # 4 GEMMs + LM head


@pytest.mark.parametrize("shard_bytes", [None, 40_000])
def test_loader_round_trip(tmp_path, shard_bytes):
    spec = VARIANTS["qwen-bias-mha"]
    model = LlamaModel(spec, max_positions=128, seed=11)
    save_model(model, tmp_path, max_shard_bytes=shard_bytes)
    if shard_bytes:
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
    loaded = load_model(tmp_path, max_positions=128)
    assert loaded.spec.model_dump(exclude={"name"}) == spec.model_dump(exclude={"name"})
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)
    model = LlamaModel(TINY, max_positions=64, seed=0)
    save_model(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing"):
        load_model(tmp_path)


def test_logits_match_transformers_llama(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers not installed (it is on the GPU machine)")
    spec = VARIANTS["llama3-rope-tied"].model_copy(update={"tie_word_embeddings": False})
    model = LlamaModel(spec, max_positions=256, seed=7)
    save_model(model, tmp_path)
    hf = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    toks = list(range(20, 110))
    with torch.no_grad():
        ref = hf(torch.tensor([toks])).logits[0]
    logits, _ = run_paged(model, new_kv(spec), [(toks, 0, list(range(23)))])
    torch.testing.assert_close(logits, ref, atol=2e-4, rtol=1e-4)
