"""The papers' lab settings as costline workloads and deployments, and the production variants.

Everything here goes through costline's public pieces: `sim.generate.generate` for workloads,
`sim.simulator.simulate` for runs (a row may price a model no preset names, e.g. Llama-2-13B),
`sim.run.load` for the shipped production traces, the advisor's workload edits
(`advisor.advise.variants`: `burstier`, `heavier_tail`, `with_dynamic`) for the seed's factors and
the advisor's gap metric (`advisor.advise.gap.gain`: mean E2E latency, baseline / optimized).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from advisor.advise.evaluate import Outcome
from advisor.advise.gap import gain as advisor_gain
from advisor.advise.variants import burstier, heavier_tail, with_dynamic
from engine.core.model_spec import ModelSpec, get_model
from engine.core.request import Request
from sim.config import DeploymentConfig, DisaggConfig, EngineConfig
from sim.generate import generate
from sim.hardware import get_gpu
from sim.metrics import SLO
from sim.profile_files import load_profile
from sim.run import load
from sim.simulator import simulate
from sim.workload_presets import get_preset
from sim.workload_source import SourceOptions, all_at_time_zero, cap_prompt_lengths
from sim.workload_spec import EmpiricalLength, FixedLength, WorkloadSpec

HERE = Path(__file__).parent
CLAIMS_FILE = HERE / "claims.json"
SHAREGPT8K_FILE = HERE / "data" / "sarathi_sharegpt8k_sample.json"

# Llama-2-13B (PR #1983's "llama 13B"): meta-llama/Llama-2-13b-hf config.json. No preset ships it.
LLAMA2_13B = ModelSpec(name="llama-2-13b", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=40,
                       head_dim=128, intermediate_size=13824, vocab_size=32000, rope_theta=10000.0,
                       max_position_embeddings=4096, dtype="float16")

# The seed's production factors, each at the value of costline's shipped production preset
# (sim/presets/chat-production.json): Gamma arrivals with CV 2, the advisor's heavier length tails,
# 30% of requests with per-request content 48 tokens into the prompt, its five-task mix.
CHAT_PRODUCTION = "chat-production"
BURST_CV2_FACTOR = 4.0  # burstier(): inter-arrival CV^2 x 4 -> CV 2 from Poisson's 1 (chat-production's 0.25 shape)
PRODUCTION_TRACES = ("mooncake-conversation", "azure-code-2023")
TRACE_REQUESTS = 600


def claims() -> list[dict[str, Any]]:
    return json.loads(CLAIMS_FILE.read_text())["claims"]


def claim(claim_id: str) -> dict[str, Any]:
    for c in claims():
        if c["id"] == claim_id:
            return c
    raise KeyError(claim_id)


@cache
def sharegpt8k() -> dict[str, Any]:
    """The Sarathi-Serve 'chat' trace sample (1,000 rows) and the full file's statistics."""
    return json.loads(SHAREGPT8K_FILE.read_text())


# ----------------------------------------------------------------------------- lab workloads


def sarathi_chat_spec(rate_rps: float, num_requests: int = 400, seed: int = 0) -> WorkloadSpec:
    """Sarathi-Serve's 'chat' trace (sharegpt_8k): the file's lengths, Poisson arrivals, no shared prefix."""
    d = sharegpt8k()
    return WorkloadSpec(name="sarathi-chat", num_requests=num_requests, seed=seed,
                        arrival={"kind": "poisson", "rate_rps": rate_rps},
                        prompt_tokens=EmpiricalLength(values=d["prompt_tokens"]),
                        output_tokens=EmpiricalLength(values=d["output_tokens"]),
                        task_mix={"chat": 1.0})


def pr1983_spec(rate_rps: float, num_requests: int = 1000, seed: int = 0) -> WorkloadSpec:
    """vLLM PR #1983: one 200-token shared prefix + 30 tokens, 50 output tokens, Poisson."""
    return WorkloadSpec(name="pr1983-prefix", num_requests=num_requests, seed=seed,
                        arrival={"kind": "poisson", "rate_rps": rate_rps},
                        prompt_tokens=FixedLength(tokens=230), output_tokens=FixedLength(tokens=50),
                        system_prompts={"count": 1, "tokens": {"kind": "fixed", "tokens": 200},
                                        "zipf_exponent": 0.0, "share_of_requests": 1.0},
                        task_mix={"chat": 1.0})


def fixed_spec(prompt: int, output: int, num_requests: int, rate_rps: float = 1.0, seed: int = 0,
               task: str = "chat") -> WorkloadSpec:
    """Fixed lengths, Poisson arrivals, no shared prefix (vLLM's random dataset shape)."""
    return WorkloadSpec(name=f"fixed-{prompt}-{output}", num_requests=num_requests, seed=seed,
                        arrival={"kind": "poisson", "rate_rps": rate_rps},
                        prompt_tokens=FixedLength(tokens=prompt), output_tokens=FixedLength(tokens=output),
                        task_mix={task: 1.0})


def requests_of(spec: WorkloadSpec, *, offline: bool = False) -> list[Request]:
    reqs = list(generate(spec).requests)
    return all_at_time_zero(reqs) if offline else reqs


def mean_tokens(requests: Sequence[Request]) -> float:
    return sum(r.prompt_len + r.output_len for r in requests) / len(requests)


# ----------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class Target:
    """What a row simulates: a model (preset name or spec), a GPU preset, a cost profile (with the
    model and GPU it was fitted or scaled for) and the deployment's shape."""

    model: str | ModelSpec
    gpu: str
    profile: str
    profile_model: str
    num_replicas: int = 1
    max_prompt_len: int | None = None  # cap (the model's context), e.g. Llama-2's 4,096

    @property
    def model_spec(self) -> ModelSpec:
        return self.model if isinstance(self.model, ModelSpec) else get_model(self.model)


def run_once(target: Target, engine: EngineConfig, requests: Sequence[Request], slo: str | None = None,
             disaggregation: DisaggConfig | None = None) -> dict[str, Any]:
    """One simulation's summary (`vllm bench serve` keys)."""
    prof = load_profile(target.profile, target.profile_model, target.gpu)
    dep = DeploymentConfig(model=target.model_spec, gpu=get_gpu(target.gpu), engine=engine,
                           num_replicas=1 if disaggregation else target.num_replicas,
                           disaggregation=disaggregation)
    reqs = cap_prompt_lengths(requests, target.max_prompt_len) if target.max_prompt_len else list(requests)
    res = simulate(dep, reqs, seed=0, profile=prof, slo=SLO.parse(slo) if slo else None)
    return res.summary().to_json_dict()


def e2e_gain(base: dict[str, Any], best: dict[str, Any]) -> float:
    """The advisor's gap metric (advisor.advise.gap.gain): mean E2E latency, baseline / optimized."""
    return advisor_gain(Outcome(metrics=None, extras={"mean_e2e_ms": base["mean_e2el_ms"]}),  # type: ignore[arg-type]
                        Outcome(metrics=None, extras={"mean_e2e_ms": best["mean_e2el_ms"]}))  # type: ignore[arg-type]


def meets_sarathi_slo(s: dict[str, Any], tbt_ms: float, delay_ms: float = 2000.0) -> bool:
    """Sarathi-Serve's capacity test: P99 TBT within the SLO and P50 scheduling delay <= 2 s; every
    request finished (an overloaded run that left requests waiting does not pass)."""
    done = s["completed"] >= s["num_prompts"]
    return bool(done and s["p99_itl_ms"] <= tbt_ms and s["median_queue_time_ms"] <= delay_ms)


def capacity(make: Callable[[float], list[Request]], target: Target, engine: EngineConfig, tbt_ms: float,
             start_rps: float, iterations: int = 9) -> float:
    """The highest Poisson rate meeting Sarathi's SLO: double until it fails, then bisect
    (Sarathi-Serve's capacity_search does the same with 7-8 trials per point)."""
    lo, hi = 0.0, start_rps
    for _ in range(8):
        if not meets_sarathi_slo(run_once(target, engine, make(hi)), tbt_ms):
            break
        lo, hi = hi, hi * 2
    else:
        return lo
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if meets_sarathi_slo(run_once(target, engine, make(mid)), tbt_ms):
            lo = mid
        else:
            hi = mid
    return lo


# ----------------------------------------------------------------------------- production variants


def production_variants(spec: WorkloadSpec) -> dict[str, WorkloadSpec]:
    """The lab spec with one of the seed's factors swapped in at a time (values from the shipped
    chat-production preset, edits from the advisor's variants module)."""
    prod = get_preset(CHAT_PRODUCTION)
    dyn = prod.dynamic_prefix
    return {
        "bursts": burstier(spec, BURST_CV2_FACTOR),
        "long-tailed lengths": spec.model_copy(update={"prompt_tokens": heavier_tail(spec.prompt_tokens),
                                                       "output_tokens": heavier_tail(spec.output_tokens)}),
        "dynamic system prompts": with_dynamic(spec, dyn.share_of_requests, dyn.position_tokens),
        "drifting task mix": spec.model_copy(update={"task_mix": dict(prod.task_mix)}),
    }


def trace_requests(name: str, token_rate: float, num_requests: int = TRACE_REQUESTS) -> list[Request]:
    """The first `num_requests` of a shipped production trace, its arrival rate rescaled so that it
    offers `token_rate` (prompt + output tokens per second): the lab's load, the trace's shape."""
    first = load(name, SourceOptions(first=num_requests, spread=True)).requests
    rate = token_rate / mean_tokens(first)
    # spread: Mooncake logs arrivals in 3-s steps; tied timestamps are spread within each step
    return list(load(name, SourceOptions(first=num_requests, rate_rps=rate, spread=True)).requests)


def rate_of(requests: Sequence[Request]) -> float:
    t = [r.arrival_s for r in requests]
    span = max(t) - min(t)
    return (len(t) - 1) / span if span > 0 else math.inf


__all__ = [
    "LLAMA2_13B", "PRODUCTION_TRACES", "Target", "capacity", "claim", "claims", "e2e_gain", "fixed_spec",
    "mean_tokens", "meets_sarathi_slo", "pr1983_spec", "production_variants", "rate_of", "requests_of",
    "run_once", "sarathi_chat_spec", "sharegpt8k", "trace_requests",
]
