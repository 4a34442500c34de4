"""What a mixture-of-experts model changes in the advice, in figures the report can quote.

A dense model's decode step reads every weight whatever the batch; a mixture of experts reads only
the experts its tokens route to, so its weight bytes per step grow with the tokens in the step
until every expert is read (sim/moe.py). Two consequences the report states with numbers from the
cost model and profile the advice used:

* the tokens per step from which (nearly) all experts are read: below it, a larger batch costs
  more weight traffic per step than for a dense model; above it, the step is as for a dense
  model of the total size;
* speculative decoding: a verify step of B sequences with k drafts routes B(1 + k) tokens, so it
  reads more experts than the plain decode step it replaces; the acceptance it needs to pay
  rises with that (break-even: expected tokens per verify step = its cost over a decode step's).
"""

from __future__ import annotations

from engine.core.model_spec import ModelSpec, dtype_bytes
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile
from sim.hardware import GPUSpec

DRAFTS = 3  # k of the spec-decode figure (vLLM's common num_speculative_tokens)
BATCHES = (1, 8, 32)


def _step_s(cost: CostModel, tokens: int, seqs: int) -> float:
    """A forward's GPU seconds for `tokens` tokens, `seqs` sampled rows, no attention context: the
    weights and fixed terms a verify step changes."""
    return cost.forward_s(tokens, seqs, 0.0, 0.0, 0.0, 0.0)


def break_even_acceptance(cost_ratio: float, k: int) -> float | None:
    """The per-draft acceptance a at which (1 - a^(k+1)) / (1 - a), the tokens a verify step yields,
    equals `cost_ratio`; None when even a = 1 (k + 1 tokens) does not pay."""
    if cost_ratio >= k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        tokens = sum(a**i for i in range(k + 1))
        lo, hi = (a, hi) if tokens < cost_ratio else (lo, a)
    return (lo + hi) / 2


def moe_notes(model: ModelSpec, gpu: GPUSpec, profile: CostProfile, max_num_seqs: int = 256) -> list[str]:
    """The report's lines on a mixture-of-experts model (empty for a dense one)."""
    if not model.is_moe:
        return []
    cost = CostModel(model, gpu, EngineConfig(max_num_seqs=max_num_seqs), profile)
    r = cost.roofline.routing
    e, k = model.num_experts, model.experts_per_token
    full = r.tokens_to_touch(0.99)
    skew = f"Zipf skew {r.skew:g}" if r.skew else "uniform routing"
    expert_gb = model.expert_params * model.num_layers * model.num_experts * dtype_bytes(model.dtype) / 1e9
    touched = ", ".join(f"{r.expected_touched(b):.0f} at {b}" for b in (1, 8, 32))
    lines = [(f"{model.name} is a mixture of experts ({e} experts, {k} per token; {model.num_params / 1e9:.1f} B "
             f"parameters, {model.num_active_params / 1e9:.1f} B active): a decode step reads only the experts its "
             f"tokens route to -- expected distinct experts per layer {touched} tokens per step, and 99% of all "
             f"{e} from {full} tokens per step ({skew}; profile {profile.name}). Below that the experts' "
             f"{expert_gb:.0f} GB of weights are read in part, so each added sequence costs weight traffic (a dense "
             f"model's step reads all weights at any batch); from {full} tokens per step on, the step reads them all.")]
    parts = []
    for b in BATCHES:
        ratio = _step_s(cost, b * (1 + DRAFTS), b) / _step_s(cost, b, b)
        a = break_even_acceptance(ratio, DRAFTS)
        be = f"break-even acceptance {a:.2f}" if a is not None else "never pays"
        parts.append(f"batch {b}: verify/decode weight cost x{ratio:.2f}, {be}")
    lines.append(f"Speculative decoding with {DRAFTS} drafts: a verify step routes (1 + {DRAFTS}) tokens per "
                 f"sequence, so it reads more experts than the decode step it replaces ({'; '.join(parts)}; "
                 "GEMM and fixed terms of the cost model, attention excluded). The draft must be accepted more "
                 "often than for a dense model of the same active size, most at small batches.")
    return lines


__all__ = ["break_even_acceptance", "moe_notes"]
