"""Expert parallelism (--enable-expert-parallel) in the cost model, against hand computation:
EP 1 is today's cost; each GPU reads E / EP of the closed form's touched experts; the all-to-all
is tokens x hidden x bytes x (EP - 1) / EP each way per MoE layer at the link's bandwidth; each
GPU holds E / EP whole experts."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.advise.assumptions import knob_assumptions
from engine.core.flag_error import FlagError
from engine.core.model_spec import dtype_bytes, get_model
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile, MoeTerms, Roofline
from sim.expert_parallel import max_touched_per_gpu, touched_per_gpu, weight_bytes_per_gpu
from sim.hardware import GB, get_gpu
from sim.memory import plan_memory
from sim.moe import ExpertRouting

GPU = get_gpu("h200")
BW = GPU.hbm_gb_per_s * GB
NVLINK = 375.3e9  # sim/links.py's measured H200 NVLink, one direction
EP_ON = {"enable_expert_parallel": True}


def _steps(cost: CostModel) -> list[float]:
    return [cost.forward_s(t, r, pp, pk, dp, dk) for t, r, pp, pk, dp, dk in
            ((1, 1, 0, 0, 1, 500), (64, 64, 0, 0, 64, 9e4), (2048, 4, 1e6, 2048, 0, 0), (300, 40, 2e4, 260, 40, 4e4))]


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b", "llama-3.1-8b"])
def test_ep_one_is_todays_cost_exactly(name):
    m = get_model(name)
    today = CostModel(m, GPU, EngineConfig())
    if m.is_moe:  # the flag at TP 1 places every expert on the one GPU: nothing changes
        assert _steps(CostModel(m, GPU, EngineConfig(**EP_ON))) == _steps(today)
    r = today.roofline
    assert r.expert_parallel_size == 1 and r.a2a_s_per_token == 0.0
    # the fitted profile's path too
    prof = CostProfile.load("h200-qwen3-30b-a3b") if name == "qwen3-30b-a3b" else None
    if prof is not None:
        assert _steps(CostModel(m, GPU, EngineConfig(**EP_ON), prof)) == _steps(CostModel(m, GPU, EngineConfig(), prof))


def test_bytes_per_gpu_shrink_by_ep_as_the_closed_form_says():
    m = get_model("qwen3-30b-a3b")  # E 128, k 8
    e, k, t, ep = 128, 8, 8, 4
    one_expert_all_layers = m.num_layers * m.expert_params * dtype_bytes(m.dtype)
    per_gpu = e / ep * (1 - (1 - k / e) ** t)  # closed form, a quarter of the experts on each GPU
    r = Roofline.of(m, GPU, EngineConfig(tensor_parallel_size=ep, **EP_ON))
    assert r.experts_s(t, compute_mult=0.0) == pytest.approx(per_gpu * one_expert_all_layers / BW, rel=1e-12)
    single = Roofline.of(m, GPU, EngineConfig())
    assert single.experts_s(t, compute_mult=0.0) == pytest.approx(ep * r.experts_s(t, compute_mult=0.0), rel=1e-12)
    # FLOPs: k / EP of a token's expert pairs per GPU
    assert r.moe_s_per_token == pytest.approx(single.moe_s_per_token / ep, rel=1e-12)


def test_skewed_routing_waits_for_the_gpu_with_the_popular_experts():
    routing = ExpertRouting(128, 8, skew=1.0)
    pi = routing.inclusion
    t = 16
    by_hand = [sum(1 - (1 - pi[g * 32 + j]) ** t for j in range(32)) for g in range(4)]
    np.testing.assert_allclose(touched_per_gpu(routing, t, 4), by_hand, rtol=1e-12)
    assert max_touched_per_gpu(routing, t, 4) == pytest.approx(by_hand[0])  # GPU 0 holds the most popular
    assert by_hand[0] > routing.expected_touched(t) / 4 > by_hand[3]
    m = get_model("qwen3-30b-a3b")
    r = Roofline.of(m, GPU, EngineConfig(tensor_parallel_size=4, **EP_ON), moe=MoeTerms(routing_skew=1.0))
    one = m.num_layers * m.expert_params * dtype_bytes(m.dtype)
    assert r.experts_s(t, compute_mult=0.0) == pytest.approx(by_hand[0] * one / BW, rel=1e-12)


def test_all_to_all_time_is_the_hand_computation():
    m = get_model("mixtral-8x7b")  # 32 layers, hidden 4096, bf16, 8 experts
    t, ep = 100, 2
    hand = 32 * 2 * (t * 4096 * 2 * (ep - 1) / ep) / NVLINK  # dispatch + combine, every MoE layer
    off = CostModel(m, GPU, EngineConfig(tensor_parallel_size=ep))
    on = CostModel(m, GPU, EngineConfig(tensor_parallel_size=ep, **EP_ON))
    assert on.roofline.a2a_s_per_token * t == pytest.approx(hand, rel=1e-12)
    # uniform routing: whole experts on half the GPUs read the same bytes and FLOPs per GPU as
    # every expert sliced in half, so the all-to-all is the whole difference
    assert on.forward_s(t, t, 0, 0, t, 5e4) - off.forward_s(t, t, 0, 0, t, 5e4) == pytest.approx(hand, rel=1e-9)


def test_memory_per_gpu_holds_e_over_ep_whole_experts():
    m = get_model("mixtral-8x7b")
    experts = 32 * 8 * m.expert_params * 2
    rest = m.num_params * 2 - experts
    assert weight_bytes_per_gpu(m, 2, 2) == pytest.approx(rest / 2 + 4 * 32 * m.expert_params * 2, rel=1e-12)
    assert weight_bytes_per_gpu(m, 4, 4) == pytest.approx(rest / 4 + 2 * 32 * m.expert_params * 2, rel=1e-12)
    # E / EP whole experts weigh what every expert / TP does: the KV plan is unchanged
    on = plan_memory(m, GPU, EngineConfig(tensor_parallel_size=2, **EP_ON).resolved_for(GPU, m))
    off = plan_memory(m, GPU, EngineConfig(tensor_parallel_size=2).resolved_for(GPU, m))
    assert on.weight_bytes / 2 == pytest.approx(weight_bytes_per_gpu(m, 2, 2), rel=1e-12)
    assert on.num_gpu_blocks == off.num_gpu_blocks


def test_bad_expert_parallel_settings_are_refused_clearly():
    with pytest.raises(FlagError, match="llama-3.1-8b is dense"):
        EngineConfig(tensor_parallel_size=2, **EP_ON).resolved_for(GPU, get_model("llama-3.1-8b"))
    with pytest.raises(FlagError, match="must divide mixtral-8x7b's 8 experts"):
        EngineConfig(tensor_parallel_size=16, **EP_ON).resolved_for(GPU, get_model("mixtral-8x7b"))
    assert EngineConfig(tensor_parallel_size=2, **EP_ON).to_vllm_args() == [
        "--tensor-parallel-size", "2", "--enable-expert-parallel"]


def test_the_advisor_marks_expert_parallelism_not_yet_validated():
    a = {x.input: x for x in knob_assumptions(EngineConfig(tensor_parallel_size=2, **EP_ON),
                                              CostProfile.load("default"), "h200")}
    ep = a["expert parallelism: expert placement and all-to-all"]
    assert ep.provenance == "prior" and ep.value.startswith("not yet validated: EP2")
    assert ep.source.startswith("first principles") and "375 GB/s" in ep.value
    assert not any("expert parallelism" in x for x in {y.input for y in knob_assumptions(
        EngineConfig(tensor_parallel_size=2), CostProfile.load("default"), "h200")})
