"""Prefix structure: system prompts, Zipf popularity, dynamic content, multi-turn carry-over, reuse."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.request import materialize_prompt
from sim.describe import prefix_reuse
from sim.generate import generate
from sim.workload_presets import get_preset
from sim.workload_spec import (
    ConstantArrival,
    DynamicPrefix,
    FixedLength,
    PoissonArrival,
    Sessions,
    SystemPrompts,
    UniformLength,
    WorkloadSpec,
)

K = 5.0


def spec(**kw) -> WorkloadSpec:
    base = {"num_requests": 2000, "arrival": PoissonArrival(rate_rps=10), "prompt_tokens": FixedLength(tokens=512),
            "output_tokens": FixedLength(tokens=8), "hash_block_size": 16}
    return WorkloadSpec(**{**base, **kw})


def test_lab_poisson_reuse_is_exactly_the_system_prompt_share():
    wl = generate(get_preset("lab-poisson"))
    n = len(wl)
    # every request after the first reuses its 256-token (16-block) system prompt of a 1024-token prompt
    want = (n - 1) * 256 / (n * 1024)
    got = prefix_reuse(wl)
    assert got["token_fraction"] == want
    assert got["block_fraction"] == (n - 1) * 16 / (n * 64)
    first = {wl.hash_ids(i)[:16].tobytes() for i in range(n)}
    assert len(first) == 1  # one shared system prompt


def test_system_prompt_zipf_popularity():
    s = spec(num_requests=20_000, system_prompts=SystemPrompts(count=5, tokens=FixedLength(tokens=64),
                                                               zipf_exponent=1.0))
    wl = generate(s)
    first_ids = np.array([wl.hash_ids(i)[0] for i in range(len(wl))])
    # prompt k owns ids 4k..4k+3 (64 tokens = 4 blocks), so the first id names the prompt
    k = first_ids // 4
    w = 1 / np.arange(1, 6)
    p = w / w.sum()
    for j in range(5):
        got = np.mean(k == j)
        assert abs(got - p[j]) < K * math.sqrt(p[j] * (1 - p[j]) / len(wl)), (j, got, p[j])


def test_share_of_requests_without_system_prompt():
    s = spec(num_requests=10_000, system_prompts=SystemPrompts(count=1, tokens=FixedLength(tokens=64),
                                                               share_of_requests=0.7))
    wl = generate(s)
    with_sys = np.mean([wl.hash_ids(i)[0] == 0 for i in range(len(wl))])
    assert abs(with_sys - 0.7) < K * math.sqrt(0.21 / len(wl))


def test_dynamic_prefix_cuts_sharing_at_its_block():
    s = spec(num_requests=10_000, system_prompts=SystemPrompts(count=1, tokens=FixedLength(tokens=128)),
             dynamic_prefix=DynamicPrefix(share_of_requests=0.4, position_tokens=40))
    wl = generate(s)
    sys_ids = np.arange(8)  # 128 tokens = 8 shared blocks
    shared = np.array([int(np.sum(wl.hash_ids(i)[:8] == sys_ids)) for i in range(len(wl))])
    # a dynamic request shares blocks 0, 1 (tokens 0..31); block 2 holds token 40, so it is its own
    assert set(np.unique(shared)) == {2, 8}
    frac = np.mean(shared == 2)
    assert abs(frac - 0.4) < K * math.sqrt(0.24 / len(wl))
    # reuse: (f * 32 + (1 - f) * 128) / 512 of prompt tokens, with the realised f (first request aside)
    want = (np.sum(shared[1:]) * 16) / (512 * len(wl))
    assert abs(prefix_reuse(wl)["token_fraction"] - want) < 1e-12


def test_dynamic_position_zero_shares_nothing():
    s = spec(system_prompts=SystemPrompts(count=1, tokens=FixedLength(tokens=128)),
             dynamic_prefix=DynamicPrefix(share_of_requests=1.0, position_tokens=0))
    assert prefix_reuse(generate(s))["token_fraction"] == 0.0


def test_partial_blocks_and_short_prompts_never_share():
    # a 40-token system prompt has 2 full blocks; a prompt shorter than it shares only full blocks
    s = spec(prompt_tokens=UniformLength(low=1, high=100), system_prompts=SystemPrompts(count=1, tokens=FixedLength(tokens=40)))
    wl = generate(s)
    for r in wl.requests[:300]:
        n_shared = min(40, r.prompt_len) // 16
        assert list(r.hash_ids[:n_shared]) == list(range(n_shared))
        assert all(h >= 2 for h in r.hash_ids[n_shared:])


def session_spec(**kw) -> WorkloadSpec:
    base = {
        "num_requests": 60, "arrival": ConstantArrival(rate_rps=0.01), "prompt_tokens": FixedLength(tokens=57),
        "output_tokens": FixedLength(tokens=5), "hash_block_size": 16,
        "system_prompts": SystemPrompts(count=1, tokens=FixedLength(tokens=40)),
        "sessions": Sessions(turns=FixedLength(tokens=3), mean_think_time_s=1.0,
                             user_message_tokens=FixedLength(tokens=7)),
    }
    return WorkloadSpec(**{**base, **kw})


def test_multiturn_hand_computed_session():
    wl = generate(session_spec())
    reqs = [r for r in wl.requests if r.session_id == 0]
    assert [r.prompt_len for r in reqs] == [57, 69, 81]  # 57 + 5 + 7, then + 5 + 7
    h0, h1, h2 = (r.hash_ids for r in reqs)
    # turn 0: blocks 0-1 are the system prompt (ids 0, 1); block 2 mixes it with the message; block 3 partial
    assert h0[:2] == (0, 1) and len(h0) == 4
    # turn 1 keeps the 57 // 16 = 3 blocks turn 0 covered fully; its partial block 3 becomes new
    assert h1[:3] == h0[:3] and h1[3] != h0[3] and len(h1) == 5
    # turn 2 keeps 69 // 16 = 4 blocks of turn 1
    assert h2[:4] == h1[:4] and h2[4] not in h1 and len(h2) == 6
    assert reqs[0].arrival_s < reqs[1].arrival_s < reqs[2].arrival_s


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), bs=st.sampled_from([4, 16, 64]), sys_tokens=st.integers(1, 200),
       dyn_pos=st.integers(0, 300))
def test_multiturn_carry_over_property(seed, bs, sys_tokens, dyn_pos):
    s = WorkloadSpec(
        num_requests=120, seed=seed, hash_block_size=bs, arrival=PoissonArrival(rate_rps=2.0),
        prompt_tokens=UniformLength(low=1, high=400), output_tokens=UniformLength(low=1, high=50),
        system_prompts=SystemPrompts(count=3, tokens=FixedLength(tokens=sys_tokens)),
        dynamic_prefix=DynamicPrefix(share_of_requests=0.5, position_tokens=dyn_pos),
        sessions=Sessions(turns=UniformLength(low=1, high=6), mean_think_time_s=3.0,
                          user_message_tokens=UniformLength(low=1, high=60)),
    )
    wl = generate(s)
    assert len(wl) == 120 and np.all(np.diff(wl.arrival_s) >= 0)
    last: dict[int, object] = {}
    seen: set[int] = set()
    for r in wl:  # Request.__post_init__ checks len(hash_ids) == ceil(prompt_len / bs)
        prev = last.get(r.session_id)
        if prev is not None:
            assert r.prompt_len > prev.prompt_len + prev.output_len  # + a non-empty user message
            keep = prev.prompt_len // bs
            assert r.hash_ids[:keep] == prev.hash_ids[:keep]
            assert not (set(r.hash_ids[keep:]) & seen)  # the rest is new content
        last[r.session_id] = r
        seen.update(r.hash_ids)


def test_task_mix_frequencies():
    mix = {"chat": 0.5, "code": 0.3, "json": 0.2}
    wl = generate(spec(num_requests=20_000, task_mix=mix))
    cats = wl.category
    for name, p in mix.items():
        assert abs(np.mean(cats == name) - p) < K * math.sqrt(p * (1 - p) / len(wl))


def test_sessions_share_one_category():
    wl = generate(session_spec(num_requests=300, task_mix={"a": 1, "b": 1, "c": 1}))
    for sid in np.unique(wl.session_id):
        assert np.unique(wl.category_code[wl.session_id == sid]).size == 1


def test_shared_hash_ids_materialize_to_shared_tokens():
    wl = generate(spec(num_requests=20, system_prompts=SystemPrompts(count=1, tokens=FixedLength(tokens=100))))
    a, b = wl[3], wl[7]
    ta, tb = materialize_prompt(a, 32000), materialize_prompt(b, 32000)
    n_shared = 100 // 16 * 16  # 96 tokens in 6 shared blocks
    assert ta[:n_shared] == tb[:n_shared]
    assert ta[n_shared:] != tb[n_shared:]
