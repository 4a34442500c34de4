"""The skinny decode GEMM (CPU interpreter, tiny shapes) against torch.matmul in float32, its
launch-table plumbing, and the engine's greedy tokens with the switch on and off."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import get_backend
from kernels import skinny_gemm as sg
from kernels.reference import linear_ref

TINY = sg.GemmConfig(block_m=16, block_n=16, block_k=16, split_k=1)


def _operands(m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen).to(dtype), torch.randn(n, k, generator=gen).to(dtype)


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 70),
       split_k=st.sampled_from([1, 2, 3, 8]), seed=st.integers(0, 2**16))
def test_float32_matches_matmul_for_any_shape_and_split(m, n, k, split_k, seed):
    x, w = _operands(m, n, k, torch.float32, seed)
    cfg = sg.GemmConfig(16, 16, 16, split_k)
    torch.testing.assert_close(sg.skinny_gemm(x, w, config=cfg), x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split_k", [1, 4])
def test_bfloat16_rounds_once_from_the_fp32_sum(split_k):
    x, w = _operands(5, 33, 100, torch.bfloat16, 3)
    want = (x.float() @ w.float().T).to(torch.bfloat16)  # exact products, one rounding
    got = sg.skinny_gemm(x, w, config=sg.GemmConfig(16, 16, 32, split_k))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)


def test_strided_rows_and_out_buffer():
    base_x, base_w = _operands(6, 20, 48, torch.float32, 7)
    x, w = base_x[::2, :40], base_w[:, 4:44]  # row strides 48, last dims contiguous
    out = torch.full((6, 20), float("nan"))[::2]  # a strided destination
    sg.skinny_gemm(x, w, out=out, config=TINY)
    torch.testing.assert_close(out, x @ w.T, rtol=1e-5, atol=1e-5)


def test_split_k_is_deterministic_and_equals_the_unsplit_sum():
    x, w = _operands(3, 17, 64, torch.float32, 11)
    a = sg.skinny_gemm(x, w, config=sg.GemmConfig(16, 16, 16, 4))
    b = sg.skinny_gemm(x, w, config=sg.GemmConfig(16, 16, 16, 4))
    assert torch.equal(a, b)
    torch.testing.assert_close(a, sg.skinny_gemm(x, w, config=TINY), rtol=1e-5, atol=1e-5)


def test_bad_operands_are_named():
    with pytest.raises(ValueError, match=r"x \[M, K\] and weight \[N, K\]"):
        sg.skinny_gemm(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(ValueError, match="contiguous last dimension"):
        sg.skinny_gemm(torch.zeros(3, 2).T, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="power of two >= 16"):
        sg.GemmConfig(16, 24, 16, 1)


def test_default_config_splits_k_only_when_the_bands_cannot_fill_the_sms():
    wide = sg.default_config(1, 28672, 4096)  # 448 bands of 64 >= 2 x 132
    assert wide.split_k == 1
    # 32 bands x 64 K tiles: 32 x 8 = 256 programs is still < 2 x 132, so 16 splits of 4 tiles
    narrow = sg.default_config(1, 2048, 8192)
    assert narrow.split_k == 16
    assert sg.default_config(1, 2048, 2048).split_k == 4  # 16 K tiles: stop at 4 per split
    assert sg.default_config(100, 64, 64).block_m == 64


def test_table_round_trips_and_buckets_m(tmp_path, monkeypatch):
    cfg = sg.GemmConfig(32, 128, 64, 2, num_warps=8, num_stages=3)
    table = sg.ConfigTable(max_m=32, configs={sg.config_key(3, 96, 64): cfg})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table.to_json()))
    monkeypatch.setattr(sg, "CONFIG_PATH", path)
    sg.config_table.cache_clear()
    try:
        loaded = sg.config_table()
        assert loaded == table
        assert loaded.lookup(4, 96, 64) == cfg  # 3 and 4 share bucket 4
        assert loaded.lookup(5, 96, 64) == sg.default_config(5, 96, 64)
    finally:
        sg.config_table.cache_clear()


def test_linear_uses_the_kernel_up_to_max_m_and_blas_above(monkeypatch):
    calls = []
    monkeypatch.setattr(sg, "skinny_gemm", lambda x, w, out=None: calls.append(x.shape[0]) or x @ w.T)
    monkeypatch.setattr(sg, "config_table", lambda: sg.ConfigTable(4, {}))
    x, w = _operands(6, 8, 16, torch.float32, 1)
    bias = torch.randn(8)
    torch.testing.assert_close(sg.linear(x[:4], w, bias), x[:4] @ w.T + bias)
    torch.testing.assert_close(sg.linear(x, w, bias), linear_ref(x, w, bias))
    assert calls == [4]


def test_backend_switch_picks_the_gemm(monkeypatch):
    monkeypatch.delenv("COSTLINE_LINEAR_BACKEND", raising=False)
    assert get_backend("triton").linear is linear_ref  # default off
    assert get_backend("triton", linear="skinny").linear is sg.linear
    monkeypatch.setenv("COSTLINE_LINEAR_BACKEND", "skinny")
    assert get_backend("triton").linear is sg.linear
    monkeypatch.setenv("COSTLINE_LINEAR_BACKEND", "cutlass")
    with pytest.raises(ValueError, match=r"unknown linear backend 'cutlass'.*COSTLINE_LINEAR_BACKEND"):
        get_backend("triton")


def test_engine_greedy_tokens_equal_with_the_switch_on_and_off(monkeypatch):
    """The tiny model in fp32, chunked prefills next to decodes: every projection and the LM head
    through the skinny kernel (all steps are <= 16 tokens, under max_m) give the tokens of the
    switch-off engine (torch's BLAS)."""
    from engine.llm import LLM
    from engine.sampling import SamplingParams

    def tokens(switch: str) -> list[list[int]]:
        monkeypatch.setenv("COSTLINE_LINEAR_BACKEND", switch)
        llm = LLM("tiny", device="cpu", dtype="float32", max_num_seqs=4, max_num_batched_tokens=16,
                  seed=0, block_size=4, attention_backend="triton")
        assert llm.engine.model.backend.linear is (sg.linear if switch == "skinny" else linear_ref)
        gen = torch.Generator().manual_seed(5)
        prompts = [torch.randint(16, 512, (n,), generator=gen).tolist() for n in (13, 4, 21)]
        return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=4))]

    assert tokens("skinny") == tokens("torch")


def test_benchmark_dry_run_writes_a_table_the_kernel_reads(tmp_path):
    """bench_gemm.py end to end on the CPU (what the GPU run executes, tiny shapes): its config
    table loads as a ConfigTable and every timed Triton config matched F.linear."""
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run([sys.executable, "benchmarks/kernels/bench_gemm.py", "--dry-run", "--out",
                           str(tmp_path), "--m", "1,17"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "gemm.json").read_text())["rows"]
    assert [(r["proj"], r["m"]) for r in rows] == [("qkv", 1), ("qkv", 17), ("lm_head", 1), ("lm_head", 17)]
    assert all(r["triton_ok"] for r in rows)
    table = sg.ConfigTable.from_json(json.loads((tmp_path / "skinny_gemm_configs.json").read_text()))
    assert set(table.configs) == {"1,48,512", "32,48,512", "1,80,256", "32,80,256"}
    assert table.max_m in (0, 1)  # CPU timings are noise; M=2 is unmeasured, so at most 1
