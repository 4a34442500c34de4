"""Calibration with mixed CUDA graphs: each run's run.json says whether its small mixed steps
replayed a graph (cudagraph_mode FULL) or ran eagerly (runs recorded before the flag existed); the
fit gives graph-replayed mixed steps their own terms over the padded token bucket and recovers
known coefficients of all three kinds from a synthetic trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.core.cuda_graphs import (
    mixed_graph_buckets,  # the engine's buckets: the reference for the padding
)
from engine.core.model_spec import get_model
from engine.core.records import StepRecord
from sim.calibrate import (
    CalibrationInputError,
    EngineRun,
    fit_profile,
    graph_fit_mode,
    held_out,
    kind_masks,
    load_run,
)
from sim.config import EngineConfig
from sim.cost_model import CostModel, GpuTerms, Roofline
from sim.hardware import get_gpu
from tests.sim.calib_synth import (
    EW,
    MAX_NUM_SEQS,
    TRUE_CPU,
    TRUE_DECODE,
    TRUE_MIXED,
    _compositions,
    timing_columns,
    true_cpu_s,
    true_gpu_s,
)
from tests.sim.test_calibrate import _close, close_decode

M1, H200 = get_model("llama-3.2-1b"), get_gpu("h200")
# a graph replay's fixed cost is a fraction of the eager launches'
TRUE_GRAPH = GpuTerms(gemm=1.3, prefill_attention=1.5, decode_kv=1.2, decode_max_kv=0.3, elementwise=EW,
                      step_s=9e-4, per_seq_s=1.5e-5)
CAPTURE, BUDGET = 512, 8192


def _small_mixed(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Mixed steps of at most CAPTURE tokens: 1-4 prefill chunks beside 0-64 decodes."""
    cols = {c: np.zeros(n) for c in ("num_prefill_tokens", "num_prefill_seqs", "sum_prefill_context",
                                     "prefill_attn_pairs", "num_decode_tokens", "num_decode_seqs",
                                     "sum_decode_context", "max_decode_context", "num_blocks_allocated",
                                     "num_blocks_hashed")}
    for i in range(n):
        b = int(rng.integers(0, 65))
        seqs = int(rng.integers(1, 5))
        chunks = rng.integers(1, (CAPTURE - b) // seqs + 1, size=seqs)
        # long cached prefixes: a small chunk's attention is then a term worth fitting
        cached = np.where(rng.random(seqs) < 0.5, rng.integers(0, 32768, size=seqs), 0)
        cols["num_prefill_tokens"][i], cols["num_prefill_seqs"][i] = chunks.sum(), seqs
        cols["sum_prefill_context"][i] = (cached + chunks).sum()
        cols["prefill_attn_pairs"][i] = (chunks * cached + chunks * (chunks + 1) // 2).sum()
        cols["num_blocks_allocated"][i] = (-(-chunks // 16)).sum()
        mean_ctx = int(rng.integers(64, 16384))
        cols["num_decode_seqs"][i] = cols["num_decode_tokens"][i] = b
        cols["sum_decode_context"][i] = b * mean_ctx
        cols["max_decode_context"][i] = round(mean_ctx * rng.uniform(1, min(b, 8))) if b else 0
    return cols


def _in_graph(cols: dict[str, np.ndarray]) -> np.ndarray:
    tokens = cols["num_prefill_tokens"] + cols["num_decode_tokens"]
    return (cols["num_prefill_tokens"] > 0) & (tokens <= CAPTURE)


def true_graph_gpu_s(cols: dict[str, np.ndarray], rates: Roofline, t: GpuTerms = TRUE_GRAPH) -> np.ndarray:
    """`t` over each step's token bucket (the engine's own list), LM head on the sampled
    rows, per scheduled sequence."""
    sizes = mixed_graph_buckets(CAPTURE)
    tokens = cols["num_prefill_tokens"] + cols["num_decode_tokens"]
    pad = np.array([next((s for s in sizes if s >= t), t) for t in tokens], dtype=float)
    n_dec = cols["num_decode_seqs"]
    f = rates.features(pad, cols["num_prefill_seqs"] + n_dec, cols["prefill_attn_pairs"],
                       cols["sum_prefill_context"], np.where(n_dec > 0, 1.0, 0.0), cols["sum_decode_context"],
                       cols["max_decode_context"])
    return (t.gemm * f["gemm"] + t.prefill_attention * f["prefill_attention"] + t.decode_kv * f["decode_kv"]
            + t.decode_max_kv * f["decode_max_kv"] + t.elementwise * f["elementwise"] + t.step_s
            + t.per_seq_s * (cols["num_prefill_seqs"] + n_dec))


def true_step_gpu_s(cols: dict[str, np.ndarray], graphs: bool, graph_terms: GpuTerms = TRUE_GRAPH) -> np.ndarray:
    rates = Roofline.of(M1, H200, EngineConfig())
    eager = true_gpu_s(cols, rates)
    return np.where(_in_graph(cols), true_graph_gpu_s(cols, rates, graph_terms), eager) if graphs else eager


def graph_run(*, graphs: bool, seed: int, n: int = 3000, asynchronous: bool = True, noise: float = 0.01,
              name: str = "synth", graph_terms: GpuTerms = TRUE_GRAPH, n_small: int | None = None) -> EngineRun:
    """A run of decode, large and small mixed steps (`n_small`, default a quarter); `graphs`:
    recorded with cudagraph_mode FULL (the small mixed steps replayed graphs priced by
    `graph_terms`), else before the flag (they ran eagerly)."""
    rng = np.random.default_rng(seed)
    n_small = n // 4 if n_small is None else n_small
    big, small = _compositions(rng, n - n_small), _small_mixed(rng, n_small)
    order = rng.permutation(n)
    cols = {k: np.concatenate([big[k], small[k]])[order] for k in big}
    gpu = true_step_gpu_s(cols, graphs, graph_terms) * (1 + noise * rng.standard_normal(n))
    cpu = true_cpu_s(cols) * (1 + noise * rng.standard_normal(n))
    cols |= timing_columns(gpu, cpu, asynchronous)
    mode = {"cudagraph_mode": "FULL"} if graphs else {}
    return EngineRun(name=name, steps=cols, async_scheduling=asynchronous, max_num_seqs=MAX_NUM_SEQS,
                     max_num_batched_tokens=BUDGET, max_cudagraph_capture_size=CAPTURE, **mode)


@pytest.fixture(scope="module")
def fit():
    runs = [graph_run(graphs=True, seed=11, name="full"),
            graph_run(graphs=False, seed=12, name="legacy-sync", asynchronous=False)]
    return runs, fit_profile(runs, M1, H200)


def test_fit_recovers_the_three_kinds(fit):
    _, res = fit
    p = res.profile
    _close(p.mixed_graph, TRUE_GRAPH, 0.03, loose=("decode_max_kv",))
    _close(p.mixed, TRUE_MIXED, 0.03, loose=("elementwise", "decode_max_kv"))
    # fewer decode steps than test_calibrate's trace (the small mixed steps take a quarter): the
    # knots, each resting on a slice of them, are looser there
    close_decode(p.decode, TRUE_DECODE, 0.05, loose=("decode_kv_by_batch", "decode_max_kv_by_batch"))
    _close(p.cpu, TRUE_CPU, 0.06)
    assert (p.cudagraph_mode, p.max_cudagraph_capture_size) == ("FULL", CAPTURE)
    assert set(res.errors) == {"decode", "mixed", "mixed_graph"}
    # the held-out steps of each kind are within the 1% noise
    assert all(e.gpu_median < 0.012 for e in res.errors.values())
    # only the FULL run's small mixed steps are graph steps: the legacy run's ran eagerly
    full, _ = fit[0]
    n_graph = sum(e.n_fit + e.n_held_out for k, e in res.errors.items() if k == "mixed_graph")
    assert n_graph == int(_in_graph(full.steps)[3:].sum())


def test_simulator_prices_graph_steps_as_fitted(fit):
    """The fitted profile in the CostModel (the simulator's path) prices the FULL run's steps at
    their noise-free truth: the graph padding of the fit and of the simulator agree."""
    (full, _), res = fit
    s = full.steps
    cm = CostModel(M1, H200, EngineConfig(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=BUDGET), res.profile)
    keep = held_out(full.name, s["step_id"])
    steps = [StepRecord(**{k: int(v[i]) for k, v in s.items() if k.startswith(("num_", "sum_", "prefill_", "max_"))})
             for i in np.flatnonzero(keep)]
    pred = np.array([cm.gpu_time_s(b) for b in steps])
    truth = true_step_gpu_s({k: v[keep] for k, v in s.items()}, graphs=True)
    graph = _in_graph({k: v[keep] for k, v in s.items()})
    assert np.median(np.abs(pred[graph] / truth[graph] - 1)) < 0.005
    assert np.median(np.abs(pred[~graph] / truth[~graph] - 1)) < 0.005
    # the eager terms would be far off on the graph steps (the truth's fixed cost differs by 1.6 ms)
    eager = CostModel(M1, H200, cm.engine, res.profile.model_copy(update={"mixed_graph": None}))
    off = np.array([eager.gpu_time_s(b) for b, g in zip(steps, graph) if g])
    assert np.median(off / truth[graph] - 1) > 0.2


def test_runs_without_graphs_fit_as_before():
    runs = [graph_run(graphs=False, seed=13, n=1500, name="a")]
    res = fit_profile(runs, M1, H200)
    assert res.profile.mixed_graph is None and set(res.errors) == {"decode", "mixed"}
    assert res.profile.cudagraph_mode == "FULL_DECODE_ONLY"


def test_graph_fit_mode_by_training_steps():
    kind = np.array(["mixed_graph"] * 70 + ["mixed"] * 10)
    held = np.zeros(80, dtype=bool)
    for n_graph, mode in ((9, "eager"), (10, "shared"), (59, "shared"), (60, "own")):
        assert graph_fit_mode(kind, held | (np.arange(80) >= n_graph)) == mode, n_graph
    masks = kind_masks(kind, "eager")  # the graph steps are then eager ones
    assert set(masks) == {"decode", "mixed"} and masks["mixed"].all()


def test_few_graph_steps_share_the_eager_multipliers():
    """With too few graph steps for terms of their own, they share the eager multipliers and
    get their own step constant: recovered when that is the truth."""
    truth = TRUE_MIXED.model_copy(update={"step_s": 9e-4})
    run = graph_run(graphs=True, seed=16, n=2000, n_small=40, graph_terms=truth, name="few")
    res = fit_profile([run], M1, H200)
    p = res.profile
    s = run.steps
    n_train = int((_in_graph(s) & ~held_out("few", s["step_id"]))[3:].sum())
    assert 10 <= n_train < 60  # a shared fit
    assert p.mixed_graph.step_s == pytest.approx(9e-4, rel=0.05)
    assert p.mixed_graph.model_copy(update={"step_s": 0.0}) == p.mixed.model_copy(update={"step_s": 0.0})
    _close(p.mixed, TRUE_MIXED, 0.03, loose=("elementwise", "decode_max_kv"))
    assert set(res.errors) == {"decode", "mixed", "mixed_graph"} and res.errors["mixed_graph"].gpu_median < 0.015


def _folder(tmp_path, name, engine_args):
    run = graph_run(graphs=False, seed=15, n=40)
    d = tmp_path / name
    d.mkdir()
    with open(d / "steps.jsonl", "w") as f:
        f.writelines(json.dumps({k: float(v[i]) for k, v in run.steps.items()}) + "\n" for i in range(40))
    (d / "run.json").write_text(json.dumps({"name": name, "engine_args": engine_args}))
    return d


def test_load_run_reads_the_graph_mode(tmp_path):
    legacy = load_run(_folder(tmp_path, "old", {"max_num_seqs": 128}))
    assert legacy.cudagraph_mode == "FULL_DECODE_ONLY" and legacy.mixed_graph_max_tokens == 0
    full = load_run(_folder(tmp_path, "full", {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 512,
                                                "max_num_batched_tokens": 384}))
    assert full.mixed_graph_max_tokens == 384 and full.decode_graphs  # the budget caps the graphs
    eager = load_run(_folder(tmp_path, "eager", {"cudagraph_mode": "FULL", "enforce_eager": True}))
    assert eager.mixed_graph_max_tokens == 0 and not eager.decode_graphs
    none = load_run(_folder(tmp_path, "none", {"cudagraph_mode": "NONE"}))
    assert none.mixed_graph_max_tokens == 0 and not none.decode_graphs
    with pytest.raises(CalibrationInputError, match="cudagraph_mode 'PIECEWISE' is not one of"):
        load_run(_folder(tmp_path, "bad", {"cudagraph_mode": "PIECEWISE"}))


def test_calibrate_prints_the_graph_terms(fit):
    from rich.console import Console

    from advisor.commands.calibrate import print_fit

    console = Console(record=True, width=200)
    print_fit(fit[1], console)
    text = console.export_text()
    assert "mixed_graph: {'gemm': 1.2" in text and "│ mixed_graph │" in text
