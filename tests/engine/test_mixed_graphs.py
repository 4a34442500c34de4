"""Mixed-step CUDA graphs on the CPU: a stand-in graph whose replay runs what the capture
records (`ModelRunner.mixed_graph_forward` over the padded persistent buffers: padding tokens
after the last sequence, zero-token dummy sequences, the full block-table width, the LM head
eager on the sampled rows) gives the eager path's greedy tokens, through chunked prompts longer
than the budget, prefix-cache hits, preemptions, async scheduling's in-flight token gather and
speculative verify batches that are not uniform."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import EngineArgs
from engine.core.cuda_graphs import mixed_graph_buckets
from engine.core.flags import FlagError
from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.model import LlamaModel
from engine.runner import ModelRunner
from engine.sampling import SamplingParams
from tests.kernels.helpers import SETTINGS

MAX_LEN = 128
BASE = {"device": "cpu", "dtype": "float32", "max_num_seqs": 5, "max_num_batched_tokens": 24, "seed": 0,
        "block_size": 4, "max_model_len": MAX_LEN}
TARGET = LlamaModel(get_model("tiny"), max_positions=MAX_LEN, dtype=torch.float32, seed=0)


class MixedReplay:
    """Stand-in for a captured mixed graph: replay = the recorded forward."""

    def __init__(self, runner: ModelRunner, num_tokens: int) -> None:
        self.runner, self.num_tokens = runner, num_tokens

    def replay(self) -> None:
        self.runner.mixed_graph_forward(self.num_tokens)


class DecodeReplay:
    """Stand-in for a captured decode graph (logits of b one-token sequences into `buf`)."""

    def __init__(self, runner: ModelRunner, b: int, buf: torch.Tensor) -> None:
        self.runner, self.b, self.buf = runner, b, buf

    def replay(self) -> None:
        self.runner.graph_forward(self.b, 1, self.buf)


def with_stand_in_graphs(core: EngineCore, decode: bool) -> EngineCore:
    """What capture does on a GPU for cudagraph_mode FULL (decode graphs too when `decode`)."""
    r = core.runner
    r.use_mixed_graphs({t: MixedReplay(r, t) for t in r.mixed_graph_sizes()})
    if decode:
        buf = torch.empty(r.max_num_seqs, r.spec.vocab_size)
        for b in (1, 2, 4, r.max_num_seqs):
            r.graphs[b] = DecodeReplay(r, b, buf)
            r._graph_logits[b] = buf[:b]
    return core


def hash_ids(prompt: list[int], block: int = 16) -> tuple[int, ...]:
    """Content keys of each 16-token block (a shared prefix gives equal keys)."""
    return tuple(hash(tuple(prompt[: i + block])) for i in range(0, len(prompt), block))


def drive(core: EngineCore, work: list[tuple[int, list[int], int]]) -> dict[int, list[int]]:
    """Add (step, prompt, max_tokens) requests at their steps; step until all finish."""
    pending = sorted(enumerate(work), key=lambda x: x[1][0])
    step = 0
    while pending or core.has_unfinished():
        while pending and pending[0][1][0] <= step:
            rid, (_, prompt, max_tokens) = pending.pop(0)
            req = Request(request_id=rid, arrival_s=0.0, prompt_len=len(prompt), output_len=max_tokens,
                          hash_ids=hash_ids(prompt))
            core.add_request(req, SamplingParams(max_tokens=max_tokens, ignore_eos=True), prompt)
        core.step()
        step += 1
        assert step < 400
    return {rid: st.output_token_ids for rid, st in core.requests.items()}


@st.composite
def workloads(draw):
    """Prompts of 1..60 tokens (the budget is 24: long ones chunk over steps that sample
    nothing), some sharing a 16- or 32-token prefix, added at random steps."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    shared = rng.integers(16, 512, 32).tolist()
    work = []
    for _ in range(draw(st.integers(2, 7))):
        n = draw(st.sampled_from([1, 2, 3, draw(st.integers(4, 60))]))
        prompt = rng.integers(16, 512, n).tolist()
        if draw(st.booleans()):
            prompt = shared[: draw(st.sampled_from([16, 32]))] + prompt
        work.append((draw(st.integers(0, 6)), prompt, draw(st.integers(1, 12))))
    return work


def engine(**kw) -> EngineCore:
    return EngineCore(EngineArgs(model="tiny", **(BASE | kw)), model=TARGET)


@settings(max_examples=12, **SETTINGS)
@given(work=workloads(), blocks=st.sampled_from([None, 14]), async_scheduling=st.booleans(),
       decode_graphs=st.booleans())
def test_mixed_graph_layout_gives_the_eager_tokens(work, blocks, async_scheduling, decode_graphs):
    """14 blocks of 4 tokens force preemptions; async scheduling gathers in-flight tokens."""
    kw = {"num_gpu_blocks_override": blocks, "async_scheduling": async_scheduling}
    eager = drive(engine(**kw), work)
    core = with_stand_in_graphs(engine(**kw), decode_graphs)
    assert drive(core, work) == eager
    r = core.runner
    assert r.num_mixed_graph_replays > 0
    assert r.num_eager_forwards == 0  # every step fits the largest bucket (the 24-token budget)


def test_non_uniform_verify_batches_replay_mixed_graphs():
    """Speculative verify batches with a varying number of drafts per request (n-gram lookups
    that find 0..3 tokens) take mixed graphs; their logits rows come from logits_idx."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    loop = [40, 41, 42, 43, 44, 45] * 3
    work = [(0, loop, 12), (0, list(range(100, 119)), 8), (2, loop[:7] + [7, 8, 9], 10), (3, [5], 6)]
    eager = drive(engine(), work)
    core = with_stand_in_graphs(engine(speculative_config=spec), decode=False)
    assert drive(core, work) == eager
    assert core.runner.num_mixed_graph_replays > 0 and core.runner.num_eager_forwards == 0


# padding rows of the attention output are never written (uninitialised memory); the layers'
# GEMMs carry whatever they hold, which numpy flags as overflow in the interpreter
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_triton_kernels_through_the_mixed_layout():
    """The Triton kernels (interpreter) over the padded layout: two attention launches with
    empty dummy sequences and unowned padding tokens give the eager Triton path's tokens."""
    model = LlamaModel(get_model("tiny"), max_positions=MAX_LEN, dtype=torch.float32, seed=0,
                       attention_backend="triton")
    work = [(0, list(range(30, 52)), 4), (1, list(range(200, 209)), 4), (2, [7, 8], 3)]

    def run(graphs: bool) -> tuple[dict[int, list[int]], EngineCore]:
        core = EngineCore(EngineArgs(model="tiny", attention_backend="triton", **BASE), model=model)
        if graphs:
            with_stand_in_graphs(core, decode=False)
        return drive(core, work), core

    eager, _ = run(False)
    out, core = run(True)
    assert out == eager
    assert core.runner.num_mixed_graph_replays > 0


def test_padded_mixed_layout_hand_computed():
    """A chunk (6 tokens) beside a decode in the 8-token graph of up to 5 sequences: padding
    tokens 7..8 write nowhere and belong to no sequence; dummy sequences are empty."""
    r = ModelRunner(LlamaModel(get_model("tiny"), max_positions=64, seed=0), block_size=4,
                    max_num_seqs=5, max_num_batched_tokens=24, max_model_len=64)
    r.use_mixed_graphs({t: None for t in r.mixed_graph_sizes()})
    assert r.mixed_graph_sizes() == [1, 2, 4, 8, 16, 24]
    sched = [types.SimpleNamespace(request_id=7, num_new_tokens=6, num_computed_tokens=4,
                                   samples=False, block_ids=[5, 2, 9], num_spec_tokens=0),
             types.SimpleNamespace(request_id=3, num_new_tokens=1, num_computed_tokens=6,
                                   samples=True, block_ids=[0, 11], num_spec_tokens=0)]
    inp = r.prepare(sched, {7: list(range(100, 110)), 3: list(range(50, 57))})
    assert (inp.graph_kind, inp.graph_size, inp.num_padded_tokens, inp.num_decode_seqs) == ("mixed", 8, 8, 1)
    assert r.d_qsl[:6].tolist() == [0, 6, 7, 7, 7, 7]
    assert r.d_seq_lens[:5].tolist() == [10, 7, 0, 0, 0]
    assert r.d_slots[:8].tolist() == [8, 9, 10, 11, 36, 37, 46, -1]
    assert r.d_logits_idx[:1].tolist() == [6]
    # the rows went through the packed copy into the full-width table the graphs read
    assert r.d_block_tables[0, :3].tolist() == [5, 2, 9] and r.d_block_tables[1, :2].tolist() == [0, 11]


def test_work_lists_staged_with_the_step():
    """A runner whose backend takes work lists stages, with the step's one copy, the Q blocks of
    each launch (the decode of row 1; the chunk of row 0, one block of 6 tokens) and their
    counts, for an eager step as for a mixed graph; a pure-decode step stages none."""
    model = LlamaModel(get_model("tiny"), max_positions=64, seed=0, attention_backend="triton")
    r = ModelRunner(model, block_size=4, max_num_seqs=5, max_num_batched_tokens=24, max_model_len=64)
    dec_cap = r._work_cap[0]
    sched = [types.SimpleNamespace(request_id=7, num_new_tokens=6, num_computed_tokens=4,
                                   samples=False, block_ids=[5, 2, 9], num_spec_tokens=0),
             types.SimpleNamespace(request_id=3, num_new_tokens=1, num_computed_tokens=6,
                                   samples=True, block_ids=[0, 11], num_spec_tokens=0)]
    toks = {7: list(range(100, 110)), 3: list(range(50, 57))}
    for graphs in (False, True):
        r.use_mixed_graphs({t: None for t in r.mixed_graph_sizes()} if graphs else {})
        inp = r.prepare(sched, toks)
        assert inp.graph_kind == ("mixed" if graphs else None) and inp.work_items == (1, 1)
        assert r.d_work_counts.tolist() == [1, 1]
        assert r.d_work[0].item() == 1 << 16 and r.d_work[dec_cap].item() == 0  # (row << 16) | block
    decodes = [types.SimpleNamespace(request_id=3, num_new_tokens=1, num_computed_tokens=7,
                                     samples=True, block_ids=[0, 11], num_spec_tokens=0)]
    r.use_mixed_graphs({})
    assert r.prepare(decodes, {3: list(range(50, 58))}).work_items is None


def test_mixed_graph_buckets():
    sizes = mixed_graph_buckets(512)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-3:] == [480, 496, 512] and len(sizes) == 51
    assert mixed_graph_buckets(100)[-2:] == [96, 100] and mixed_graph_buckets(3) == [1, 2, 3]
    # exhaustive: the padding of every step size, from the bucket it replays
    for n in range(1, 513):
        pad = next(t for t in sizes if t >= n) - n
        assert pad <= (7 if n <= 256 else 15)
    # past vLLM's default of 512: 16 sizes per doubling, every step padded by <= 1/16 of itself
    big = mixed_graph_buckets(8192)
    assert big[:51] == sizes and len(big) == 51 + 64 and big[-1] == 8192 and big == sorted(set(big))
    for n in range(257, 8193):
        assert next(t for t in big if t >= n) - n <= n / 16
    assert mixed_graph_buckets(700)[-3:] == [640, 672, 700]


def test_cudagraph_flags():
    assert EngineArgs().cudagraph_mode == "FULL" and EngineArgs().max_cudagraph_capture_size == 2048
    with pytest.raises(ValueError, match="cudagraph_mode"):
        EngineArgs(cudagraph_mode="PIECEWISE")
    with pytest.raises(ValueError, match="max_cudagraph_capture_size"):
        EngineArgs(max_cudagraph_capture_size=0)
    assert issubclass(FlagError, ValueError)
