"""The FP8 KV cache in the cost model: attention priced by the kernels' measured time against the
16-bit cache (benchmarks/kernels data, read here as the independent reference), the capacity by
the bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.model_spec import get_model
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile
from sim.hardware import get_gpu
from sim.kv_dtype_costs import H200_FP8, SIXTEEN_BIT, kv_dtype_cost
from sim.memory import plan_memory
from tests.sim.simhelpers import decode_batch, prefill_batch

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"
M8 = get_model("llama-3.1-8b")
H200 = get_gpu("h200")


def measured_decode_ratio() -> float:
    """fp8 / bf16 time at 64x4096 for the shipped fp8 decode config, from run 6's raw rows."""
    shipped = json.loads((Path(__file__).resolve().parents[2] / "kernels" / "attention_configs.json")
                         .read_text())["decode"]["fp8"]
    rows = json.loads((KERNELS / "data" / "run6" / "fp8_words.json").read_text())["rows"]
    row, = [r for r in rows if r["shape"] == "64x4096" and r["fp8_convert"] == shipped["fp8_convert"]
            and (r["tile_n"], r["num_stages"], r["num_warps"])
            == (shipped["tile_n"], shipped["num_stages"], shipped["num_warps"])]
    return row["us"] / row["bf16_us"]


def measured_prefill_ratio() -> float:
    rows = json.loads((KERNELS / "results.json").read_text())["prefill"]
    ratios = [r["fp8_us"] / r["ours_us"] for r in rows if r["shape"] in ("8x2048+0", "8x2048+4096")]
    assert len(ratios) == 2
    return (ratios[0] * ratios[1]) ** 0.5


def test_the_ratios_are_the_committed_measurements() -> None:
    assert H200_FP8.decode_time_ratio == pytest.approx(measured_decode_ratio(), rel=1e-3)
    assert H200_FP8.prefill_time_ratio == pytest.approx(measured_prefill_ratio(), rel=1e-3)
    # the point of the module: far from the byte ratio in both directions
    assert 0.8 < H200_FP8.decode_time_ratio < 0.9 and 1.35 < H200_FP8.prefill_time_ratio < 1.5


@pytest.mark.parametrize("dtype", ["auto", "bfloat16", "float16"])
def test_sixteen_bit_caches_are_the_reference(dtype: str) -> None:
    assert kv_dtype_cost(dtype, "h200") == SIXTEEN_BIT


def test_unmeasured_gpus_take_the_h200_ratios_and_say_so() -> None:
    c = kv_dtype_cost("fp8", "l4")
    assert (c.decode_time_ratio, c.prefill_time_ratio) == (H200_FP8.decode_time_ratio, H200_FP8.prefill_time_ratio)
    assert c.source.startswith("not measured on l4")
    assert kv_dtype_cost("fp8_e4m3", "h200") is H200_FP8


def cost(kv: str, profile: str) -> CostModel:
    p = CostProfile.resolve(profile, "llama-3.1-8b", "h200")
    return CostModel(M8, H200, EngineConfig(kv_cache_dtype=kv, max_num_seqs=256), p)


@pytest.mark.parametrize("profile", ["auto", "default"])  # fitted (v2) and first-principles (v1)
def test_decode_attention_costs_the_measured_ratio_not_half(profile: str) -> None:
    """The KV part of a decode step (its slope in the batch's context) scales by 0.845, the
    rest of the step (weights, per-sequence terms) not at all."""
    slope = {}
    for kv in ("auto", "fp8"):
        m = cost(kv, profile)
        lo, hi = m.gpu_time_s(decode_batch(64, 64 * 1024)), m.gpu_time_s(decode_batch(64, 64 * 4096))
        slope[kv] = (hi - lo, lo)
    assert slope["fp8"][0] / slope["auto"][0] == pytest.approx(H200_FP8.decode_time_ratio, rel=1e-9)
    kv_part = slope["auto"][0] / 3  # 64 x 1024 tokens' worth of KV in the smaller batch
    assert slope["auto"][1] - slope["fp8"][1] == pytest.approx(kv_part * (1 - H200_FP8.decode_time_ratio), rel=1e-9)


@pytest.mark.parametrize("profile", ["auto", "default"])
def test_prefill_attention_costs_more_with_fp8(profile: str) -> None:
    """An eager 2048-token chunk's attention (its slope in the cached context: q x c pairs)
    is 1.42x slower with the fp8 cache, as the prefill kernel measured."""
    slope = {}
    for kv in ("auto", "fp8"):
        m = cost(kv, profile)
        slope[kv] = m.gpu_time_s(prefill_batch(2048, 8192)) - m.gpu_time_s(prefill_batch(2048, 4096))
    assert slope["fp8"] / slope["auto"] == pytest.approx(H200_FP8.prefill_time_ratio, rel=1e-9)


def test_fp8_still_doubles_the_kv_capacity() -> None:
    """The bytes decide the capacity: fp8 holds twice the tokens in the same memory."""
    tokens = {kv: plan_memory(M8, H200, EngineConfig(kv_cache_dtype=kv).resolved_for(H200, M8)).kv_capacity_tokens
              for kv in ("auto", "fp8")}
    assert tokens["fp8"] == pytest.approx(2 * tokens["auto"], rel=1e-3)
