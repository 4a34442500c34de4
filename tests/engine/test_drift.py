"""Replays of one workload in one engine: the heap the GC scans must not grow from replay to replay,
the frozen replay must leave only the run's own objects to scan and unfreeze afterwards, and the
run's GC statistics reach summary.json. Counts, not wall time: the CPU box's timings are noise."""

from __future__ import annotations

import gc
import itertools
import json
import weakref
from pathlib import Path

import pytest

from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.replay import GcWatch, frozen_heap, replay

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 4


def requests(n: int = 4) -> list[Request]:
    lens = [(9, 4), (14, 3), (6, 5), (17, 3), (11, 4), (8, 3)][:n]
    return [Request(request_id=i, arrival_s=0.0, prompt_len=p, output_len=o,
                    hash_ids=tuple(range(100 * i, 100 * i + -(-p // 16)))) for i, (p, o) in enumerate(lens)]


@pytest.fixture(scope="module")
def core() -> EngineCore:
    return EngineCore(EngineArgs(model="tiny", device="cpu", max_model_len=64, block_size=BLOCK,
                                 max_num_batched_tokens=32, max_num_seqs=4, seed=0))


@pytest.fixture
def low_gc_thresholds():
    """Collections every few dozen allocations, so a short replay collects every generation."""
    old = gc.get_threshold()
    gc.set_threshold(30, 2, 2)
    yield
    gc.set_threshold(*old)


def test_replays_do_not_grow_what_the_gc_scans(core, low_gc_thresholds):
    stats = []
    for _ in range(4):
        core.start_over()
        res = replay(core, requests(6), honor_arrivals=False, freeze_gc=False)
        assert res.gc_stats is not None and res.gc_stats.frozen_objects == 0
        stats.append(res.gc_stats)
        # every step row got its share of the pauses, and the shares add up to the run's
        assert res.step_gc_pause_s.size == res.steps["gpu_s"].size == res.step_launch_s.size
        assert 0 <= res.step_gc_pause_s.sum() <= res.gc_stats.pause_s_total + 1e-9
    assert stats[-1].collections[0] > 0  # the low thresholds did make the replay collect
    # the previous replay's requests are dropped at start_over: the tracked heap stays level
    # (keeping a replay's requests alive would add at least 4 objects per request: 24)
    growth = [b.tracked_objects_end - a.tracked_objects_end for a, b in itertools.pairwise(stats[1:])]
    assert all(g <= 5 for g in growth), growth
    # and full collections do not come more often replay after replay
    assert stats[3].collections[2] <= stats[1].collections[2] + 1


def test_frozen_replay_scans_only_its_own_objects_and_unfreezes(core, tmp_path):
    core.start_over()
    res = replay(core, requests(), honor_arrivals=False, freeze_gc=True)
    s = res.gc_stats
    assert gc.get_freeze_count() == 0  # unfrozen after the run
    # what a full collection would scan during the run: the run's objects, not the start-up heap
    assert s.frozen_objects > 10_000
    assert s.tracked_objects_end - s.frozen_objects < 0.05 * s.frozen_objects
    summary = res.write(tmp_path / "run")
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["gc"] == on_disk["gc"]
    assert on_disk["gc"]["collections"] == list(s.collections) and on_disk["gc"]["frozen_objects"] == s.frozen_objects
    assert "gc" not in res.summary().to_json_dict()  # the summary keys stay the simulator's


def test_frozen_heap_freezes_only_inside_and_frees_frozen_garbage_after():
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a reference cycle: only the cyclic GC frees it
    alive = weakref.ref(a)
    del a, b
    with frozen_heap() as frozen:
        assert frozen > 10_000 and gc.get_freeze_count() > 10_000
        gc.collect()
        assert alive() is not None  # frozen with the heap: no collection reaches it
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None  # unfrozen: collectable again
    with frozen_heap(enabled=False) as frozen:
        assert frozen == 0 == gc.get_freeze_count()


def test_gc_watch_counts_collections():
    with GcWatch() as watch:
        gc.collect()
    assert watch.collections[2] == 1 and watch.pause_s[2] > 0 and watch.pause_s_total == sum(watch.pause_s)
    gc.collect()
    assert watch.collections[2] == 1  # uninstalled
