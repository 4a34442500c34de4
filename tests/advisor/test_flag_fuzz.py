"""Flag combinations through the CLI (typer's CliRunner): what vLLM refuses at start-up, and what
would exhaust memory, ends with exit status 2 and one message naming the flag as typed, with no
traceback, before anything big is allocated; a valid combination runs (exit 0)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import tracemalloc
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from costline.cli import app
from engine.core.flags import FlagError
from sim.metrics import SLO

runner = CliRunner()
SIM = ["simulate", "-w", "lab-poisson", "-n", "3"]
CLEAN = {"Traceback", "pydantic", "errors.pydantic.dev", "unexpected"}


def _invoke(args: list[str]):
    """Run the CLI in an empty folder; nothing may appear there (no output was asked for). argv
    is set as a shell sets it: the message names an alias (`-tp`) by looking there."""
    with (tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder),
          mock.patch.object(sys, "argv", ["costline", *args])):
        res = runner.invoke(app, args, terminal_width=400)
        assert os.listdir(".") == [], os.listdir(".")
    return res


def _refused(args: list[str], *names: str) -> str:
    res = _invoke(args)
    out = res.output
    assert res.exit_code == 2, (args, res.exit_code, out)
    assert all(n in out for n in names), (args, out)
    assert not any(word in out for word in CLEAN), (args, out)
    assert out.count("error:") == 1, out
    return out


# (extra simulate arguments, what the message must contain): each a rule vLLM applies at start-up,
# a contradiction, or a limit; hand-written so that each names the exact flag and figure.
REFUSED = [
    (["--max-num-batched-tokens", "8", "--max-num-seqs", "16"], "--max-num-batched-tokens 8: must be >= --max-num-seqs (16)"),
    (["--max-num-seqs", "9000"], "--max-num-seqs 9000: must be <= --max-num-batched-tokens (8192, the default here)"),
    (["--disable-chunked-prefill", "--max-num-batched-tokens", "512"], "--max-num-batched-tokens 512: must be >= --max-model-len (131072) when chunked prefill is off"),
    (["--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096", "--max-model-len", "8192"], "--max-num-batched-tokens 4096: must be >= --max-model-len (8192)"),
    (["--block-size", "7"], "--block-size 7: must be a multiple of 16 for the flash_attn attention backend"),
    (["--block-size", "24", "--attention-backend", "flashinfer"], "--block-size 24: must be a multiple of 16 for the flashinfer"),
    (["--block-size", "0"], "--block-size 0: must be an integer from 1 to 4096"),
    (["-tp", "3"], "-tp 3: must divide the model's 32 attention heads"),
    (["--tensor-parallel-size", "5", "--model", "llama-3.1-70b"], "--tensor-parallel-size 5: must divide the model's 64"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0: must be an integer >= 1"),
    (["--max-model-len", "200000"], "--max-model-len 200000: exceeds the model's max_position_embeddings (131072)"),
    (["--gpu", "l4"], "--max-model-len 131072: one request of this length needs 16.00 GiB"),
    (["--model", "llama-3.1-70b", "--gpu", "l4"], "llama-3.1-70b does not fit on 1x l4"),
    (["--max-num-batched-tokens", "1g"], "lower --max-num-batched-tokens"),
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization 0: must be in (0, 1]"),
    (["--device-memory-utilization", "1.01"], "--device-memory-utilization 1.01: must be in (0, 1]"),
    (["--num-gpu-blocks-override", "0"], "--num-gpu-blocks-override 0: must be an integer >= 1"),
    (["--num-gpu-blocks-override", "1000000000"], "--num-gpu-blocks-override 1000000000: would simulate 1 replica(s)"),
    (["--long-prefill-token-threshold", "-1"], "--long-prefill-token-threshold -1: must be an integer >= 0"),
    (["--max-num-seqs", "1.5K"], "--max-num-seqs '1.5K': a decimal needs a decimal suffix: did you mean 1.5k?"),
    (["--max-num-batched-tokens", "1e30"], "--max-num-batched-tokens '1e30': use an integer"),
    (["--scheduling-policy", "lifo"], "--scheduling-policy lifo: must be one of fcfs, priority"),
    (["--kv-cache-dtype", "int3"], "--kv-cache-dtype int3: must be one of"),
    (["-sc", "{not json"], "-sc '{not json': speculative_config is not valid JSON"),
    (["--speculative-config", '{"method":"ngram","num_speculative_tokens":40}'], "must be <= 16"),
    (["--speculative-config", '{"method":"draft_model","num_speculative_tokens":4}'], 'method "draft_model" needs "model"'),
    (["--goodput", "ttft:-5"], "--goodput 'ttft:-5': an SLO must be a finite number of milliseconds >= 0"),
    (["--goodput", "tpot:nan"], "--goodput 'tpot:nan': an SLO must be a finite number"),
    (["--goodput", "ttft:abc"], "--goodput 'ttft:abc': 'abc' is not a number of milliseconds"),
    (["--goodput", "latency:5"], "--goodput 'latency:5': use KEY:MS pairs with KEY in ttft, tpot, e2el"),
    (["--goodput", "ttft"], "--goodput 'ttft': use KEY:MS pairs"),
    (["--link-latency-ms", "-1", "--disagg", "1:1"], "--link-latency-ms -1: must be a time >= 0 in ms"),
    (["--link-latency-ms", "2"], "--link-latency-ms only applies to disaggregated prefill; add --disagg"),
    (["--kv-link-gb-per-s", "0", "--disagg", "1:1"], "--kv-link-gb-per-s 0: must be a bandwidth > 0"),
    (["--kv-link-gb-per-s", "-3", "--disagg", "1:1"], "--kv-link-gb-per-s -3: must be a bandwidth > 0"),
    (["--kv-link-gb-per-s", "inf", "--disagg", "1:1"], "--kv-link-gb-per-s inf: must be a bandwidth > 0"),
    (["--kv-link", "nvlink", "--kv-link-gb-per-s", "50"], "--kv-link, --kv-link-gb-per-s only apply to disaggregated prefill"),
    (["--kv-link", "pigeon", "--disagg", "1:1"], "--kv-link 'pigeon': must be network or nvlink"),
    (["--disagg", "0:1"], "--disagg '0:1': give prefill:decode replica counts"),
    (["--disagg", "1:1", "--num-gpus", "3"], "--num-gpus 3: does not match --disagg 1:1"),
    (["--num-gpus", "3", "-tp", "2"], "--num-gpus 3: is not a multiple of -tp 2"),
    (["--num-gpus", "0"], "--num-gpus 0: must be >= 1"),
    (["--num-gpus", "10000"], "--num-gpus 10000: must be <= 4096"),
    (["--num-gpus", "100000000000000000000"], "--num-gpus 100000000000000000000: must be <= 4096"),
    (["--num-gpus", "4096"], "--num-gpus 4096: would simulate 4,096 replica(s)"),
    (["-n", "1000000000000"], "-n 1000000000000: must be <= 10000000"),
    (["--num-requests", "20000000"], "--num-requests 20000000: must be <= 10000000"),
    (["--seed", "-1"], "--seed -1: must be an integer >= 0"),
    (["--router", "fastest"], "--router 'fastest': must be one of"),
    (["--sim-block-coarsening", "0"], "--sim-block-coarsening '0': use an integer from 1 to 64 or 'auto'"),
    (["--sim-block-coarsening", "1000000000"], "--sim-block-coarsening '1000000000': use an integer from 1 to 64"),
    (["--speedup", "0"], "--speedup 0.0: must be > 0"),
    (["--rate", "-1"], "--rate -1.0: must be > 0"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_refused_with_the_flag_named(extra, message):
    _refused(SIM + extra, message)


def test_refusals_are_distinct_cases():
    assert len({tuple(a) for a, _ in REFUSED}) == len(REFUSED) >= 50


@pytest.mark.parametrize("extra", [["-n", "1000000000000"], ["--num-gpus", "4096"],
                                   ["--num-gpu-blocks-override", "1000000000"]])
def test_absurd_sizes_are_refused_before_allocating(extra):
    tracemalloc.start()
    try:
        _refused(SIM + extra, extra[0])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200e6, peak  # the run itself would need tens of GB


# --------------------------------------------------------------------------- generated
INT_BOUNDS = {"--max-num-seqs": 1, "--max-num-batched-tokens": 1, "--block-size": 1, "--max-model-len": 1,
              "--num-gpu-blocks-override": 1, "--tensor-parallel-size": 1, "-tp": 1,
              "--long-prefill-token-threshold": 0, "--num-gpus": 1, "--seed": 0}
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(flag=st.sampled_from(sorted(INT_BOUNDS)), below=st.integers(1, 10**6))
def test_any_integer_below_its_bound_is_refused(flag, below):
    value = INT_BOUNDS[flag] - below
    _refused([*SIM, flag, str(value)], f"{flag} {value}")


@FUZZ
@given(key=st.sampled_from(["ttft", "tpot", "e2el"]), ms=st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False))
def test_any_negative_slo_is_refused(key, ms):
    _refused([*SIM, "--goodput", f"{key}:{ms!r}"], f"--goodput '{key}:{ms!r}'")


@FUZZ
@given(budget=st.integers(1, 4096), seqs=st.integers(1, 4096))
def test_budget_below_sequences_is_refused_else_runs(budget, seqs):
    args = [*SIM, "--max-num-batched-tokens", str(budget), "--max-num-seqs", str(seqs), "--json"]
    if budget < seqs:  # vllm/config/scheduler.py: max_num_batched_tokens >= max_num_seqs
        _refused(args, f"--max-num-batched-tokens {budget}: must be >= --max-num-seqs ({seqs})")
    else:
        res = _invoke(args)
        assert res.exit_code == 0, res.output


@FUZZ
@given(block=st.integers(1, 256), backend=st.sampled_from(["flash_attn", "flashinfer", "costline"]))
def test_block_size_per_backend(block, backend):
    args = [*SIM, "--block-size", str(block), "--attention-backend", backend, "--json"]
    if backend != "costline" and block % 16:
        _refused(args, f"--block-size {block}: must be a multiple of 16 for the {backend}")
    else:
        res = _invoke(args)
        assert res.exit_code == 0, res.output


@FUZZ
@given(tp=st.integers(1, 16), replicas=st.integers(1, 3),
       goodput=st.lists(st.tuples(st.sampled_from(["ttft", "tpot", "e2el"]), st.integers(0, 10**5)), max_size=3),
       chunked=st.booleans(), prefix=st.booleans(), policy=st.sampled_from(["fcfs", "priority"]))
def test_valid_combinations_run(tp, replicas, goodput, chunked, prefix, policy):
    args = [*SIM, "-tp", str(tp), "--num-gpus", str(tp * replicas), "--scheduling-policy", policy,
            "--enable-chunked-prefill" if chunked else "--disable-chunked-prefill",
            "--enable-prefix-caching" if prefix else "--no-enable-prefix-caching", "--json"]
    if goodput:
        args += ["--goodput", " ".join(f"{k}:{v}" for k, v in goodput)]
    if 32 % tp:  # llama-3.1-8b has 32 attention heads
        _refused(args, f"-tp {tp}: must divide the model's 32 attention heads")
        return
    res = _invoke(args)
    assert res.exit_code == 0, res.output


def test_a_small_budget_lowers_the_default_max_num_seqs_as_vllm_does():
    # vLLM (_set_default_max_num_seqs_and_batched_tokens_args) caps a *default* max_num_seqs at the
    # budget instead of refusing; the printed `vllm serve` command says so
    res = _invoke([*SIM, "--max-num-batched-tokens", "8", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["vllm_args"] == "--max-num-batched-tokens 8 --max-num-seqs 8"


@pytest.mark.parametrize(("text", "expected"), [
    ("ttft:500 tpot:50", SLO(ttft_ms=500.0, tpot_ms=50.0)), ("e2el:0", SLO(e2el_ms=0.0)),
    ("ttft:1.5,tpot:2", SLO(ttft_ms=1.5, tpot_ms=2.0)), ("  ", None), (None, None),
])
def test_goodput_parses_as_vllm_bench_serve(text, expected):
    assert SLO.parse(text) == expected


@pytest.mark.parametrize("text", ["ttft:-0.1", "ttft:inf", "ttft:nan", "ttft:", ":5", "TTFT:5", "ttft=5"])
def test_goodput_refusals_name_the_pair(text):
    with pytest.raises(FlagError) as exc:
        SLO.parse(text)
    assert exc.value.field == "slo" and text.split()[0] in str(exc.value)


BENCH = ["engine", "bench", "--model", "tiny", "--device", "cpu"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--num-prompts", "1000000000", "--input-len", "100000000"], "--num-prompts 1000000000 x --input-len 100000000"),
    (["--num-prompts", "2", "--input-len", "100000"], "--input-len 100000 + --output-len 64 exceeds the model length 4096"),
    (["--input-len", "4000", "--output-len", "200"], "--input-len 4000 + --output-len 200 exceeds the model length 4096"),
    (["--max-num-batched-tokens", "8", "--max-num-seqs", "16"], "--max-num-batched-tokens 8: must be >= --max-num-seqs (16)"),
    (["--block-size", "-16"], "--block-size -16: must be an integer from 1 to 4096"),
    (["--seed", "-3"], "--seed -3: must be an integer >= 0"),
])
def test_engine_bench_refusals(extra, message):
    _refused(BENCH + extra, message)
