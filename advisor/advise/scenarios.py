"""Six traffic scenarios with different right answers (issue 11's quality target): each is a
workload spec, a deployment and the knobs searched. `benchmarks/advisor/regret.py` finds each
one's best configuration by exhaustive search and commits it; tests/advisor/test_advise_scenarios.py
checks that the advisor's search lands within 5% of it and explains why."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.advise.search import BudgetPlan, Context
from advisor.advise.space import ENGINE_DIMENSIONS, Dimension, dimensions
from sim.workload_spec import WorkloadSpec

SLO = "ttft:500 tpot:50"
# slices small enough for CI: 6 scenarios x ~35 simulations within the test budget
TEST_PLAN = BudgetPlan(first_slice=100, max_slice=300, max_pool=12)


def _dims(*names: str, model: str = "llama-3.1-8b", num_gpus: int = 1) -> tuple[Dimension, ...]:
    every = dimensions(model, num_gpus)
    return tuple(d for d in every if d.name in names)


ENGINE_KNOBS = ("prefix caching", "token budget", "speculative decoding", "FP8")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    spec: dict
    model: str = "llama-3.1-8b"
    gpu: str = "h200"
    num_gpus: int = 1
    knobs: tuple[str, ...] = ENGINE_KNOBS
    num_requests: int = 300

    def workload_spec(self) -> WorkloadSpec:
        return WorkloadSpec.model_validate({"name": self.name, "num_requests": self.num_requests, "seed": 0, **self.spec})

    def context(self, num_requests: int, seed: int = 0) -> Context:
        dims = _dims(*self.knobs, model=self.model, num_gpus=self.num_gpus)
        # The first-principles profile, pinned: these scenarios test the SEARCH against exhaustive
        # search, and their committed exhaustive answers must not move when a profile is refitted.
        return Context(model=self.model, gpu=self.gpu, num_gpus=self.num_gpus, slo=SLO, seed=seed, profile="default",
                       objective="goodput", dims=dims, num_requests=num_requests, plan_override=TEST_PLAN)


def _ln(median: float, sigma: float, lo: int, hi: int) -> dict:
    return {"kind": "lognormal", "median": median, "sigma": sigma, "min_tokens": lo, "max_tokens": hi}


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("short-chat", {
        "arrival": {"kind": "poisson", "rate_rps": 60.0},
        "prompt_tokens": _ln(250, 0.6, 16, 4000), "output_tokens": _ln(120, 0.6, 1, 1024),
        "system_prompts": {"count": 4, "tokens": {"kind": "fixed", "tokens": 150}, "share_of_requests": 0.8},
        "task_mix": {"chat": 1.0}}),
    Scenario("long-prompt-rag", {
        "arrival": {"kind": "poisson", "rate_rps": 6.0},
        "prompt_tokens": _ln(6000, 0.5, 700, 30000), "output_tokens": _ln(150, 0.7, 1, 1024),
        "system_prompts": {"count": 2, "tokens": {"kind": "fixed", "tokens": 600}},
        "task_mix": {"qa": 0.85, "summarize": 0.15}}, num_requests=200),
    Scenario("code-high-acceptance", {
        "arrival": {"kind": "poisson", "rate_rps": 9.0},
        "prompt_tokens": _ln(1500, 0.5, 100, 16000), "output_tokens": _ln(200, 0.5, 16, 4096),
        "system_prompts": {"count": 2, "tokens": {"kind": "fixed", "tokens": 1000}},
        "task_mix": {"code": 0.7, "json": 0.3}}, num_requests=200,
        # a code assistant kept in BF16 (FP8 weights are not an option for its accuracy budget)
        knobs=("prefix caching", "token budget", "max-num-seqs", "speculative decoding")),
    Scenario("bursty-agent-dynamic-prefix", {
        "arrival": {"kind": "onoff", "on_rate_rps": 40.0, "off_rate_rps": 1.0, "mean_on_s": 3.0, "mean_off_s": 10.0},
        "prompt_tokens": _ln(3400, 0.3, 1000, 16000), "output_tokens": _ln(150, 0.8, 1, 2048),
        "system_prompts": {"count": 3, "tokens": {"kind": "fixed", "tokens": 3000}},
        "dynamic_prefix": {"share_of_requests": 0.5, "position_tokens": 1024},
        "task_mix": {"agent": 0.6, "json": 0.4}}),
    Scenario("tight-memory", {
        "arrival": {"kind": "poisson", "rate_rps": 0.6},
        "prompt_tokens": _ln(1500, 0.6, 100, 8000), "output_tokens": _ln(200, 0.6, 1, 2048),
        "task_mix": {"chat": 1.0}}, gpu="l4",
        knobs=("token budget", "max-num-seqs", "FP8", "gpu memory utilization")),
    Scenario("large-model-multi-gpu", {
        "arrival": {"kind": "poisson", "rate_rps": 4.0},
        "prompt_tokens": _ln(1000, 0.7, 16, 8000), "output_tokens": _ln(200, 0.7, 1, 2048),
        "task_mix": {"chat": 0.5, "reasoning": 0.5}},
        model="llama-3.1-70b", num_gpus=4, knobs=("speculative decoding", "FP8", "parallelism")),
)

__all__ = ["ENGINE_DIMENSIONS", "SCENARIOS", "SLO", "TEST_PLAN", "Scenario"]
