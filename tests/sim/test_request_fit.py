"""The request-level fit (sim/request_fit.py): what each multiplier scales (checked on the cost
model's step times), the workload rebuilt from a result file, the loss, and — the independent
check — multipliers recovered from a benchmark result the simulator itself produced with known
ones."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from engine.core.model_spec import get_model
from engine.core.request import Request
from sim.bench_results import bench_from_tables, parse_bench
from sim.config import EngineConfig
from sim.cost_model import STEP_TABLE_COLUMNS, CostModel, step_table_seconds
from sim.hardware import get_gpu
from sim.profile_files import load_profile
from sim.request_fit import (
    Multipliers,
    apply_multipliers,
    bench_requests,
    first_principles_v2,
    fit_request_level,
    log_loss,
    make_case,
)
from sim.run import LoadedWorkload, SimConfig, run

MODEL, GPU = "llama-3.1-8b", "h200"


def steps_table(rows: list[dict[str, int]]) -> dict[str, np.ndarray]:
    return {c: np.array([r.get(c, 0) for r in rows], dtype=np.int64) for c in STEP_TABLE_COLUMNS}


DECODE = {"num_decode_seqs": 64, "num_decode_tokens": 64, "sum_decode_context": 64 * 3000, "max_decode_context": 4000}
PREFILL = {"num_prefill_seqs": 1, "num_prefill_tokens": 2048, "prefill_attn_pairs": 2048 * 2049 // 2,
           "sum_prefill_context": 2048, "num_blocks_allocated": 128}


def seconds(profile, rows, async_scheduling=True):
    cost = CostModel(get_model(MODEL), get_gpu(GPU), EngineConfig(async_scheduling=async_scheduling), profile)
    return step_table_seconds(cost, steps_table(rows))


@pytest.mark.parametrize("base", ["h200-llama-3.1-8b", "default"])
def test_each_multiplier_scales_its_own_part_of_the_step_time(base):
    p = load_profile(base)
    gpu0, cpu0 = seconds(first_principles_v2(p), [DECODE, PREFILL])
    gpu, cpu = seconds(apply_multipliers(p, Multipliers(prefill=1.7, decode=0.6, kv=0.6, host=2.5)), [DECODE, PREFILL])
    assert gpu[0] == pytest.approx(0.6 * gpu0[0], rel=1e-9)  # decode-only step: decode and kv terms
    assert gpu[1] == pytest.approx(1.7 * gpu0[1], rel=1e-9)  # a step with prompt tokens: prefill's
    assert cpu == pytest.approx(2.5 * cpu0, rel=1e-9)
    # kv alone moves only the part that grows with context: a short-context batch barely moves
    short = dict(DECODE, sum_decode_context=64 * 10, max_decode_context=10)
    g_short0, _ = seconds(first_principles_v2(p), [short, DECODE])
    g_short, _ = seconds(apply_multipliers(p, Multipliers(kv=3.0)), [short, DECODE])
    assert g_short[0] / g_short0[0] < 1.05 < g_short[1] / g_short0[1]


def test_a_first_principles_profile_becomes_schema_2_terms_of_one_over_its_efficiencies():
    p = load_profile("default")
    v2 = first_principles_v2(p)
    assert v2.is_fitted and v2.decode.gemm == pytest.approx(1 / p.gemm_memory_efficiency)
    assert v2.mixed.gemm == pytest.approx(1 / p.gemm_compute_efficiency)
    assert v2.mixed.prefill_attention == pytest.approx(1 / p.attn_compute_efficiency)
    assert v2.cpu.step_s == p.cpu_step_s and first_principles_v2(v2) is v2


def test_log_loss_is_the_mean_absolute_log_ratio_over_the_keys_both_have():
    measured = {"a": 10.0, "b": 4.0, "c": 0.0, "d": 1.0}
    sim = {"a": 20.0, "b": 2.0, "c": 5.0}
    assert log_loss(measured, sim, ["a", "b", "c", "d"]) == pytest.approx(math.log(2))
    assert log_loss({"a": 1.0}, {"a": math.inf}, ["a"]) == 5.0  # never finished: a large finite penalty


def test_the_workload_rebuilt_from_a_result_shares_only_the_prefix_it_is_told():
    obj = {"input_lens": [40, 20, 50], "output_lens": [3, 2, 0], "ttfts": [0.1, 0.1, 0.0],
           "itls": [[0.01, 0.01], [0.01], []], "errors": ["", "", "timeout"], "start_times": [5.0, 4.0, 6.0]}
    run_ = parse_bench(obj, Path("r.json"))
    reqs, rows, how = bench_requests(run_, block_size=16, shared_prefix_tokens=32)
    assert how.startswith("measured")
    assert rows.tolist() == [1, 0] and [r.arrival_s for r in reqs] == [0.0, 1.0]  # the failed row left out
    assert [r.request_id for r in reqs] == [1, 0] and [r.output_len for r in reqs] == [2, 3]
    assert reqs[0].hash_ids[:1] == (0,) and reqs[1].hash_ids[:2] == (0, 1)  # 20 tokens: one full shared block
    assert len(set(reqs[0].hash_ids[1:]) & set(reqs[1].hash_ids[2:])) == 0
    plain, _, _ = bench_requests(run_, block_size=16)
    assert not set(plain[0].hash_ids) & set(plain[1].hash_ids)


def _requests(n: int, rate: float, seed: int, long: bool = False) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    p = rng.integers(2048, 6144, n) if long else rng.integers(64, 2048, n)
    o = rng.integers(16, 256, n)
    out, nid = [], 0
    for i in range(n):
        nb = -(-int(p[i]) // 16)
        out.append(Request(request_id=i, arrival_s=float(t[i] - t[0]), prompt_len=int(p[i]), output_len=int(o[i]),
                           hash_ids=tuple(range(nid, nid + nb))))
        nid += nb
    return out


def test_fit_recovers_the_multipliers_a_simulated_server_ran_with():
    """Independent check: the "server" is the simulator with known multipliers; its requests go
    through the bench-result format (client view: TTFT, token gaps, e2e) and back; the fit starts
    from the unscaled profile. prefill and decode are pinned by TTFT and TPOT; host by the
    synchronous runs; kv by the long-prompt run's TPOT."""
    base = load_profile("h200-llama-3.1-8b")
    truth = Multipliers(prefill=1.3, decode=0.8, kv=1.3, host=1.5)
    cases = []
    for name, rate, asyn, long in (("light", 2.0, False, False), ("heavy", 9.0, False, False),
                                   ("long", 2.0, True, True)):
        eng = EngineConfig(async_scheduling=asyn, num_gpu_blocks_override=20000)
        res = run(LoadedWorkload(_requests(80, rate, 1, long), name), SimConfig(model=MODEL, gpu=GPU, engine=eng),
                  cost_profile=apply_multipliers(base, truth))
        obj, _ = bench_from_tables(res.requests, res.steps, duration_s=res.summary().duration_s, model_id=MODEL,
                                   backend="sim", date="")
        cases.append(make_case(parse_bench(obj, Path(f"{name}.json")), eng))
    fit = fit_request_level(cases, base, MODEL, GPU, max_evals=140)
    got = fit.multipliers
    assert got.prefill == pytest.approx(truth.prefill, rel=0.05)
    assert got.decode == pytest.approx(truth.decode, rel=0.05)
    assert got.host == pytest.approx(truth.host, rel=0.10)
    assert got.kv == pytest.approx(truth.kv, rel=0.15)
    assert fit.fit_error < 0.02 and fit.held_out_error < 0.03  # one file each: split by request
