"""The engine's GPU-only timing path, run on the CPU with a stand-in for torch.cuda.Event.

The stand-in keeps CUDA's contract: an event completes only when it, or an event recorded after
it on the same stream, is synchronized (a host read like .tolist() would also complete it on a
GPU, but nothing here can know of it), and elapsed_time() refuses incomplete events with CUDA's
message. A step that samples nothing (only partial prefill chunks, a prompt longer than the
token budget) used to read its events before anything had synchronized them.
"""

from __future__ import annotations

import itertools

import pytest

from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.engine_loop import (
    WARM_UP_OUTPUT_TOKENS,
    WARM_UP_REQUEST_ID_BASE,
    EngineCore,
    warm_up_prompt_lens,
)
from engine.replay import replay

STEP_MS = 2.5  # every fake event is this far after the one recorded before it


class FakeStream:
    def __init__(self) -> None:
        self.seq = itertools.count()
        self.completed_upto = -1


class FakeEvent:
    def __init__(self, stream: FakeStream) -> None:
        self.stream, self.n = stream, None

    def record(self) -> None:
        self.n = next(self.stream.seq)

    def synchronize(self) -> None:
        assert self.n is not None, "synchronize() on an event never recorded"
        self.stream.completed_upto = max(self.stream.completed_upto, self.n)

    def elapsed_time(self, other: FakeEvent) -> float:
        for e in (self, other):
            if e.n is None or e.n > self.stream.completed_upto:
                raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (other.n - self.n) * STEP_MS


def core_with_fake_events(async_scheduling: bool, **kw) -> EngineCore:
    core = EngineCore(EngineArgs(model="tiny", device="cpu", max_model_len=256, block_size=4,
                                 max_num_batched_tokens=32, max_num_seqs=8, seed=0,
                                 async_scheduling=async_scheduling, **kw))
    stream = FakeStream()
    core._use_events = True
    core._new_event = lambda: FakeEvent(stream)
    return core


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_steps_that_sample_nothing_read_their_events_after_a_sync(async_scheduling):
    core = core_with_fake_events(async_scheduling)
    # 100 prompt tokens against a 32-token budget: three steps schedule only a partial chunk
    reqs = [Request(0, 0.0, 100, 3, tuple(range(25)), hash_block_size=4),
            Request(1, 0.0, 10, 5, (90, 91, 92), hash_block_size=4)]
    res = replay(core, reqs, honor_arrivals=False)
    steps = res.step_rows()
    silent = [s for s in steps if s["num_output_tokens"] == 0]
    assert len(silent) >= 2  # the case that crashed on the GPU
    assert all(r["status"] == "finished" for r in res.request_rows())
    # GPU time comes from the events: one event gap (sync: start->end of the forward) or, async,
    # start->forward end; never the host-side fallback
    assert {s["gpu_s"] for s in steps} == {STEP_MS / 1e3}


def test_warm_up_prompt_lens_cover_the_budget_and_fit_the_model():
    assert warm_up_prompt_lens(32, 256) == [1, 2, 15, 16, 17, 31, 32, 33, 69, 100, 128]
    lens = warm_up_prompt_lens(8192, 131072)
    assert {1, 16, 17, 8191, 8192, 8193, 16389} <= set(lens)
    # max_model_len 9000 leaves room for 8993-token prompts: 2 x budget + 5 is dropped, 8193 kept
    assert max(warm_up_prompt_lens(8192, 9000)) == 8193
    assert max(warm_up_prompt_lens(8192, 8195)) == 8195 - WARM_UP_OUTPUT_TOKENS == 8192  # the cap itself


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_warm_up_leaves_the_engine_as_new(async_scheduling):
    reqs = [Request(i, 0.0, 20 + 9 * i, 4 + i, tuple(range(100 * i, 100 * i + -(-(20 + 9 * i) // 4))),
                    hash_block_size=4) for i in range(6)]
    cold = core_with_fake_events(async_scheduling)
    warm = core_with_fake_events(async_scheduling)
    report = warm.warm_up()
    lens = warm_up_prompt_lens(32, 256)
    short = sum(n <= 128 for n in lens)
    assert report.num_requests == 2 * len(lens) + 1 + (1 + 7) + 2 * short and report.num_steps > len(lens)
    assert warm.scheduler.num_running == warm.scheduler.num_waiting == 0
    assert warm.scheduler.stats.prefix_cache_queries_tokens == 0  # a fresh scheduler: no counts, no cache
    assert not warm.requests and all(r < WARM_UP_REQUEST_ID_BASE for r in warm.requests)
    a, b = replay(cold, reqs, honor_arrivals=False), replay(warm, reqs, honor_arrivals=False)
    cols = ("step_id", "num_prefill_tokens", "num_decode_seqs", "sum_decode_context", "num_blocks_allocated",
            "num_blocks_hashed", "num_output_tokens")
    assert [[s[c] for c in cols] for s in a.step_rows()] == [[s[c] for c in cols] for s in b.step_rows()]
    assert a.counters == b.counters


def test_start_over_with_a_smaller_pool_preempts_like_an_engine_built_that_small():
    reqs = [Request(i, 0.0, 40, 30, tuple(range(100 * i, 100 * i + 10)), hash_block_size=4) for i in range(6)]
    built = EngineCore(EngineArgs(model="tiny", device="cpu", max_model_len=256, block_size=4,
                                  max_num_batched_tokens=32, max_num_seqs=8, seed=0, num_gpu_blocks_override=40))
    restarted = core_with_fake_events(False)
    restarted.start_over(num_gpu_blocks_override=40)
    a, b = replay(built, reqs, honor_arrivals=False), replay(restarted, reqs, honor_arrivals=False)
    assert a.summary().num_preemptions > 0
    assert a.summary().num_gpu_blocks == b.summary().num_gpu_blocks == 40
    assert [s["num_preempted"] for s in a.step_rows()] == [s["num_preempted"] for s in b.step_rows()]
    with pytest.raises(ValueError, match="max_num_seqs=9 exceeds the 8"):
        restarted.start_over(max_num_seqs=9)
    with pytest.raises(ValueError, match="block_size"):
        restarted.start_over(block_size=8)


def test_start_over_flags_do_not_stick():
    core = core_with_fake_events(False)
    core.start_over(num_gpu_blocks_override=40, async_scheduling=True)
    assert core.num_gpu_blocks == 40 and core.async_scheduling
    core.start_over()
    assert core.num_gpu_blocks == core.runner.num_blocks > 40 and not core.async_scheduling
    assert core.config.num_gpu_blocks_override is None
