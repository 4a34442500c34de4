"""FP8 weights (`--quantization fp8`, engine/quant.py): the GEMM computes exactly the product of
its quantized operands (against float64), quantization error stays at e4m3's precision, the model's
logits stay close to the 16-bit model's, and the engine serves with it (CPU: torch._scaled_mm)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import EngineArgs
from engine.core.flags import FlagError
from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.model import LlamaModel
from engine.quant import PROJECTIONS, Fp8Weight, quantize_fp8
from engine.replay import replay
from kernels.reference import FP8_MAX, linear_fp8_ref, quantize_fp8_tensor


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), k16=st.integers(1, 8), n16=st.integers(1, 8), seed=st.integers(0, 10**6),
       spread=st.floats(0.01, 100.0))
def test_fp8_gemm_is_the_product_of_its_quantized_operands(m, k16, n16, seed, spread):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 16 * k16, generator=g) * torch.logspace(0, 1, m).reshape(-1, 1) * spread  # rows of other scales
    w = Fp8Weight.of(torch.randn(16 * n16, 16 * k16, generator=g))
    xq, xs = quantize_fp8_tensor(x)
    exact = (xq.double() * xs.double()) @ w.dequantized().double().t()
    got = linear_fp8_ref(x, w.weight, w.scale)
    assert got.dtype == x.dtype and got.shape == (m, 16 * n16)
    assert rel(got, exact) < 1e-5  # fp32 accumulation of the very operands
    # the tensor's largest entry maps to the top of e4m3's range (one scale for all rows, as
    # vLLM's dynamic scheme), and nothing overflows
    assert xs.shape == () and float(xq.float().abs().max()) == FP8_MAX
    # rows far below the largest lose mantissa bits to e4m3's subnormals: judge the product on
    # the rows within 2^6 of the top, where e4m3 keeps its 3 mantissa bits
    big = x.abs().amax(-1) > x.abs().max() / 64
    ref = x.double() @ w.dequantized().double().t()
    assert rel(got[big], ref[big]) < 0.08


def test_weight_quantization_is_per_tensor_within_e4m3_precision():
    w = torch.randn(64, 128) * 0.02
    q = Fp8Weight.of(w)
    assert q.weight.dtype == torch.float8_e4m3fn and q.scale.shape == ()
    assert float(q.weight.float().abs().max()) == FP8_MAX
    big = w.abs() > w.abs().max() / 16  # normal range of e4m3 relative to the scale
    assert float(((q.dequantized() - w).abs() / w.abs())[big].max()) <= 2**-4 + 1e-6


def test_model_logits_stay_close_and_the_projections_shrink():
    spec = get_model("tiny")
    ref = LlamaModel(spec, max_positions=64, dtype=torch.float32, seed=3)
    fp8 = LlamaModel(spec, max_positions=64, dtype=torch.float32, seed=3)
    before = sum(getattr(layer, n).weight.numel() * 4 for layer in fp8.layers for n in PROJECTIONS)
    freed = quantize_fp8(fp8)
    assert 0.7 * before < freed < before  # fp32 -> 1 byte per weight (plus the scales)
    assert all(set(layer.fp8) == set(PROJECTIONS) for layer in fp8.layers)
    ids = torch.randint(16, spec.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        h_ref, h_fp8 = (m(ids, torch.arange(12), *_one_sequence(m, 12)) for m in (ref, fp8))
        err = rel(fp8.compute_logits(h_fp8), ref.compute_logits(h_ref))
    assert 1e-4 < err < 0.1, err  # quantized (not the same numbers), and close


def _one_sequence(model: LlamaModel, n: int):
    from engine.attention import AttentionMetadata

    s = model.spec
    kv = torch.zeros(s.num_layers, 2, 4, 16, s.num_kv_heads, s.head_dim)
    meta = AttentionMetadata(slot_mapping=torch.arange(n), block_tables=torch.arange(4).reshape(1, 4).int(),
                             seq_lens=torch.tensor([n], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, n], dtype=torch.int32), max_query_len=n, max_seq_len=n)
    return kv, meta


def test_engine_serves_with_fp8_weights_and_the_draft_keeps_its_own():
    args = {"model": "tiny", "device": "cpu", "dtype": "float32", "max_model_len": 128,
            "max_num_batched_tokens": 32, "max_num_seqs": 4, "seed": 0}
    core = EngineCore(EngineArgs(**args, quantization="fp8"))
    assert all(set(layer.fp8) == set(PROJECTIONS) for layer in core.model.layers)
    reqs = [Request(request_id=i, arrival_s=0.0, prompt_len=40, output_len=6, hash_ids=(i, 9, 10)) for i in range(3)]
    res = replay(core, reqs, honor_arrivals=False)
    assert res.summary().completed == 3 and int(res.requests["num_output_tokens"].sum()) == 18
    spec = {"model": "tiny", "num_speculative_tokens": 2}
    core = EngineCore(EngineArgs(**args, quantization="fp8", speculative_config=spec))
    assert core.model.layers[0].fp8 and not core.drafter.runner.model.layers[0].fp8
    with pytest.raises((FlagError, ValueError), match="quantization"):
        EngineArgs(**args, quantization="int8")
