"""Behaviour that must emerge from the model (decision-rules.md), never from coded rules.

Each test sets up a workload and a deployment and compares two simulations; nothing in
sim/ knows about these scenarios. The comparisons are one-sided claims from public
decision rules, with margins wide enough to be robust to the seed.
"""

from __future__ import annotations

import numpy as np

from engine.core.request import Request
from sim.metrics import SLO
from sim.simulator import simulate
from tests.sim.simhelpers import deployment, fresh_ids, poisson, req

SYSTEM_PROMPT = tuple(range(5000, 5000 + 128))  # 2,048 tokens in 16-token hash blocks


def _prefill_ratio(reqs: list[Request]) -> float:
    on = simulate(deployment(), reqs).summary().to_json_dict()
    off = simulate(deployment(enable_prefix_caching=False), reqs).summary().to_json_dict()
    return on["prefill_tokens_computed"] / off["prefill_tokens_computed"]


def test_prefix_caching_halves_prefill_with_a_shared_system_prompt():
    rng = np.random.default_rng(0)
    reqs = [req(i, i * 0.05, 2048 + int(rng.integers(64, 512)), 64, SYSTEM_PROMPT) for i in range(200)]
    assert _prefill_ratio(reqs) <= 0.5


def test_prefix_caching_saves_nothing_with_dynamic_content_at_position_0():
    # the same system prompt, but a per-request first block (a timestamp, a user name)
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(200):
        p = 2048 + int(rng.integers(64, 512))
        nb = -(-p // 16)
        ids = fresh_ids(1) + SYSTEM_PROMPT[1:] + fresh_ids(nb - 128)
        reqs.append(Request(i, i * 0.05, p, 64, ids[:nb], 16))
    assert _prefill_ratio(reqs) > 0.98


DRAFT = {"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4}


def _closed_loop(conc: int, spec: dict | None, util: float) -> dict:
    """`conc` concurrent streams: 4 x conc requests queued at t=0, at most `conc` running."""
    rng = np.random.default_rng(0)
    reqs = [req(i, 0.0, 1024, int(rng.integers(256, 768))) for i in range(4 * conc)]
    # requests are < 2K tokens; vLLM refuses a KV cache that cannot hold one max_model_len request
    eng = {"max_num_seqs": conc, "gpu_memory_utilization": util, "max_model_len": 8192}
    if spec:
        eng["speculative_config"] = spec
    return simulate(deployment(gpu="h100-sxm", **eng), reqs, seed=0).summary().to_json_dict()


def test_spec_decode_lowers_tpot_at_low_concurrency():
    for conc in (1, 4):
        base, spec = _closed_loop(conc, None, 0.92), _closed_loop(conc, DRAFT, 0.92)
        assert spec["median_tpot_ms"] < 0.8 * base["median_tpot_ms"], (conc, spec["median_tpot_ms"])


def test_spec_decode_loses_throughput_at_64_concurrent_when_kv_is_tight():
    # gpu_memory_utilization 0.35 on an 80 GB H100 leaves ~70K tokens of KV for 64 x ~1.5K:
    # the draft's weights and its own KV shrink that further and add preemptions
    base, spec = _closed_loop(64, None, 0.35), _closed_loop(64, DRAFT, 0.35)
    assert spec["num_gpu_blocks"] < 0.7 * base["num_gpu_blocks"]
    assert spec["output_throughput"] < base["output_throughput"]


def test_disaggregation_improves_ttft_p99_for_long_prompts_at_high_load():
    reqs = poisson(400, 8.0, 8192, 256, seed=1)
    agg = simulate(deployment(replicas=4), reqs).summary().to_json_dict()
    pd = simulate(deployment(disagg=(3, 1)), reqs).summary().to_json_dict()
    assert agg["gpu_busy_share"] > 0.85  # high load
    assert pd["p99_ttft_ms"] < 0.85 * agg["p99_ttft_ms"]
    assert pd["p99_itl_ms"] < agg["p99_itl_ms"] / 3  # decode no longer stalls behind prefill chunks


def test_disaggregation_loses_for_short_prompts_at_low_load():
    reqs = poisson(200, 1.0, 512, 128, seed=1)
    agg = simulate(deployment(replicas=4), reqs).summary().to_json_dict()
    pd = simulate(deployment(disagg=(3, 1)), reqs).summary().to_json_dict()
    assert pd["mean_ttft_ms"] > 1.2 * agg["mean_ttft_ms"]  # the KV transfer and a second hop


def test_bursty_arrivals_lower_goodput_at_equal_mean_rate():
    slo = SLO(ttft_ms=300, tpot_ms=30)
    poisson_ = simulate(deployment(), poisson(600, 10.0, 2048, 256, seed=1), slo=slo).summary().to_json_dict()
    bursty = simulate(deployment(), poisson(600, 10.0, 2048, 256, seed=1, burstiness=0.25), slo=slo).summary().to_json_dict()
    assert bursty["request_goodput"] < 0.8 * poisson_["request_goodput"]


def test_one_32k_request_causes_preemptions_when_kv_is_tight():
    shorts = poisson(150, 5.0, 512, 256, seed=3)
    long_one = req(10_000, 5.0, 32768, 64)
    dep = deployment(num_gpu_blocks_override=2400, max_model_len=40000)
    alone_res, mixed_res = simulate(dep, shorts), simulate(dep, shorts + [long_one])
    alone, mixed = alone_res.summary().to_json_dict(), mixed_res.summary().to_json_dict()
    assert alone["num_preemptions"] == 0
    assert mixed["num_preemptions"] > 0
    assert mixed["completed"] == 151
    # the jitter: a preempted request waits for its recompute, far longer than any step
    assert mixed_res.stall_itl_s.size > 0
    assert mixed_res.stall_itl_s.max() > 3 * alone_res.itl_samples()[0].max()
