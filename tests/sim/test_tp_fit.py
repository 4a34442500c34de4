"""TP terms from measurements: on synthetic data made with known latency, bus bandwidth, overlap and
per-step cost (1% noise), the fit gives them back, and the cost model then prices TP steps with
them; the closed form of the terms; inputs the fit cannot use are named."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.model_spec import get_model
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile, TPTerms, step_table_seconds
from sim.hardware import get_gpu
from sim.tp_fit import (
    LinkFit,
    TPFitError,
    TPRun,
    comm_seconds,
    compute_only,
    fit_allreduce,
    fit_tp_terms,
)

MODEL, GPU = get_model("llama-3.1-8b"), get_gpu("h200")
TRUE = {"latency_s": 12e-6, "bus_gb_per_s": 360.0, "overlap": 0.3, "step_s": 150e-6}


def sweep_rows(rng: np.random.Generator, world: int = 2) -> list[dict]:
    rows = []
    for k in range(12, 29):
        nbytes = 2**k
        t = TRUE["latency_s"] + nbytes * 2 * (world - 1) / world / (TRUE["bus_gb_per_s"] * 1e9)
        rows.append({"bytes": nbytes, "us": 1e6 * t * (1 + 0.01 * rng.standard_normal())})
    return rows


def step_table(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Decode batches over contexts, prefill chunks and mixed steps, one row per step."""
    rows = []
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for ctx in (256, 2048, 8192):
            rows.append({"num_decode_seqs": b, "num_decode_tokens": b, "sum_decode_context": b * ctx,
                         "max_decode_context": ctx})
    for n in (64, 512, 2048, 8192):
        rows.append({"num_prefill_seqs": 1, "num_prefill_tokens": n, "sum_prefill_context": n,
                     "prefill_attn_pairs": n * (n + 1) // 2})
        rows.append({"num_prefill_seqs": 1, "num_prefill_tokens": n, "sum_prefill_context": n,
                     "prefill_attn_pairs": n * (n + 1) // 2, "num_decode_seqs": 16, "num_decode_tokens": 16,
                     "sum_decode_context": 16 * 1024, "max_decode_context": 1024})
    rows = rows * 3
    cols = ("num_decode_seqs", "num_decode_tokens", "sum_decode_context", "max_decode_context", "num_prefill_seqs",
            "num_prefill_tokens", "sum_prefill_context", "prefill_attn_pairs", "num_blocks_allocated",
            "num_blocks_hashed")
    table = {c: np.array([r.get(c, 0) for r in rows], dtype=np.int64) for c in cols}
    table["step_id"] = np.arange(len(rows))
    return table


def synthetic_runs(rng: np.random.Generator, profile: CostProfile) -> list[TPRun]:
    engine = EngineConfig(tensor_parallel_size=2, max_num_seqs=256, max_num_batched_tokens=8192)
    link = LinkFit(TRUE["latency_s"], TRUE["bus_gb_per_s"], 0.0, 0)
    runs = []
    for name in ("grid-a", "grid-b"):
        s = step_table(rng)
        compute, _ = step_table_seconds(CostModel(MODEL, GPU, engine, compute_only(profile, 2)), s)
        comm = comm_seconds(s, MODEL, 2, link)
        truth = compute + TRUE["step_s"] + (1 - TRUE["overlap"]) * comm
        s["gpu_s"] = truth * (1 + 0.01 * rng.standard_normal(truth.size))
        runs.append(TPRun(name, s, engine))
    return runs


def test_the_sweep_fit_recovers_latency_and_bus_bandwidth():
    fit = fit_allreduce(sweep_rows(np.random.default_rng(0)), 2)
    assert fit.latency_s == pytest.approx(TRUE["latency_s"], rel=0.1)
    assert fit.bus_gb_per_s == pytest.approx(TRUE["bus_gb_per_s"], rel=0.03)
    assert fit.median_rel_error < 0.02


def test_the_step_fit_recovers_overlap_and_step_cost_and_the_model_uses_them():
    rng = np.random.default_rng(1)
    profile = CostProfile.load("default")
    runs = synthetic_runs(rng, profile)
    terms = fit_tp_terms(sweep_rows(rng), runs, MODEL, GPU, profile, {"runs": ["grid-a", "grid-b"]})
    assert terms.allreduce_latency_s == pytest.approx(TRUE["latency_s"], rel=0.1)
    assert terms.allreduce_bus_gb_per_s == pytest.approx(TRUE["bus_gb_per_s"], rel=0.03)
    assert terms.overlap_fraction == pytest.approx(TRUE["overlap"], abs=0.05)
    assert terms.step_s == pytest.approx(TRUE["step_s"], abs=30e-6)
    fit = terms.provenance["fit"]
    assert terms.provenance["status"] == "measured" and terms.provenance["runs"] == ["grid-a", "grid-b"]
    assert fit["held_out_median_rel_error"] < 0.02 and fit["held_out_steps"] > 0
    # the simulator prices TP steps with the fitted terms: within the noise of the truth
    s = runs[0].steps
    priced, _ = step_table_seconds(CostModel(MODEL, GPU, runs[0].engine, profile.model_copy(update={"tp": terms})), s)
    assert np.median(np.abs(priced - s["gpu_s"]) / s["gpu_s"]) < 0.02


def test_comm_terms_closed_form():
    t = TPTerms(tensor_parallel_size=2, allreduce_latency_s=10e-6, allreduce_bus_gb_per_s=400.0,
                overlap_fraction=0.25, step_s=1e-4)
    n = 2 * MODEL.num_layers + 1
    fixed, per_token = t.comm_terms(MODEL, 2)
    assert fixed == pytest.approx(0.75 * n * 10e-6 + 1e-4)
    assert per_token == pytest.approx(0.75 * n * (2 * 1 / 2) * 4096 * 2 / 400e9)
    fixed4, per_token4 = t.comm_terms(MODEL, 4)  # ring at 4 ranks: 3x the latency, 1.5x the bus bytes
    assert fixed4 - 1e-4 == pytest.approx(3 * (fixed - 1e-4))
    assert per_token4 == pytest.approx(1.5 * per_token)


def test_a_profile_without_tp_terms_prices_tp_from_the_datasheet_link():
    engine = EngineConfig(tensor_parallel_size=2)
    p = CostProfile.load("default")
    first = CostModel(MODEL, GPU, engine, p)
    measured = CostModel(MODEL, GPU, engine, p.model_copy(update={"tp": TPTerms(
        tensor_parallel_size=2, allreduce_latency_s=p.allreduce_latency_s, allreduce_bus_gb_per_s=1.0,
        overlap_fraction=1.0)}))
    t1, t2 = first.forward_s(64, 64, 0, 0, 64, 64 * 1024), measured.forward_s(64, 64, 0, 0, 64, 64 * 1024)
    assert t1 > t2  # fully hidden communication prices less than the datasheet's


def test_unusable_inputs_are_named():
    rng = np.random.default_rng(2)
    with pytest.raises(TPFitError, match="at least 3"):
        fit_allreduce(sweep_rows(rng)[:2], 2)
    runs = synthetic_runs(rng, CostProfile.load("default"))
    one = TPRun("x", runs[0].steps, EngineConfig(tensor_parallel_size=4))
    with pytest.raises(TPFitError, match="one size"):
        fit_tp_terms(sweep_rows(rng), [runs[0], one], MODEL, GPU, CostProfile.load("default"))
    with pytest.raises(TPFitError, match="no engine runs"):
        fit_tp_terms(sweep_rows(rng), [], MODEL, GPU, CostProfile.load("default"))


# --- costline calibrate --tp-runs --tp-collectives ----------------------------------------------
def test_cli_adds_measured_tp_terms_and_keeps_tp_runs_out_of_the_one_gpu_fit(tmp_path):
    """The command's plumbing (the recovery itself is the tests above): one-GPU runs fit the profile,
    the TP runs and the sweep its `tp` terms, tagged measured with their sources."""
    import json

    from typer.testing import CliRunner

    from costline.cli import app
    from tests.sim.calib_synth import synthetic_run
    from tests.sim.test_calibrate import _run_json, _write_run

    m1 = get_model("llama-3.2-1b")
    one = _write_run(tmp_path / "one", synthetic_run(m1, GPU, n=1200, seed=3, name="one"), _run_json(m1, 8192))
    info = _run_json(m1, 8192)
    info["engine_args"] |= {"tensor_parallel_size": 2}
    two = _write_run(tmp_path / "two", synthetic_run(m1, GPU, n=600, seed=5, name="two"), info)
    sweep = tmp_path / "collectives.json"
    sweep.write_text(json.dumps({"world_size": 2, "sizes": [r | {"mode": "engine"}
                                                            for r in sweep_rows(np.random.default_rng(0))]}))
    out = tmp_path / "p.json"
    args = ["calibrate", str(one), "--model", "llama-3.2-1b", "--gpu", "h200", "--out", str(out)]
    r = CliRunner().invoke(app, [*args, "--tp-runs", str(two), "--tp-collectives", str(sweep)])
    assert r.exit_code == 0, r.output
    assert "tp: TP2 all-reduce" in r.output
    prof = CostProfile.load(out)
    assert prof.tp is not None and prof.tp.provenance["status"] == "measured"
    assert prof.tp.provenance["runs"] == [str(two)] and prof.tp.allreduce_bus_gb_per_s == pytest.approx(360, rel=0.03)
    r = CliRunner().invoke(app, ["calibrate", str(one), str(two), "--model", "llama-3.2-1b", "--gpu", "h200"])
    assert r.exit_code != 0 and "--tp-runs" in r.output
    r = CliRunner().invoke(app, [*args, "--force", "--tp-runs", str(two)])
    assert r.exit_code != 0 and "--tp-collectives" in r.output


def test_validate_simulates_a_tp_run_over_as_many_gpus():
    from sim.validate import EngineRunInfo, sim_engine_config

    base = {"schema_name": "costline-engine-run/1", "name": "chat", "model": "llama-3.1-8b", "gpu": "h200",
            "hash_block_size": 16, "honor_arrivals": True, "num_gpu_blocks": 1000}
    two = EngineRunInfo.model_validate(base | {"engine_args": {"max_num_seqs": 64, "tensor_parallel_size": 2}})
    one = EngineRunInfo.model_validate(base | {"engine_args": {"max_num_seqs": 64}})
    assert sim_engine_config(two).tensor_parallel_size == 2
    assert sim_engine_config(one).tensor_parallel_size == 1
