"""The cost model's mixture-of-experts terms: bytes of the touched experts, FLOPs of the active ones."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import binom

from engine.core.model_spec import dtype_bytes, get_model
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile, MoeTerms, Roofline, graph_routed
from sim.hardware import GB, get_gpu

GPU = get_gpu("h200")
BW = GPU.hbm_gb_per_s * GB


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_one_token_reads_exactly_the_active_parameters(name):
    m = get_model(name)
    r = Roofline.of(m, GPU, EngineConfig())
    f = r.features(1, 1, 0, 0, 0, 0)
    active_bytes = (m.num_layers * m.active_params_per_layer + m.vocab_size * m.hidden_size) * dtype_bytes(m.dtype)
    assert f["gemm"] == pytest.approx(active_bytes / BW, rel=1e-12)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_bytes_saturate_at_all_experts_and_flops_follow_the_active_ones(name):
    m = get_model(name)
    r = Roofline.of(m, GPU, EngineConfig())
    all_layer_bytes = (m.num_layers * m.params_per_layer + m.vocab_size * m.hidden_size) * dtype_bytes(m.dtype)
    bytes_side = r.weights_s + r.experts_s(10**6, compute_mult=0.0)
    assert bytes_side == pytest.approx(all_layer_bytes / BW, rel=1e-9)
    flops_per_token = r.gemm_s_per_token + r.moe_s_per_token
    assert flops_per_token == pytest.approx(2 * m.num_layers * m.active_params_per_layer / (GPU.bf16_tflops * 1e12))


def test_expert_bytes_follow_the_expected_distinct_experts():
    m = get_model("qwen3-30b-a3b")
    r = Roofline.of(m, GPU, EngineConfig())
    for t in (1, 2, 8, 32, 64):
        touched = 128 * (1 - (1 - 8 / 128) ** t)
        assert r.experts_s(t, compute_mult=0.0) == pytest.approx(r.expert_s * touched, rel=1e-12)
    arr = np.array([1.0, 8.0, 64.0])
    assert np.allclose(r.experts_s(arr), [r.experts_s(float(x)) for x in arr])  # vector = scalar


def test_a_graphs_padding_rows_add_one_tokens_experts():
    """A CUDA graph's padding rows are copies of one dummy token: the experts read are those of the
    real tokens and one more; the kernels' factors stay those of the padded launch."""
    assert graph_routed(9, 16) == 10 and graph_routed(16, 16) == 16 and graph_routed(1, 1) == 1
    assert graph_routed(np.array([3.0, 8.0, 24.0]), np.array([4.0, 8.0, 32.0])).tolist() == [4.0, 8.0, 25.0]
    m = get_model("qwen3-30b-a3b")
    factors = MoeTerms(bytes_factor_by_tokens=((1, 2.0), (16, 1.25), (64, 1.0)))
    r = Roofline.of(m, GPU, EngineConfig(), moe=factors)
    touched_10 = 128 * (1 - (1 - 8 / 128) ** 10)
    assert r.experts_s(16, compute_mult=0.0, routed=10) == pytest.approx(r.expert_s * touched_10 * 1.25, rel=1e-12)
    arr = r.experts_s(np.array([16.0, 16.0]), compute_mult=0.0, routed=np.array([10.0, 16.0]))
    assert arr.tolist() == pytest.approx([r.experts_s(16, compute_mult=0.0, routed=10), r.experts_s(16, compute_mult=0.0)])


def test_decode_steps_in_one_graph_bucket_cost_more_with_more_real_sequences():
    """Batches of 9..16 replay the 16-sequence graph: the dense work is the graph's, the experts' the
    real tokens' (+1), so the price rises with the batch inside the bucket, by the experts alone
    (15 real rows and one padding row route like 16 real ones)."""
    m = get_model("qwen3-30b-a3b")
    cm = CostModel(m, GPU, EngineConfig(max_num_seqs=256), CostProfile.load("h200-qwen3-30b-a3b"))
    prices = [cm.decode_linear(b).gpu_s for b in range(9, 17)]
    assert all(b > a for a, b in itertools.pairwise(prices[:-1])) and prices[-2] == prices[-1]
    r, p = cm.roofline, cm.profile
    mults = (1 / p.gemm_compute_efficiency, 1 / p.gemm_memory_efficiency)  # the experts' multipliers' base
    step = p.decode.experts * (r.experts_s(16, *mults, routed=16) - r.experts_s(16, *mults, routed=10))
    assert prices[-1] - prices[0] == pytest.approx(step, rel=1e-9)


def test_skew_and_measured_factors_change_only_the_expert_term():
    m = get_model("qwen3-30b-a3b")
    base = Roofline.of(m, GPU, EngineConfig())
    skewed = Roofline.of(m, GPU, EngineConfig(), moe=MoeTerms(routing_skew=1.0))
    slow = Roofline.of(m, GPU, EngineConfig(), moe=MoeTerms(bytes_factor_by_tokens=((1, 2.0), (64, 1.0))))
    assert skewed.weights_s == base.weights_s
    assert skewed.experts_s(32, compute_mult=0) < base.experts_s(32, compute_mult=0)  # fewer distinct experts
    assert slow.experts_s(1) == pytest.approx(2 * base.experts_s(1))
    assert slow.experts_s(64) == pytest.approx(base.experts_s(64))


def test_block_rows_price_the_rows_the_grouped_gemm_computes():
    """With the plans' row blocks the FLOPs side is the needed rows' FLOPs times the computed/needed
    ratio (Binomial(T, k/E) pairs per expert in whole blocks: by the pmf here); the bytes side and
    a profile without blocks are unchanged; scalar and array paths agree."""
    m = get_model("qwen3-30b-a3b")
    plain = Roofline.of(m, GPU, EngineConfig())
    blocks = ((1, 1), (6, 16), (182, 32), (513, 128))
    padded = Roofline.of(m, GPU, EngineConfig(), moe=MoeTerms(block_rows_by_tokens=blocks))
    for t in (2048, 2306, 4096):
        n = np.arange(t + 1)
        ratio = 128 * 128 * (binom.pmf(n, t, 8 / 128) * np.ceil(n / 128)).sum() / (t * 8)
        assert padded.experts_s(t, memory_mult=0) == pytest.approx(ratio * plain.experts_s(t, memory_mult=0), rel=1e-9)
        assert padded.experts_s(t, compute_mult=0) == plain.experts_s(t, compute_mult=0)
    assert padded.experts_s(2306, memory_mult=0) / plain.experts_s(2306, memory_mult=0) == pytest.approx(1.698, abs=2e-3)
    arr = np.array([3.0, 100.0, 700.0, 2306.0])
    assert np.allclose(padded.experts_s(arr), [padded.experts_s(float(t)) for t in arr], rtol=1e-12)
    assert padded.experts_s(3) == plain.experts_s(3)  # the direct plan (1-row blocks) pads nothing


def test_dense_models_have_no_expert_term():
    r = Roofline.of(get_model("llama-3.1-8b"), GPU, EngineConfig())
    assert r.routing is None and r.experts_s(100) == 0


def test_decode_step_cost_grows_with_batch_until_all_experts_are_read():
    m = get_model("qwen3-30b-a3b")
    cm = CostModel(m, GPU, EngineConfig(max_num_seqs=512), CostProfile.load("default"))
    t = [cm.forward_s(b, b, 0, 0, 0, 0) for b in (1, 8, 32, 72, 128, 256)]
    assert t[0] < t[1] < t[2] < t[3]  # more experts read
    assert t[4] / t[3] < 1.05  # past ~72 tokens nearly every expert is read already: bytes flat


def test_an_eagle_head_of_a_mixture_of_experts_is_one_dense_layer():
    from sim.config import SpeculativeConfig
    from sim.memory import draft_spec, draft_weight_bytes

    m = get_model("qwen3-30b-a3b")
    spec = SpeculativeConfig(method="eagle3", num_speculative_tokens=3)
    head = draft_spec(m, spec)
    assert not head.is_moe and head.num_layers == 1
    dense_layer = m.attention_params_per_layer + 3 * m.hidden_size * m.intermediate_size  # width 6144
    assert draft_weight_bytes(m, spec, None) == (dense_layer + 2 * m.hidden_size**2) * 2


def test_layer_fixed_cost_adds_once_per_moe_layer_and_forward():
    m = get_model("mixtral-8x7b")
    base = CostModel(m, GPU, EngineConfig(), CostProfile.load("default"))
    prof = CostProfile.load("default").model_copy(update={"moe": MoeTerms(layer_fixed_s=5e-6)})
    fixed = CostModel(m, GPU, EngineConfig(), prof)
    for t in (1, 64, 4096):
        assert fixed.forward_s(t, t, 0, 0, 0, 0) - base.forward_s(t, t, 0, 0, 0, 0) == pytest.approx(32 * 5e-6)


def test_memory_plan_keeps_every_expert_resident_and_kv_from_attention():
    from sim.memory import NON_TORCH_BYTES_PER_GPU, activation_reserve_bytes, plan_memory

    m = get_model("qwen3-30b-a3b")
    eng = EngineConfig(max_num_batched_tokens=8192, max_num_seqs=256)
    plan = plan_memory(m, GPU, eng)
    assert plan.weight_bytes == m.num_params * 2  # all 128 experts, not the 3.3 B active
    assert plan.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2  # K and V, 48 layers x 4 kv heads x 128
    # activations of k experts per token: k x (expert width + hidden) + 4 hidden, bf16
    per_token = (8 * 768 + 8 * 2048 + 4 * 2048) * 2
    logits = 256 * m.vocab_size * 4
    assert activation_reserve_bytes(m, eng) == pytest.approx(8192 * per_token + logits + NON_TORCH_BYTES_PER_GPU)
    free = GPU.hbm_bytes * eng.gpu_memory_utilization - plan.weight_bytes - activation_reserve_bytes(m, eng)
    assert plan.kv_capacity_tokens == pytest.approx(free / plan.kv_bytes_per_token, rel=0.01)
