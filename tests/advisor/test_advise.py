"""`advisor.advise`: the Python API's recommendation, its internal consistency against values
recomputed independently, the --out files, the CLI's refusals, and parallel runs (local
processes, Ray) giving the serial answer."""

from __future__ import annotations

import fcntl
import json
import math
import os
import pickle
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from advisor.advise import AdviseRequest, Recommendation, advise
from advisor.advise.cost_lines import crossing
from advisor.advise.evaluate import Evaluator, spread_slice
from advisor.advise.records import normalise_slo
from advisor.advise.report import write_outputs
from advisor.advise.scenarios import SCENARIOS
from advisor.advise.search import search
from costline.cli import app
from engine.core.outputs import OutputPathError
from sim.config import ENGINE_CONFIG_FLAGS, EngineConfig
from sim.generate import generate
from sim.workload_spec import WorkloadSpec

SMALL = WorkloadSpec.model_validate({
    "name": "small-chat", "num_requests": 150, "seed": 3,
    "arrival": {"kind": "gamma", "rate_rps": 12.0, "burstiness": 0.5},
    "prompt_tokens": {"kind": "lognormal", "median": 400, "sigma": 0.6, "min_tokens": 16, "max_tokens": 4000},
    "output_tokens": {"kind": "lognormal", "median": 40, "sigma": 0.5, "min_tokens": 1, "max_tokens": 400},
    "system_prompts": {"count": 2, "tokens": {"kind": "fixed", "tokens": 200}, "share_of_requests": 0.7},
    "dynamic_prefix": {"share_of_requests": 0.2, "position_tokens": 32},
    "task_mix": {"chat": 0.7, "code": 0.3}})


EVENTS: list = []  # the fixture's progress events
_SHARED: list[tuple[Recommendation, list]] = []  # (recommendation, its events), once computed


@pytest.fixture(scope="module")
def rec(tmp_path_factory) -> Recommendation:
    """The recommendation for SMALL, a copy per module (test_charts, test_alerts and test_verdict
    import this fixture): computed once per test run and shared."""
    computed, events = _shared_recommendation(tmp_path_factory)
    EVENTS[:] = events
    return computed.model_copy(deep=True)


def _recommend_small(tmp_path_factory) -> tuple[Recommendation, list]:
    path = tmp_path_factory.mktemp("spec") / "small.json"
    path.write_text(SMALL.to_json())
    events: list = []
    return advise(str(path), AdviseRequest(workers=1, slo="ttft_p99:300 tpot_p99:30"), progress=events.append), events


def _shared_recommendation(tmp_path_factory) -> tuple[Recommendation, list]:
    """Once per process, and under pytest-xdist once per run: the first worker to get here
    computes it under a lock and pickles it into the run's shared temporary folder; the others
    read it (four modules each advising on the same workload cost ~20 CPU s, 2026-12-02)."""
    if not _SHARED:
        _SHARED.append(_load_or_recommend(tmp_path_factory))
    return _SHARED[0]


def _load_or_recommend(tmp_path_factory) -> tuple[Recommendation, list]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: nothing to share with
        return _recommend_small(tmp_path_factory)
    path = tmp_path_factory.getbasetemp().parent / f"advise-small-{run}.pickle"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.exists():
            return pickle.loads(path.read_bytes())
        computed = _recommend_small(tmp_path_factory)
        path.write_bytes(pickle.dumps(computed))
        return computed


def test_progress_counts_every_simulation_once_per_phase(rec: Recommendation) -> None:
    phases: dict[str, list] = {}
    for e in EVENTS:
        phases.setdefault(e.phase, []).append(e)
    assert {"search", "ladder", "cost lines", "robustness"} <= set(phases)
    for name, evs in phases.items():
        assert [e.done for e in evs] == sorted(e.done for e in evs), name
        assert [e.finished for e in evs].count(True) == 1 and evs[-1].finished, name
        assert evs[-1].done == evs[-1].total > 0, name
    # the phases' totals add up to the evaluator's own count
    assert sum(evs[-1].total for evs in phases.values()) == rec.num_simulations


def test_crossing_interpolates_the_sign_change() -> None:
    assert crossing([1, 2, 4], [10, 5, -5]) == pytest.approx(3.0)  # 2 + 2 * 5 / 10
    assert crossing([1, 2], [1, 2]) is None
    assert crossing([4, 1, 2], [-1, 3, 1]) == pytest.approx(2 + 2 * 1 / 2)  # sorted by x first


def test_slo_spellings() -> None:
    assert normalise_slo("ttft_p99:500 tpot_p99:50") == "ttft:500 tpot:50"
    with pytest.raises(ValueError, match="slo"):
        AdviseRequest(slo="ttft_p99:fast")


def test_spread_slice_covers_the_whole_trace() -> None:
    wl = generate(SMALL.with_overrides(num_requests=1000))
    s = spread_slice(wl, 200)
    assert len(s) == 200 and (s.arrival_s[1:] >= s.arrival_s[:-1]).all()
    # four windows, the last one ending with the trace's last request
    assert s.prompt_len[-1] == wl.prompt_len[-1] and s.prompt_len[0] == wl.prompt_len[0]


def test_flags_and_serve_command_carry_only_non_defaults(rec: Recommendation) -> None:
    default = EngineConfig()
    for name, value in rec.best.flags.items():
        if name != "kv_transfer_config":
            assert getattr(default, name) != value, name
    assert rec.serve_command.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct")
    flags = {f.name: f for f in ENGINE_CONFIG_FLAGS}
    for name, value in rec.best.flags.items():
        if name in flags and name != "tensor_parallel_size":
            spelled = flags[name].vllm_args(getattr(EngineConfig(**{name: value}), name))
            assert spelled[0] in rec.serve_command, (name, spelled)
    for flag in ENGINE_CONFIG_FLAGS:  # nothing at its default is spelled out
        if flag.name not in rec.best.flags and flag.type is not bool:
            assert flag.cli + " " not in rec.serve_command


def test_ladder_adds_up_to_the_recommendation(rec: Recommendation) -> None:
    if not rec.ladder:
        assert rec.best.flags == rec.baseline.flags
        return
    assert rec.ladder[-1].metrics == rec.best.metrics  # same configuration, same slice, same seed
    product = math.prod(1 + s.delta_goodput_pct / 100 for s in rec.ladder)
    assert product == pytest.approx(rec.best.metrics.goodput_rps / rec.baseline.metrics.goodput_rps, rel=1e-9)
    assert rec.best.metrics.goodput_rps >= rec.baseline.metrics.goodput_rps * 0.99


def test_every_kept_change_clears_the_bar_and_every_other_is_reported(rec: Recommendation) -> None:
    """The no-change rule: each rung's interval is above --min-gain at its low end, contains its
    point gain, and the changes the search found but the bar refused keep vLLM's default."""
    bar = rec.request.min_gain_pct
    for s in rec.ladder:
        assert s.gain is not None and s.gain.low_pct > bar, s.optimization
        assert s.gain.low_pct <= s.gain.gain_pct <= s.gain.high_pct
        assert s.gain.gain_pct == pytest.approx(s.delta_goodput_pct, abs=1e-3)  # goodput objective
        assert s.gain.realizations == 3  # the quick budget's other traffic realizations
    for k in rec.kept_defaults:
        assert k.gain.low_pct <= bar and "keep vLLM's default" in k.reason and k.gain.text() in k.reason
    # provenance: the step costs first, measured (auto picks the H200 8B fit)
    assert rec.assumptions[0].input == "step costs (cost profile)" and rec.assumptions[0].provenance == "measured"
    kept = {k.optimization.split(":")[0] for k in rec.kept_defaults}
    assert not kept & {r.optimization.split(":")[0] for r in rec.rejected}  # told once, with its interval


def test_a_bar_nothing_clears_recommends_vllm_defaults(tmp_path) -> None:
    path = tmp_path / "small.json"
    path.write_text(SMALL.with_overrides(num_requests=60).to_json())
    high = advise(str(path), AdviseRequest(workers=1, slo="ttft_p99:300 tpot_p99:30", min_gain_pct=1000))
    assert high.ladder == [] and high.best.flags == {} and high.best.metrics == high.baseline.metrics
    assert high.serve_command == "vllm serve meta-llama/Llama-3.1-8B-Instruct"
    assert all(k.gain.low_pct <= 1000 for k in high.kept_defaults)


def test_rejected_reasons_and_questions_are_quantified(rec: Recommendation) -> None:
    assert rec.rejected
    assert all(any(ch.isdigit() for ch in r.reason) for r in rec.rejected)
    assert len(rec.questions) == 7
    assert all(any(ch.isdigit() for ch in q.answer) for q in rec.questions)
    names = {m.metric for m in rec.metrics_to_watch}
    assert {"vllm:time_to_first_token_seconds", "vllm:kv_cache_usage_perc"} <= names


def test_cost_lines_break_even_lies_on_the_curve(rec: Recommendation) -> None:
    variables = {(c.optimization.split(" (")[0], c.variable) for c in rec.cost_lines}
    assert ("speculative decoding", "mean concurrency") in variables
    assert ("prefix caching", "prefix-cache hit rate") in variables
    assert ("disaggregated prefill", "mean prompt length") in variables
    for line in rec.cost_lines:
        if line.break_even is None or "CPU" in line.optimization:
            continue
        xs = sorted(p.x for p in line.points)
        assert xs[0] <= line.break_even <= xs[-1]
        pts = sorted(line.points, key=lambda p: p.x)
        below = [p.gain_pct for p in pts if p.x <= line.break_even]
        above = [p.gain_pct for p in pts if p.x >= line.break_even]
        assert below[-1] * above[0] <= 0  # the gain changes sign (or is zero) around it


def test_robustness_regret_and_fallback(rec: Recommendation) -> None:
    rb = rec.robustness
    assert [r.perturbation for r in rb.rows][:3] == ["as given", "rate +25%", "rate -25%"]
    for r in rb.rows:
        expect = (r.best_goodput_rps - r.kept_goodput_rps) / r.best_goodput_rps * 100 if r.best_goodput_rps else 0
        assert r.regret_pct == pytest.approx(expect)
    assert rb.fallback_max_regret_pct <= max(r.regret_pct for r in rb.rows) + 1e-9


def test_gap_shares(rec: Recommendation) -> None:
    if rec.gap is None:
        return
    shares = [abs(f.share_pct) for f in rec.gap.factors]
    assert sum(shares) == pytest.approx(100.0) or sum(shares) == 0
    assert [f.factor for f in rec.gap.factors] == ["burstiness", "length tails", "dynamic prefixes",
                                                   "task-mix drift", "concurrency"]


def test_out_files_and_force(rec: Recommendation, tmp_path) -> None:
    out = write_outputs(rec, tmp_path / "advice")
    names = {p.name for p in out.iterdir()}
    assert {"recommendation.json", "report.md", "serve.sh", "alerts.yaml", "ladder.png", "cost_lines.png"} <= names
    assert (out / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Recommendation.model_validate_json((out / "recommendation.json").read_text()).best == rec.best
    assert rec.serve_command in (out / "serve.sh").read_text()
    with pytest.raises(OutputPathError, match="--force"):
        write_outputs(rec, out)
    write_outputs(rec, out, force=True)


def test_cli_refuses_bad_input_in_one_line(tmp_path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["advise", "-w", "chat-production", "--slo", "ttft_p99:fast"])
    assert bad.exit_code == 2 and "--slo 'ttft_p99:fast'" in bad.output and "Traceback" not in bad.output
    assert len(bad.output.strip().splitlines()) == 1
    taken = tmp_path / "run"
    taken.mkdir()
    (taken / "recommendation.json").write_text("{}")
    refused = runner.invoke(app, ["advise", "-w", "chat-production", "--out", str(taken)])
    assert refused.exit_code == 2 and "--force" in refused.output


def test_help_path_stays_light() -> None:
    code = "import sys, costline.cli; print('ray' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def _search(workers: int = 1, ray: str | None = None):
    sc = SCENARIOS[0]
    wl = generate(sc.workload_spec().with_overrides(num_requests=60))  # three searches: a small trace
    ctx = sc.context(len(wl))
    with Evaluator(wl, workers=workers, ray=ray) as ev:
        found = search(ev, ctx)
    return found.best.cand, found.best.outcome.metrics


def test_local_processes_and_ray_give_the_serial_answer() -> None:
    import ray
    serial = _search()
    assert _search(workers=2) == serial
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert _search(ray="auto") == serial
    finally:
        ray.shutdown()


def test_json_round_trip(rec: Recommendation) -> None:
    data = json.loads(rec.model_dump_json())
    assert set(data) >= {"request", "profile", "workload", "baseline", "best", "ladder", "rejected", "cost_lines",
                         "gap", "robustness", "serve_command", "metrics_to_watch", "questions", "elapsed_s",
                         "num_simulations"}
    assert data["num_simulations"] > 0 and data["profile"]["name"]


def _outcome(goodput: float, attainment: float):
    from advisor.advise.evaluate import Outcome
    from advisor.advise.records import Metrics
    m = Metrics(goodput_rps=goodput, throughput_tok_s=0, ttft_p50_ms=1, ttft_p99_ms=1, tpot_p50_ms=1, tpot_p99_ms=1,
                itl_p99_ms=1, e2e_p99_ms=100, slo_attainment=attainment, preemptions=0)
    return Outcome(m, {})


@pytest.mark.parametrize(("objective", "winner"), [("goodput", "TP1 x2"), ("cost", "TP1 x1"), ("min-gpus", "TP1 x1")])
def test_objectives_rank_layouts(objective: str, winner: str) -> None:
    from advisor.advise.search import Context, score
    from advisor.advise.space import Candidate, dimensions
    dims = dimensions("llama-3.1-8b", 2, min_gpus=1)
    lay = dims[-1]
    names = [o.name for o in lay.options]
    ctx = Context(model="llama-3.1-8b", gpu="h200", num_gpus=2, slo=None, seed=0, profile=None,
                  objective=objective, dims=dims, num_requests=10)  # type: ignore[arg-type]
    two = Candidate((0,) * (len(dims) - 1) + (names.index("TP1 x2"),))
    one = Candidate((0,) * (len(dims) - 1) + (names.index("TP1 x1"),))
    # two GPUs serve 1.5x one GPU's goodput; both meet the SLOs
    keys = {"TP1 x2": score(_outcome(9.0, 1.0), two, ctx), "TP1 x1": score(_outcome(6.0, 0.995), one, ctx)}
    assert max(keys, key=keys.get) == winner


def test_speed_words_say_which_way_latency_moves():
    from advisor.advise.cost_lines import speed_words

    # latency_cut_pct = (1 - mean latency with / without) x 100: the words quote the number itself
    assert speed_words(30.0) == "cuts mean end-to-end latency by 30% (x0.70)"
    assert speed_words(-54.0) == "raises mean end-to-end latency by 54% (x1.54)"
    assert speed_words(0.2) == "leaves mean end-to-end latency unchanged"
    assert speed_words(float("nan")).startswith("has no measurable effect")
