"""bench_h200.py's measures on hand-made tables, and its CPU dry run of the spec-off phase."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
import torch

from benchmarks.spec_decode import bench_h200, corpora, train_pair
from sim.calibrate import load_run
from sim.traces import load_mooncake
from sim.validate import read_run_info


def test_spec_stats_follow_vllm_definitions():
    reqs = {"num_spec_drafts": np.array([4, 6]), "num_spec_draft_tokens": np.array([12, 18]),
            "num_spec_accepted_tokens": np.array([6, 9]), "num_output_tokens": np.array([11, 16])}
    s = bench_h200.spec_stats(reqs)
    assert s["acceptance_rate"] == pytest.approx(15 / 30)
    assert s["mean_acceptance_length"] == pytest.approx(1 + 15 / 10)  # accepted per draft, plus the bonus token
    assert bench_h200.per_request_spec(reqs) == {"drafts": [4, 6], "drafted": [12, 18], "accepted": [6, 9],
                                                 "output_tokens": [11, 16]}


def test_acceptance_windows_split_the_run_in_equal_slices():
    steps = {"t_start_s": np.array([0.0, 1.0, 2.0, 3.0]), "num_spec_tokens": np.array([4, 4, 4, 0]),
             "num_spec_accepted_tokens": np.array([4, 2, 1, 0])}
    w = bench_h200.acceptance_windows(steps, 2)
    assert [x["steps"] for x in w] == [2, 2]
    assert w[0]["acceptance_rate"] == pytest.approx(6 / 8) and w[1]["acceptance_rate"] == pytest.approx(1 / 4)


def test_goodput_counts_finished_requests_within_both_targets():
    reqs = {"status": np.array(["finished", "finished", "finished", "rejected"]),
            "tpot_s": np.array([0.005, 0.02, 0.005, np.nan]), "ttft_s": np.array([0.1, 0.1, 2.0, np.nan])}
    assert bench_h200.goodput_rps(reqs, 2.0, tpot_ms=10, ttft_ms=1000) == pytest.approx(0.5)


def test_best_k_is_the_highest_summed_throughput_per_method():
    rows = [{"method": "ngram", "k": k, "task": t, "output_throughput": tp}
            for k, t, tp in ((1, "code", 10), (1, "json", 10), (2, "code", 30), (2, "json", 1))]
    rows.append({"method": "off", "k": 0, "task": "code", "output_throughput": 99})
    assert bench_h200.best_k(rows) == {"ngram": 2}


def test_break_even_is_the_first_concurrency_where_spec_stops_paying():
    sweep = {"off": [{"concurrency": c, "output_throughput": t, "median_tpot_ms": 10.0}
                     for c, t in ((1, 100.0), (4, 300.0), (16, 800.0))],
             "ngram": [{"concurrency": c, "output_throughput": t, "median_tpot_ms": 5.0}
                       for c, t in ((1, 200.0), (4, 290.0), (16, 900.0))]}
    be = bench_h200.break_even(sweep)["ngram"]
    assert be["stops_paying_at_concurrency"] == 4
    assert [x["throughput_ratio"] for x in be["by_concurrency"]] == pytest.approx([2.0, 290 / 300, 900 / 800])
    assert be["by_concurrency"][0]["tpot_p50_ratio"] == 0.5


def test_draft_memory_counts_the_kv_blocks_the_draft_takes():
    m = bench_h200.draft_memory({"off": {"num_gpu_blocks": 1000}, "draft_model": {"num_gpu_blocks": 880}})
    assert m["kv_blocks_lost"] == 120 and m["kv_blocks_lost_share"] == pytest.approx(0.12)
    assert bench_h200.draft_memory({"off": {"num_gpu_blocks": 1000}}) is None


def test_spec_config_is_the_engine_contract(tmp_path):
    assert bench_h200.spec_config("draft_model", 3, tmp_path) == {
        "method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3}
    assert bench_h200.spec_config("ngram", 2, tmp_path) == {
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """The dry run's target and draft shapes, untrained (the dry run measures plumbing, not text)."""
    root = tmp_path_factory.mktemp("pair")
    for role, spec in (("target", train_pair.TINY_TARGET), ("draft", train_pair.TINY_DRAFT)):
        model = train_pair.TrainLlama(spec, max_positions=64)
        model.init_weights(1)
        train_pair.export(model, root / role)
    return root


def test_a_trained_pair_is_recognised_as_its_presets(tmp_path):
    """run.json names the simulator preset of the exported checkpoint (the simulator prices by it)."""
    from engine.core.model_spec import get_model
    from engine.loader import load_model

    spec = get_model("byte-lm-10m")
    train_pair.export(train_pair.TrainLlama(spec, max_positions=16), tmp_path / "draft")
    facts = bench_h200._model_facts(load_model(tmp_path / "draft", max_positions=16))
    assert facts["preset"] == "byte-lm-10m" and facts["num_params"] == spec.num_params


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()  # the dry run sets one thread
    yield
    torch.set_num_threads(n)


def test_dry_run_serves_spec_off_and_writes_run_folders_the_simulator_reads(tiny_pair, tmp_path, restore_threads):
    out, work = tmp_path / "out", tmp_path / "work"
    bench = bench_h200.main(["--out", str(out), "--work", str(work), "--dry-run", "--weights", str(tiny_pair),
                             "--phases", "serve-off"])
    assert sorted(p.name for p in out.iterdir()) == ["bench.log", "results.json", "runs.tar.xz"]
    results = json.loads((out / "results.json").read_text())
    assert results["phases"]["train"]["ok"] and results["phases"]["serve-off"]["ok"], results["phases"]
    sweep = results["sweep"]["off"]
    assert [r["concurrency"] for r in sweep] == list(bench.plan.concurrencies)
    assert all(r["completed"] == max(bench.plan.min_sweep_requests, 2 * r["concurrency"]) for r in sweep)
    assert all(r["goodput_rps"] is not None for r in sweep)
    assert [r["workload"] for r in results["replays"]] == list(bench_h200.REPLAYS)
    folders = sorted(p.parent for p in (work / "runs").rglob("run.json"))
    assert len(folders) == len(sweep) + len(bench_h200.REPLAYS)
    for f in folders:
        info = read_run_info(f)
        assert info.engine_args["max_model_len"] == bench.plan.max_model_len
        assert load_run(f).steps["step_id"].size > 0
        wl = load_mooncake(f / "workload.jsonl", hash_block_size=info.hash_block_size).requests
        rows = [json.loads(x) for x in (f / "requests.jsonl").read_text().splitlines()]
        cats = [json.loads(x)["category"] for x in (f / "workload.jsonl").read_text().splitlines()]
        assert [r["prompt_len"] for r in rows] == [r.prompt_len for r in wl]
        assert [r["category"] for r in rows] == cats and set(cats) <= set(corpora.TASKS)
    with tarfile.open(out / "runs.tar.xz") as tar:
        assert sum(n.endswith("/run.json") for n in tar.getnames()) == len(folders)
