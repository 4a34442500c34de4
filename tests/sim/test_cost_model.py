"""Cost model and memory plan: values against hand-written roofline arithmetic."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.model_spec import get_model
from sim.config import EngineConfig, SpeculativeConfig
from sim.cost_model import CostModel, CostProfile, DecodeRun, DecodeRuns
from sim.hardware import get_gpu
from sim.kv_dtype_costs import H200_FP8
from sim.memory import NON_TORCH_BYTES_PER_GPU, plan_memory
from tests.sim.simhelpers import decode_batch, prefill_batch, step_s

M8 = get_model("llama-3.1-8b")
H200 = get_gpu("h200")
P = CostProfile.load("default")


def cm(**engine) -> CostModel:
    return CostModel(M8, H200, EngineConfig(**engine).resolved_for(H200, M8), P)


def prefill(q: int, c: int = 0):
    return prefill_batch(q, c)


def decode(b: int, ctx_each: int):
    return decode_batch(b, b * ctx_each)


def test_large_prefill_is_compute_bound_by_hand():
    # 8192-token prefill of Llama-3.1-8B: every term written out from FLOP and byte counts
    q = 8192
    L, h, H, D, inter, V = 32, 4096, 32, 128, 14336, 128256
    layer_params = L * (h * H * D + 2 * h * 8 * D + H * D * h + 3 * h * inter + 2 * h)
    gemm_flops = 2 * layer_params * q + 2 * V * h * 1  # LM head on the one sampled row
    gemm = max(gemm_flops / (989.5e12 * 0.70), (layer_params + V * h) * 2 / (4800e9 * 0.85))
    attn_flops = 4 * L * H * D * (q * (q + 1) / 2)
    attn = max(attn_flops / (989.5e12 * 0.50), q * 131072 / (4800e9 * 0.70))
    elementwise = q * L * (8 * h + 3 * inter) * 2 / (4800e9 * 0.70)
    gpu = gemm + attn + elementwise + 1.5e-4
    cpu = 4e-4 + 1.2e-5
    assert step_s(cm(), prefill(q)) == pytest.approx(gpu + cpu, rel=1e-12)
    assert gemm == pytest.approx(gemm_flops / (989.5e12 * 0.70))  # compute side wins


def test_small_decode_is_bandwidth_bound():
    m = cm()
    t1, t8 = m.gpu_time_s(decode(1, 100)), m.gpu_time_s(decode(8, 100))
    weights_s = M8.num_matmul_params_per_token * 2 / (4800e9 * 0.85)
    assert weights_s < t1 < weights_s * 1.1  # weight streaming dominates
    assert t8 / t1 < 1.05  # 8x the tokens for under 5% more time
    # decode attention: KV bytes grow linearly with context
    a, b = m.gpu_time_s(decode(64, 1000)), m.gpu_time_s(decode(64, 5000))
    assert b - a == pytest.approx(64 * 4000 * 131072 / (4800e9 * 0.70), rel=1e-9)


def test_fp8_weights_and_kv():
    base, w8, kv8 = cm(), cm(quantization="fp8"), cm(kv_cache_dtype="fp8")
    # weight streaming halves with FP8 weights, but for the LM head, which stays 16-bit (as vLLM)
    head_s = M8.vocab_size * M8.hidden_size * 2 / (4800e9 * base.profile.gemm_memory_efficiency)
    assert w8._weights_s == pytest.approx((base._weights_s - head_s) / 2 + head_s)
    # compute-bound prefill: FP8 tensor cores double the decoder GEMMs' rate (the datasheet prior)
    assert w8._gemm_s_per_token == pytest.approx(base._gemm_s_per_token / 2)
    assert w8._gemm_s_per_row == base._gemm_s_per_row
    # long-context decode attention: FP8 KV halves the bytes read, but the kernel converts them
    # slower than HBM streams them: the measured time ratio, not 1/2 (sim/kv_dtype_costs.py)
    d = decode(128, 20000)
    att_base = base.gpu_time_s(d) - base.gpu_time_s(decode(128, 0))
    att_kv8 = kv8.gpu_time_s(d) - kv8.gpu_time_s(decode(128, 0))
    assert att_kv8 == pytest.approx(att_base * H200_FP8.decode_time_ratio, rel=1e-9)


def test_tensor_parallel_all_reduce():
    one, two = cm(), cm(tensor_parallel_size=2)
    assert two._weights_s == pytest.approx(one._weights_s / 2)
    # ring all-reduce: 2 per layer x 2 (tp-1)/tp x tokens x hidden x 2 bytes over NVLink
    q = 4096
    ar = 2 * 32 * (8e-6 + 2 * 0.5 * q * 4096 * 2 / (450e9 * 0.70))
    g1, g2 = one.gpu_time_s(prefill(q)), two.gpu_time_s(prefill(q))
    no_ar = g2 - ar
    replicated = q * 32 * 8 * 4096 * 2 / (4800e9 * 0.70)  # norms/residual run on every rank
    assert no_ar == pytest.approx((g1 - 1.5e-4 - replicated) / 2 + replicated + 1.5e-4, rel=1e-9)


def test_async_scheduling_overlaps_cpu():
    b = decode(256, 500)
    sync, asy = cm(), cm(async_scheduling=True)
    g, c = sync.gpu_time_s(b), sync.cpu_time_s(b)
    assert step_s(sync, b) == pytest.approx(g + c)
    assert step_s(asy, b) == pytest.approx(max(g, c))
    # CPU terms: per step, per sequence, per block allocated and hashed
    b2 = decode_batch(10, 1000, blocks=7)
    b2.num_blocks_hashed = 3
    assert sync.cpu_time_s(b2) == pytest.approx(4e-4 + 10 * 1.2e-5 + 7 * 1.5e-6 + 3 * 1e-6)
    # KV block coarsening: the scheduler's blocks are `block_scale` engine blocks each
    assert sync.cpu_time_s(b2, block_scale=4) == pytest.approx(4e-4 + 10 * 1.2e-5 + 28 * 1.5e-6 + 12 * 1e-6)


def test_speculative_costs():
    sc = SpeculativeConfig(method="draft_model", model="llama-3.2-1b", num_speculative_tokens=4)
    e = EngineConfig(speculative_config=sc).resolved_for(H200, M8)
    draft = get_model("llama-3.2-1b")
    m = CostModel(M8, H200, e, P, draft)
    b = decode_batch(4, 4000, tokens=20)
    d = CostModel(draft, H200, EngineConfig(), P.model_copy(update={"gpu_step_overhead_s": 8e-5}))
    assert m.proposer_gpu_s(b) == pytest.approx(4 * d.forward_s(4, 4, 0, 0, 4000, 4000))
    # the target verifies 5 tokens per sequence: attention sees 5 queries per context token
    no_draft = m.gpu_time_s(b) - m.proposer_gpu_s(b)
    assert no_draft == pytest.approx(m.forward_s(20, 20, 0, 0, 5 * 4000, 4000))
    ng = cm(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert ng.cpu_time_s(b) - cm().cpu_time_s(b) == pytest.approx(4 * 2e-5)


@settings(max_examples=60, deadline=None)
@given(g0=st.floats(1e-4, 0.1), slope=st.floats(0, 1e-4), cpu=st.floats(0, 0.05),
       n=st.integers(1, 300), overlap=st.booleans(), frac=st.floats(0, 1.2))
def test_decode_run_closed_form(g0, slope, cpu, n, overlap, frac):
    run = DecodeRun(g0, slope, cpu, n, overlap)
    dts = [run.dt(i) for i in range(n)]
    assert run.elapsed_s(n) == pytest.approx(sum(dts), rel=1e-9, abs=1e-15)
    # steps that start before a given elapsed time, brute force
    t = frac * sum(dts)
    starts = [sum(dts[:i]) for i in range(n)]
    want = sum(1 for s in starts if s < t)
    got = run.steps_started_before(t)
    assert abs(got - want) <= (1 if any(abs(s - t) < 1e-12 for s in starts) else 0)


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-4), st.integers(1, 40)), min_size=1,
                      max_size=5), cpu=st.floats(0, 0.02), overlap=st.booleans(), frac=st.floats(0, 1.1))
def test_decode_runs_chain_their_segments(parts, cpu, overlap, frac):
    runs = DecodeRuns([DecodeRun(g0, slope, cpu, n, overlap) for g0, slope, n in parts])
    dts = [r.dt(i) for r in runs.runs for i in range(r.n)]  # every step, in order
    assert runs.n == len(dts) and [runs.dt(i) for i in range(runs.n)] == dts
    for m in (0, 1, runs.n // 2, runs.n):
        assert runs.elapsed_s(m) == pytest.approx(sum(dts[:m]), rel=1e-9, abs=1e-15)
    t = frac * sum(dts)
    starts = [sum(dts[:i]) for i in range(runs.n)]
    want = sum(1 for x in starts if x < t)
    assert abs(runs.steps_started_before(t) - want) <= (1 if any(abs(x - t) < 1e-12 for x in starts) else 0)


@settings(max_examples=80, deadline=None)
@given(parts=st.lists(st.tuples(st.floats(1e-4, 0.05), st.floats(0, 1e-4), st.integers(1, 60)), min_size=1,
                      max_size=5), cpu=st.floats(0, 0.02), cpu_slope=st.floats(0, 1e-5), overlap=st.booleans(),
       frac=st.floats(0, 1.1))
def test_runs_count_started_steps_as_a_bisection_of_their_starts(parts, cpu, cpu_slope, overlap, frac):
    # the count starts from a closed-form estimate inside one run: it must be exactly what a
    # bisection over every step's start (elapsed_s, the same floats) finds
    runs = DecodeRuns([DecodeRun(g0, slope, cpu, n, overlap, cpu_slope) for g0, slope, n in parts])
    for t in (frac * runs.elapsed_s(runs.n), runs.elapsed_s(runs.n // 2), 0.0):
        lo, hi = 0, runs.n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if runs.elapsed_s(mid - 1) < t else (lo, mid - 1)
        assert runs.steps_started_before(t) == lo


def test_decode_linear_matches_step_time():
    m = cm()
    run = m.decode_run(16, 16 * 300, 50)
    for i in (0, 17, 49):
        assert run.dt(i) == pytest.approx(step_s(m, decode_batch(16, 16 * 300 + 16 * i)))


def test_profile_roundtrip_and_errors(tmp_path):
    p = tmp_path / "x.json"
    prof = P.model_copy(update={"name": "x", "hardware": "h200", "cpu_step_s": 1e-3})
    prof.save(p)
    assert CostProfile.load(p) == prof
    data = json.loads(p.read_text())
    data["schema_version"] = 99
    p.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="schema_version"):
        CostProfile.load(p)
    with pytest.raises(ValueError, match="built-in profiles"):
        CostProfile.load("nope")


def test_memory_plan_by_hand():
    e = EngineConfig().resolved_for(H200, M8)  # 8192 batched tokens, 1024 seqs
    plan = plan_memory(M8, H200, e)
    act = 8192 * (2 * 14336 + 4 * 4096) * 2 + 1024 * 128256 * 4 + NON_TORCH_BYTES_PER_GPU
    free = 141e9 * 0.92 - M8.num_params * 2 - act
    assert plan.activation_reserve_bytes == pytest.approx(act)
    assert plan.kv_capacity_tokens == int(free // 131072)
    assert plan.num_gpu_blocks == plan.kv_capacity_tokens // 16
    # a draft model's weights come out of KV capacity
    sd = EngineConfig(speculative_config={"method": "draft_model", "model": "llama-3.2-1b",
                                          "num_speculative_tokens": 4}).resolved_for(H200, M8)
    drafted = plan_memory(M8, H200, sd)
    draft = get_model("llama-3.2-1b")
    # ...and every token also keeps the draft's KV (16 layers x 8 heads x 64 x 2 x 2 bytes)
    assert draft.kv_bytes_per_token() == 32768
    free_after = free - draft.num_params * 2
    assert drafted.kv_bytes_per_token == 131072 + 32768
    assert drafted.kv_capacity_tokens == pytest.approx(free_after / (131072 + 32768), abs=1)
    # FP8 KV doubles the tokens (same bytes)
    assert plan_memory(M8, H200, e.model_copy(update={"kv_cache_dtype": "fp8"})).kv_capacity_tokens \
        in (2 * plan.kv_capacity_tokens, 2 * plan.kv_capacity_tokens + 1)


def test_memory_plan_does_not_fit_names_fix():
    e = EngineConfig().resolved_for(get_gpu("h100-sxm"), get_model("llama-3.1-70b"))
    with pytest.raises(ValueError, match="tensor-parallel-size"):
        plan_memory(get_model("llama-3.1-70b"), get_gpu("h100-sxm"), e)
    # TP 4 fits
    e4 = e.model_copy(update={"tensor_parallel_size": 4})
    assert plan_memory(get_model("llama-3.1-70b"), get_gpu("h100-sxm"), e4).num_gpu_blocks > 1000


def test_vllm_defaults_and_args():
    e = EngineConfig().resolved_for(H200, M8)
    assert (e.max_num_batched_tokens, e.max_num_seqs) == (8192, 1024)
    a = EngineConfig().resolved_for(get_gpu("a100-80gb"), M8)
    assert (a.max_num_batched_tokens, a.max_num_seqs) == (2048, 256)
    args = EngineConfig(enable_prefix_caching=False, max_num_seqs=64,
                        speculative_config='{"method":"ngram","num_speculative_tokens":4}').to_vllm_args()
    assert args == ["--max-num-seqs", "64", "--disable-prefix-caching", "--speculative-config",
                    """'{"method":"ngram","num_speculative_tokens":4}'"""]
    with pytest.raises(ValueError, match="speculative_config is not valid JSON"):
        EngineConfig(speculative_config="{bad")
