"""What makes the advisor's search faster without changing its answer (issue 26): each distinct
simulation runs once per evaluator (the same outcome as a fresh run), two stages asking at once
share one run, and costly ones start first while outcomes come back in task order."""

from __future__ import annotations

import threading

from advisor.advise.evaluate import REPLICA_COST, Evaluator, Outcome, SimTask, task_key, task_weight
from engine.core.model_spec import get_model
from sim.config import EngineConfig
from sim.generate import generate
from sim.hardware import get_gpu
from sim.run import SimConfig
from sim.workload_spec import WorkloadSpec

TINY = WorkloadSpec.model_validate({
    "name": "tiny", "num_requests": 40, "seed": 1, "arrival": {"kind": "poisson", "rate_rps": 8.0},
    "prompt_tokens": {"kind": "lognormal", "median": 300, "sigma": 0.5, "min_tokens": 16, "max_tokens": 2000},
    "output_tokens": {"kind": "lognormal", "median": 30, "sigma": 0.5, "min_tokens": 1, "max_tokens": 200},
    "task_mix": {"chat": 1.0}})
SPEC = {"method": "ngram", "num_speculative_tokens": 4}


def _task(n: int = 30, label: str | None = None, **engine) -> SimTask:
    return SimTask(SimConfig(engine=EngineConfig(**engine), label=label, profile="default", slo="ttft:500 tpot:50"), n)


def test_a_simulation_asked_again_runs_once_with_a_fresh_runs_outcome() -> None:
    wl = generate(TINY)
    default_budget = EngineConfig().resolved_for(get_gpu("h200"), get_model("llama-3.1-8b")).max_num_batched_tokens
    a, b = _task(label="a"), _task(label="b", max_num_batched_tokens=default_budget)  # the defaults, spelt out
    c = _task(n=20)
    with Evaluator(wl) as ev:
        first = ev.map([a, b, c, a])
        again = ev.map([c, b])
        assert ev.count == 2  # a (= b: the label and vLLM's default spelt out change nothing) and c
    assert first[0] is first[1] is first[3] and again == [first[2], first[1]]
    with Evaluator(wl) as fresh:
        assert fresh.map([b])[0].metrics == first[0].metrics
        assert fresh.map([c])[0].metrics == first[2].metrics


def test_the_key_is_what_the_outcome_depends_on() -> None:
    assert task_key(_task(label="x")) == task_key(_task(label="y"))
    assert task_key(_task(n=30)) != task_key(_task(n=31))
    assert task_key(_task()) != task_key(_task(block_size=32))
    assert task_key(_task()) != task_key(SimTask(_task().config.model_copy(update={"seed": 1}), 30))
    assert task_weight(_task(speculative_config=SPEC)) > task_weight(_task(n=100))


def test_a_replica_past_the_first_weighs_replica_cost_more() -> None:
    def on(num_gpus: int | None, tp: int = 1, pd: dict | None = None) -> float:
        return task_weight(SimTask(SimConfig(engine=EngineConfig(tensor_parallel_size=tp), num_gpus=num_gpus,
                                             disaggregation=pd, profile="default"), 100))
    assert on(None) == on(2, tp=2) == 100  # one replica
    assert on(4) == on(8, tp=2) == 100 * (1 + 3 * REPLICA_COST)  # four replicas (4 GPUs / TP1, 8 / TP2)
    assert on(None, pd={"num_prefill_replicas": 1, "num_decode_replicas": 2}) == 100 * (1 + 2 * REPLICA_COST)


def test_a_variant_is_keyed_as_simulated_at_the_tasks_request_count() -> None:
    wl = generate(TINY)
    cfg = _task().config
    whole, cut = SimTask(cfg, 20, TINY), SimTask(cfg, 20, TINY.with_overrides(num_requests=20, name="cut"))
    assert task_key(whole) == task_key(cut)
    assert task_key(whole) != task_key(SimTask(cfg, 21, TINY))
    with Evaluator(wl) as ev:
        a, b = ev.map([whole, cut])
        assert ev.count == 1 and a is b
    with Evaluator(wl) as fresh:
        assert fresh.map([cut])[0].metrics == a.metrics


def test_outcomes_come_back_in_task_order_though_costly_ones_start_first() -> None:
    wl = generate(TINY)
    tasks = [_task(n=10), _task(n=20, speculative_config=SPEC), _task(n=15)]
    with Evaluator(wl) as ev:
        outs = ev.map(tasks)
    with Evaluator(wl) as ev:
        one_by_one = [ev.map([t])[0] for t in tasks]
    assert [o.metrics for o in outs] == [o.metrics for o in one_by_one]


def test_two_stages_asking_at_once_share_one_simulation() -> None:
    wl = generate(TINY)
    outs: list[list[Outcome]] = []
    with Evaluator(wl) as ev:
        threads = [threading.Thread(target=lambda: outs.append(ev.map([_task(n=25)]))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert ev.count == 1
    assert len(outs) == 4 and all(o[0] is outs[0][0] for o in outs)
