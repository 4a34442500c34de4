"""The sampler's counter-based draws: one uniform number per (seed, counter), each row's CDF
inverted at it, tokens distributed as softmax(logits / T), and a request's tokens the same whatever
else shares its batches."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from engine.sampling import Sampler, SamplingParams, counter_uniform, inverse_cdf

CPU = torch.device("cpu")


def _splitmix64_torch(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 in signed int64 tensors (products wrap; >> is arithmetic, so masked): the sampler's
    earlier on-device hash, the reference for its host version."""
    def shr(v, k):
        return (v >> k) & ((1 << (64 - k)) - 1)
    z = x + (0x9E3779B97F4A7C15 - (1 << 64))
    z = (z ^ shr(z, 30)) * (0xBF58476D1CE4E5B9 - (1 << 64))
    z = (z ^ shr(z, 27)) * (0x94D049BB133111EB - (1 << 64))
    return z ^ shr(z, 31)


def _uniform_torch(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    bits = _splitmix64_torch(seeds ^ _splitmix64_torch(counters))
    return (((bits >> 11) & ((1 << 53) - 1)).to(torch.float64) + 0.5) * 2.0 ** -53


def test_numbers_are_uniform_and_a_function_of_seed_and_counter():
    n = 1 << 16
    u = np.array([counter_uniform(7, c) for c in range(n)])
    other = np.array([counter_uniform(8, c) for c in range(n)])
    assert bool(((u > 0) & (u < 1)).all())
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert stats.kstest(other, "uniform").pvalue > 1e-3
    # successive counters of one seed, and one counter across neighbouring seeds, are not correlated
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02
    assert abs(np.corrcoef(u, other)[0, 1]) < 0.02


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), counter=st.integers(0, 2**40))
def test_host_numbers_equal_the_int64_tensor_hash(seed, counter):
    """The host's Python-int hash equals the wrapping int64 tensor one, bit for bit (the numbers the
    sampler drew on the device before, so seeded requests keep their tokens)."""
    ref = _uniform_torch(torch.tensor([seed]), torch.tensor([counter]))
    assert counter_uniform(seed, counter) == float(ref[0])


def test_inverse_cdf_against_a_hand_computed_table():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]] * 6)
    u = torch.tensor([0.0001, 0.0999, 0.1001, 0.6999, 0.7001, 0.9999], dtype=torch.float64)
    # cumulative 0.1, 0.1, 0.7, 1.0: token 1 (probability 0) is never drawn
    assert inverse_cdf(probs, u).tolist() == [0, 0, 2, 2, 3, 3]
    # unnormalised rows (a filtered row's mass below 1) are scaled by their total
    assert inverse_cdf(probs * 0.5, u).tolist() == [0, 0, 2, 2, 3, 3]


def test_draws_follow_the_tempered_softmax():
    """4,000 tokens of one request against softmax(logits / T): a chi-square test per temperature."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    for temperature in (0.7, 1.0, 2.0):
        s = Sampler(CPU)
        p = SamplingParams(temperature=temperature, seed=11)
        s.add_request(0, p)
        n = 4000
        draws = [int(s.sample(logits, [0], [p])[0]) for _ in range(n)]
        expected = torch.softmax(logits[0].double() / temperature, -1).numpy() * n
        observed = np.bincount(draws, minlength=5)
        assert stats.chisquare(observed, expected).pvalue > 1e-3, (temperature, observed, expected)


def test_top_k_and_top_p_rows_draw_only_inside_their_set():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]] * 2)
    s = Sampler(CPU)
    pk, pp = SamplingParams(temperature=1.0, top_k=2, seed=1), SamplingParams(temperature=1.0, top_p=0.5, seed=2)
    s.add_request(0, pk)
    s.add_request(1, pp)
    seen_k, seen_p = set(), set()
    for _ in range(300):
        t = s.sample(logits, [0, 1], [pk, pp]).tolist()
        seen_k.add(t[0])
        seen_p.add(t[1])
    assert seen_k == {0, 1}
    assert seen_p == {0}  # softmax(3, 2, ...) puts 0.64 on the first token: the nucleus at 0.5 is it alone


@settings(max_examples=25, deadline=None)
@given(others=st.lists(st.tuples(st.booleans(), st.integers(0, 2**40)), max_size=5), position=st.integers(0, 5),
       steps=st.integers(1, 6))
def test_a_requests_tokens_do_not_depend_on_its_batch(others, position, steps):
    """Request 100 (seeded) drawn alone and inside batches of greedy and random rows, in any place."""
    vocab = 50
    g = torch.Generator().manual_seed(3)
    mine = SamplingParams(temperature=1.3, seed=99)

    def tokens(batch: bool) -> list[int]:
        s = Sampler(CPU)
        s.add_request(100, mine)
        rows = [(100, mine)]
        if batch:
            extra = [(i, SamplingParams(temperature=0.0 if greedy else 1.0, seed=seed))
                     for i, (greedy, seed) in enumerate(others)]
            for rid, p in extra:
                s.add_request(rid, p)
            rows = extra[:position] + rows + extra[position:]
        out = []
        for step in range(steps):
            logits = torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(step))
            logits[[rid for rid, _ in rows].index(100)] = torch.randn(vocab, generator=g.manual_seed(step))
            t = s.sample(logits, [rid for rid, _ in rows], [p for _, p in rows])
            out.append(int(t[[rid for rid, _ in rows].index(100)]))
        return out

    assert tokens(batch=True) == tokens(batch=False)
