"""`costline calibrate --from-bench`: a result file and a scrape in, a profile out with its
provenance and fit errors; the profile then drives `simulate`; outputs never replaced without
--force; bad input ends as one line naming the file and the key (exit 2).

The "server" is the simulator: its run is written as the bench result a client would have saved,
and its Prometheus text as the scrape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from advisor.commands.calibrate_bench import held_out_runs, scrapes_per_run, split_files
from costline.cli import app
from engine.core.request import Request
from sim.bench_results import bench_from_tables
from sim.config import EngineConfig
from sim.profile_files import load_profile
from sim.request_fit import Multipliers, apply_multipliers
from sim.run import LoadedWorkload, SimConfig, run

runner = CliRunner()
MODEL, GPU = "llama-3.2-1b", "h200"
SERVE = "--max-num-seqs 64 --max-num-batched-tokens 2048 --num-gpu-blocks-override 4000 --no-async-scheduling"


@pytest.fixture(scope="module")
def server_files(tmp_path_factory) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1 / 8.0, 40))
    reqs, nid = [], 0
    for i in range(40):
        p, o = int(rng.integers(32, 1024)), int(rng.integers(8, 96))
        reqs.append(Request(request_id=i, arrival_s=float(t[i] - t[0]), prompt_len=p, output_len=o,
                            hash_ids=tuple(range(nid, nid - (-p // 16)))))
        nid -= -p // 16
    eng = EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048, num_gpu_blocks_override=4000,
                       async_scheduling=False)
    prof = apply_multipliers(load_profile("h200-llama-3.2-1b"), Multipliers(prefill=1.2, decode=1.1, host=1.3))
    res = run(LoadedWorkload(reqs, "srv"), SimConfig(model=MODEL, gpu=GPU, engine=eng), cost_profile=prof)
    obj, _ = bench_from_tables(res.requests, res.steps, duration_s=res.summary().duration_s,
                               model_id="meta-llama/Llama-3.2-1B-Instruct", backend="vllm", date="20261202-120000")
    d = tmp_path_factory.mktemp("server")
    (d / "r.json").write_text(json.dumps(obj))
    (d / "after.prom").write_text(res.prometheus_text())
    return d / "r.json", d / "after.prom"


def calibrate(*args: str):
    return runner.invoke(app, ["calibrate", *args, "--model", MODEL, "--gpu", GPU], terminal_width=300)


def test_a_profile_is_fitted_written_and_usable(server_files, tmp_path):
    bench, prom = server_files
    out = tmp_path / "mine.json"
    res = calibrate("--from-bench", str(bench), "--from-metrics", str(prom), "--serve-args", SERVE, "-o", str(out),
                    "--max-seconds", "60")
    assert res.exit_code == 0, res.output
    assert "held-out" in res.output and "multipliers: prefill" in res.output and "arrivals: measured" in res.output
    prof = load_profile(out)
    assert prof.provenance["kind"] == "measured (request-level fit)" and prof.provenance["bench_files"] == [str(bench)]
    err = prof.fit_error["request_level"]
    # one file: its requests are split; the simulated server is the profile's own kind of engine
    assert err["fit_median_abs_error"] < 0.05 and err["held_out_median_abs_error"] < 0.05
    assert prof.source.startswith("measured (request-level fit)") and prof.model == MODEL
    sim = runner.invoke(app, ["simulate", "--workload", "chat-production", "-n", "20", "--model", MODEL, "--gpu", GPU,
                              "--profile", str(out)], terminal_width=300)
    assert sim.exit_code == 0, sim.output
    again = calibrate("--from-bench", str(bench), "-o", str(out))
    assert again.exit_code == 2 and "--force" in again.output and "already exists" in again.output


def test_a_bad_result_or_a_missing_flag_is_one_line(server_files, tmp_path):
    bench, _ = server_files
    obj = json.loads(bench.read_text())
    obj["ttfts"] = obj["ttfts"][:-1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(obj))
    res = calibrate("--from-bench", str(bad))
    assert res.exit_code == 2 and "bad.json: key 'ttfts' has" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["calibrate", "--from-bench", str(bench), "--gpu", GPU], terminal_width=300)
    assert res.exit_code == 2 and "--model" in res.output
    res = calibrate("--from-bench", str(bench), "--serve-args", "--tensor-parallel 2x")
    assert res.exit_code == 2 and "tensor-parallel" in res.output
    res = calibrate(str(bench), "--from-metrics", str(bench))
    assert res.exit_code == 2 and "--from-bench" in res.output
    res = runner.invoke(app, ["calibrate", "--from-bench", str(bench), "--model", "llama-3.1-8b", "--gpu", GPU],
                        terminal_width=300)
    assert res.exit_code == 2 and "key 'model_id'" in res.output and "--model llama-3.2-1b" in res.output


def test_files_after_the_options_and_scrapes_are_assigned_per_run():
    b, m = split_files([Path("a.json")], [Path("before.prom")], [Path("after.prom"), Path("b.json")])
    assert b == [Path("a.json"), Path("b.json")] and m == [Path("before.prom"), Path("after.prom")]
    assert scrapes_per_run([], 2) == [None, None]
    with pytest.raises(ValueError, match="3 scrape"):
        scrapes_per_run([Path("x")] * 3, 2)
    cases = list("abcdefg")
    assert held_out_runs(cases, 3) == (list("abdeg"), list("cf"))
    assert held_out_runs(list("ab"), 3) == (["a"], ["b"]) and held_out_runs(["a"], 3) == (["a"], [])


def test_serve_args_read_back_what_the_serve_line_prints():
    from sim.serve_line import parse_serve_args

    cfg = EngineConfig(max_num_seqs=96, max_num_batched_tokens=4096, enable_prefix_caching=False, block_size=32,
                       async_scheduling=True, gpu_memory_utilization=0.85, kv_cache_dtype="fp8")
    line = " ".join(cfg.to_vllm_args())
    back = parse_serve_args(f"vllm serve meta-llama/Llama-3.1-8B-Instruct {line}")
    for k in ("max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "block_size", "async_scheduling",
              "gpu_memory_utilization", "kv_cache_dtype"):
        assert getattr(back, k) == getattr(cfg, k), (k, line)
    assert parse_serve_args("--max-num-batched-tokens=8K").max_num_batched_tokens == 8192
