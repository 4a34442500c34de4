"""Small workload builders for the simulator tests (Request lists built directly)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.core.scheduler_output import SchedulerOutput
from sim.config import DeploymentConfig, DisaggConfig, EngineConfig
from sim.hardware import get_gpu

_NEXT_ID = [10**9]


def fresh_ids(n_blocks: int) -> tuple[int, ...]:
    """Hash ids nobody else uses (unique content)."""
    start = _NEXT_ID[0]
    _NEXT_ID[0] += n_blocks
    return tuple(range(start, start + n_blocks))


def req(i: int, t: float, prompt: int, out: int, prefix: tuple[int, ...] = (), category: str = "default",
        hbs: int = 16) -> Request:
    """A request whose prompt starts with the hash ids `prefix` (whole blocks) then unique content."""
    n_blocks = -(-prompt // hbs)
    ids = tuple(prefix[:n_blocks]) + fresh_ids(n_blocks - min(len(prefix), n_blocks))
    return Request(i, t, prompt, out, ids, hbs, category)


def poisson(n: int, rate: float, prompt: int, out: int, seed: int = 0, burstiness: float = 1.0,
            prefix: tuple[int, ...] = ()) -> list[Request]:
    """vLLM bench's arrivals: gaps ~ Gamma(burstiness, 1/(rate*burstiness)); 1 = Poisson."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), n)
    t = np.cumsum(gaps) - gaps[0]
    return [req(i, float(t[i]), prompt, out, prefix) for i in range(n)]


def deployment(model: str = "llama-3.1-8b", gpu: str = "h200", replicas: int = 1,
               disagg: tuple[int, int] | None = None, router: str = "least_loaded", **engine) -> DeploymentConfig:
    d = None
    if disagg:
        extra = {k: engine.pop(k) for k in list(engine) if k.startswith("link")}
        d = DisaggConfig(num_prefill_replicas=disagg[0], num_decode_replicas=disagg[1], **extra)
    return DeploymentConfig(model=get_model(model), gpu=get_gpu(gpu), engine=EngineConfig(**engine),
                            num_replicas=replicas, router=router, disaggregation=d)


def prefill_batch(q: int, c: int = 0, blocks: int = 0) -> SchedulerOutput:
    """One prefill chunk of q new tokens over c already in KV (causal pairs by hand)."""
    return SchedulerOutput(step_id=0, num_batched_tokens=q, num_prefill_tokens=q, num_prefill_seqs=1,
                           sum_prefill_context=c + q, prefill_attn_pairs=q * c + q * (q + 1) // 2,
                           num_blocks_allocated=blocks)


def decode_batch(seqs: int, sum_context: int, tokens: int | None = None, blocks: int = 0) -> SchedulerOutput:
    """`seqs` decodes (`tokens` query tokens in all, drafts included) over `sum_context` KV tokens."""
    tokens = seqs if tokens is None else tokens
    return SchedulerOutput(step_id=0, num_batched_tokens=tokens, num_decode_tokens=tokens, num_decode_seqs=seqs,
                           sum_decode_context=sum_context, num_blocks_allocated=blocks)


def step_s(cost, batch) -> float:
    """A step's duration as the simulator charges it."""
    return cost.combine(cost.gpu_time_s(batch), cost.cpu_time_s(batch))


def shared_prefix_requests(n: int, seed: int, block: int, arrival_gap_s: float = 0.0) -> list:
    """n requests of 20-90 prompt tokens, each opening with part of one of three shared system
    prompts (4-10 blocks, at least its last block its own), then one 150-token prompt that a
    160-token max_model_len must reject; arrivals `arrival_gap_s` apart."""
    import numpy as np

    from engine.core.request import Request

    rng = np.random.default_rng(seed)
    systems = [tuple(range(1000 * g, 1000 * g + int(rng.integers(4, 11)))) for g in range(3)]
    reqs, next_id = [], 10**6
    for i in range(n):
        prompt = int(rng.integers(20, 91))
        blocks = -(-prompt // block)
        shared = systems[int(rng.integers(3))][: blocks - 1]
        own = tuple(range(next_id, next_id + blocks - len(shared)))
        next_id += len(own)
        reqs.append(Request(i, arrival_gap_s * i, prompt, int(rng.integers(2, 24)), shared + own, hash_block_size=block))
    reqs.append(Request(n, arrival_gap_s * n, 150, 20, tuple(range(next_id, next_id + 38)), hash_block_size=block))
    return reqs


FROZEN_PROFILES = Path(__file__).with_name("data") / "profiles-0a63c25"


def frozen_profile(name: str):
    """A shipped H200 profile as it was at commit 0a63c25 (tests pin values fitted then)."""
    from sim.cost_model import CostProfile

    return CostProfile.load(FROZEN_PROFILES / f"{name}.json")
