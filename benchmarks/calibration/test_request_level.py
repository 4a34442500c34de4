"""request_level.py: an engine run folder becomes the bench result and scrape a client and a
scraper would have recorded (checked against the run's own summary), scrapes are found beside
a result, and the table renders every row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.calibration.request_level import engine_run_to_bench, render_md, scrapes_of
from engine.core.request import Request
from engine.core.run_summary import jsonable
from sim.bench_results import read_bench, read_scrape_pair
from sim.config import EngineConfig
from sim.run import LoadedWorkload, SimConfig, run


def _run_folder(tmp_path: Path) -> tuple[Path, dict]:
    """A run folder written from a synchronous simulation (the engine's files, no torch)."""
    rng = np.random.default_rng(2)
    t = np.cumsum(rng.exponential(1 / 6.0, 30))
    reqs, nid = [], 0
    for i in range(30):
        p, o = int(rng.integers(32, 800)), int(rng.integers(4, 64))
        nb = -(-p // 16)
        reqs.append(Request(request_id=i, arrival_s=float(t[i] - t[0]), prompt_len=p, output_len=o,
                            hash_ids=tuple(range(nid, nid + nb))))
        nid += nb
    eng = EngineConfig(max_num_seqs=32, max_num_batched_tokens=1024, num_gpu_blocks_override=2000,
                       async_scheduling=False)
    res = run(LoadedWorkload(reqs, "r"), SimConfig(model="llama-3.2-1b", gpu="h200", engine=eng, skip_ahead=False))
    d = tmp_path / "chat-x"
    d.mkdir()
    info = {"schema": "costline-engine-run/1", "name": "chat-x", "model": "llama-3.2-1b", "gpu": "h200",
            "engine_args": {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "async_scheduling": False,
                            "max_model_len": 4096},
            "hash_block_size": 16, "honor_arrivals": True, "num_gpu_blocks": 2000}
    (d / "run.json").write_text(json.dumps(info))
    for name, table in (("requests", res.requests), ("steps", res.steps)):
        rows = [{k: jsonable(v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in table.items()}
                for i in range(len(next(iter(table.values()))))]
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = jsonable(res.summary().to_json_dict())
    (d / "summary.json").write_text(json.dumps(summary))
    return d, summary


def test_an_engine_run_becomes_the_client_s_result_and_the_server_s_scrape(tmp_path):
    d, summary = _run_folder(tmp_path)
    out = engine_run_to_bench(d, tmp_path / "bench")
    assert out["spread"] == 0  # one token per step: every request's gaps are step ends
    (bench,) = read_bench(out["bench"])
    assert len(bench) == 30 and bench.ok.all()
    assert np.median(bench.ttft_s) * 1e3 == pytest.approx(summary["median_ttft_ms"])
    assert np.percentile(bench.latency_s, 99) * 1e3 == pytest.approx(summary["p99_e2el_ms"])
    itl = np.concatenate(bench.itls_s)
    assert itl.mean() * 1e3 == pytest.approx(summary["mean_itl_ms"], rel=0.02)  # per request vs per step
    delta = read_scrape_pair([out["prom"]])
    assert delta.histograms["ttft"].count == 30 and delta.counters["generation_tokens"] == bench.output_lens.sum()


def test_scrapes_are_found_beside_a_result(tmp_path):
    r = tmp_path / "run@0.5-b1.json"
    r.write_text("{}")
    assert scrapes_of(r) == []
    (tmp_path / "run@0.5-b1.prom").write_text("")
    assert scrapes_of(r) == [tmp_path / "run@0.5-b1.prom"]
    for s in ("before", "after"):
        (tmp_path / f"run@0.5-b1.{s}.prom").write_text("")
    assert scrapes_of(r) == [tmp_path / "run@0.5-b1.before.prom", tmp_path / "run@0.5-b1.after.prom"]


def test_the_table_has_a_line_per_row_with_its_figures():
    row = {"model": "m", "start": "first principles", "metrics": True, "multipliers":
           {"prefill": 1.0, "decode": 1.5, "kv": 0.5, "host": 2.0}, "fit_error": 0.01, "held_out_error": 0.02,
           "step_level_same_rebuild": 0.04, "step_level_exact_workload": None,
           "ratio_to_step_level_same_rebuild": 0.5, "ratio_to_step_level_exact": None, "fit_seconds": 9.0,
           "fit_cpu_seconds": 3.0, "simulations": 12, "held_out_runs": {"a": 0.02}, "fit_runs": {"b": 0.01}}
    md = render_md({"date": "d", "command": "c", "method": "m", "fit_runs": ["b"], "rows": [row]})
    assert "| m | first principles | engine run as bench + metrics | 1.00 / 1.50 / 0.50 / 2.00 | 1.0% | 2.0% | 4.0% | -" in md
    assert "0.50x / -" in md and "- m, engine run as bench + metrics: a 2.0%" in md
