"""The CPU-side pieces of draw_probe.py and power_probe.py (MOE.md runs 19-20), against hand-computed values."""

from __future__ import annotations

import torch

from benchmarks.kernels.draw_probe import Route, relabelled, route_stats, shuffled
from benchmarks.kernels.power_probe import Sample, Sampler


def _route(ids: list[list[int]]) -> Route:
    t = len(ids)
    return Route(torch.arange(t * 2, dtype=torch.float32).reshape(t, 2), torch.full((t, len(ids[0])), 0.5),
                 torch.tensor(ids, dtype=torch.int32))


def test_route_stats_counts_blocks_and_padding_by_hand():
    # 4 experts, blocks of 2 rows: expert 0 has 3 pairs (2 blocks), 1 has 1 (1 block), 2 has 2 (1), 3 none
    r = _route([[0, 1], [0, 2], [0, 2]])
    s = route_stats([r], 4, 2)
    assert s["used_blocks"] == 4 and s["padding_rows"] == 4 * 2 - 6
    assert (s["max_expert_pairs"], s["min_expert_pairs"]) == (3, 0)
    assert s["experts_with_1_2_3_4plus_blocks"] == [2, 1, 0, 0]


def test_relabelling_keeps_the_block_sizes_and_shuffling_keeps_each_tokens_route():
    r = _route([[0, 1], [0, 2], [0, 2], [3, 1]])
    (moved,) = relabelled([r], 4, seed=5)
    assert sorted(torch.bincount(moved.ids.reshape(-1).long(), minlength=4).tolist()) == \
        sorted(torch.bincount(r.ids.reshape(-1).long(), minlength=4).tolist())
    (mixed,) = shuffled([r], seed=3)
    before = {tuple(x.tolist()): tuple(i.tolist()) for x, i in zip(r.x, r.ids)}
    assert {tuple(x.tolist()): tuple(i.tolist()) for x, i in zip(mixed.x, mixed.ids)} == before


def test_sampler_window_means_the_clock_and_ors_the_reasons():
    s = Sampler.__new__(Sampler)
    s.samples = [Sample(0.0, 1980, 100.0, 0), Sample(1.0, 1500, 690.0, 4), Sample(2.0, 1400, 700.0, 1),
                 Sample(3.0, 1980, 120.0, 0)]
    w = s.over(0.5, 2.5)
    assert (w["sm_mhz"], w["min_sm_mhz"], w["watts"], w["reasons_mask"], w["samples"]) == (1450, 1400, 695.0, 5, 2)
    assert s.over(10.0, 11.0) == {}



def test_sustained_timing_counts_only_the_replays_of_the_last_half(monkeypatch):
    """A fake clock that advances 0.1 s a reading, replays that take 100 us a call while the limiter has not
    acted and 50 us after: over 2 s of load only the second half's replays count."""
    from benchmarks.kernels import power_probe

    clock = iter(i * 0.1 for i in range(10_000))
    monkeypatch.setattr(power_probe.time, "monotonic", lambda: next(clock))
    calls = iter([200.0] * 5 + [100.0] * 1000)  # us a replay of 2 calls
    monkeypatch.setattr(power_probe, "replay_us", lambda replay, dry: next(calls))
    s = Sampler.__new__(Sampler)
    s.samples = []
    out = power_probe.sustained_us(lambda: None, 2, 2.0, True, s)
    assert out["median_us"] == 50.0 and 4 <= out["replays"] <= 6
