"""`costline engine run --disagg 1:1` on the CPU: the aggregated run's files plus transfers.jsonl."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from costline.cli import app
from engine.core.records import REQUEST_COLUMNS, STEP_COLUMNS

ARGS = ["engine", "run", "--model", "tiny", "--device", "cpu", "--workload", "lab-random", "--first", "3",
        "--speedup", "1000", "--max-prompt-len", "40", "--max-model-len", "512", "--block-size", "8"]


def _jsonl(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_engine_run_disagg_writes_transfers(tmp_path):
    res = CliRunner().invoke(app, [*ARGS, "--disagg", "1:1", "--out", str(tmp_path / "pd")])
    assert res.exit_code == 0, res.output
    out = tmp_path / "pd"
    rows, steps, transfers = (_jsonl(out / f"{n}.jsonl") for n in ("requests", "steps", "transfers"))
    assert tuple(rows[0]) == REQUEST_COLUMNS and tuple(steps[0]) == STEP_COLUMNS
    assert [r["status"] for r in rows] == ["finished"] * 3 and {r["replica"] for r in rows} == {1}
    assert {s["replica"] for s in steps} == {0, 1}
    # tiny: 2 layers x (K, V) x 8 tokens x 2 KV heads x 16 dims x 4 bytes (float32)
    by_id = {r["request_id"]: r for r in rows}
    for t in transfers:
        assert t["block_bytes"] == 2 * 2 * 8 * 2 * 16 * 4
        assert t["num_blocks"] == -(-by_id[t["request_id"]]["prompt_len"] // 8)
        assert t["bytes"] == t["num_blocks"] * t["block_bytes"] and t["status"] == "done"
    pools = json.loads((out / "pools.json").read_text())
    assert all(p["intact"] for p in pools.values()) and sorted(pools) == ["0", "1"]
    assert json.loads((out / "summary.json").read_text())["num_prompts"] == 3


def test_engine_run_disagg_bad_split_is_one_line(tmp_path):
    res = CliRunner().invoke(app, [*ARGS, "--disagg", "2", "--out", str(tmp_path / "x")], terminal_width=300)
    assert res.exit_code == 2, res.output
    assert "--disagg '2': expected P:D with two integers >= 1, e.g. 1:1" in res.output
    assert "Traceback" not in res.output
