"""Calibration: the fit recovers known coefficients from a synthetic engine trace, reports its
held-out error honestly, keeps the simulator's closed forms exact, and reproduces the engine's KV
block count; the CLI refuses bad input in one line; profiles are picked and scaled."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from costline.cli import app
from engine.core.cuda_graphs import decode_graph_bucket, decode_graph_buckets
from engine.core.model_spec import get_model
from engine.core.records import StepRecord
from engine.core.request import Request
from sim import cost_model
from sim.calibrate import (
    CalibrationInputError,
    EngineRun,
    eager_blocked_s,
    fit_memory,
    fit_overlap,
    fit_profile,
    held_out,
    load_run,
    mean_nnls,
    memory_checks,
    pipelined_periods,
    robust_nnls,
    scale_profile,
)
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile, CpuTerms, DecodeRun, Roofline
from sim.hardware import get_gpu
from sim.memory import plan_memory
from sim.run import SimConfig, run
from tests.sim.calib_synth import (
    MAX_NUM_SEQS,
    SAMPLER_GPU_S,
    TRUE_CPU,
    TRUE_DECODE,
    TRUE_MIXED,
    TRUE_OVERLAP,
    async_periods,
    synthetic_run,
    true_cpu_s,
    true_gpu_s,
)

M1, H200 = get_model("llama-3.2-1b"), get_gpu("h200")


@pytest.fixture(scope="module")
def fit():
    runs = [synthetic_run(M1, H200, seed=1, name="async-run"),
            synthetic_run(M1, H200, seed=2, name="sync-run", async_scheduling=False)]
    return runs, fit_profile(runs, M1, H200)


def decode_fixed_s(t, rates: Roofline, batch: int) -> float:
    """A decode graph replay's seconds that do not grow with context: its GEMMs (weights-bound at
    small batches, so a fit cannot tell them from a fixed cost: only the sum is determined) and
    its fixed costs."""
    gemm = float(rates.features(batch, batch, 0.0, 0.0, 1.0, 0.0)["gemm"])
    return t.gemm * gemm + t.step_s + t.per_seq_s * batch + t.decode_step_extra_s(batch)


def close_decode(got, want, rel, loose=(), rates: Roofline | None = None):
    """`_close` for decode terms: the fixed seconds at each knot rather than the GEMM multiplier
    and the fixed costs apart."""
    rates = rates or Roofline.of(M1, H200, EngineConfig())
    fixed = ("gemm", "step_s", "per_seq_s", "decode_step_by_batch")
    _close(got.model_copy(update=dict.fromkeys(fixed[:3], 0.0) | {fixed[3]: ()}),
           want.model_copy(update=dict.fromkeys(fixed[:3], 0.0) | {fixed[3]: ()}), rel, loose)
    for batch, _ in want.decode_step_by_batch:
        assert decode_fixed_s(got, rates, batch) == pytest.approx(decode_fixed_s(want, rates, batch), rel=rel), batch


def _close(got, want, rel, loose=()):
    for k, v in want.model_dump().items():
        if k in ("decode_kv_by_batch", "decode_max_kv_by_batch"):
            assert [b for b, _ in getattr(got, k)] == [b for b, _ in v]
            # loose: the knots rest on a slice of the steps each, beside a fixed cost of their own; batch
            # 1's on the steps of one sequence only, where attention is <10% of the step
            tol = 2.5 * rel if k in loose else rel
            for (batch, c), (_, c_true) in zip(getattr(got, k), v):
                # a zero multiplier is recovered to within the noise of the knot's largest term
                assert c == pytest.approx(c_true, rel=tol * (1.6 if batch == 1 else 1.0), abs=0.02), (k, batch)
            continue
        if v is None:  # `experts`: a mixture of experts' only
            assert getattr(got, k) is None, k
            continue
        assert getattr(got, k) == pytest.approx(v, rel=2 * rel if k in loose else rel, abs=1e-12), k


def test_fit_recovers_each_known_coefficient(fit):
    _, res = fit
    p = res.profile
    # decode attention at batch 1-2 is <10% of a 1B model's step: the weakest-determined terms
    close_decode(p.decode, TRUE_DECODE, 0.03, loose=("decode_kv_by_batch", "decode_max_kv_by_batch"))
    _close(p.mixed, TRUE_MIXED, 0.03, loose=("elementwise", "decode_max_kv"))
    _close(p.cpu, TRUE_CPU, 0.06)  # five count terms from 1% noise
    _close(p.cpu_sync, TRUE_CPU, 0.06)  # the sync run alone: the same truth
    # the synthetic eager launches never block: a launch block of (almost) none, to the fit's tolerance
    assert p.overlap.async_eager_block < 1e-3 and p.overlap.async_eager_block_s < 1e-5
    _close(p.overlap.model_copy(update={"async_eager_block": 0.0, "async_eager_block_s": 0.0}), TRUE_OVERLAP, 0.03)
    assert p.schema_version == 2 and p.status == cost_model.STATUS_FITTED


def test_warmup_and_outliers_are_dropped_and_counted(fit):
    runs, res = fit
    assert res.n_warmup_dropped == 6  # 3 per run: the compile spike is not fitted
    assert res.n_steps == sum(r.steps["step_id"].size for r in runs) - 6
    n_fit = sum(e.n_fit for e in res.errors.values())
    outliers = sum(e.n_outliers for e in res.errors.values())
    assert 0.015 * n_fit < outliers < 0.04 * n_fit  # 2% spoiled (x3), a few noise tails


def test_held_out_share_is_deterministic():
    ids = np.arange(20_000)
    a = held_out("run", ids)
    assert np.array_equal(a, held_out("run", ids))
    assert a.mean() == pytest.approx(0.2, abs=0.01)
    assert not np.array_equal(a, held_out("other", ids))


def _rows(steps, i):
    return StepRecord(**{k: int(v[i]) if k.startswith(("num_", "sum_", "prefill_")) else float(v[i])
                         for k, v in steps.items()})


def test_simulator_reproduces_the_steps_and_the_reported_error(fit):
    """The CostModel with the fitted profile (the simulator's own path: its device, host and
    launch parts) predicts each held-out step's period through the engine's loop; its median
    |error| against the measured period is the one the fit reports, and against the noise-free
    truth it is well under the noise."""
    runs, res = fit
    r = runs[0]
    eng = EngineConfig(async_scheduling=True, max_num_seqs=MAX_NUM_SEQS)
    cm = CostModel(M1, H200, eng, res.profile)
    s = r.steps
    held = held_out(r.name, s["step_id"]) & (np.arange(s["step_id"].size) >= 3)
    is_dec = s["num_prefill_tokens"] == 0
    steps = [_rows(s, i) for i in range(s["step_id"].size)]
    parts = np.array([cm.device_and_host_s(cm.gpu_time_s(b), cm.cpu_time_s(b)) for b in steps])
    pred = async_periods(parts[:, 0], parts[:, 1], np.array([cm.launch_s(b) for b in steps]))
    o = TRUE_OVERLAP
    g, c = true_gpu_s(s, Roofline.of(M1, H200, eng)), true_cpu_s(s)
    truth = async_periods(g + o.async_gpu_gap_s, c + o.async_host_s, np.where(is_dec, 0.0, o.async_eager_launch_s))
    assert np.median(np.abs(pred[3:] / truth[3:] - 1)) < 0.005
    assert res.profile.overlap.async_eager_launch_s == pytest.approx(o.async_eager_launch_s, rel=0.1)
    err = np.abs(pred - s["total_s"]) / s["total_s"]
    # the fit reports both runs together: this run alone must be close to it
    assert np.median(err[held & is_dec]) == pytest.approx(res.errors["decode"].step_median, rel=0.25)
    assert np.median(err[held & ~is_dec]) == pytest.approx(res.errors["mixed"].step_median, rel=0.25)
    assert res.errors["decode"].step_median < 0.01 and res.errors["mixed"].gpu_p90 < 0.03


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 300), ctx=st.integers(0, 2_000_000), n=st.integers(1, 40), asynchronous=st.booleans(),
       m=st.integers(0, 40), longest_share=st.floats(0, 1))
def test_decode_run_closed_form_equals_stepping_with_a_v2_profile(fit, b, ctx, n, asynchronous, m, longest_share):
    _, res = fit
    cm = CostModel(M1, H200, EngineConfig(async_scheduling=asynchronous, max_num_seqs=MAX_NUM_SEQS), res.profile)
    longest = -(-ctx // b) + round(longest_share * (ctx - -(-ctx // b)))  # from the mean to the whole sum
    runs = cm.decode_run(b, ctx, n, longest)
    dts = []
    for i in range(n):
        step = StepRecord(num_decode_seqs=b, num_decode_tokens=b, sum_decode_context=ctx + i * b,
                          max_decode_context=longest + i)
        dts.append(cm.combine(cm.gpu_time_s(step), cm.cpu_time_s(step)))
        assert runs.dt(i) == pytest.approx(dts[-1], rel=1e-12)
    assert runs.elapsed_s(min(m, n)) == pytest.approx(sum(dts[:min(m, n)]), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(g0=st.floats(0, 1e-2), slope=st.floats(0, 1e-4), cpu=st.floats(0, 1e-2), cpu_slope=st.floats(0, 1e-4),
       n=st.integers(1, 60), m=st.integers(0, 70), overlap=st.booleans())
def test_decode_run_with_growing_cpu_time_sums_its_steps(g0, slope, cpu, cpu_slope, n, m, overlap):
    run = DecodeRun(g0, slope, cpu, n, overlap, cpu_slope)
    k = min(m, n)
    dts = [max(g0 + slope * i, cpu + cpu_slope * i) if overlap else g0 + slope * i + cpu + cpu_slope * i
           for i in range(k)]
    assert run.elapsed_s(k) == pytest.approx(sum(dts), rel=1e-9, abs=1e-15)
    assert run.cpu_elapsed_s(k) == pytest.approx(sum(cpu + cpu_slope * i for i in range(k)), rel=1e-9, abs=1e-15)


def test_graph_buckets_are_the_engines():
    for max_seqs in (1, 5, 64, 100, 256):
        sizes = decode_graph_buckets(max_seqs)
        for b in range(1, max_seqs + 1):
            assert decode_graph_bucket(b, max_seqs) == min(s for s in sizes if s >= b)


# --- KV block count -------------------------------------------------------------------------------
def _run_json(model, tokens, *, act0=3.1e8, act_per_token=2.5e5, other=1.37e9, total=150.1e9, util=0.9):
    weights = model.weight_bytes(None)
    block_bytes = model.kv_bytes_per_token("auto") * 16
    tmp_kv = tokens * model.kv_bytes_per_token("auto")
    peak = weights + act0 + act_per_token * tokens + tmp_kv
    blocks = int((total * util - (peak - tmp_kv) - other) // block_bytes)
    return {"schema": "costline-engine-run/1", "name": f"r{tokens}", "purpose": "sweep", "model": model.name,
            "gpu": "h200", "engine_args": {"max_num_batched_tokens": tokens, "max_num_seqs": 256,
                                           "gpu_memory_utilization": util, "async_scheduling": True},
            "num_gpu_blocks": blocks, "engine_commit": "abc123", "date": "2026-12-01",
            "memory": {"total_bytes": total, "gpu_memory_utilization": util, "weights_bytes": weights,
                       "profile_peak_bytes": peak, "profile_tmp_kv_bytes": tmp_kv, "other_bytes": other,
                       "block_bytes": block_bytes}}


def test_kv_block_count_equals_the_engines(fit):
    _, res = fit
    infos = [_run_json(M1, t) for t in (2048, 8192, 16384)]
    runs = [load_run_from(info, res) for info in infos]
    mem = fit_memory(runs, M1)
    assert mem.activation_bytes_per_batched_token == pytest.approx(2.5e5, rel=1e-9)
    prof = res.profile.model_copy(update={"memory": mem})
    for info in infos:
        eng = EngineConfig(max_num_batched_tokens=info["engine_args"]["max_num_batched_tokens"],
                           gpu_memory_utilization=0.9).resolved_for(H200, M1)
        assert plan_memory(M1, H200, eng, prof).num_gpu_blocks == info["num_gpu_blocks"]
        # the first-principles estimate is not the engine's count: the profile is what fixes it
        assert plan_memory(M1, H200, eng).num_gpu_blocks != info["num_gpu_blocks"]
    # an engine sized once at 8192 tokens and reused for a run at a 2048-token budget: its memory
    # record is the 8192-token profile's, and the check sizes the simulator the same way
    reused = _run_json(M1, 8192) | {"name": "reused"}
    reused["engine_args"] = reused["engine_args"] | {"max_num_batched_tokens": 2048}
    with_reused = fit_memory([*runs, load_run_from(reused, res)], M1).model_dump()
    assert with_reused == pytest.approx(mem.model_dump(), rel=1e-6)
    check = memory_checks([load_run_from(reused, res)], prof, M1, H200)[0]
    assert check.sim_blocks == check.engine_blocks == reused["num_gpu_blocks"]


def load_run_from(info, res):
    return EngineRun(name=info["name"], steps={}, async_scheduling=True, max_num_seqs=256, run_info=info)


# --- the command ------------------------------------------------------------------------------
def _write_run(folder, run, info=None, drop=()):
    folder.mkdir(parents=True)
    s = run.steps
    with open(folder / "steps.jsonl", "w") as f:
        f.writelines(json.dumps({k: float(v[i]) for k, v in s.items() if k not in drop}) + "\n"
                     for i in range(s["step_id"].size))
    if info is not None:
        (folder / "run.json").write_text(json.dumps(info))
    return folder


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    a = _write_run(base / "a", synthetic_run(M1, H200, n=1500, seed=3, name="a"), _run_json(M1, 8192))
    b = _write_run(base / "b", synthetic_run(M1, H200, n=1500, seed=4, name="b"), _run_json(M1, 4096))
    return base, a, b


def _cli(*args):
    return CliRunner().invoke(app, list(map(str, args)))


def test_cli_fits_writes_and_refuses_to_overwrite(run_dirs):
    base, a, b = run_dirs
    out = base / "h200-llama-3.2-1b.json"
    r = _cli("calibrate", a, b, "--model", "llama-3.2-1b", "--gpu", "h200", "--out", out, "--scaled")
    assert r.exit_code == 0, r.output
    assert "held-out |relative error|" in r.output
    assert re.search(r"KV blocks r8192: engine ([\d,]+), simulator \1\n", r.output)
    prof = CostProfile.load(out)
    assert prof.schema_version == 2 and prof.provenance["runs"] == ["r8192", "r4096"]
    assert prof.provenance["engine_commit"] == "abc123" and set(prof.fit_error) == {"decode", "mixed"}
    assert ("cpu (sync scheduling)" in r.output) == (prof.cpu_sync is not None)
    for g in ("a100-80gb", "h100-sxm", "b200", "l4"):
        assert CostProfile.load(base / f"{g}-llama-3.2-1b.json").status == cost_model.STATUS_SCALED
    r = _cli("calibrate", a, "--model", "llama-3.2-1b", "--gpu", "h200", "--out", out)
    assert r.exit_code == 2 and "--force" in r.output


def test_cli_errors_name_the_file(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _cli("calibrate", empty, "--model", "llama-3.2-1b", "--gpu", "h200")
    assert r.exit_code == 2 and "no steps.jsonl" in r.output and "empty" in r.output
    short = _write_run(tmp_path / "short", synthetic_run(M1, H200, n=50, seed=5), drop=("prefill_attn_pairs",))
    r = _cli("calibrate", short, "--model", "llama-3.2-1b", "--gpu", "h200")
    assert r.exit_code == 2 and "prefill_attn_pairs" in r.output and "steps.jsonl" in r.output
    few = _write_run(tmp_path / "few", synthetic_run(M1, H200, n=60, seed=6))
    r = _cli("calibrate", few, "--model", "llama-3.2-1b", "--gpu", "h200")
    assert r.exit_code == 2 and "decode-only steps to fit from" in r.output and "needs at least 40" in r.output
    assert "Traceback" not in r.output
    with pytest.raises(CalibrationInputError, match="no such file"):
        load_run(tmp_path / "nope")


# --- profiles shipped and picked --------------------------------------------------------------
def test_scaled_profile_scales_the_roofline_and_keeps_fixed_terms(fit):
    _, res = fit
    b200 = scale_profile(res.profile, "b200")
    assert b200.decode == res.profile.decode and b200.cpu == res.profile.cpu
    assert b200.status == cost_model.STATUS_SCALED and b200.hardware == "b200" and b200.memory is None
    eng = EngineConfig(max_num_seqs=MAX_NUM_SEQS)
    step = StepRecord(num_decode_seqs=1, num_decode_tokens=1)  # weights-bound: time ~ 1 / bandwidth
    d = res.profile.decode
    fixed = d.step_s + d.per_seq_s + d.decode_step_extra_s(1)  # one padded sequence's graph
    t_h200 = CostModel(M1, H200, eng, res.profile).gpu_time_s(step) - fixed
    t_b200 = CostModel(M1, get_gpu("b200"), eng, b200).gpu_time_s(step) - fixed
    assert t_b200 / t_h200 == pytest.approx(4800 / 8000, rel=1e-9)
    with pytest.raises(ValueError, match="not a fitted one"):
        scale_profile(b200, "l4")


def test_auto_picks_the_matching_profile_and_default_forces_first_principles(fit, tmp_path, monkeypatch):
    _, res = fit
    (tmp_path / "default.json").write_text((cost_model.PROFILES_DIR / "default.json").read_text())
    res.profile.model_copy(update={"validation": {"median_abs_error": 0.04}}).save(tmp_path / "h200-llama-3.2-1b.json")
    monkeypatch.setattr(cost_model, "PROFILES_DIR", tmp_path)
    assert CostProfile.for_target("llama-3.2-1b", "h200").name == res.profile.name
    assert CostProfile.for_target("llama-3.1-8b", "h200").name == "default"
    cfg = SimConfig(model="llama-3.2-1b", gpu="h200", seed=1)
    reqs = [Request(request_id=i, arrival_s=0.01 * i, prompt_len=192, output_len=20, hash_ids=(i,) * 12)
            for i in range(20)]
    auto = run(reqs, cfg).summary().to_json_dict()
    assert auto["profile"] == res.profile.name and auto["profile_status"] == cost_model.STATUS_VALIDATED
    assert auto["profile_validation"] == {"median_abs_error": 0.04}
    first = run(reqs, cfg.model_copy(update={"profile": "default"})).summary().to_json_dict()
    assert first["profile"] == "default" and first["profile_status"] == cost_model.STATUS_FIRST_PRINCIPLES
    assert first["duration"] != auto["duration"]


def test_v1_profiles_still_load_and_v2_round_trips(fit, tmp_path):
    _, res = fit
    assert CostProfile.load("default").schema_version == 1
    p = tmp_path / "x.json"
    res.profile.save(p)
    assert CostProfile.load(p) == res.profile
    data = json.loads(p.read_text())
    del data["decode"]
    p.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="needs decode, mixed"):
        CostProfile.load(p)


def test_pipelined_periods_equal_the_engines_events():
    """The fit's recursion (a lead carried from step to step) against the engine's loop written as
    events, on random device, host and launch times, with idle gaps (non-contiguous rows)."""
    rng = np.random.default_rng(3)
    n = 400
    device, host = rng.exponential(5e-3, n), rng.exponential(1e-3, n)
    launch = np.where(rng.random(n) < 0.3, rng.exponential(8e-3, n), 0.0)
    contiguous = np.ones(n, dtype=bool)
    contiguous[0] = False
    np.testing.assert_allclose(pipelined_periods(device, host, launch, contiguous),
                               async_periods(device, host, launch), rtol=1e-9, atol=1e-15)
    # an idle gap: the recursion restarts with nothing in flight, as the engine after a wait
    cut = 200
    contiguous[cut] = False
    got = pipelined_periods(device, host, launch, contiguous)
    np.testing.assert_allclose(got[cut:], async_periods(device[cut:], host[cut:], launch[cut:]), rtol=1e-9, atol=1e-15)


def test_pipelined_periods_with_a_launch_block_equal_the_engines_events():
    """Eager steps whose launch returns only once most of their device work has run (a full launch
    queue): the recursion against the events, and the block binding (periods change)."""
    rng = np.random.default_rng(4)
    n = 400
    device, host = rng.exponential(5e-3, n), rng.exponential(1e-3, n)
    eager = rng.random(n) < 0.3
    launch, block, block_s = np.where(eager, 1e-4, 0.0), np.where(eager, 0.8, 0.0), np.where(eager, 2e-3, 0.0)
    contiguous = np.ones(n, dtype=bool)
    contiguous[0] = False
    got = pipelined_periods(device, host, launch, contiguous, eager_blocked_s(device, eager, 0.8, 0.0))
    np.testing.assert_allclose(got, async_periods(device, host, launch, block), rtol=1e-9, atol=1e-15)
    # with seconds beyond the share: capped at the whole step, as the events wait at most for its end
    with_s = pipelined_periods(device, host, launch, contiguous, eager_blocked_s(device, eager, 0.8, 2e-3))
    np.testing.assert_allclose(with_s, async_periods(device, host, launch, block, block_s), rtol=1e-9, atol=1e-15)
    assert (with_s > got + 1e-4).sum() > 20
    unblocked = pipelined_periods(device, host, launch, contiguous)
    assert (got > unblocked + 1e-4).sum() > 20
    np.testing.assert_allclose(got.sum(), unblocked.sum(), rtol=0.05)  # the same work, shifted between periods


def test_fit_overlap_recovers_a_launch_block():
    """Periods made by the engine's events with a launch block of 0.6 of the device work plus 1 ms on
    eager rows: the fit finds it."""
    rng = np.random.default_rng(5)
    n = 600
    device, host = rng.uniform(2e-3, 9e-3, n), rng.uniform(3e-4, 1.2e-3, n)
    eager = rng.random(n) < 0.35
    total = async_periods(device, host, np.zeros(n), np.where(eager, 0.6, 0.0), np.where(eager, 1e-3, 0.0))
    rows = SimpleNamespace(is_async=np.ones(n, dtype=bool), contiguous=np.r_[False, np.ones(n - 1, dtype=bool)],
                           total=total, gpu_y=device, cpu_y=host, kind=np.where(eager, "mixed", "decode"))
    o = fit_overlap(rows, np.ones(n, dtype=bool))
    assert abs(o.async_eager_block - 0.6) < 0.03 and abs(o.async_eager_block_s - 1e-3) < 2e-4
    # a launch shorter than the blocked share of the device work changes nothing: the periods decide
    dev = device + o.async_gpu_gap_s
    fitted = pipelined_periods(dev, host + o.async_host_s, np.where(eager, o.async_eager_launch_s, 0.0),
                               rows.contiguous, eager_blocked_s(dev, eager, o.async_eager_block, o.async_eager_block_s))
    np.testing.assert_allclose(fitted, total, rtol=1e-3)


# a synchronous host that is cheaper per step and dearer per context token than the async one
SYNC_CPU = CpuTerms(step_s=2.2e-4, per_seq_s=2e-5, per_token_s=3e-7, per_context_token_s=6e-9,
                    per_block_allocated_s=1e-6, per_block_hashed_s=2e-6)


def _cpu_by_hand(c: CpuTerms, s: dict, i: int) -> float:
    return (c.step_s + c.per_seq_s * (s["num_prefill_seqs"][i] + s["num_decode_seqs"][i])
            + c.per_token_s * (s["num_prefill_tokens"][i] + s["num_decode_tokens"][i])
            + c.per_context_token_s * (s["sum_decode_context"][i] + s["sum_prefill_context"][i])
            + c.per_block_allocated_s * s["num_blocks_allocated"][i] + c.per_block_hashed_s * s["num_blocks_hashed"][i])


def _with_sync_host(run: EngineRun) -> EngineRun:
    """The synthetic sync run with its host time re-priced by SYNC_CPU (its noise kept)."""
    s = dict(run.steps)
    # the host's time, its sampling part (in sample_s, beside the sampler's GPU time) included
    old = s["schedule_s"] + s["prepare_s"] + s["sample_s"] - SAMPLER_GPU_S
    new = old * np.array([_cpu_by_hand(SYNC_CPU, s, i) for i in range(old.size)]) / true_cpu_s(s)
    s |= {"schedule_s": 0.4 * new, "prepare_s": 0.4 * new, "sample_s": SAMPLER_GPU_S + 0.2 * new,
          "total_s": s["total_s"] - old + new}
    return EngineRun(name=run.name, steps=s, async_scheduling=False, max_num_seqs=run.max_num_seqs)


def test_sync_runs_get_their_own_host_terms_and_the_simulator_uses_them():
    runs = [synthetic_run(M1, H200, seed=3, name="async-run"),
            _with_sync_host(synthetic_run(M1, H200, seed=4, name="sync-run", async_scheduling=False))]
    p = fit_profile(runs, M1, H200).profile
    _close(p.cpu, TRUE_CPU, 0.06)
    _close(p.cpu_sync, SYNC_CPU, 0.06)
    s = runs[1].steps
    for asynchronous, want in ((True, p.cpu), (False, p.cpu_sync)):
        cm = CostModel(M1, H200, EngineConfig(async_scheduling=asynchronous, max_num_seqs=MAX_NUM_SEQS), p)
        for i in (5, 50, 500):
            assert cm.cpu_time_s(_rows(s, i)) == pytest.approx(_cpu_by_hand(want, s, i), rel=1e-9)
    # one kind of run only: one set of terms, from every run
    assert fit_profile(runs[:1], M1, H200).profile.cpu_sync is None
    with pytest.raises(ValueError, match="schema_version 2"):
        CostProfile(name="x", cpu_sync=SYNC_CPU)


def test_host_terms_fit_the_mean_of_a_skewed_host_time():
    """A host's step time has a long right tail (pauses, a slower core): the simulator adds it to
    each period, so the fit must give its mean. The GPU fit's robust estimator gives the typical
    value instead; the host fit stays within 2% of the mean and ignores one pause of 1 s."""
    rng = np.random.default_rng(7)
    seqs = rng.integers(1, 256, size=20_000).astype(float)
    tail = rng.exponential(1e-4, size=seqs.size)  # mean 0.1 ms, median 0.07 ms
    y = 2e-4 + 1e-6 * seqs + tail
    y[0] += 1.0
    X = np.column_stack([np.ones_like(seqs), seqs])
    step_s, per_seq_s = mean_nnls(X, y)
    assert step_s == pytest.approx(2e-4 + 1e-4, rel=0.02) and per_seq_s == pytest.approx(1e-6, rel=0.02)
    typical = robust_nnls(X, y).coef[0]
    assert typical < 2e-4 + 0.8e-4  # what the GPU's estimator would have said: the tail left out


def test_cli_longest_excess_auto_chooses_and_a_bad_weight_names_the_flag(run_dirs):
    """--longest-excess auto fits at each weight of the grid and keeps the best on the held-out steps
    with prefill (the scores it prints are the ones the profile's provenance records); a number sets
    the weight of the mixed kinds only; anything outside 0-1 is refused before any fit, naming the flag."""
    base, a, b = run_dirs
    out = base / "auto.json"
    r = _cli("calibrate", a, b, "--model", "llama-3.2-1b", "--gpu", "h200", "--out", out, "--longest-excess", "auto")
    assert r.exit_code == 0, r.output
    prof = CostProfile.load(out)
    scores = {float(k): v for k, v in prof.provenance["longest_excess_scores"].items()}
    assert set(scores) == {1.0, 0.7, 0.5, 0.35}
    assert prof.mixed.decode_max_excess == min(scores, key=lambda w: (scores[w], -w))
    assert "longest-decode weight: 1 " in r.output
    fixed = base / "fixed.json"
    r = _cli("calibrate", a, "--model", "llama-3.2-1b", "--gpu", "h200", "--out", fixed, "--longest-excess", "0.5")
    assert r.exit_code == 0, r.output
    prof = CostProfile.load(fixed)
    assert (prof.mixed.decode_max_excess, prof.decode.decode_max_excess) == (0.5, 1.0)
    for bad in ("1.5", "-0.1", "half"):
        r = _cli("calibrate", a, "--model", "llama-3.2-1b", "--gpu", "h200", "--longest-excess", bad)
        assert r.exit_code == 2 and "--longest-excess" in r.output and "auto" in r.output, r.output
