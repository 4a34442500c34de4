"""The side-by-side script's CPU-only parts: the trace Vidur reads carries costline's requests
exactly, and the stand-in attention profile reproduces the measured rows it was fitted to."""

from __future__ import annotations

import csv

import pytest

from benchmarks.sim import vidur_attention_standin as standin
from benchmarks.sim import vidur_side_by_side as sbs


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_trace_carries_the_same_requests(tmp_path):
    reqs = sbs.workload(50)
    sbs.write_trace(reqs, tmp_path / "t.csv")
    rows = _rows(tmp_path / "t.csv")
    assert [(float(r["arrived_at"]), int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in rows] \
        == [(q.arrival_s, q.prompt_len, q.output_len) for q in reqs]


def _lookup(rows, batch, chunk, kv):
    hit = [r for r in rows if (int(r["batch_size"]), int(r["prefill_chunk_size"]), int(r["kv_cache_size"]))
           == (batch, chunk, kv)]
    assert len(hit) == 1
    return hit[0]


@pytest.mark.parametrize(("batch", "kv", "ms"), [(128, 768, 0.258), (256, 768, 0.476), (512, 768, 0.929)])
def test_standin_decode_matches_measured_rows(tmp_path, batch, kv, ms):
    standin.write_standin(tmp_path / "a.csv")
    got = float(_lookup(_rows(tmp_path / "a.csv"), batch, 0, kv)["time_stats.attn_decode.median"])
    assert got == pytest.approx(ms, rel=0.1)


@pytest.mark.parametrize(("chunk", "prefill_ms", "save_ms"), [(2176, 0.344, 1.181), (4096, 0.961, 2.314),
                                                               (8192, 3.398, 4.635)])
def test_standin_prefill_matches_measured_rows(tmp_path, chunk, prefill_ms, save_ms):
    standin.write_standin(tmp_path / "a.csv")
    row = _lookup(_rows(tmp_path / "a.csv"), 1, chunk, 0)
    assert float(row["time_stats.attn_prefill.median"]) == pytest.approx(prefill_ms, rel=0.15)
    assert float(row["time_stats.attn_kv_cache_save.median"]) == pytest.approx(save_ms, rel=0.15)


def test_standin_has_the_columns_vidur_filters_on(tmp_path):
    standin.write_standin(tmp_path / "a.csv")
    row = _rows(tmp_path / "a.csv")[0]
    assert (row["n_embd"], row["n_q_head"], row["n_kv_head"], row["block_size"],
            row["num_tensor_parallel_workers"]) == ("4096", "32", "8", "16", "1")


def test_missing_vidur_checkout_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        sbs.parse_args(["--vidur-src", str(tmp_path)])
    assert "--vidur-src" in capsys.readouterr().err
