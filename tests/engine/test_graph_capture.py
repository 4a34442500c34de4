"""The CUDA-graph capture functions' bookkeeping on the CPU: torch.cuda's stream and graph calls
replaced by stand-ins that run what they wrap, so each capture_*_graphs call runs the real
forward of every bucket (twice to warm up, once "captured") and must register one graph per
bucket, largest first in one pool, with the captured call's output: the logits it returns equal
an independent eager forward of the same persistent buffers."""

from __future__ import annotations

import contextlib
from typing import ClassVar

import pytest
import torch

from engine.core.model_spec import get_model
from engine.model import LlamaModel
from engine.runner import ModelRunner

BLOCK = 4


class _Graph:
    made: ClassVar[list[_Graph]] = []

    def __init__(self) -> None:
        _Graph.made.append(self)

    def pool(self) -> tuple[str, int]:
        return ("pool", id(self))


class _Stream:
    def wait_stream(self, other) -> None:
        pass


@pytest.fixture
def runner(monkeypatch):
    pools: list = []

    @contextlib.contextmanager
    def graph(g, pool=None):
        pools.append(pool)
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    _Graph.made.clear()
    model = LlamaModel(get_model("tiny"), max_positions=128, dtype=torch.float32, seed=0)
    r = ModelRunner(model, block_size=BLOCK, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128)
    r.allocate_kv_cache(num_gpu_blocks_override=64)
    r.is_cuda = True
    r.pools = pools
    return r


def _calls(runner: ModelRunner, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(runner, name)

    def counted(n, *a):
        calls.append(n)
        return real(n, *a)

    setattr(runner, name, counted)
    return calls


def test_decode_graphs_one_per_bucket_with_their_logits(runner):
    calls = _calls(runner, "graph_forward")
    runner.capture_decode_graphs([2, 8, 4])
    assert calls == [8] * 3 + [4] * 3 + [2] * 3  # largest first: two warm-ups, one capture
    assert list(runner.graphs) == [8, 4, 2] and runner.num_graph_captures == 3
    # one pool: the first capture makes it, the others reuse the previous graph's
    assert runner.pools == [None, _Graph.made[0].pool(), _Graph.made[1].pool()]
    for b, g in runner.graphs.items():
        assert g is _Graph.made[[8, 4, 2].index(b)]
        logits = runner._graph_logits[b]
        assert logits.shape == (b, runner.spec.vocab_size)
        with torch.inference_mode():  # an eager forward of the same buffers, into its own logits
            want = ModelRunner.graph_forward(runner, b, 1, torch.empty_like(runner._logits_buf))
        # the buckets share one logits buffer (the smaller ones captured later wrote its first
        # rows, at their own batch size): equal up to the GEMM's rounding at another batch
        assert logits.data_ptr() == runner._logits_buf.data_ptr()
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-6)


def test_verify_and_mixed_graphs_register_every_bucket(runner):
    runner.capture_verify_graphs(2)
    sizes = runner.verify_graph_sizes(2)
    assert sorted(runner.verify_graphs) == sorted(sizes) and runner.verify_q == 3
    for b in sizes:
        assert runner._verify_logits[b].shape == (3 * b, runner.spec.vocab_size)
    calls = _calls(runner, "mixed_graph_forward")
    runner.capture_mixed_graphs()
    mixed = runner.mixed_graph_sizes()
    assert sorted(runner.mixed_graphs) == mixed and runner._mixed_sizes == mixed
    assert calls == [t for t in sorted(mixed, reverse=True) for _ in range(3)]
    assert runner.num_graph_captures == len(sizes) + len(mixed)
