"""Mixture-of-experts terms of the step cost: how many experts a step of T tokens reads.

A decode step reads only the experts its tokens route to, so an MoE model's weight bytes per
step grow with the batch until every expert is touched. Per layer, with E experts and top-k routing:

* uniform routing: a token's k experts are k distinct of E, each expert is among them with
  probability k/E, so one token misses a given expert with probability 1 - k/E and T independent
  tokens touch, in expectation, exactly E * (1 - (1 - k/E)^T) distinct experts;
* skewed routing: expert popularity p_e follows a Zipf law over the experts' ranks, p_e ~ (rank)^-s
  (s = `skew`, 0 = uniform), and a token draws its k experts without replacement with probabilities
  proportional to p (successive sampling: the top-k of Gumbel-perturbed log p). Its inclusion
  probability pi_e has no closed form; we use Rosen's approximation for successive sampling,
  pi_e = 1 - (1 - p_e)^lam with lam solved so that sum_e pi_e = k (exact for uniform p), and then
  E[distinct] = sum_e 1 - (1 - pi_e)^T. tests/sim/test_moe_routing.py checks both against Monte
  Carlo draws (the skewed approximation within a few per cent).

The skew is a cost-profile parameter (`MoeTerms.routing_skew`): a user sets it, or fits it from
measured distinct-expert counts (`fit_routing_skew`). Tokens are taken as independent: real
batches route correlated tokens (one prompt's prefill) to fewer experts; the fit absorbs that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np


def zipf_popularity(num_experts: int, skew: float) -> np.ndarray:
    """Expert popularity p_e (sums to 1), proportional to (rank)^-skew; skew 0 is uniform."""
    if skew < 0:
        raise ValueError(f"routing skew must be >= 0 (0 = uniform), got {skew}")
    p = np.arange(1, num_experts + 1, dtype=np.float64) ** -float(skew)
    return p / p.sum()


def inclusion_probabilities(p: np.ndarray, top_k: int) -> np.ndarray:
    """pi_e, the chance an expert is among one token's k (drawn without replacement, proportional to
    p): Rosen's approximation pi_e = 1 - (1 - p_e)^lam, lam such that sum pi_e = k."""
    e = p.size
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k {top_k} must be in 1..{e} (the number of experts)")
    if top_k == e:
        return np.ones(e)
    log_miss = np.log1p(-np.minimum(p, 1 - 1e-15))

    def total(lam: float) -> float:
        return float(np.sum(-np.expm1(lam * log_miss)))

    lo, hi = 0.0, float(top_k)
    while total(hi) < top_k:  # sum pi rises with lam towards e > k: bracket, then bisect
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) < top_k else (lo, mid)
    return -np.expm1((lo + hi) / 2 * log_miss)


@dataclass(frozen=True)
class ExpertRouting:
    """Top-k routing over `num_experts` experts with Zipf popularity `skew` (0 = uniform)."""

    num_experts: int
    top_k: int
    skew: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k {self.top_k} must be in 1..{self.num_experts} (the number of experts)")
        if self.skew < 0:
            raise ValueError(f"routing skew must be >= 0 (0 = uniform), got {self.skew}")

    @cached_property
    def inclusion(self) -> np.ndarray:
        return inclusion_probabilities(zipf_popularity(self.num_experts, self.skew), self.top_k)

    def expected_touched(self, num_tokens: Any) -> Any:
        """Expected distinct experts a layer reads for `num_tokens` tokens (scalar or numpy array)."""
        t = np.asarray(num_tokens, dtype=np.float64)
        if self.skew == 0:  # exact closed form
            out = self.num_experts * -np.expm1(t * math.log1p(-self.top_k / self.num_experts)) \
                if self.top_k < self.num_experts else np.where(t > 0, float(self.num_experts), 0.0)
        else:
            log_miss = np.log1p(-np.minimum(self.inclusion, 1 - 1e-15))
            out = -np.expm1(np.multiply.outer(t, log_miss)).sum(axis=-1)
        return float(out) if np.ndim(out) == 0 else out

    def tokens_to_touch(self, fraction: float = 0.99) -> int:
        """The fewest tokens per step whose expected distinct experts reach `fraction` of all."""
        want = fraction * self.num_experts
        if self.expected_touched(1) >= want:
            return 1
        lo, hi = 1, 2
        while self.expected_touched(hi) < want:
            lo, hi = hi, hi * 2
            if hi > 1 << 30:
                raise ValueError(f"{fraction:.0%} of the experts are not reached at any batch (skew {self.skew})")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.expected_touched(mid) < want else (lo, mid)
        return hi


def padded_rows_ratio(routing: ExpertRouting, num_tokens: int, block_rows: int) -> float:
    """Rows a grouped GEMM computes over the rows it needs, for `num_tokens` tokens in blocks of
    `block_rows` rows per expert: sum_e block_rows * E[ceil(n_e / block_rows)] / (T k), n_e the pairs
    routed to expert e, Binomial(T, pi_e) (pi_e the inclusion probability; tokens independent).
    E[ceil(n / b)] = sum_{j >= 0} P(n > j b). 1 for `block_rows` 1 (no padding); near 2 when the
    experts get a little more than a block each on average (qwen3-30b-a3b: 128 experts of top 8 in
    128-row blocks at T = 2,200-2,600), where the engine's step time jumps and the factors measured
    at T = 1,024 and 4,096 alone do not say so."""
    if block_rows <= 1 or num_tokens <= 0:
        return 1.0
    return _padded_rows_ratio(routing, int(num_tokens), int(block_rows))


@lru_cache(maxsize=16384)
def _padded_rows_ratio(routing: ExpertRouting, num_tokens: int, block_rows: int) -> float:
    # bdtrc(k, n, p) = P(Binomial(n, p) > k). scipy.special, imported here: only an MoE profile with row
    # blocks needs it (scipy.stats' binom.sf gives the same values but takes ~0.6 s to import, a third
    # of a short qwen3 simulation)
    from scipy.special import bdtrc

    pi = np.unique(np.round(routing.inclusion, 12), return_counts=True)  # uniform routing: one expert class
    edges = np.arange(0, num_tokens + 1, block_rows)
    blocks = sum(c * bdtrc(edges, num_tokens, min(p, 1.0)).sum() for p, c in zip(*pi))
    return float(block_rows * blocks / (num_tokens * routing.top_k))


def sample_touched(routing: ExpertRouting, num_tokens: int, trials: int, seed: int) -> np.ndarray:
    """Monte Carlo: distinct experts touched by `num_tokens` tokens, each drawing its top-k without
    replacement proportional to the Zipf popularity (top-k of Gumbel-perturbed log p), per trial."""
    rng = np.random.default_rng(seed)
    logp = np.log(zipf_popularity(routing.num_experts, routing.skew))
    out = np.empty(trials)
    for i in range(trials):
        g = logp + rng.gumbel(size=(num_tokens, routing.num_experts))
        top = np.argpartition(-g, routing.top_k - 1, axis=1)[:, : routing.top_k]
        out[i] = np.unique(top).size
    return out


def fit_routing_skew(num_experts: int, top_k: int, observed: Sequence[tuple[int, float]]) -> float:
    """The Zipf skew whose expected distinct experts best match `observed` (tokens, mean distinct
    experts) pairs, least squares in relative terms over skew in [0, 4]."""
    if not observed:
        raise ValueError("fit_routing_skew needs at least one (tokens, distinct experts) observation")

    def err(s: float) -> float:
        r = ExpertRouting(num_experts, top_k, s)
        return sum((r.expected_touched(t) / d - 1) ** 2 for t, d in observed)

    grid = np.linspace(0, 4, 81)
    best = float(grid[int(np.argmin([err(s) for s in grid]))])
    lo, hi = max(0.0, best - 0.05), best + 0.05
    for _ in range(40):  # golden-section refinement around the grid's best
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        lo, hi = (lo, b) if err(a) < err(b) else (a, hi)
    return round((lo + hi) / 2, 4)


__all__ = ["ExpertRouting", "fit_routing_skew", "inclusion_probabilities", "padded_rows_ratio", "sample_touched",
           "zipf_popularity"]
