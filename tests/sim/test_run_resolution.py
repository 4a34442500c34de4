"""A run resolves its configuration and plans its memory once (issue 26; before: the flags three
times, the memory plan once per replica plus once): the size check and every
replica read one `ResolvedDeployment`, and the replicas get the very flags and plans that
resolving the deployment by hand gives."""

from __future__ import annotations

import pytest

import sim.resolved
from engine.core.request import Request
from sim.config import DisaggConfig, EngineConfig
from sim.cost_model import CostProfile
from sim.resolved import resolve_deployment
from sim.run import SimConfig, check_simulation_size, run
from sim.simulator import Simulation


def _requests(n: int = 12) -> list[Request]:
    out = []
    for i in range(n):
        prompt = 200 + 10 * i
        out.append(Request(i, 0.05 * i, prompt, 8, tuple(range(1000 * i, 1000 * i + -(-prompt // 16)))))
    return out


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of EngineConfig.resolved_for and plan_memory calls, wherever they come from."""
    calls = {"resolved_for": 0, "plan_memory": 0}
    resolved_for, plan_memory = EngineConfig.resolved_for, sim.resolved.plan_memory

    def count_resolve(self, gpu, model):
        calls["resolved_for"] += 1
        return resolved_for(self, gpu, model)

    def count_plan(*args, **kwargs):
        calls["plan_memory"] += 1
        return plan_memory(*args, **kwargs)

    monkeypatch.setattr(EngineConfig, "resolved_for", count_resolve)
    monkeypatch.setattr(sim.resolved, "plan_memory", count_plan)
    return calls


def test_a_four_replica_run_resolves_its_flags_and_plans_memory_once(counted: dict[str, int]) -> None:
    result = run(_requests(), SimConfig(num_gpus=4, engine=EngineConfig(max_num_seqs=64)))
    assert result.meta["num_replicas"] == 4
    # the deployment's flags and vLLM's defaults (the serve line's baseline): one each
    assert counted == {"resolved_for": 2, "plan_memory": 1}


def test_a_pd_run_plans_each_instance_kind_once(counted: dict[str, int]) -> None:
    pd = DisaggConfig(num_prefill_replicas=1, num_decode_replicas=3, link="nvlink")
    result = run(_requests(), SimConfig(disaggregation=pd))
    assert result.meta["num_replicas"] == 4
    assert counted == {"resolved_for": 2, "plan_memory": 2}  # prefill and decode differ (no proposer)


def test_replicas_get_the_resolved_flags_and_plans() -> None:
    cfg = SimConfig(num_gpus=4, engine=EngineConfig(max_num_seqs=64, block_size=32))
    dep = cfg.deployment()
    by_hand = resolve_deployment(dep)
    sim_ = Simulation(dep, _requests())
    engine = dep.engine.resolved_for(dep.gpu, dep.model)
    assert engine.max_num_batched_tokens is not None and engine.max_num_seqs == 64
    for rep in sim_.replicas:
        assert rep.engine == engine == by_hand.engine
        assert rep.plan == by_hand.instance("mixed").plan
    assert check_simulation_size(dep, 1) == 4 * by_hand.instance("mixed").plan.num_gpu_blocks
    assert check_simulation_size(by_hand, 1) == 4 * by_hand.instance("mixed").plan.num_gpu_blocks


def test_a_profile_beside_a_resolved_deployment_is_refused() -> None:
    """The record was resolved with its own profile: a second one would be ignored silently."""
    resolved = resolve_deployment(SimConfig(num_gpus=2).deployment())
    with pytest.raises(ValueError, match="pass `profile` with a DeploymentConfig only"):
        check_simulation_size(resolved, 1, CostProfile.load("default"))


def test_a_record_for_another_deployment_is_refused() -> None:
    other = resolve_deployment(SimConfig(num_gpus=2).deployment())
    with pytest.raises(ValueError, match="resolved for another deployment"):
        Simulation(SimConfig(num_gpus=4).deployment(), _requests(), resolved=other)
