"""The H200 serving script's pieces that need no server: request sets, scrape parsing, the archive."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np

from benchmarks.serve import h200


def test_requests_are_reproducible_and_within_the_mix():
    mix = h200.MIXES["chat"]
    a = h200.make_requests(mix, 50, 0, [0.0] * 50, 512, dry=False)
    b = h200.make_requests(mix, 50, 0, [0.0] * 50, 512, dry=False)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    p = np.array([r.prompt_len for r in a])
    o = np.array([r.output_len for r in a])
    assert p.min() >= mix.prompt[2] and p.max() <= mix.prompt[3]
    assert o.min() >= mix.output[2] and o.max() <= mix.output[3]
    assert all(len(r.prompt_token_ids) == r.prompt_len for r in a)
    # own hash ids per request: no two prompts share their first block
    assert len({r.prompt_token_ids[:16] for r in a}) == 50


def test_metric_value_sums_labelled_samples():
    text = ('# HELP x\nvllm:iteration_tokens_total_count{model_name="m"} 12.0\n'
            'vllm:iteration_tokens_total_count{model_name="n"} 3.0\nvllm:iteration_tokens_total_sum{} 99.0\n')
    assert h200.metric_value(text, "vllm:iteration_tokens_total_count") == 15.0
    assert h200.metric_value(text, "vllm:absent") == 0.0


def test_runs_archive_round_trip(tmp_path):
    run = h200.HttpRun("bench-chat@0.5-b1", {"ttfts": [0.1]}, "before 1\n", "after 2\n")
    h200.write_runs_tar(tmp_path / "runs.tar.gz", [run])
    with tarfile.open(tmp_path / "runs.tar.gz") as tar:
        names = tar.getnames()
        assert names == ["runs/bench-chat@0.5-b1.json", "runs/bench-chat@0.5-b1.before.prom",
                         "runs/bench-chat@0.5-b1.after.prom"]
        assert json.load(io.BytesIO(tar.extractfile(names[0]).read())) == {"ttfts": [0.1]}


def test_cli_flags_spell_the_engine_flags():
    flags = h200.Setup.make(True).cli_flags()
    assert flags[:4] == ["--model", "tiny", "--device", "cpu"] and "--async-scheduling" in flags
    off = h200.Setup(True, "tiny", {"async_scheduling": False}, 1, 1, 1).cli_flags()
    assert off == ["--no-async-scheduling"]


def test_overhead_loads_are_budgeted_from_the_replay():
    info = {"runs": {"0.8sat": {"duration": 10.0}, "offline": {"duration": 4.0}}}
    assert h200.overhead_need_s(info, "0.8sat") == 18.0
    assert h200.overhead_need_s(info, "offline") == 10.2
    assert h200.OVERHEAD_ORDER[0] == h200.REPEATED_LOAD  # the load with the noise estimate goes first


def test_dry_run_fills_the_overhead_table(tmp_path):
    """The whole script on the CPU (tiny model): every overhead load has its HTTP row, nothing
    is skipped, every request succeeded (GPU run 2 skipped the HTTP loads on a short budget)."""
    import subprocess
    import sys

    out = tmp_path / "serve"
    subprocess.run([sys.executable, str(h200.Path(h200.__file__)), "--out", str(out), "--dry-run",
                    "--num-requests", "8", "--parts", "overhead", "--budget-s", "900"],
                   check=True, cwd=h200.ROOT, capture_output=True, timeout=900)
    s = json.loads((out / "summary.json").read_text())
    assert "error" not in s and s["skipped"] == []
    rows = s["http_overhead"]
    assert set(rows) == {"0.8sat", "offline", "1.0sat", "0.8sat in-process repeat"}
    for name in ("0.8sat", "offline", "1.0sat"):
        assert rows[name]["http"]["completed"] == 8 and rows[name]["http"]["failed"] == 0
        assert rows[name]["http"]["num_engine_steps"] > 0
    assert "| 0.8sat |" in (out / "summary.md").read_text()
    with tarfile.open(out / "runs.tar.gz") as tar:
        assert sum(n.endswith(".json") for n in tar.getnames()) == 3
