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
