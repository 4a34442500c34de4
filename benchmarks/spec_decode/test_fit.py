"""The acceptance Beta fit recovers the simulator's own law; fit_sim.py runs end to end on
run folders the simulator wrote (known acceptance and costs)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from benchmarks.spec_decode import bench_h200, fit_sim
from engine.core.request import Request
from engine.core.run_summary import jsonable
from sim.config import EngineConfig, SpeculativeConfig
from sim.cost_model import CostProfile
from sim.run import LoadedWorkload, SimConfig, run
from sim.speculative import AcceptanceModel, fit_acceptance_beta, steps_pmf


@pytest.mark.parametrize(("alpha", "k", "steps"), [(0.3, 2, 3), (0.8, 3, 2), (0.55, 1, 4)])
def test_steps_pmf_equals_exhaustive_enumeration(alpha, k, steps):
    one = [alpha**x * ((1 - alpha) if x < k else 1.0) for x in range(k + 1)]
    ref = np.zeros(steps * k + 1)
    for xs in itertools.product(range(k + 1), repeat=steps):
        ref[sum(xs)] += np.prod([one[x] for x in xs])
    np.testing.assert_allclose(steps_pmf(np.array([alpha]), k, steps)[0], ref, atol=1e-12)


def draw_requests(a: float, b: float, k: int, n: int, seed: int, task: str = "code") -> dict[str, list[int]]:
    """Per-request totals drawn by the simulator's AcceptanceModel (alpha ~ Beta(a, b) per request,
    truncated-geometric accepted counts per verify step), 5..60 verify steps per request."""
    spec = SpeculativeConfig(method="draft_model", model="byte-lm-10m", num_speculative_tokens=k,
                             acceptance_beta={task: (a, b)})
    model = AcceptanceModel(spec, seed=seed)
    rng = np.random.default_rng(seed)
    out: dict[str, list[int]] = {"drafts": [], "drafted": [], "accepted": []}
    for r in range(n):
        steps = int(rng.integers(5, 60))
        emitted = model.tokens_per_step(np.full(steps, model.alpha(r, task)), 0.0)
        out["drafts"].append(steps)
        out["drafted"].append(steps * k)
        out["accepted"].append(int((emitted - 1).sum()))
    return out


@pytest.mark.parametrize(("a", "b", "k"), [(6.0, 3.0, 3), (2.0, 5.0, 4), (12.0, 2.0, 1)])
def test_fit_recovers_the_beta_the_simulator_drew_from(a, b, k):
    d = draw_requests(a, b, k, n=300, seed=7)
    fa, fb = fit_acceptance_beta(d["accepted"], d["drafted"], k, num_steps=d["drafts"])
    assert fa / (fa + fb) == pytest.approx(a / (a + b), abs=0.03)
    assert fa + fb == pytest.approx(a + b, rel=0.35)  # the concentration: 300 alphas, each seen through noise


def test_fit_refuses_requests_without_a_verify_step():
    with pytest.raises(ValueError, match="no request has a verify step"):
        fit_acceptance_beta([0, 0], [0, 0], 3)


# ---------------------------------------------------------------------------- fit_sim end to end
TASK_BETA = {"code": (8.0, 2.0), "prose": (3.0, 4.0), "json": (9.0, 1.5)}


def requests(n: int, rate_rps: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate_rps, n))
    out, base = [], 10**6 * (seed + 1)
    for i, t in enumerate(arrivals):
        p = int(rng.integers(64, 512))
        hb = -(-p // 16)
        out.append(Request(i, float(t), p, int(rng.integers(32, 256)), tuple(range(base, base + hb)),
                           category=("code", "prose", "json")[i % 3]))
        base += hb
    return out


def write_folder(root, purpose: str, name: str, reqs: list[Request], spec: dict | None):
    """A run folder in the engine's format, its tables simulated (default first-principles profile)."""
    cfg = EngineConfig(max_num_seqs=64, async_scheduling=False, speculative_config=(
        None if spec is None else json.dumps(spec | {"model": "byte-lm-10m", "acceptance_beta": TASK_BETA})))
    res = run(LoadedWorkload(reqs, name), SimConfig(model="byte-lm-100m", gpu="h200", engine=cfg, profile="default",
                                                   skip_ahead=False, label=name))
    folder = root / purpose / name
    folder.mkdir(parents=True)
    bench_h200.write_workload(reqs, folder / "workload.jsonl")
    steps = dict(res.steps)
    for col in ("schedule_s", "prepare_s"):  # the engine splits its host time in two; the simulator has one
        steps[col] = steps["cpu_s"] / 2
    for table_name, table in (("requests", res.requests), ("steps", steps)):
        rows = zip(*(v.tolist() for v in table.values()))
        with open(folder / f"{table_name}.jsonl", "w") as f:
            f.writelines(json.dumps(jsonable(dict(zip(table, vals)))) + "\n" for vals in rows)
    summary = jsonable(res.summary().to_json_dict())
    (folder / "summary.json").write_text(json.dumps(summary))
    info = {"schema": "costline-engine-run/1", "name": name, "purpose": purpose, "model": "byte-lm-100m", "gpu": "h200",
            "engine_args": cfg.model_dump(mode="json", exclude={"speculative_config"}), "hash_block_size": 16,
            "honor_arrivals": True, "num_gpu_blocks": summary["num_gpu_blocks"], "speculative_config": spec}
    (folder / "run.json").write_text(json.dumps(info))


def test_fit_sim_recovers_acceptance_and_reproduces_simulated_runs(tmp_path):
    runs = tmp_path / "runs"
    for i, rate in enumerate((5.0, 20.0, 60.0)):
        write_folder(runs, "sweep", f"off-{i}", requests(150, rate, seed=i), None)
    spec = {"method": "draft_model", "num_speculative_tokens": 3}
    write_folder(runs, "validation", "mixed-draft", requests(150, 20.0, seed=9), spec)
    rows = [{"method": "draft_model", "k": 3, "task": t, "per_request": draw_requests(*ab, 3, 200, seed=3, task=t)}
            for t, ab in TASK_BETA.items()]
    profile, table = tmp_path / "profile.json", tmp_path / "acceptance.json"
    report = fit_sim.fit_and_validate({"acceptance": rows, "best_k": {"draft_model": 3}}, runs, tmp_path / "out",
                                      profile, table)
    fitted = json.loads(table.read_text())["acceptance_beta"]["draft_model"]
    for task, (a, b) in TASK_BETA.items():
        fa, fb = fitted[task]
        assert fa / (fa + fb) == pytest.approx(a / (a + b), abs=0.04), task
    assert CostProfile.load(profile).is_fitted
    assert report["cost"]["runs"] == ["off-0", "off-1", "off-2"]
    (v,) = report["validation"]
    assert v["name"] == "mixed-draft" and v["spec"] == spec
    assert report["summary"]["spec_on_median_abs_error"] <= 0.10, v["metrics"]
    assert "mixed-draft" in (tmp_path / "out" / "results.md").read_text()


def test_decode_steps_count_steps_without_a_proposal():
    # request 0: 10 outputs, 4 accepted -> 5 decode steps, only 3 had drafts (n-gram misses)
    steps, drafted = fit_sim.decode_steps({"drafts": [3, 6], "accepted": [4, 6], "output_tokens": [10, 10]}, 2)
    assert steps.tolist() == [5, 6] and drafted.tolist() == [10, 12]


def test_measurements_are_written_as_markdown_tables():
    results = {"acceptance": [{"method": "ngram", "k": 2, "task": "json", "acceptance_rate": 0.5,
                               "mean_acceptance_length": 2.0, "spec_decode_per_position_acceptance_rates": [0.7, 0.3],
                               "output_throughput": 900.0}],
               "best_k": {"ngram": 2},
               "sweep": {"off": [{"concurrency": 4, "output_throughput": 800.0, "median_tpot_ms": 3.0,
                                  "p99_tpot_ms": 4.0, "goodput_rps": 9.5}]},
               "break_even": {"ngram": {"stops_paying_at_concurrency": 64}}}
    text = "\n".join(fit_sim.measurement_lines(results))
    assert "| ngram | 2 | json | 0.500 | 2.00 | 0.70 0.30 | 900 |" in text
    assert "| off | 4 | 800 | 3.00 | 4.00 | 9.5 |" in text
    assert '{"ngram": 64}' in text


def test_draft_pass_cost_is_recovered_from_propose_times(tmp_path):
    """propose_s = the draft's roofline math + k forwards (the catch-up and k - 1 single-token ones)
    x 0.4 ms: the fit finds 0.4 ms per forward."""
    from engine.core.model_spec import get_model
    from sim.cost_model import CostModel, SpecTerms
    from sim.hardware import get_gpu

    spec = {"method": "draft_model", "num_speculative_tokens": 2}
    write_folder(tmp_path, "sweep", "draft-c16", requests(60, 20.0, seed=4), spec)
    folder = tmp_path / "sweep" / "draft-c16"
    profile = CostProfile.load("h200-byte-lm-100m")
    cfg = EngineConfig(max_num_seqs=64, async_scheduling=False, speculative_config=json.dumps(spec | {"model": "byte-lm-10m"}))
    cm = CostModel(get_model("byte-lm-100m"), get_gpu("h200"), cfg, profile.model_copy(update={"spec": SpecTerms()}),
                   draft=get_model("byte-lm-10m"))
    rows = [json.loads(x) for x in (folder / "steps.jsonl").read_text().splitlines()]
    for r in rows:
        r["propose_s"] = cm.proposer_gpu_s(fit_sim._composition(r)) + 2 * 4e-4
    (folder / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fitted, report = fit_sim.fit_proposer(profile, [folder])
    assert fitted.spec.draft_pass_s == pytest.approx(4e-4, rel=1e-6)
    assert report["draft_pass_s"]["steps"] == sum(1 for r in rows if r["num_decode_seqs"] and r["num_spec_tokens"])
