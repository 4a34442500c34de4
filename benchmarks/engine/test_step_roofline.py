"""benchmarks/engine/step_roofline.py: a step's naive roofline against a hand computation, the
binning of the ratio table, and the run-folder round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.engine import step_roofline as sr

# Llama-3.1-8B by hand: 32 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 14336, vocab 128256, bf16
LAYER_PARAMS = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
WEIGHT_BYTES = 2 * (32 * LAYER_PARAMS + 128256 * 4096)  # layers + LM head (the embedding is a gather)
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
FLOPS_PER_TOKEN = 2 * 32 * LAYER_PARAMS
FLOPS_PER_ROW = 2 * 128256 * 4096
FLOPS_PER_PAIR = 4 * 32 * 32 * 128  # QK^T and PV, every layer and query head
BW, RATE = 4.2e12, 790e12

COLUMNS = ("num_prefill_tokens", "num_prefill_seqs", "sum_prefill_context", "prefill_attn_pairs",
           "num_decode_tokens", "num_decode_seqs", "sum_decode_context")
# a decode-only step of 4 sequences (1,000 tokens of KV), a mixed step (a 100-token first chunk
# beside 2 decodes of 300 KV tokens), a prefill-only step of 3,000 tokens behind 1,000 cached
ROWS = [(0, 0, 0, 0, 4, 4, 1000), (100, 1, 100, 5050, 2, 2, 600), (3000, 1, 4000, 3000 * 1000 + 3000 * 3001 // 2,
                                                                    0, 0, 0)]


def hand_roofline_s(prefill_tokens, prefill_seqs, prefill_ctx, pairs, decode_tokens, decode_seqs, decode_ctx):
    tokens = prefill_tokens + decode_tokens
    kv_bytes = KV_BYTES_PER_TOKEN * (prefill_ctx + decode_ctx + tokens)  # read, then the new tokens written
    flops = (FLOPS_PER_TOKEN * tokens + FLOPS_PER_ROW * (prefill_seqs + decode_tokens)
             + FLOPS_PER_PAIR * (pairs + decode_ctx))  # one query per decode against its context
    return (WEIGHT_BYTES + kv_bytes) / BW + flops / RATE


def table(rows=ROWS) -> dict[str, np.ndarray]:
    return {c: np.array([r[i] for r in rows], dtype=np.float64) for i, c in enumerate(COLUMNS)}


def test_roofline_equals_hand_computation():
    got = sr.roofline_s(table(), sr.rates("llama-3.1-8b", 4.2, 790.0))
    want = [hand_roofline_s(*r) for r in ROWS]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # the decode step is bandwidth-bound: weights alone are 3.6 ms at 4.2 TB/s
    assert 3.5e-3 < got[0] < 3.7e-3


def test_rates_override_changes_only_their_terms():
    base = sr.roofline_s(table(), sr.rates("llama-3.1-8b", 4.2, 790.0))
    double_bw = sr.roofline_s(table(), sr.rates("llama-3.1-8b", 8.4, 790.0))
    mem = np.array([(WEIGHT_BYTES + KV_BYTES_PER_TOKEN * (r[2] + r[6] + r[0] + r[4])) / BW for r in ROWS])
    np.testing.assert_allclose(base - double_bw, mem / 2, rtol=1e-9)


def test_kinds_and_bins():
    kind = sr.step_kind(table())
    assert kind.tolist() == ["decode", "mixed", "prefill"]
    roof = np.array([1e-3, 2e-3, 4e-3, 1e-3, 1e-3])
    kind = np.array(["decode", "mixed", "prefill", "mixed", "decode"])
    batch = np.array([4, 2, 0, 1, 300])
    chunk = np.array([0, 100, 3000, 127, 0])
    gpu = roof * np.array([1.5, 2.0, 1.2, 3.0, 1.1])
    rows = {(r.kind, r.bin): r for r in sr.ratio_table(kind, batch, chunk, gpu, roof)}
    assert rows["decode", "4-7"].count == 1 and rows["decode", "4-7"].median == pytest.approx(1.5)
    assert rows["decode", ">=256"].median == pytest.approx(1.1)
    assert rows["mixed", "64-127"].count == 2
    assert rows["mixed", "64-127"].median == pytest.approx(2.5)
    # total time: (2 ms x 2 + 1 ms x 3) / 3 ms
    assert rows["mixed", "64-127"].weighted == pytest.approx(7 / 3)
    assert rows["prefill", ">=2048"].median == pytest.approx(1.2)
    assert rows["decode", "all"].count == 2
    assert ("mixed", "<64") not in rows and ("mixed", "0-63") not in rows  # empty bins are left out


def test_run_folder_round_trip(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    steps = table()
    roof = sr.roofline_s(steps, sr.rates("llama-3.1-8b", 4.2, 790.0))
    with open(run / "steps.jsonl", "w") as f:
        for i in range(3):
            row = {c: float(steps[c][i]) for c in COLUMNS} | {
                "step_id": i + 1, "t_start_s": float(i), "total_s": 0.1, "gpu_s": float(2 * roof[i]),
                "schedule_s": 0.0, "prepare_s": 0.0, "sample_s": 0.0, "num_blocks_allocated": 0,
                "num_blocks_hashed": 0}
            f.write(json.dumps(row) + "\n")
    (run / "run.json").write_text(json.dumps({"name": "r", "model": "llama-3.1-8b", "engine_args": {}}))
    out = tmp_path / "res" / "table"
    assert sr.main([str(run), "--out", str(out), "--warmup-steps", "0"]) == 0
    doc = json.loads(out.with_name("table.json").read_text())
    assert {r["kind"] for r in doc["rows"]} == {"decode", "mixed", "prefill"}
    assert all(r["median"] == pytest.approx(2.0) for r in doc["rows"])
    assert "| mixed | chunk 64-127 | 1 | 2.00 |" in out.with_name("table.md").read_text()
    # an existing table is not overwritten without --force
    assert sr.main([str(run), "--out", str(out), "--warmup-steps", "0"]) == 2
    assert "--force" in capsys.readouterr().err
    assert sr.main([str(run), "--out", str(out), "--warmup-steps", "0", "--force"]) == 0
