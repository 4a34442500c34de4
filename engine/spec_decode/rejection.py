"""Speculative (rejection) sampling: accept a draft token d drawn from the draft distribution q
with probability min(1, p(d) / q(d)), and on rejection draw from norm(max(p - q, 0)); the token
that comes out is distributed exactly as p (Leviathan et al. 2023, Chen et al. 2023). Greedy
requests accept by exact match with the target's argmax. Vectorised over rows so that a test
can run many trials at once; the engine calls it with one row per draft position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Verdict:
    """Per draft position: whether the draft token was accepted, and the token that replaces
    it when it was not (meaningful at the first rejection only)."""

    accepted: torch.Tensor  # bool [N]
    replacement: torch.Tensor  # int64 [N]


def speculative_accept(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor,
                       uniform: torch.Tensor, noise: torch.Tensor) -> Verdict:
    """Rows of target probabilities `p` [N, V], draft probabilities `q` [N, V] (None: the drafts
    were proposed deterministically, q one-hot at them, as n-gram lookup does), draft tokens
    [N], `uniform` [N] in [0, 1) and Exp(1) `noise` [N, V] for the residual draw."""
    draft = draft.long()
    p_d = p.gather(1, draft[:, None])[:, 0]
    if q is None:
        q = torch.zeros_like(p).scatter_(1, draft[:, None], 1.0)
    q_d = q.gather(1, draft[:, None])[:, 0]
    accepted = uniform * q_d < p_d  # u < p/q, without dividing by a q that may underflow
    residual = (p - q).clamp_min(0.0)
    # p == q leaves no residual mass, but then every draft is accepted: any fallback will do
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, p, residual)
    # the exponential race: argmax(w / E) picks index i with probability w_i / sum(w)
    replacement = (residual / noise).argmax(-1)
    return Verdict(accepted, replacement)


def first_rejection(accepted: list[bool]) -> int:
    """Index of the first rejected draft; len(accepted) when all were accepted."""
    return next((i for i, a in enumerate(accepted) if not a), len(accepted))


def greedy_verify(target_argmax: list[int], drafts: list[int]) -> list[int]:
    """Greedy: drafts kept while they equal the target's argmax at their position, then the
    target's own token (the correction, or the bonus after k accepted). len = accepted + 1."""
    j = first_rejection([d == t for d, t in zip(drafts, target_argmax)])
    return drafts[:j] + [target_argmax[j]]


__all__ = ["Verdict", "first_rejection", "greedy_verify", "speculative_accept"]
