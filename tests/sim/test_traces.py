"""Trace loaders: the shared real traces' published figures, formats, bad input, export round trip."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from costline.cli import app
from sim.builtin_traces import BUILTIN_TRACES
from sim.describe import describe_workload, index_of_dispersion
from sim.generate import generate
from sim.traces import (
    MAX_REQUEST_TOKENS,
    TraceFormatError,
    check_input_file,
    detect_format,
    export_mooncake,
    load_trace,
    spread_ties,
)
from sim.workload import Workload
from sim.workload_presets import get_preset
from sim.workload_source import SourceOptions, _is_spec_file, load_workload

MOONCAKE = "mooncake_conversation_trace.jsonl.gz"
AZURE = "AzureLLMInferenceTrace_code.csv.gz"
runner = CliRunner()


# ----------------------------------------------------------------------------- the shared real traces


def test_mooncake_figures_match_its_readme(traces_dir):
    d = describe_workload(load_trace(traces_dir / MOONCAKE))
    assert d["requests"] == 12_031
    assert round(d["duration_s"], 1) == 3537.0
    assert round(d["mean_rate_rps"], 2) == 3.40
    p, o = d["prompt_tokens"], d["output_tokens"]
    assert (round(p["mean"], 1), p["p50"], round(p["p90"]), round(p["p99"]), p["min"], p["max"]) == (
        12035.1, 6909, 27367, 85400, 891, 126195)
    assert (round(o["mean"], 1), o["p50"], round(o["p90"]), round(o["p99"]), o["min"], o["max"]) == (
        342.6, 350, 597, 1119, 1, 2000)
    assert (d["total_prompt_tokens"], d["total_output_tokens"]) == (144_793_823, 4_122_048)
    assert round(100 * d["prefix_reuse"]["token_fraction"], 1) == 37.4
    assert round(100 * d["prefix_reuse"]["block_fraction"], 1) == 36.6
    assert round(d["index_of_dispersion_1s"], 1) == 7.9
    assert d["distinct_arrival_times"] == 1180
    assert d["hash_block_size"] == 512


def test_azure_figures_match_its_readme(traces_dir):
    d = describe_workload(load_trace(traces_dir / AZURE))
    assert d["requests"] == 8_819
    assert round(d["duration_s"], 1) == 3435.9
    assert round(d["mean_rate_rps"], 2) == 2.57
    p, o = d["prompt_tokens"], d["output_tokens"]
    assert (round(p["mean"], 1), p["p50"], round(p["p90"]), round(p["p99"]), p["min"], p["max"]) == (
        2047.8, 1469, 5188, 7436, 3, 7437)
    assert (round(o["mean"], 1), o["p50"], round(o["p90"]), round(o["p99"]), o["min"], o["max"]) == (
        27.9, 13, 55, 251, 6, 1899)
    assert (d["total_prompt_tokens"], d["total_output_tokens"]) == (18_059_974, 245_896)
    assert round(d["index_of_dispersion_1s"], 1) == 13.2
    assert d["distinct_arrival_times"] == 8_819  # no duplicate timestamps
    assert d["prefix_reuse"]["token_fraction"] == 0.0  # no prefix info: every block is its own


def test_shipped_traces_are_the_published_bytes(traces_dir):
    """Decompressed, each shipped trace has the SHA-256 its README records (the published file)."""
    readme = (traces_dir / "README.md").read_text()
    for trace in BUILTIN_TRACES.values():
        digest = hashlib.sha256(gzip.decompress(trace.path.read_bytes())).hexdigest()
        row = next(line for line in readme.splitlines() if f"`{trace.file}`" in line)
        assert digest in row, trace.name


def test_builtin_traces_load_by_name_wherever_a_workload_is_taken():
    moon = load_workload("mooncake-conversation", SourceOptions(first=100))
    assert len(moon) == 100 and moon.hash_block_size == 512
    assert any("built-in trace 'mooncake-conversation'" in n for n in moon.notes)
    azure = load_workload("azure-code-2023")
    assert len(azure) == 8_819 and int(azure.prompt_len.sum()) == 18_059_974
    res = runner.invoke(app, ["workload", "presets"])
    assert res.exit_code == 0
    assert "mooncake-conversation" in res.output and "azure-code-2023" in res.output
    with pytest.raises(FileNotFoundError, match="built-in trace"):
        load_workload("mooncake-conversaton")


def test_spread_ties_keeps_counts_and_stays_within_each_step(traces_dir):
    wl = load_trace(traces_dir / MOONCAKE)
    sp = spread_ties(wl, seed=1)
    assert len(sp) == len(wl) and np.all(np.diff(sp.arrival_s) >= 0)
    assert np.unique(sp.arrival_s).size == len(wl)
    assert np.array_equal(np.sort(sp.prompt_len), np.sort(wl.prompt_len))
    # every request stays inside its own step: floor to the original grid gives the original times
    grid = np.unique(wl.arrival_s)
    step_of = np.searchsorted(grid, sp.arrival_s, side="right") - 1
    assert np.array_equal(np.sort(grid[step_of]), wl.arrival_s)
    assert index_of_dispersion(sp.arrival_s) < 0.5 * index_of_dispersion(wl.arrival_s)
    assert np.array_equal(spread_ties(wl, seed=1).arrival_s, sp.arrival_s)  # seeded
    assert not np.array_equal(spread_ties(wl, seed=2).arrival_s, sp.arrival_s)


def test_real_mooncake_export_round_trip(traces_dir, tmp_path):
    wl = load_trace(traces_dir / MOONCAKE)
    out = export_mooncake(wl, tmp_path / "m.jsonl")
    back = load_trace(out)
    assert back.hash_block_size == 512
    for a, b in zip(_cols(wl), _cols(back), strict=True):
        assert np.array_equal(a, b)
    # byte-for-byte the same rows as the source (same keys, order and values)
    src = [json.loads(x) for x in gzip.decompress((traces_dir / MOONCAKE).read_bytes()).decode().splitlines()[:50]]
    assert [json.loads(x) for x in out.read_text().splitlines()[:50]] == src


# ----------------------------------------------------------------------------- formats


def _cols(wl):
    ids, offs = wl.flat_hash_ids()
    return wl.arrival_s, wl.prompt_len, wl.output_len, ids, offs


def test_generated_workload_export_round_trip(tmp_path):
    wl = generate(get_preset("agent-multiturn").with_overrides(num_requests=500))
    back = load_trace(export_mooncake(wl, tmp_path / "g.jsonl"))
    assert back.hash_block_size == 16  # inferred: 512 does not fit these rows
    np.testing.assert_allclose(back.arrival_s, wl.arrival_s, atol=0.5e-3)  # whole milliseconds
    for a, b in zip(_cols(wl)[1:], _cols(back)[1:], strict=True):
        assert np.array_equal(a, b)


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode())
    return path


def test_azure_2023_crlf_without_trailing_newline(tmp_path):
    p = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
              "2023-11-16 18:17:03.9799600,4808,10\r\n2023-11-16 18:17:04.0000001,100,2\r\n"
              "2023-11-16 18:17:05.5,7,1")
    assert detect_format(p) == "azure"
    wl = load_trace(p)
    np.testing.assert_allclose(wl.arrival_s, [0.0, 0.0200401, 1.5200400], atol=1e-9)
    assert wl.prompt_len.tolist() == [4808, 100, 7] and wl.output_len.tolist() == [10, 2, 1]


def test_azure_2024_timestamps_with_utc_offsets(tmp_path):
    p = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2024-05-10 00:00:00.009930+00:00,10,5\n2024-05-10 02:00:01+02:00,20,6\n2024-05-10T00:00:03Z,30,7\n")
    wl = load_trace(p)
    np.testing.assert_allclose(wl.arrival_s, [0.0, 1.0 - 0.00993, 3.0 - 0.00993], atol=1e-9)


def test_burstgpt_failures_are_excluded_and_counted(tmp_path):
    p = write(tmp_path / "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "5,ChatGPT,472,18,490,Conversation log\n9,GPT-4,1087,0,1087,API log\n"
              "12,GPT-4,300,25,325,API log\n")
    assert detect_format(p) == "burstgpt"
    wl = load_trace(p)
    assert len(wl) == 2 and wl.arrival_s.tolist() == [0.0, 7.0]
    assert wl.category.tolist() == ["conversation", "api"]
    assert wl.skipped_rows == {"failed request (Response tokens = 0), excluded": 1}
    kept = load_trace(p, keep_failed=True)
    assert len(kept) == 3 and kept.output_len.tolist() == [18, 1, 25]


def test_burstgpt_session_ids(tmp_path):
    p = write(tmp_path / "b.csv", "Timestamp,Session ID,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "0,7,GPT-4,10,5,15,Conversation log\n1,7,GPT-4,30,5,35,Conversation log\n")
    assert load_trace(p).session_id.tolist() == [7, 7]


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}\n'


@pytest.mark.parametrize("text, line, field, words", [
    (GOOD + '{"timestamp": 5, "input_length": \n', 2, None, "not valid JSON"),
    (GOOD + '{"timestamp": 5, "input_length": 600, "hash_ids": [0, 1]}\n', 2, "output_length", "missing"),
    (GOOD + '{"timestamp": 5, "input_length": -3, "output_length": 2, "hash_ids": []}\n', 2, "input_length", ">= 1"),
    (GOOD + '{"timestamp": 5, "input_length": 12.5, "output_length": 2, "hash_ids": [0]}\n', 2, "input_length",
     "whole number"),
    (GOOD + '{"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [0, 1, 2]}\n', 2, "hash_ids",
     "ceil(600/512) = 2"),
    (GOOD + GOOD.replace('"timestamp": 0', '"timestamp": 9') + GOOD, 3, "timestamp", "backwards"),
])
def test_bad_mooncake_rows_name_line_field_and_fix(tmp_path, text, line, field, words):
    p = write(tmp_path / "t.jsonl", text)
    with pytest.raises(TraceFormatError) as e:
        load_trace(p)
    err = e.value
    assert (err.line, err.field) == (line, field) and words in str(err)
    assert str(p) in str(err) and "Fix:" in str(err)
    # the command line prints the same message, no traceback, and exits 2
    res = runner.invoke(app, ["workload", "describe", str(p)], terminal_width=400)
    assert res.exit_code == 2 and "Traceback" not in res.output and f"line {line}" in res.output
    # --lenient skips the bad row and says so
    wl = load_trace(p, lenient=True)
    assert sum(wl.skipped_rows.values()) == 1 and len(wl) == text.count("\n") - 1


def test_lenient_reports_counts_and_reasons(tmp_path):
    rows = [GOOD, '{"bad json\n', '{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}\n',
            '{"bad json\n', GOOD.replace('"timestamp": 0', '"timestamp": 2')]
    p = write(tmp_path / "t.jsonl", "".join(rows))
    wl = load_trace(p, lenient=True)
    assert len(wl) == 2
    assert wl.skipped_rows == {"bad JSON": 2, "bad input_length": 1}
    res = runner.invoke(app, ["workload", "describe", str(p), "--lenient"], terminal_width=300)
    assert res.exit_code == 0 and "skipped 3 rows: 2 x bad JSON; 1 x bad input_length" in res.output


@pytest.mark.parametrize("name, text, field, words", [
    ("empty.jsonl", "", None, "empty"),
    ("blank.csv", "\n\n", None, "empty"),
    ("x.csv", "a,b,c\n1,2,3\n", None, "unknown trace format"),
    ("az.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.97,5\n", None, "unknown trace format"),
])
def test_bad_files(tmp_path, name, text, field, words):
    p = write(tmp_path / name, text)
    with pytest.raises(TraceFormatError, match=words) as e:
        load_trace(p)
    assert e.value.field == field
    res = runner.invoke(app, ["workload", "describe", str(p)])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_forced_format_with_a_missing_column(tmp_path):
    p = write(tmp_path / "az.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.97,5\n")
    with pytest.raises(TraceFormatError, match="GeneratedTokens") as e:
        load_trace(p, "azure")
    assert (e.value.line, e.value.field) == (1, "GeneratedTokens")


@pytest.mark.parametrize("row, field", [
    ("2023-11-16 25:17:03.97,5,1", "TIMESTAMP"),
    ("yesterday,5,1", "TIMESTAMP"),
    ("2023-11-16 18:17:03.97,-5,1", "ContextTokens"),
    ("2023-11-16 18:17:03.97,5,x", "GeneratedTokens"),
    ("2023-11-16 18:17:03.97,5", "GeneratedTokens"),
    ("2023-11-16 18:17:01.00,5,1", "TIMESTAMP"),  # earlier than the row before
])
def test_bad_azure_rows(tmp_path, row, field):
    p = write(tmp_path / "a.csv", f"TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:02.00,4,1\r\n{row}")
    with pytest.raises(TraceFormatError) as e:
        load_trace(p)
    assert (e.value.line, e.value.field) == (3, field)




# ----------------------------------------------------------------------------- limits and file kinds


@pytest.mark.parametrize("n_in, ok", [(MAX_REQUEST_TOKENS, True), (MAX_REQUEST_TOKENS + 1, False)])
def test_per_request_token_cap_is_inclusive(tmp_path, n_in, ok):
    p = tmp_path / "t.csv"
    p.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,5,1\n2023-01-01 00:00:01,{n_in},1\n")
    if ok:
        wl = load_trace(p)
        # no prefix information: one run of fresh ids per request, not one id per block
        assert wl.prompt_len.tolist() == [5, n_in] and wl.run_len.tolist() == [1, -(-n_in // 16)]
        assert wl.run_start.tolist() == [0, 1]
    else:
        with pytest.raises(TraceFormatError, match=r"line 3: field 'ContextTokens': 10000001 tokens is above"):
            load_trace(p)
        assert load_trace(p, lenient=True).skipped_rows == {"ContextTokens above 10,000,000 tokens": 1}


def test_fresh_block_runs_match_the_flat_id_layout(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "0,ChatGPT,33,2,35,Conversation log\n1,GPT-4,16,1,17,API log\n2,GPT-4,1,1,2,Conversation log\n")
    wl = load_trace(p)
    counts = np.array([3, 1, 1])  # ceil(33/16), ceil(16/16), ceil(1/16)
    ids, offs = np.arange(counts.sum()), np.concatenate([[0], np.cumsum(counts)])
    ref = Workload.from_columns(arrival_s=wl.arrival_s, prompt_len=wl.prompt_len, output_len=wl.output_len,
                                hash_ids=ids, hash_offsets=offs, hash_block_size=16,
                                category=["conversation", "api", "conversation"])
    for col in ("run_start", "run_len", "run_offsets", "category_code"):
        assert np.array_equal(getattr(wl, col), getattr(ref, col)), col
    assert wl.categories == ref.categories


@pytest.mark.parametrize("h, ok", [(2**63 - 1, True), (2**63, False)])
def test_hash_ids_must_fit_int64(tmp_path, h, ok):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [h]}) + "\n")
    if ok:
        assert load_trace(p).flat_hash_ids()[0].tolist() == [h]
    else:
        with pytest.raises(TraceFormatError, match="line 1: field 'hash_ids'"):
            load_trace(p)


@pytest.mark.parametrize("gz", [False, True])
def test_non_utf8_names_line_and_column(tmp_path, gz):
    data = b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n{"timestamp": 1\xe9}\n'
    p = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    p.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(TraceFormatError, match=r"line 2: byte 0xe9 at column 16 is not utf-8.*iconv"):
        load_trace(p, "mooncake")


def test_truncated_gzip_is_named(tmp_path):
    p = tmp_path / "t.csv.gz"
    p.write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n" * 50)[:30])
    with pytest.raises(TraceFormatError, match="cannot be read.*complete gzip"):
        load_trace(p, "azure")


def test_directory_and_device_are_named(tmp_path):
    with pytest.raises(TraceFormatError, match="is a directory"):
        check_input_file(tmp_path)
    with pytest.raises(TraceFormatError, match="is a character device"):
        load_workload("/dev/zero")


@pytest.mark.parametrize("name, text, is_spec", [
    ("s.json", '{\n  "arrival": {"kind": "poisson" "rate_rps": 1}\n}\n', True),  # pretty-printed, broken
    ("s", '{\n  "num_requests": 5,\n', True),  # no extension, cut short
    ("t.json", '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n{"timestamp": 1}\n', False),
    ("t.json", '{"timestamp": 0, "input_length": 1 "output_length": 1}\n', False),  # a broken one-line row
    ("t.jsonl", '{\n', False),
    ("s.txt", '{"arrival": {"kind": "poisson", "rate_rps": 1}}', True),
    ("s.json", '\ufeff{\n  "num_requests": 5\n}\n', True),  # a byte-order mark before the brace
    ("s.json", '[1, 2]', True),
    ("t.csv", '{\n', False),
])
def test_spec_or_trace_by_extension_then_content(tmp_path, name, text, is_spec):
    p = tmp_path / name
    p.write_text(text)
    assert _is_spec_file(p) is is_spec
