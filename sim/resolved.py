"""A deployment resolved once per run: each instance kind's engine flags after vLLM's start-up
rules (the GPU- and model-dependent defaults filled in) and its memory plan.

`sim.run.run` resolves a `SimConfig`'s deployment once (`resolve_deployment`) and hands the
record to the size check and to `Simulation`, whose replicas read their flags and KV blocks from
it: before, the flags were resolved in `run`, again in `Simulation` and a memory plan made per
replica, with the same answer every time (the rules are pure functions of model, GPU, flags and
profile). A `Simulation` built without one resolves its deployment itself, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sim.config import DeploymentConfig, EngineConfig
from sim.cost_model import CostProfile
from sim.memory import MemoryPlan, plan_memory

Role = Literal["mixed", "prefill", "decode"]


@dataclass(frozen=True, slots=True)
class ResolvedInstance:
    """One kind of `vllm serve` instance of the deployment: its resolved flags, its memory plan
    (per replica, summed over its TP GPUs) and how many replicas run it."""

    role: Role
    engine: EngineConfig
    plan: MemoryPlan
    num_replicas: int


@dataclass(frozen=True, slots=True)
class ResolvedDeployment:
    """`deployment` after vLLM's start-up checks and defaults, with the profile whose measured
    memory terms sized the KV caches."""

    deployment: DeploymentConfig
    profile: CostProfile | None
    engine: EngineConfig  # the deployment's flags, resolved (P/D: before the per-role budgets)
    defaults: EngineConfig  # vLLM's defaults resolved for this GPU and model (the serve line's baseline)
    instances: tuple[ResolvedInstance, ...]  # "mixed"; or "prefill" then "decode"

    def instance(self, role: Role) -> ResolvedInstance:
        return next(i for i in self.instances if i.role == role)

    @property
    def num_replicas(self) -> int:
        return sum(i.num_replicas for i in self.instances)

    def simulated_blocks(self, kv_block_coarsening: int) -> int:
        """KV blocks the simulator tracks over all replicas at this coarsening."""
        return sum(i.num_replicas * max(i.plan.num_gpu_blocks // kv_block_coarsening, 1) for i in self.instances)


def resolve_deployment(deployment: DeploymentConfig, profile: CostProfile | None = None) -> ResolvedDeployment:
    """Resolve `deployment`'s flags for its GPU and model and plan each instance kind's memory;
    raises vLLM's start-up errors (heads not divisible, the model does not fit) naming the fix.
    P/D: the prefill side runs without the proposer and with its own token budget, the decode
    side with its own budget (vllm PR #6170)."""
    dep = deployment
    base = dep.engine.resolved_for(dep.gpu, dep.model)
    defaults = EngineConfig().resolved_for(dep.gpu, dep.model)

    def instance(role: Role, engine: EngineConfig, n: int) -> ResolvedInstance:
        return ResolvedInstance(role, engine, plan_memory(dep.model, dep.gpu, engine, profile), n)

    d = dep.disaggregation
    if d is None:
        return ResolvedDeployment(dep, profile, base, defaults, (instance("mixed", base, dep.num_replicas),))
    pe = base.model_copy(update={"max_num_batched_tokens": d.prefill_max_num_batched_tokens
                                 or base.max_num_batched_tokens, "speculative_config": None})
    de = base.model_copy(update={"max_num_batched_tokens": d.decode_max_num_batched_tokens
                                 or base.max_num_batched_tokens})
    return ResolvedDeployment(dep, profile, base, defaults, (instance("prefill", pe, d.num_prefill_replicas),
                                                            instance("decode", de, d.num_decode_replicas)))


__all__ = ["ResolvedDeployment", "ResolvedInstance", "Role", "resolve_deployment"]
