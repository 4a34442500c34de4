"""Speculative pricing with measured `SpecTerms`: verify graphs, the draft's catch-up forward,
verification's host time; values against the roofline terms written out by hand."""

from __future__ import annotations

import pytest

from engine.core.model_spec import get_model
from sim.config import EngineConfig, SpeculativeConfig
from sim.cost_model import CostModel, CostProfile, Roofline, SpecTerms
from sim.hardware import get_gpu
from tests.sim.simhelpers import decode_batch, frozen_profile, prefill_batch

M8, DRAFT = get_model("llama-3.1-8b"), get_model("llama-3.2-1b")
H200 = get_gpu("h200")
FITTED = frozen_profile("h200-llama-3.1-8b")  # no mixed_graph terms: verify pricing as fitted
TERMS = SpecTerms(draft_pass_s=7e-4, verify_cpu_step_s=1e-4, verify_cpu_per_seq_s=3e-6)


def model(method: str = "draft_model", k: int = 2, terms: SpecTerms | None = TERMS) -> CostModel:
    sc = SpeculativeConfig(method=method, num_speculative_tokens=k,
                           model="llama-3.2-1b" if method == "draft_model" else None)
    e = EngineConfig(speculative_config=sc, max_num_seqs=256).resolved_for(H200, M8)
    return CostModel(M8, H200, e, FITTED.model_copy(update={"spec": terms}),
                     DRAFT if method == "draft_model" else None)


def target_s(m: CostModel, b) -> float:
    return m.gpu_time_s(b) - m.proposer_gpu_s(b)


def graph_by_hand(n: int, pad: int, q: int, ctx: int, max_ctx: int) -> float:
    """The decode graph's fitted terms over pad x q tokens, logits at every one."""
    r, t = Roofline.of(M8, H200, EngineConfig()), FITTED.decode
    tokens = pad * q
    gemm = t.gemm * max(r.gemm_s_per_token * tokens + r.gemm_s_per_row * tokens, r.weights_s)
    per_kv = max(r.attn_s_per_pair * q, r.kv_s_per_token)
    attn = per_kv * (t.decode_kv_multiplier(pad) * ctx + t.decode_max_kv_multiplier(pad) * max_ctx)
    return gemm + t.elementwise * r.ew_s_per_token * tokens + t.step_s + t.per_seq_s * pad + attn


def eager_by_hand(n: int, q: int, ctx: int, max_ctx: int) -> float:
    """The eager ("mixed") terms: n decodes of q tokens each, no prefill."""
    r, t = Roofline.of(M8, H200, EngineConfig()), FITTED.mixed
    tokens = n * q
    gemm = t.gemm * max(r.gemm_s_per_token * tokens + r.gemm_s_per_row * tokens, r.weights_s)
    attn = t.decode_kv * max(r.attn_s_per_pair * q, r.kv_s_per_token) * ctx
    attn += t.decode_max_kv * max(r.attn_s_per_pair * q, r.kv_s_per_token) * max_ctx
    return gemm + t.elementwise * r.ew_s_per_token * tokens + t.step_s + t.per_seq_s * n + attn


def verify(n: int, q: int, ctx_each: int = 500):
    b = decode_batch(n, n * ctx_each, tokens=n * q)
    b.max_decode_context = ctx_each
    return b


def test_uniform_verify_batch_replays_a_graph():
    m = model(k=2)
    # 5 decodes pad to the 8-sequence graph: 24 tokens, 3 queries per context token
    assert target_s(m, verify(5, 3)) == pytest.approx(graph_by_hand(5, 8, 3, 2500, 500))
    assert target_s(m, verify(5, 3)) < eager_by_hand(5, 3, 2500, 500)


def test_without_spec_terms_verify_stays_eager():
    # the shipped profiles carry no SpecTerms: their verify pricing is what it was
    assert target_s(model(terms=None), verify(5, 3)) == pytest.approx(eager_by_hand(5, 3, 2500, 500))


def test_verify_graph_token_cap_and_non_uniform_batches():
    m = model(k=6)  # q = 7: graphs up to 512 tokens, the 72-sequence bucket (504) is the last
    assert target_s(m, verify(72, 7)) == pytest.approx(graph_by_hand(72, 72, 7, 72 * 500, 500))
    assert target_s(m, verify(73, 7)) == pytest.approx(eager_by_hand(73, 7, 73 * 500, 500))
    ragged = decode_batch(4, 2000, tokens=4 * 7 - 3)  # one sequence with fewer drafts
    ragged.max_decode_context = 500
    assert target_s(m, ragged) == pytest.approx(eager_by_hand(4, 25 / 4, 2000, 500))


def test_ngram_batches_of_several_sequences_run_eagerly():
    m = model("ngram", k=3)
    assert target_s(m, verify(4, 4)) == pytest.approx(eager_by_hand(4, 4, 2000, 500))
    assert target_s(m, verify(1, 4)) == pytest.approx(graph_by_hand(1, 1, 4, 500, 500))


def draft_forward(tokens: int, rows: int, pairs: float, pkv: float, dkv: float) -> float:
    """The draft's first-principles forward (default efficiencies) plus the measured per-pass cost."""
    r, p = Roofline.of(DRAFT, H200, EngineConfig()), CostProfile.load("default")
    gemm = max((r.gemm_s_per_token * tokens + r.gemm_s_per_row * rows) / p.gemm_compute_efficiency,
               r.weights_s / p.gemm_memory_efficiency)
    pre = max(r.attn_s_per_pair * pairs / p.attn_compute_efficiency, r.kv_s_per_token * pkv / p.attn_memory_efficiency)
    dec = max(r.attn_s_per_pair * dkv / p.attn_compute_efficiency, r.kv_s_per_token * dkv / p.attn_memory_efficiency)
    return gemm + pre + dec + r.ew_s_per_token * tokens / p.elementwise_memory_efficiency + TERMS.draft_pass_s


def test_draft_runs_one_catch_up_forward_then_k_minus_1():
    m = model(k=3)
    b = verify(4, 4)
    one = draft_forward(4, 4, 0, 0, 2000)
    assert m.proposer_gpu_s(b) == pytest.approx(3 * one)
    # a prefill chunk rides in the catch-up forward: still k forwards, not k + 1
    mixed = prefill_batch(100, 20)
    mixed.num_decode_seqs, mixed.num_decode_tokens, mixed.sum_decode_context = 4, 16, 2000
    catch_up = draft_forward(104, 5, 100 * 20 + 5050, 120, 2000)
    assert m.proposer_gpu_s(mixed) == pytest.approx(catch_up + 2 * one)
    # a step of prefill only: the catch-up alone
    assert m.proposer_gpu_s(prefill_batch(100, 20)) == pytest.approx(draft_forward(100, 1, 7050, 120, 0))


def test_verification_host_time():
    with_terms, without = model(k=2), model(k=2, terms=None)
    b = verify(6, 3)
    assert with_terms.cpu_time_s(b) - without.cpu_time_s(b) == pytest.approx(1e-4 + 6 * 3e-6)
    plain = decode_batch(6, 3000)  # no drafts scheduled: nothing to verify
    assert with_terms.cpu_time_s(plain) == pytest.approx(without.cpu_time_s(plain))


def test_spec_terms_round_trip(tmp_path):
    p = FITTED.model_copy(update={"spec": TERMS})
    p.save(tmp_path / "p.json")
    assert CostProfile.load(tmp_path / "p.json").spec == TERMS


def head_forward(tokens: int, rows: int, pairs: float, pkv: float, dkv: float, pass_s: float) -> float:
    """The EAGLE-3 head (one layer of the target's shape, sim.memory.draft_spec) from first
    principles, plus its measured per-pass cost."""
    from sim.memory import draft_spec

    head = draft_spec(M8, SpeculativeConfig(method="eagle3", num_speculative_tokens=2))
    r, p = Roofline.of(head, H200, EngineConfig()), CostProfile.load("default")
    gemm = max((r.gemm_s_per_token * tokens + r.gemm_s_per_row * rows) / p.gemm_compute_efficiency,
               r.weights_s / p.gemm_memory_efficiency)
    pre = max(r.attn_s_per_pair * pairs / p.attn_compute_efficiency, r.kv_s_per_token * pkv / p.attn_memory_efficiency)
    dec = max(r.attn_s_per_pair * dkv / p.attn_compute_efficiency, r.kv_s_per_token * dkv / p.attn_memory_efficiency)
    return gemm + pre + dec + r.ew_s_per_token * tokens / p.elementwise_memory_efficiency + pass_s


def test_eagle3_head_catches_up_over_every_verified_position_at_its_measured_pass_cost():
    """The engine's head runs its catch-up over the 1 + k positions each decode verified, then
    k - 1 single-token forwards; each forward costs `eagle3_pass_s` where measured, else the
    draft's `draft_pass_s`."""
    from sim.memory import draft_spec

    k, b = 3, verify(4, 4)
    sc = SpeculativeConfig(method="eagle3", num_speculative_tokens=k)
    e = EngineConfig(speculative_config=sc, max_num_seqs=256).resolved_for(H200, M8)
    head = draft_spec(M8, sc)
    for terms, pass_s in ((TERMS.model_copy(update={"eagle3_pass_s": 2e-4}), 2e-4), (TERMS, TERMS.draft_pass_s)):
        m = CostModel(M8, H200, e, FITTED.model_copy(update={"spec": terms}), head)
        catch_up = head_forward(16, 4, 0, 0, 2000, pass_s)
        assert m.proposer_gpu_s(b) == pytest.approx(catch_up + 2 * head_forward(4, 4, 0, 0, 2000, pass_s))
    # the draft model ignores the head's term
    assert model(k=3, terms=TERMS.model_copy(update={"eagle3_pass_s": 2e-4})).proposer_gpu_s(b) == \
        pytest.approx(model(k=3).proposer_gpu_s(b))


def test_eagle3_head_cost_grows_per_decoding_sequence_where_measured():
    """The engine's head spends host time per sequence on each of its k forwards (the fit's
    `eagle3_pass_per_seq_s`): k x that x the decodes, on top of the fixed term."""
    from sim.memory import draft_spec

    k, b = 3, verify(4, 4)
    sc = SpeculativeConfig(method="eagle3", num_speculative_tokens=k)
    e = EngineConfig(speculative_config=sc, max_num_seqs=256).resolved_for(H200, M8)
    fixed = TERMS.model_copy(update={"eagle3_pass_s": 2e-4})
    m0, m1 = (CostModel(M8, H200, e, FITTED.model_copy(update={"spec": t}), draft_spec(M8, sc))
              for t in (fixed, fixed.model_copy(update={"eagle3_pass_per_seq_s": 1e-5})))
    assert m1.proposer_gpu_s(b) - m0.proposer_gpu_s(b) == pytest.approx(k * 1e-5 * 4)
