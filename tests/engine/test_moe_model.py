"""The engine's mixture-of-experts model (tiny-moe: Qwen3-style qk-norm, 8 experts, top 2) over a
paged KV cache equals the independent token-by-token reference (engine/dense_reference.py), through
either kernel backend; greedy tokens agree."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from engine.core.model_spec import get_model
from engine.dense_reference import dense_logits, greedy_reference
from engine.loader import save_model
from engine.model import LlamaModel
from engine.paged_forward import new_kv, run_paged

SPEC = get_model("tiny-moe")


# top-k weights left as the softmax gave them, no q/k norms, top 3 of 5
PLAIN = SPEC.model_copy(update={"name": "t-moe", "norm_topk_prob": False, "qk_norm": False, "num_experts": 5,
                                "experts_per_token": 3})


def _model(backend: str, seed: int = 3, spec=SPEC) -> LlamaModel:
    model = LlamaModel(spec, max_positions=256, seed=seed, attention_backend=backend)
    with torch.no_grad():  # a router with weight: routing that differs token to token (N(0, .02) is near uniform)
        for layer in model.layers:
            layer.router.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed))
    return model


def _hf(model: LlamaModel, tmp_path) -> dict[str, torch.Tensor]:
    save_model(model, tmp_path)
    return load_file(str(tmp_path / "model.safetensors"))


@pytest.mark.parametrize(("backend", "spec"), [("torch", SPEC), ("triton", SPEC), ("triton", PLAIN)])
def test_prefill_and_decode_logits_match_the_reference(backend, spec, tmp_path):
    model = _model(backend, spec=spec)
    w = _hf(model, tmp_path)
    g = torch.Generator().manual_seed(1)
    a = torch.randint(16, SPEC.vocab_size, (13,), generator=g).tolist()
    b = torch.randint(16, SPEC.vocab_size, (6,), generator=g).tolist()
    kv = new_kv(spec)
    run_paged(model, kv, [(a[:10], 0, [5, 2, 9])])  # a's first 10 tokens cached
    logits, qsl = run_paged(model, kv, [(a, 10, [5, 2, 9, 11]), (b, 0, [1, 3])])  # chunk + fresh prompt
    torch.testing.assert_close(logits[qsl[0]:qsl[1]].double(), dense_logits(spec, w, a)[10:], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(logits[qsl[1]:qsl[2]].double(), dense_logits(spec, w, b), atol=2e-4, rtol=1e-4)


def test_greedy_tokens_equal_the_reference(tmp_path):
    model = _model("triton", seed=4)
    w = _hf(model, tmp_path)
    prompt = [17, 99, 300, 45, 2]
    want = greedy_reference(SPEC, w, prompt, 6)
    kv, seq, got = new_kv(SPEC), list(prompt), []
    blocks, cached = [0, 1, 2, 3], 0
    for _ in range(6):
        logits, _ = run_paged(model, kv, [(seq, cached, blocks)])
        cached = len(seq)
        got.append(int(logits[-1].argmax()))
        seq.append(got[-1])
    assert got == want


def test_weight_counts_match_the_spec():
    model = _model("torch")
    n = sum(p.numel() for p in model.parameters())
    assert n == SPEC.num_params
    w = model.layers[0]
    assert w.w13.shape == (8, 64, 64) and w.w2.shape == (8, 64, 32) and w.router.weight.shape == (8, 64)


def test_checkpoint_round_trip_in_qwen3_moe_and_mixtral_names(tmp_path):
    import json

    from safetensors.torch import save_file

    from engine.loader import load_model

    model = _model("torch")
    save_model(model, tmp_path / "q")
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["num_experts"] == 8
    loaded = load_model(tmp_path / "q")
    assert loaded.spec.model_dump(exclude={"name"}) == SPEC.model_dump(exclude={"name"})
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the same weights under Mixtral's names (w1 gate, w3 up, w2 down, block_sparse_moe.gate), Mixtral's config
    mix = SPEC.model_copy(update={"name": "m", "qk_norm": False})
    m2 = _model("torch", spec=mix)
    save_model(m2, tmp_path / "m")
    names = {".mlp.gate.": ".block_sparse_moe.gate.", ".mlp.experts.": ".block_sparse_moe.experts.",
             ".gate_proj.weight": ".w1.weight", ".up_proj.weight": ".w3.weight", ".down_proj.weight": ".w2.weight"}
    tensors = {}
    for k, v in load_file(str(tmp_path / "m" / "model.safetensors")).items():
        if ".mlp." in k:
            for old, new in names.items():
                k = k.replace(old, new)
        tensors[k] = v
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg |= {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8,
            "intermediate_size": mix.moe_intermediate_size}
    for k in ("num_experts", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"):
        cfg.pop(k)
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    loaded = load_model(tmp_path / "m")
    assert loaded.spec.is_moe and not loaded.spec.qk_norm and loaded.spec.norm_topk_prob
    a, b = m2.state_dict(), loaded.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
