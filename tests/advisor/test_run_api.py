"""The public simulation API `sim.run`: deterministic, config round-trips, every workload form alike."""

from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pytest

from engine.core.request import Request
from sim.config import DisaggConfig, EngineConfig
from sim.metrics import SLO
from sim.run import LoadedWorkload, SimConfig, kv_block_coarsening_for, load, run
from sim.workload_source import SourceOptions, load_workload

UNSTABLE = {"date", "wall_s", "simulated_requests_per_wall_s"}
SMALL = SourceOptions(num_requests=60)
CONFIG = SimConfig(gpu="a100-80gb", num_gpus=2, slo="ttft:300 tpot:40", seed=5,
                   engine=EngineConfig(max_num_seqs=32, enable_prefix_caching=False,
                                       speculative_config={"method": "ngram", "num_speculative_tokens": 3}))


def stable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in UNSTABLE}


def same_result(a, b) -> None:
    assert stable(a.summary().to_json_dict()) == stable(b.summary().to_json_dict())
    for col in a.requests:
        np.testing.assert_array_equal(a.requests[col], b.requests[col], err_msg=col)


def test_same_config_twice_gives_identical_results():
    same_result(run("lab-poisson", CONFIG, source=SMALL), run("lab-poisson", CONFIG, source=SMALL))


def test_config_json_and_pickle_round_trip_give_the_same_result():
    text = CONFIG.model_dump_json()
    back = SimConfig.model_validate_json(text)
    assert back == CONFIG and pickle.loads(pickle.dumps(CONFIG)) == CONFIG
    assert back.slo == SLO(ttft_ms=300.0, tpot_ms=40.0)
    same_result(run("lab-poisson", CONFIG, source=SMALL), run("lab-poisson", back, source=SMALL))


def _summary_in_child(config: SimConfig) -> dict:
    return stable(run("lab-poisson", config, source=SMALL).summary().to_json_dict())


def test_a_config_runs_the_same_in_another_process():
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        child = pool.apply(_summary_in_child, (CONFIG,))
    assert child == _summary_in_child(CONFIG)


def test_every_workload_form_gives_the_same_result():
    wl = load_workload("lab-poisson", SourceOptions(num_requests=60, seed=CONFIG.seed))
    by_name = run("lab-poisson", CONFIG, source=SMALL)
    for form in (wl, list(wl.requests), load("lab-poisson", SMALL, seed=CONFIG.seed)):
        res = run(form, CONFIG)
        for col in by_name.requests:
            np.testing.assert_array_equal(res.requests[col], by_name.requests[col], err_msg=col)


def test_summary_carries_the_config_and_its_vllm_flags():
    res = run("lab-poisson", CONFIG, source=SMALL)
    s = res.summary().to_json_dict()
    assert s["num_gpus"] == 2 and s["goodput_slo"] == {"ttft": 300.0, "tpot": 40.0}
    assert s["vllm_args"] == ("--max-num-seqs 32 --disable-prefix-caching --speculative-config "
                              """'{"method":"ngram","num_speculative_tokens":3}'""")
    assert s["label"] == "lab-poisson" and s["completed"] + s["failed"] == 60


def test_deployment_errors_name_the_field():
    with pytest.raises(ValueError, match=r"num_gpus 3: is not a multiple of tensor_parallel_size 2"):
        SimConfig(num_gpus=3, engine=EngineConfig(tensor_parallel_size=2)).deployment()
    pd = DisaggConfig(num_prefill_replicas=2, num_decode_replicas=1)
    with pytest.raises(ValueError, match=r"num_gpus 4: does not match disaggregation 2:1 .* \(3 GPUs\)"):
        SimConfig(num_gpus=4, disaggregation=pd).deployment()
    assert SimConfig(disaggregation=pd).deployment().num_gpus == 3
    assert SimConfig(num_gpus=4, engine=EngineConfig(tensor_parallel_size=2)).deployment().num_replicas == 2
    with pytest.raises(ValueError, match="kv_block_coarsening"):
        SimConfig(kv_block_coarsening=0)


def _reqs(hash_block: int) -> list[Request]:
    return [Request(i, 0.1 * i, 2 * hash_block, 4, (i, 1000 + i), hash_block) for i in range(3)]


@pytest.mark.parametrize("hash_block, block, want", [
    (512, 16, 32), (16, 16, 1), (48, 16, 1), (64, 16, 4), (4096, 16, 64), (512, 32, 16),
])
def test_auto_coarsening_by_hand(hash_block, block, want):
    assert kv_block_coarsening_for("auto", block, _reqs(hash_block)) == want
    assert kv_block_coarsening_for(3, block, _reqs(hash_block)) == 3


def test_auto_coarsening_reaches_the_simulation():
    res = run(LoadedWorkload(_reqs(512), "x"), SimConfig(kv_block_coarsening="auto"))
    assert res.meta["kv_block_coarsening"] == 32
