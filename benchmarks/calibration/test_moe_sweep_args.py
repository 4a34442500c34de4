"""moe_sweep.py: a partial call takes the earlier sweep's mixed-graph capture size from its index, and
an index that does not record it is refused with an error naming the flag."""

import argparse
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from moe_sweep import earlier_capture_size


def test_the_earlier_sweeps_capture_size_or_a_clear_error(tmp_path, capsys):
    ap = argparse.ArgumentParser(prog="moe_sweep.py")
    recorded = tmp_path / "index.json"
    recorded.write_text(json.dumps({"capacity_rps": {"chat-production": 1.5}, "max_cudagraph_capture_size": 2048}))
    assert earlier_capture_size(recorded, ap) == 2048
    old = tmp_path / "old-index.json"
    old.write_text(json.dumps({"capacity_rps": {"chat-production": 1.5}}))
    with pytest.raises(SystemExit):
        earlier_capture_size(old, ap)
    err = capsys.readouterr().err
    assert "--max-cudagraph-capture-size" in err and "old-index.json" in err


def test_the_ranking_set_runs_one_request_list_under_each_configuration_capped_at_the_engine():
    """ranking_runs: the same requests at 90% of the earlier chat capacity for every MOE_RANKING entry,
    asynchronous unless the entry says otherwise, its budgets and sequences capped at what the engine was
    built with; a missing chat capacity is an error naming the flag."""
    from types import SimpleNamespace

    from moe_sweep import MOE_RANKING, TINY, ranking_runs

    calls = []
    runner = SimpleNamespace(core=SimpleNamespace(runner=SimpleNamespace(max_num_batched_tokens=2048, max_num_seqs=48)),
                             run=lambda purpose, name, reqs, **kw: calls.append((purpose, name, reqs, kw)))
    ranking_runs(runner, TINY, {"chat-production": 2.0}, 12)
    assert [c[1] for c in calls] == [f"rank-{n}" for n, _ in MOE_RANKING]
    assert all(c[0] == "validation" and c[2] == calls[0][2] and len(c[2]) == 12 for c in calls)
    arrivals = [q.arrival_s for q in calls[0][2]]
    assert arrivals == sorted(arrivals) and 0 < arrivals[-1] < 12 / 1.8 * 3  # Poisson at 1.8 req/s
    kw = {c[1]: c[3] for c in calls}
    assert kw["rank-budget-1024"]["max_num_batched_tokens"] == 1024
    assert kw["rank-budget-4096"]["max_num_batched_tokens"] == 2048  # capped at the engine's buffers
    assert kw["rank-seqs-64"]["max_num_seqs"] == 48
    assert kw["rank-sync"]["async_scheduling"] is False and kw["rank-defaults"]["async_scheduling"] is True
    with pytest.raises(SystemExit, match="--ranking"):
        ranking_runs(runner, TINY, {"code-bursty": 2.0}, 12)


def test_the_long_context_supplement_puts_three_long_decodes_among_poisson_short_requests():
    """long_context_supplement: per scheduling mode (async, then sync), the three long prompts at 1, 4
    and 8 s among the Poisson requests at 1.3x the chat capacity, unique ids, sorted by arrival, in
    the sweep; the long ones' outputs outlast the short ones'."""
    from types import SimpleNamespace

    from moe_sweep import QWEN, long_context_supplement

    calls = []
    runner = SimpleNamespace(run=lambda purpose, name, reqs, **kw: calls.append((purpose, name, reqs, kw)))
    long_context_supplement(runner, QWEN, {"chat-production": 4.0}, n=50)
    assert [(c[0], c[1], c[3]["async_scheduling"]) for c in calls] == [
        ("sweep", "long-context-async", True), ("sweep", "long-context-sync", False)]
    for _, _, reqs, kw in calls:
        assert len(reqs) == 53 and len({q.request_id for q in reqs}) == 53
        assert [q.arrival_s for q in reqs] == sorted(q.arrival_s for q in reqs)
        longs = sorted((q for q in reqs if q.prompt_len >= 6000), key=lambda q: q.arrival_s)
        assert [(q.arrival_s, q.prompt_len, q.output_len) for q in longs] == [
            (1.0, 6000, 700), (4.0, 10000, 700), (8.0, 14000, 700)]
        short = [q for q in reqs if q.prompt_len < 6000]
        assert all(32 <= q.prompt_len < 1536 and 32 <= q.output_len < 320 for q in short)
        # Poisson at 5.2 req/s: 50 arrivals take ~9.6 s
        assert 5 < short[-1].arrival_s < 16
        assert kw["honor_arrivals"] is True


def test_a_ranking_seed_draws_another_slice_of_the_same_workload():
    """ranking_runs(seed=2): the same configurations over requests another draw of chat-production
    (none of seed 1's request lengths in the same order), at the same rate."""
    from types import SimpleNamespace

    from moe_sweep import TINY, ranking_runs

    lists = {}
    for seed in (1, 2):
        calls = []
        runner = SimpleNamespace(core=SimpleNamespace(runner=SimpleNamespace(max_num_batched_tokens=2048,
                                                                              max_num_seqs=48)),
                                 run=lambda purpose, name, reqs, calls=calls, **kw: calls.append((name, reqs, kw)))
        ranking_runs(runner, TINY, {"chat-production": 2.0}, 12, seed)
        lists[seed] = calls
        assert all(f"seed {seed}" in kw["description"] for _, _, kw in calls)
    one, two = lists[1][0][1], lists[2][0][1]
    assert [(q.prompt_len, q.output_len) for q in one] != [(q.prompt_len, q.output_len) for q in two]
    assert len(one) == len(two) == 12
