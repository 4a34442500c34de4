"""What makes the advisor's search fast without changing its answer (issue 26): each distinct
simulation runs once per evaluator (same outcome as a fresh run), costly ones start first while
outcomes come back in task order, and the hill-climb halves the winner's single-knob moves over
the slices yet finds the best move where the moves' ranking does not change with the slice."""

from __future__ import annotations

import threading

from advisor.advise.evaluate import INFEASIBLE, Evaluator, Outcome, SimTask, task_key, task_weight
from advisor.advise.search import BudgetPlan, Context, SearchResult, exhaustive, search
from advisor.advise.space import dimensions
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


class Separable:
    """A stand-in evaluator: goodput is a sum of per-option gains (no simulation), so the best
    configuration and each move's rank are known in closed form, on every slice alike."""

    def __init__(self, ctx: Context, gains: dict[tuple[int, int], float]) -> None:
        self.ctx, self.gains, self.tasks, self.count, self.parallel = ctx, gains, [], 0, False

    def map(self, tasks, on_done=None, on_submit=None):
        self.tasks += tasks
        self.count += len(tasks)
        return [self._outcome(t) for t in tasks]

    def _outcome(self, t: SimTask) -> Outcome:
        label = t.config.label or ""
        g = 10.0
        for d, dim in enumerate(self.ctx.dims):
            for o, opt in enumerate(dim.options):
                if o and f"{dim.name} {opt.name}" in label.split(", "):
                    g += self.gains.get((d, o), 0.0)
        m = INFEASIBLE.model_copy(update={"goodput_rps": g, "e2e_p99_ms": 1000.0, "slo_attainment": 1.0})
        return Outcome(m, {"n": t.num_requests})

    def expect(self, total: int) -> None:
        pass


def _ctx() -> Context:
    dims = tuple(d for d in dimensions("llama-3.1-8b", 4)
                 if d.name in ("token budget", "speculative decoding", "FP8", "parallelism"))
    return Context(model="llama-3.1-8b", gpu="h200", num_gpus=4, slo="ttft:500 tpot:50", seed=0, profile="default",
                   objective="goodput", dims=dims, num_requests=1000,
                   plan_override=BudgetPlan(first_slice=100, max_slice=900, max_pool=12))


def _run(gains: dict[tuple[int, int], float]) -> tuple[SearchResult, Separable]:
    ctx = _ctx()
    ev = Separable(ctx, gains)
    return search(ev, ctx), ev  # type: ignore[arg-type]


def test_on_separable_gains_the_search_finds_the_exhaustive_best_with_fewer_long_runs() -> None:
    ctx = _ctx()
    for seed in range(20):
        # every option gains or loses up to 10%, some only together with the pool's limits
        gains = {(d, o): ((seed * 7 + d * 13 + o * 5) % 21 - 10) / 10
                 for d, dim in enumerate(ctx.dims) for o in range(1, len(dim.options))}
        found, ev = _run(gains)
        ref = exhaustive(Separable(ctx, gains), ctx)  # type: ignore[arg-type]
        assert found.best.outcome.metrics.goodput_rps == ref[0].outcome.metrics.goodput_rps, seed
        # the moves: each once per pass, paired with the winner on the same slice
        for winner, move in found.neighbours:
            assert winner.outcome.extras["n"] == move.outcome.extras["n"]
            assert sum(a != b for a, b in zip(winner.cand.picks, move.cand.picks, strict=True)) == 1
        moves = [m.cand for _, m in found.neighbours]
        assert len(moves) == len(set(moves)) == sum(len(d.options) - 1 for d in ctx.dims)
        long_runs = sum(1 for t in ev.tasks if t.num_requests == 900)
        assert long_runs < 2 + 2 * len(moves)  # before: every move of each pass on the longest slice


def test_every_option_is_reachable_in_the_moves() -> None:
    ctx = _ctx()
    found, _ = _run({})
    moved = {(d, m.cand.picks[d]) for _, m in found.neighbours for d in range(len(ctx.dims))
             if m.cand.picks[d] != found.best.cand.picks[d]}
    every = {(d, o) for d, dim in enumerate(ctx.dims) for o in range(len(dim.options))
             if o != found.best.cand.picks[d]}
    assert moved == every
