"""The simulator's loop against the engine's own loop on a virtual clock (engine/virtual_clock.py).

The engine (CPU, tiny model) replays a workload with arrivals honoured, and every step takes
exactly the host and device seconds the simulator's cost model charges for it (the 8B H200
profile: realistic async gap and host terms). The scheduler is shared, so any difference is in
the loops: when a step is scheduled (which arrivals it admits), when its tokens arrive, which
decodes a step leaves out. The simulator must reproduce the engine step for step, token time for
token time, and its inter-token-latency samples must be the engine's measured gaps, under
synchronous and async scheduling, chunked prefill on and off, a roomy and a tight KV pool,
stepping and skipping ahead.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from engine.core.config import EngineArgs
from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.replay import replay
from engine.virtual_clock import StepTimes, virtual_clock
from sim.config import DeploymentConfig, EngineConfig
from sim.hardware import get_gpu
from sim.simulator import Simulation
from tests.sim.simhelpers import frozen_profile
from tests.sim.step_rows import expand_step_rows

BLOCK = 4
LAUNCH_COLUMNS = ("num_prefill_tokens", "num_decode_tokens", "num_decode_seqs", "num_prefill_seqs")
DECISIONS = ("step_id", "num_batched_tokens", "num_prefill_tokens", "num_prefill_seqs", "sum_prefill_context",
             "num_decode_tokens", "num_decode_seqs", "sum_decode_context", "max_decode_context",
             "num_blocks_allocated", "num_preempted", "num_output_tokens")


def workload(n: int, rate: float, seed: int) -> list[Request]:
    """Poisson arrivals; prompts of 10-150 tokens (past a 64-token budget), opening with one of
    three shared system prompts; outputs of 2-40 tokens."""
    rng = np.random.default_rng(seed)
    systems = [tuple(range(1000 * g, 1000 * g + int(rng.integers(3, 8)))) for g in range(3)]
    t = np.cumsum(rng.exponential(1 / rate, n)) - 0.0
    reqs = []
    for i in range(n):
        prompt = int(rng.integers(10, 150))
        blocks = -(-prompt // BLOCK)
        sys_ids = systems[int(rng.integers(3))][: blocks - 1]
        ids = sys_ids + tuple(range(10**6 * (i + 1), 10**6 * (i + 1) + blocks - len(sys_ids)))
        reqs.append(Request(request_id=i, arrival_s=float(t[i]), prompt_len=prompt,
                            output_len=int(rng.integers(2, 40)), hash_ids=ids, hash_block_size=BLOCK))
    return reqs


def flags(async_scheduling: bool, chunked: bool, blocks: int) -> dict:
    return {"block_size": BLOCK, "max_num_batched_tokens": 64 if chunked else 256, "max_num_seqs": 8,
            "max_model_len": 256, "enable_prefix_caching": True, "enable_chunked_prefill": chunked,
            "async_scheduling": async_scheduling, "num_gpu_blocks_override": blocks}


def profile(eager_launch_s: float = 0.0, eager_block: float = 0.0):
    """The frozen 8B profile; with `eager_launch_s` or `eager_block`, steps past 16 tokens run
    eagerly, their kernel launches take that long and return once that share of their device
    work has run (async scheduling)."""
    p = frozen_profile("h200-llama-3.1-8b")
    if not eager_launch_s and not eager_block:
        return p
    return p.model_copy(update={"max_cudagraph_capture_size": 16, "overlap": p.overlap.model_copy(
        update={"async_eager_launch_s": eager_launch_s, "async_eager_block": eager_block,
                "async_eager_block_s": 2e-4 if eager_block else 0.0})})


def simulate(reqs, f: dict, skip_ahead: bool, eager_launch_s: float = 0.0, eager_block: float = 0.0):
    dep = DeploymentConfig(model=get_model("llama-3.1-8b"), gpu=get_gpu("h200"),
                           engine=EngineConfig(attention_backend="costline", **f))
    sim = Simulation(dep, reqs, skip_ahead=skip_ahead, profile=profile(eager_launch_s, eager_block))
    return sim, sim.run()


def engine_replay(reqs, f: dict, sim: Simulation):
    core = EngineCore(EngineArgs(model="tiny", device="cpu", seed=0, **f))
    cost = sim.replicas[0].cost
    assert core.scheduler.config == sim.replicas[0].sched.config

    def step_times(out) -> StepTimes:
        device_s, host_s = cost.device_and_host_s(cost.gpu_time_s(out), cost.cpu_time_s(out))
        return StepTimes(host_s=host_s, device_s=device_s, launch_s=cost.launch_s(out),
                         blocked_s=cost.blocked_device_s(out, device_s))

    with virtual_clock(core, step_times):
        return replay(core, reqs, honor_arrivals=True)


# async, chunked prefill, KV blocks, eager steps' launch seconds and launch block
CASES = {"sync": (False, True, 4000, 0.0, 0.0), "async": (True, True, 4000, 0.0, 0.0),
         "async-no-chunk": (True, False, 4000, 0.0, 0.0), "sync-no-chunk": (False, False, 4000, 0.0, 0.0),
         "async-tight": (True, True, 90, 0.0, 0.0), "sync-tight": (False, True, 90, 0.0, 0.0),
         "async-eager-launches": (True, True, 4000, 0.004, 0.0),
         "async-eager-blocked": (True, True, 4000, 1e-4, 0.9)}


@pytest.fixture(scope="module", params=list(CASES))
def runs(request):
    async_scheduling, chunked, blocks, launch_s, block = CASES[request.param]
    reqs = workload(48, rate=60.0, seed=5)
    f = flags(async_scheduling, chunked, blocks)
    sim, stepped = simulate(reqs, f, skip_ahead=False, eager_launch_s=launch_s, eager_block=block)
    _, skipped = simulate(reqs, f, skip_ahead=True, eager_launch_s=launch_s, eager_block=block)
    if launch_s:  # the case is not vacuous: eager steps launched, and some launch-bound periods
        cost = sim.replicas[0].cost
        eager = SimpleNamespace(**{c: int(stepped.steps[c][stepped.steps["num_prefill_tokens"] > 16][0])
                                   for c in LAUNCH_COLUMNS})
        block_s = 2e-4 if block else 0.0  # what profile() sets beside the share
        assert cost.launch_s(eager) == launch_s
        assert cost.blocked_device_s(eager, 1e-2) == pytest.approx(min(1e-2, block_s + block * 1e-2))
    return request.param, engine_replay(reqs, f, sim), stepped, skipped


def test_same_steps_at_the_same_times(runs):
    name, eng, stepped, skipped = runs
    e = eng.steps
    assert e["step_id"].size > 60
    for res in (stepped, skipped):
        s = expand_step_rows(res.steps)
        for c in DECISIONS:
            if c == "num_blocks_allocated" and res is skipped:
                continue  # a skip row's blocks are a total (expand_step_rows cannot place them)
            np.testing.assert_array_equal(s[c], e[c], err_msg=f"{name}: {c}")
        # each row's start and period (a skip row's: its steps' periods summed; inside it the
        # block CPU time lands per step, which expand_step_rows cannot place)
        rows = res.steps
        at = np.searchsorted(e["step_id"], rows["step_id"])
        ends = np.concatenate([[0.0], np.cumsum(e["total_s"])])
        np.testing.assert_allclose(rows["t_start_s"], e["t_start_s"][at], rtol=1e-9, atol=1e-9, err_msg=name)
        np.testing.assert_allclose(rows["total_s"], ends[at + rows["n_steps"]] - ends[at], rtol=1e-9, atol=1e-9,
                                   err_msg=name)
    if "tight" in name:
        assert e["num_preempted"].sum() > 0
    if "no-chunk" in name:  # prompts admitted whole, in steps of their own: decodes left out
        assert ((e["num_prefill_seqs"] > 0) & (e["num_decode_seqs"] == 0) & (e["num_running"] > 1)).any()


def test_same_token_times(runs):
    name, eng, stepped, skipped = runs
    for res in (stepped, skipped):
        for c in ("first_token_s", "finish_s", "scheduled_s", "num_preemptions", "num_cached_tokens"):
            np.testing.assert_allclose(res.requests[c], eng.requests[c], rtol=1e-9, atol=1e-9,
                                       err_msg=f"{name}: {c}")


def test_itl_samples_are_the_engines_token_gaps(runs):
    name, eng, stepped, skipped = runs
    gaps = np.sort(eng.itl_gaps_s)
    for res in (stepped, skipped):
        v, w = res.itl_samples()
        assert np.all(w == np.round(w)), name
        sim_gaps = np.sort(np.repeat(v, w.astype(np.int64)))
        assert sim_gaps.size == gaps.size, name
        # a skip row spreads its block CPU time evenly over its steps (at most tens of microseconds)
        np.testing.assert_allclose(sim_gaps, gaps, rtol=1e-9, atol=1e-9 if res is stepped else 2e-5, err_msg=name)
        sm, em = res.summary().to_json_dict(), eng.summary().to_json_dict()
        for k in ("mean_itl_ms", "p99_itl_ms", "mean_tpot_ms", "p99_tpot_ms", "num_engine_steps"):
            assert sm[k] == pytest.approx(em[k], rel=1e-6 if res is stepped else 1e-3), (name, k)
