"""Mixed CUDA graphs in the cost model: a step with prefill tokens within the engine's capture size
replays a graph (tokens padded to the engine's bucket) priced with the profile's `mixed_graph`
terms; a profile without them predicts exactly what it did before mixed graphs existed."""

from __future__ import annotations

import pytest

from engine.core.cuda_graphs import mixed_graph_bucket, mixed_graph_buckets
from engine.core.model_spec import get_model
from engine.core.records import StepRecord
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile, GpuTerms, Roofline
from sim.hardware import get_gpu
from tests.sim.simhelpers import frozen_profile

H200 = get_gpu("h200")
M1 = get_model("llama-3.2-1b")
GRAPH = GpuTerms(gemm=1.3, prefill_attention=1.5, decode_kv=1.2, decode_max_kv=0.2, elementwise=1 / 0.7,
                 step_s=9e-4, per_seq_s=1e-5)


def step(chunks=(), cached=(), decodes=0, ctx_each=0, max_ctx=0, blocks=0, hashed=0) -> StepRecord:
    pairs = sum(q * c + q * (q + 1) // 2 for q, c in zip(chunks, cached))
    return StepRecord(num_prefill_tokens=sum(chunks), num_prefill_seqs=len(chunks),
                      sum_prefill_context=sum(q + c for q, c in zip(chunks, cached)), prefill_attn_pairs=pairs,
                      num_decode_seqs=decodes, num_decode_tokens=decodes, sum_decode_context=decodes * ctx_each,
                      max_decode_context=max_ctx, num_blocks_allocated=blocks, num_blocks_hashed=hashed)


# decode batches, small mixed steps (which the engine now runs as graphs) and large ones (eager)
BATCHES = [step((), (), 1, 512, 512), step((), (), 7, 2000, 4000, 1), step((), (), 64, 1500, 8000, 4),
           step((), (), 256, 3000, 30000, 16), step((100,), (0,), blocks=7, hashed=6),
           step((200,), (1000,), 30, 900, 3000, 13, 12), step((200, 180), (0, 4096), 120, 2500, 16000, 30, 20),
           step((7,), (0,), 3, 100, 120), step((2048,), (0,), 64, 1200, 5000, 128, 128),
           step((4000, 4192), (0, 0), blocks=512)]
# (model, async scheduling, tensor parallel) -> the step times the committed H200 profiles gave
# before mixed graphs existed (sim/cost_model.py at commit 70bfecc, the same BATCHES)
BEFORE = {
    ("llama-3.2-1b", True, 1): [0.0012229970926776568, 0.0014899104855263842, 0.0031619977477571476,
                                0.010134643709946625, 0.001976570182533696, 0.004111954582571365,
                                0.016212594131721787, 0.00201235860715261, 0.012793148099682301,
                                0.03520181982620944],
    ("llama-3.2-1b", False, 1): [0.0014258547143652833, 0.0017549764623456575, 0.0038435871893198314,
                                 0.01361796675486151, 0.0022000044493811636, 0.004518870267871823,
                                 0.017831533302769747, 0.0022209145437899636, 0.013840320535067535,
                                 0.03636448832068621],
    ("llama-3.1-8b", True, 1): [0.004807584568817922, 0.005597423830801261, 0.011142420720489276,
                                0.03804978837182708, 0.005612816256987484, 0.011995844322869377,
                                0.04644632072317589, 0.005732678487496148, 0.05889423394943244,
                                0.19585936433008563],
    ("llama-3.1-8b", False, 1): [0.005035328173281931, 0.005914999677441081, 0.012063314401498167,
                                 0.043037975093532285, 0.005860309317390366, 0.012500175451379818,
                                 0.048694894180971116, 0.005968651527121568, 0.060144713732073,
                                 0.1971787933614786],
    ("llama-3.1-8b", True, 2): [0.003455706364233985, 0.0038894325948876686, 0.00698736349417064,
                                0.021551109199004426, 0.004113704484333564, 0.008000938319854406,
                                0.027090783925399486, 0.004039629878258584, 0.03566715395489581,
                                0.1152453011344078],
}


def cost_model(model: str, asynchronous: bool = True, tp: int = 1, profile: CostProfile | None = None,
               **engine) -> CostModel:
    m = get_model(model)
    e = EngineConfig(async_scheduling=asynchronous, tensor_parallel_size=tp, **engine).resolved_for(H200, m)
    return CostModel(m, H200, e, profile or frozen_profile(f"h200-{model}"))


def step_s(cm: CostModel, b: StepRecord) -> float:
    return cm.combine(cm.gpu_time_s(b), cm.cpu_time_s(b))


@pytest.mark.parametrize("case", sorted(BEFORE))
def test_profiles_without_graph_fields_predict_exactly_as_before(case):
    prof = frozen_profile(f"h200-{case[0]}")
    assert prof.mixed_graph is None and prof.cudagraph_mode is None and prof.max_cudagraph_capture_size is None
    cm = cost_model(*case)
    assert [step_s(cm, b) for b in BATCHES] == BEFORE[case]


def test_bucket_is_the_engines():
    for max_tokens in [*range(1, 600), 1000, 1024, 1025, 2048, 3000, 8192]:
        sizes = mixed_graph_buckets(max_tokens)
        for n in range(1, max_tokens + 20):
            assert mixed_graph_bucket(n, max_tokens) == next((s for s in sizes if s >= n), None), (n, max_tokens)


def with_graphs(capture: int = 512) -> CostProfile:
    return frozen_profile("h200-llama-3.2-1b").model_copy(update={
        "mixed_graph": GRAPH, "cudagraph_mode": "FULL", "max_cudagraph_capture_size": capture})


def graph_by_hand(b: StepRecord, pad: int) -> float:
    """GRAPH's roofline terms written out: token-wise terms over the padded bucket, the LM head
    over the sampled rows, per sequence the scheduled ones."""
    r, t = Roofline.of(M1, H200, EngineConfig()), GRAPH
    rows = b.num_prefill_seqs + b.num_decode_tokens
    gemm = max(r.gemm_s_per_token * pad + r.gemm_s_per_row * rows, r.weights_s)
    pre = max(r.attn_s_per_pair * b.prefill_attn_pairs, r.kv_s_per_token * b.sum_prefill_context)
    per_kv = max(r.attn_s_per_pair, r.kv_s_per_token)
    return (t.gemm * gemm + t.prefill_attention * pre + per_kv * (t.decode_kv * b.sum_decode_context
                                                                    + t.decode_max_kv * b.max_decode_context)
            + t.elementwise * r.ew_s_per_token * pad + t.step_s + t.per_seq_s * (b.num_prefill_seqs + b.num_decode_seqs))


@pytest.mark.parametrize(("b", "pad"), [(step((3,), (0,)), 4), (step((200,), (1000,), 30, 900, 3000), 232),
                                        (step((200, 180), (0, 4096), 120, 2500, 16000), 512),
                                        (step((250,), (64,), 51, 700, 2000), 304)])
def test_a_mixed_step_within_the_capture_size_replays_its_bucket(b, pad):
    cm = cost_model("llama-3.2-1b", profile=with_graphs())
    assert cm.gpu_time_s(b) == pytest.approx(graph_by_hand(b, pad), rel=1e-12)


def test_steps_beyond_the_graphs_and_decodes_are_priced_as_before():
    old, new = cost_model("llama-3.2-1b"), cost_model("llama-3.2-1b", profile=with_graphs())
    for b in BATCHES:
        tokens = b.num_prefill_tokens + b.num_decode_tokens
        if b.num_prefill_tokens == 0 or tokens > 512:
            assert new.gpu_time_s(b) == old.gpu_time_s(b)
        else:
            assert new.gpu_time_s(b) != old.gpu_time_s(b)
    # the capture size bounds the graphs, and so does a smaller token budget (the engine captures
    # up to the smaller of the two; its largest graph is that budget itself)
    b = step((290,), (0,))
    assert cost_model("llama-3.2-1b", profile=with_graphs(256)).gpu_time_s(b) == old.gpu_time_s(b)
    small = cost_model("llama-3.2-1b", profile=with_graphs(), max_num_batched_tokens=300, max_num_seqs=128)
    assert small.gpu_time_s(b) == pytest.approx(graph_by_hand(b, 300), rel=1e-12)


def test_graph_terms_need_the_full_mode():
    base = frozen_profile("h200-llama-3.2-1b")
    for update in ({"mixed_graph": GRAPH}, {"mixed_graph": GRAPH, "cudagraph_mode": "FULL_DECODE_ONLY",
                                            "max_cudagraph_capture_size": 512},
                   {"mixed_graph": GRAPH, "cudagraph_mode": "FULL"}):
        with pytest.raises(ValueError, match="mixed_graph terms need"):
            CostProfile.model_validate(base.model_dump() | update)
    with pytest.raises(ValueError, match="cudagraph_mode 'PIECEWISE' is not one of"):
        CostProfile.model_validate(base.model_dump() | {"cudagraph_mode": "PIECEWISE"})
    p = CostProfile.model_validate(with_graphs().model_dump())  # a saved profile round-trips
    assert p.mixed_graph == GRAPH and p.max_cudagraph_capture_size == 512
