"""Async scheduling's in-flight input tokens (sampled by the previous step, still on the
device) against a plain reference: gathered eagerly in prepare(), or inside a decode or mixed
CUDA graph (stand-ins whose replay runs the captured forward, graph_forward or
mixed_graph_forward, whose first op is the gather over the fixed-size staged lists), with the
tokens in the runner's persistent sampled-token buffer (as the engine's sampler leaves them)
or in another tensor (copied there first). Random steps on one runner each (the lists' unused
entries left by a larger step must write nowhere that matters): decodes whose token is in
flight (their rows in the previous step's tokens shuffled), decodes whose token is on the
host, prefill chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.core.model_spec import get_model
from engine.core.scheduler_output import ScheduledRequest
from engine.model import LlamaModel
from engine.runner import ModelRunner
from tests.engine.test_mixed_graphs import DecodeReplay, MixedReplay

BLOCK = 4
MAX_SEQS = 8
MODEL = LlamaModel(get_model("tiny"), max_positions=64, dtype=torch.float32, seed=0)


def _runner(graphs: bool) -> ModelRunner:
    r = ModelRunner(MODEL, block_size=BLOCK, max_num_seqs=MAX_SEQS, max_num_batched_tokens=32, max_model_len=64)
    r.allocate_kv_cache(num_gpu_blocks_override=MAX_SEQS * 16 + 1)
    if graphs:  # what capture registers on a GPU (cudagraph_mode FULL)
        buf = torch.empty(MAX_SEQS, MODEL.spec.vocab_size)
        for b in r.decode_graph_sizes():
            r.graphs[b] = DecodeReplay(r, b, buf)
            r._graph_logits[b] = buf[:b]
        r.use_mixed_graphs({t: MixedReplay(r, t) for t in r.mixed_graph_sizes()})
    return r


def _step(rng: np.random.Generator, chunks: bool):
    """A random batch: (entries, token lists as the host holds them, in-flight rows, in-flight
    tokens, the ids a forward must read)."""
    n = int(rng.integers(1, MAX_SEQS + 1))
    entries, held, row_of, want = [], {}, {}, []
    flight = list(rng.permutation(MAX_SEQS))  # rows of the previous step's tokens
    prev = rng.integers(300, 500, size=MAX_SEQS).tolist()  # ids the tiny model knows
    budget = 32
    for i in range(n):
        rid = int(rng.integers(0, 1 << 20)) * MAX_SEQS + i
        c = int(rng.integers(1, 40))
        q = int(rng.integers(2, 7)) if chunks and rng.random() < 0.3 else 1
        q = min(q, budget - (n - i - 1))
        budget -= q
        toks = rng.integers(5, 300, size=c + q).tolist()
        if q == 1 and rng.random() < 0.7:  # its input token is still in flight
            row_of[rid] = int(flight.pop())
            want.append(prev[row_of[rid]])
            held[rid] = toks[:c]
        else:
            want += toks[c: c + q]
            held[rid] = toks
        blocks = list(range(16 * i, 16 * i + -(-(c + q) // BLOCK)))
        entries.append(ScheduledRequest(rid, q, c, 0, 0, c + q > 10, True, blocks, ()))
    return entries, held, row_of, prev, want


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("in_buffer", [True, False], ids=["sampled-buffer", "other-tensor"])
def test_inflight_gather_gives_the_reference_ids(graphs, in_buffer):
    rng = np.random.default_rng(5 + 2 * graphs + in_buffer)
    r = _runner(graphs)
    kinds = set()
    for k in range(40):
        entries, held, row_of, prev, want = _step(rng, chunks=k % 2 == 1)
        tokens = torch.tensor(prev)
        if in_buffer:  # where the engine's sampler writes them
            tokens = r.sampled_tokens_out(len(prev)).copy_(tokens)
        inp = r.prepare(entries, held, (row_of, tokens) if row_of else None)
        r.forward(inp)  # a graph step gathers here
        kinds.add(inp.graph_kind)
        assert r.d_input_ids[: inp.num_tokens].tolist() == want
        assert not r.d_input_ids[inp.num_tokens: inp.num_padded_tokens].any()  # padding tokens stay 0
    assert kinds == ({"decode", "mixed"} if graphs else {None})


def test_graph_gather_writes_only_listed_ids():
    """The captured gather runs over every entry of the fixed-size lists: those past the
    step's own write the spare id past the token buffer, whatever a larger earlier step
    staged there."""
    r = _runner(graphs=True)
    big = [ScheduledRequest(i, 1, 5, 0, 0, False, True, [2 * i, 2 * i + 1], ()) for i in range(MAX_SEQS)]
    toks = {i: list(range(10 + i, 15 + i)) for i in range(MAX_SEQS)}  # 5 tokens known, the 6th in flight
    out = r.sampled_tokens_out(MAX_SEQS).copy_(torch.arange(400, 400 + MAX_SEQS))
    for _ in range(2):  # both staging sets hold the large step's lists
        r.forward(r.prepare(big, toks, ({i: i for i in range(MAX_SEQS)}, out)))
    small = big[:2]
    full = {0: toks[0] + [77], 1: toks[1] + [78]}  # now on the host
    inp = r.prepare(small, full)
    r.forward(inp)
    assert r.d_input_ids[:2].tolist() == [77, 78]
    assert r.d_gather_dst.tolist() == [r.d_input_ids.numel()] * MAX_SEQS
