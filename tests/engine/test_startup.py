"""The engine says where its start-up time goes and records when it was ready (engine/startup.py)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from engine import startup
from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.replay import replay


def test_process_age_counts_from_the_process_start():
    a = startup.process_age_s()
    time.sleep(0.05)
    b = startup.process_age_s()
    assert 0.0 < a < b < a + 5.0
    assert b - a >= 0.04  # /proc's clock ticks are 10 ms: at least 4 of the 5 elapsed


def test_a_long_loop_reports_its_progress(monkeypatch):
    lines: list[str] = []
    log = startup.StartupLog(lines.append)
    monkeypatch.setattr(startup, "PROGRESS_EVERY_S", 0.0)
    told = log.counter("decode graphs", 3)
    for done in (1, 2, 3):
        told(done)
    assert lines == ["engine: decode graphs: 1/3 after 0 s", "engine: decode graphs: 2/3 after 0 s"]
    with log.phase("decode graphs") as detail:
        detail.append("3 graphs")
    assert lines[-1].startswith("engine: decode graphs: ") and lines[-1].endswith(" s (3 graphs)")
    assert [p.name for p in log.phases] == ["decode graphs"] and log.seconds == log.phases[0].seconds


def test_engine_start_up_phases_and_ready_time():
    lines: list[str] = []
    core = EngineCore(EngineArgs(model="tiny", device="cpu", max_model_len=256, max_num_batched_tokens=64,
                                 max_num_seqs=4, seed=0), progress=lines.append)
    assert [p.name for p in core.startup.phases] == ["model", "KV cache"]  # no graphs on a CPU
    core.warm_up()
    names = [p.name for p in core.startup.phases]
    assert names == ["model", "KV cache", "warm-up batches", "attention launches"]
    assert len(lines) == len(names) and all(line.startswith("engine: ") for line in lines)
    warm = core.startup.phases[2]
    assert "requests" in warm.detail and warm.seconds > 0
    assert core.ready_s is None  # warm-up requests do not count
    reqs = [Request(request_id=i, arrival_s=0.0, prompt_len=20, output_len=3, hash_ids=(i, 10 + i)) for i in range(2)]
    before = startup.process_age_s()
    res = replay(core, reqs, honor_arrivals=False)
    assert before <= core.ready_s <= startup.process_age_s()
    s = res.summary().to_json_dict()
    assert s["ready_s"] == core.ready_s
    assert [p["name"] for p in res.startup["phases"]] == names
