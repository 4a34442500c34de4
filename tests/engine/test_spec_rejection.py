"""Speculative sampling keeps the target distribution: over many vectorised trials on a small
vocabulary with known p and q, the emitted token's frequencies pass a chi-square test against
p; a subtly wrong rule (resampling from p instead of norm(max(p - q, 0)) after a rejection)
fails the same test, so the test can tell."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from engine.sampling import Sampler, SamplingParams
from engine.spec_decode.rejection import greedy_verify, speculative_accept

V = 6
TRIALS = 200_000


def distributions(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(V, generator=g) ** 2 + 0.01
    q = torch.rand(V, generator=g) ** 2 + 0.01
    q[0] = 0.0  # a token the draft never proposes, that the target likes
    p[0] = 0.3
    return (p / p.sum()).double(), (q / q.sum()).double()


def trials(p: torch.Tensor, q: torch.Tensor, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    draft = torch.multinomial(q.float(), n, replacement=True, generator=g)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    noise = torch.empty(n, V, dtype=torch.float64).exponential_(generator=g)
    return draft, u, noise


def emitted(p, q, seed: int, q_rows=True) -> torch.Tensor:
    draft, u, noise = trials(p, q, TRIALS, seed)
    P, Q = p.expand(TRIALS, V), q.expand(TRIALS, V)
    v = speculative_accept(P, Q if q_rows else None, draft, u, noise)
    return torch.where(v.accepted, draft, v.replacement)


def p_value(tokens: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=V).double()
    return float(chisquare(counts.numpy(), (p / p.sum() * counts.sum()).numpy()).pvalue)


def test_emitted_tokens_follow_the_target_distribution():
    for seed in range(3):
        p, q = distributions(seed)
        assert p_value(emitted(p, q, seed), p) > 1e-3


def test_acceptance_rate_is_the_overlap_of_p_and_q():
    """P(accept) = sum_x min(p(x), q(x)) (the closed form)."""
    p, q = distributions(1)
    draft, u, noise = trials(p, q, TRIALS, 11)
    v = speculative_accept(p.expand(TRIALS, V), q.expand(TRIALS, V), draft, u, noise)
    rate = v.accepted.double().mean().item()
    expect = torch.minimum(p, q).sum().item()
    assert abs(rate - expect) < 4 * (expect * (1 - expect) / TRIALS) ** 0.5


def test_resampling_from_p_after_a_rejection_is_detected():
    """Negative control: the wrong residual inflates tokens q over-proposes; chi-square sees it."""
    p, q = distributions(0)
    draft, u, noise = trials(p, q, TRIALS, 0)
    P = p.expand(TRIALS, V)
    v = speculative_accept(P, q.expand(TRIALS, V), draft, u, noise)
    wrong = (P / noise).argmax(-1)  # a draw from p itself
    tokens = torch.where(v.accepted, draft, wrong)
    assert p_value(tokens, p) < 1e-6


def test_one_hot_drafts_keep_the_target_distribution():
    """n-gram drafts: q is one-hot at the proposed token (accept with p(d), else p without d)."""
    p, _ = distributions(2)
    g = torch.Generator().manual_seed(5)
    draft = torch.full((TRIALS,), 3, dtype=torch.long)
    u = torch.rand(TRIALS, generator=g, dtype=torch.float64)
    noise = torch.empty(TRIALS, V, dtype=torch.float64).exponential_(generator=g)
    v = speculative_accept(p.expand(TRIALS, V), None, draft, u, noise)
    tokens = torch.where(v.accepted, draft, v.replacement)
    assert p_value(tokens, p) > 1e-3
    assert abs(v.accepted.double().mean().item() - p[3].item()) < 0.01


def test_sampler_verify_first_token_follows_p_with_top_k():
    """Through the sampler (per-request generators, top-k applied to p and q): the first token
    kept from a verify follows the filtered target distribution."""
    torch.manual_seed(0)
    logits = torch.randn(2, V)
    draft_logits = torch.randn(V)
    params = SamplingParams(temperature=0.7, top_k=4)
    sampler = Sampler(torch.device("cpu"))
    n = 1200
    for rid in range(n):
        sampler.add_request(rid, params.model_copy(update={"seed": rid}))
    q = sampler.probs(draft_logits[None], params)[0]
    drafts = torch.multinomial(q, n, replacement=True, generator=torch.Generator().manual_seed(1)).tolist()
    kept = sampler.verify(logits.repeat(n, 1), list(range(n)), [params] * n,
                          [[d] for d in drafts], [[q] for _ in range(n)])
    first = torch.tensor([k[0] for k in kept])
    p0 = sampler.probs(logits[:1], params)[0].double()
    counts = torch.bincount(first, minlength=V).double()
    keep = p0 > 0
    assert counts[~keep].sum() == 0  # nothing outside the target's top-k
    expect = p0[keep] / p0[keep].sum() * n
    assert chisquare(counts[keep].numpy(), expect.numpy()).pvalue > 1e-3


def test_greedy_verify_keeps_matching_drafts_then_the_target_token():
    assert greedy_verify([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted: bonus
    assert greedy_verify([5, 6, 7, 8], [5, 9, 7]) == [5, 6]  # correction at the first mismatch
    assert greedy_verify([5], []) == [5]
