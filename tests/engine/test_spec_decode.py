"""Speculative decoding in the engine (CPU, tiny model): greedy tokens are the same with drafts
as without, for a draft model that rarely agrees with the target, the target as its own draft
(every draft accepted: exercises the catch-up of the last draft) and n-gram lookup, through
chunked prefills, preemptions (a tight KV pool) and prefix-cache hits of requests added mid-run;
the block pool stays consistent after every step; the counters add up."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.config import EngineArgs
from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.model import LlamaModel
from engine.replay import replay
from engine.sampling import SamplingParams
from engine.spec_decode.proposers import NgramProposer, WithDrafts

BASE = {"device": "cpu", "dtype": "float32", "max_num_seqs": 6, "max_num_batched_tokens": 24, "seed": 0,
        "block_size": 4}
MAX_LEN = 256


def tiny_model(seed: int) -> LlamaModel:
    return LlamaModel(get_model("tiny"), max_positions=MAX_LEN, dtype=torch.float32, seed=seed)


TARGET = tiny_model(0)
OTHER_DRAFT = tiny_model(5)  # same vocabulary, other weights: accepts little


def engine(spec: dict | None, draft: LlamaModel | None = None, **kw) -> EngineCore:
    args = EngineArgs(model="tiny", max_model_len=MAX_LEN, speculative_config=spec, **(BASE | kw))
    return EngineCore(args, model=TARGET, draft_model=draft)


def prompts_of(seed: int, lens: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(16, 512, (n,), generator=g).tolist() for n in lens]


def workload(seed: int) -> list[tuple[int, list[int]]]:
    """(step to add it at, prompt): a shared 16-token prefix (prefix-cache hits for requests
    added after the first finished its prefill), repeats (n-gram lookups find them), one prompt
    longer than the token budget."""
    shared = prompts_of(seed, [16])[0]
    a, b, c, d = prompts_of(seed + 1, [7, 30, 3, 11])
    loop = [40, 41, 42, 43, 44, 45] * 4
    return [(0, shared + a), (0, b), (0, loop), (3, shared + c), (5, shared + d), (6, a + a + a)]


def drive(core: EngineCore, work: list[tuple[int, list[int]]], max_tokens: int = 10,
          check: bool = True) -> dict[int, list[int]]:
    """Add each prompt at its step, step to the end; the block pool checked after every step."""
    step = 0
    pending = sorted(enumerate(work), key=lambda x: x[1][0])
    while pending or core.has_unfinished():
        while pending and pending[0][1][0] <= step:
            rid, (_, p) = pending.pop(0)
            req = Request(request_id=rid, arrival_s=0.0, prompt_len=len(p), output_len=max_tokens,
                          hash_ids=tuple(range(-(-len(p) // 16))))
            core.add_request(req, SamplingParams(max_tokens=max_tokens, ignore_eos=True), p)
        core.step()
        if check:
            core.scheduler.check_invariants()
        step += 1
        assert step < 500
    return {rid: st.output_token_ids for rid, st in core.requests.items()}


REFERENCE: dict[tuple[int, int | None], dict[int, list[int]]] = {}


def reference(seed: int, blocks: int | None) -> dict[int, list[int]]:
    key = (seed, blocks)
    if key not in REFERENCE:
        REFERENCE[key] = drive(engine(None, num_gpu_blocks_override=blocks), workload(seed), check=False)
    return REFERENCE[key]


SPECS = {
    "draft-other": ({"model": "tiny", "num_speculative_tokens": 3}, OTHER_DRAFT),
    "draft-self": ({"model": "tiny", "num_speculative_tokens": 4}, TARGET),
    "ngram": ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
               "prompt_lookup_max": 4}, None),
}


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("blocks", [None, 13])  # 13 blocks of 4 tokens: preemptions
def test_greedy_tokens_equal_without_speculation(name, blocks):
    spec, draft = SPECS[name]
    core = engine(spec, draft, num_gpu_blocks_override=blocks)
    out = drive(core, workload(0))
    assert out == reference(0, blocks)
    s = core.scheduler.stats
    assert s.num_spec_drafts > 0 and s.prefix_cache_hits_tokens > 0
    if blocks is not None:
        assert s.num_preemptions > 0
    if name == "draft-self":  # the target drafts its own greedy tokens: all accepted
        assert s.num_spec_accepted_tokens == s.num_spec_draft_tokens > 0
    if name == "draft-other":
        assert s.num_spec_accepted_tokens < s.num_spec_draft_tokens / 2
    if name == "ngram":  # the repeating prompt is predicted from its own earlier tokens
        assert s.num_spec_accepted_tokens > 0
    assert s.num_free_blocks == s.num_gpu_blocks  # nothing leaked
    # per-request counters add up to the scheduler's
    reqs = core.requests.values()
    assert sum(r.num_spec_draft_tokens for r in reqs) == s.num_spec_draft_tokens
    assert sum(r.num_spec_accepted_tokens for r in reqs) == s.num_spec_accepted_tokens
    assert sum(core.scheduler.num_spec_accepted_per_pos) == s.num_spec_accepted_tokens


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), name=st.sampled_from(list(SPECS)), blocks=st.sampled_from([14, 18, 40]),
       k=st.integers(1, 5), budget=st.sampled_from([8, 24]))
def test_random_runs_keep_outputs_and_block_pool(seed, name, blocks, k, budget):
    """Other prompts, k, pool sizes and budgets: same tokens, invariants after every step."""
    spec, draft = SPECS[name]
    spec = spec | {"num_speculative_tokens": k}
    core = engine(spec, draft, num_gpu_blocks_override=blocks, max_num_batched_tokens=budget)
    ref = drive(engine(None, num_gpu_blocks_override=blocks, max_num_batched_tokens=budget), workload(seed),
                check=False)
    assert drive(core, workload(seed)) == ref
    assert core.scheduler.stats.num_free_blocks == blocks


def test_stop_token_inside_accepted_run_ends_the_request_there():
    """The target as its own draft accepts everything: a stop id that is the 3rd greedy token
    arrives inside a run of accepted drafts; the request ends with it, later tokens dropped."""
    p = prompts_of(3, [9])[0]
    plain = drive(engine(None), [(0, p)], max_tokens=12)[0]
    stop = plain[2]
    first = plain.index(stop)
    core = engine({"model": "tiny", "num_speculative_tokens": 4}, TARGET)
    req = Request(request_id=0, arrival_s=0.0, prompt_len=len(p), output_len=12, hash_ids=(0,))
    core.add_request(req, SamplingParams(max_tokens=12, stop_token_ids=(stop,)), p)
    while core.has_unfinished():
        core.step()
        core.scheduler.check_invariants()
    st_ = core.requests[0]
    assert st_.output_token_ids == plain[: first + 1]
    assert st_.finish_reason == "stop"
    assert core.scheduler.stats.num_free_blocks == core.num_gpu_blocks


def test_temperature_runs_are_seeded_and_consistent():
    """Random sampling with drafts: the same seed gives the same tokens; the block pool and the
    counters stay consistent."""
    work = workload(1)

    def run():
        core = engine({"model": "tiny", "num_speculative_tokens": 3}, OTHER_DRAFT, num_gpu_blocks_override=18)
        for rid, (_, p) in enumerate(work):
            req = Request(request_id=rid, arrival_s=0.0, prompt_len=len(p), output_len=10,
                          hash_ids=tuple(range(-(-len(p) // 16))))
            core.add_request(req, SamplingParams(max_tokens=10, temperature=0.8, top_k=50, seed=rid), p)
        while core.has_unfinished():
            core.step()
            core.scheduler.check_invariants()
        return core, {r: s.output_token_ids for r, s in core.requests.items()}

    a, out_a = run()
    _, out_b = run()
    assert out_a == out_b
    assert all(len(t) == 10 for t in out_a.values())
    assert a.scheduler.stats.num_spec_drafts > 0


def test_replay_tables_summary_and_prometheus_carry_spec_metrics():
    """The target as its own draft (all accepted): per-request, per-step and per-position
    counts are known exactly; async scheduling resolves to False with drafts."""
    k = 3
    core = engine({"model": "tiny", "num_speculative_tokens": k}, TARGET, async_scheduling=True)
    assert core.config.async_scheduling is False and not core.async_scheduling
    out_len = 9  # 1 token from the prefill, then 2 verify steps of 1 + 3 tokens
    reqs = [Request(request_id=i, arrival_s=0.0, prompt_len=5 + i, output_len=out_len, hash_ids=(i,))
            for i in range(3)]
    res = replay(core, reqs, honor_arrivals=False)
    r, s = res.requests, res.steps
    assert r["num_spec_drafts"].tolist() == [2, 2, 2]
    assert r["num_spec_draft_tokens"].tolist() == [2 * k] * 3
    assert r["num_spec_accepted_tokens"].tolist() == [2 * k] * 3
    assert r["num_output_tokens"].tolist() == [out_len] * 3
    assert s["num_spec_accepted_tokens"].sum() == s["num_spec_tokens"].sum() == 6 * k
    assert (s["propose_s"] > 0).all() and (s["propose_s"] <= s["gpu_s"]).all()
    summary = res.summary().to_json_dict()
    assert summary["spec_decode_num_drafts"] == 6
    assert summary["spec_decode_acceptance_length"] == 1 + k
    assert summary["spec_decode_per_position_acceptance_rates"] == [1.0] * k
    assert summary["async_scheduling"] is False  # the effective value, recorded with the run
    assert summary["speculative_config"] == '{"method":"draft_model","model":"tiny","num_speculative_tokens":3}'
    prom = res.prometheus_text()
    for pos in range(k):
        assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="tiny",position="{pos}"}} 6.0' in prom


def test_ngram_proposer_matches_a_brute_force_search():
    rng = np.random.default_rng(0)
    prop = NgramProposer(lookup_min=1, lookup_max=3)
    for _ in range(300):
        toks = rng.integers(0, 4, size=int(rng.integers(1, 25))).tolist()
        k = int(rng.integers(1, 5))
        expect: list[int] = []
        for n in range(min(3, len(toks) - 1), 0, -1):
            suffix = toks[-n:]
            starts = [i for i in range(len(toks) - n) if toks[i: i + n] == suffix]
            if starts:
                expect = toks[starts[-1] + n: starts[-1] + n + k]
                break
        assert prop.propose(toks, k) == expect


def test_with_drafts_reads_like_the_concatenated_list():
    base, drafts = [1, 2, 3, 4], [7, 8]
    view, full = WithDrafts(base, drafts), base + drafts
    assert len(view) == len(full)
    for i in range(len(full)):
        assert view[i] == full[i]
        for j in range(i, len(full) + 1):
            assert view[i:j] == full[i:j]


class ReplayOnCPU:
    """A stand-in for a captured verify graph: replaying runs what the capture records
    (`graph_forward` over the padded persistent buffers), so the CPU checks the padding."""

    def __init__(self, runner, b: int, q: int, buf: torch.Tensor) -> None:
        self.runner, self.b, self.q, self.buf = runner, b, q, buf

    def replay(self) -> None:
        self.runner.graph_forward(self.b, self.q, self.buf)


@pytest.mark.parametrize("name", ["draft-other", "draft-self"])
def test_verify_graph_layout_gives_the_same_tokens(name):
    """Uniform verify batches (every request a decode with k drafts) take the graph path, with
    padding sequences of 1 + k dummy tokens; tokens equal the reference."""
    spec, draft = SPECS[name]
    core = engine(spec, draft, num_gpu_blocks_override=13)
    r, k = core.runner, spec["num_speculative_tokens"]
    sizes = r.verify_graph_sizes(k)
    assert sizes and max(sizes) * (k + 1) <= r.d_input_ids.shape[0]
    buf = torch.empty(max(sizes) * (k + 1), TARGET.spec.vocab_size)
    r.verify_q = k + 1
    for b in sizes:
        r.verify_graphs[b] = ReplayOnCPU(r, b, k + 1, buf)
        r._verify_logits[b] = buf[: b * (k + 1)]
    assert drive(core, workload(0)) == reference(0, 13)
    assert r.num_graph_replays > 0


def test_start_over_switches_ngram_speculation_on_and_off():
    """One engine built without speculation serves n-gram speculation after start_over (the same
    greedy tokens, drafts verified, async turned off as with drafts) and then none again; a draft
    model's config cannot be switched there (it sizes the KV pool)."""
    core = engine(None, async_scheduling=True)
    spec = SPECS["ngram"][0]
    core.start_over(speculative_config=spec)
    assert core.spec_k == 3 and core.scheduler.config.num_speculative_tokens == 3 and not core.async_scheduling
    assert drive(core, workload(0)) == reference(0, None)
    assert core.scheduler.stats.num_spec_drafts > 0 and core.scheduler.stats.num_spec_accepted_tokens > 0
    core.start_over()
    assert core.spec_k == 0 and core.ngram is None and core.async_scheduling
    assert drive(core, workload(0)) == reference(0, None)
    assert core.scheduler.stats.num_spec_drafts == 0
    with pytest.raises(ValueError, match="draft model"):
        core.start_over(speculative_config={"model": "tiny", "num_speculative_tokens": 2})
