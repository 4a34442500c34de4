"""A cost line whose sweep reaches a configuration that cannot start (the model does not fit the
GPU) is left out instead of failing the whole advice (it raised KeyError 'concurrency' on l4 with
llama-3.1-8b)."""

from __future__ import annotations

from advisor.advise.cost_lines import cost_lines
from advisor.advise.evaluate import INFEASIBLE, Outcome
from advisor.advise.scenarios import SCENARIOS
from advisor.advise.space import Candidate


class RefusingEvaluator:
    """Every simulation refused at start-up, as vLLM refuses a model larger than the GPU."""

    def __init__(self) -> None:
        self.calls = 0

    def map(self, tasks):
        self.calls += len(tasks)
        return [Outcome(INFEASIBLE, {}, "model weights need 16.1 GB, the GPU has 14.4 GB") for _ in tasks]


def test_lines_whose_points_cannot_start_are_left_out():
    sc = SCENARIOS[0]
    ctx = sc.context(50)
    ev = RefusingEvaluator()
    best = Candidate(tuple(0 for _ in ctx.dims))
    assert cost_lines(ev, ctx, sc.workload_spec(), best, 50) == []
    assert ev.calls > 0  # the sweeps were asked for, and their refusals absorbed
