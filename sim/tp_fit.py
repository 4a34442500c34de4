"""Tensor parallelism's terms fitted from measurements (`TPTerms`): the all-reduce's latency and bus
bandwidth from a message-size sweep, then its overlap with compute and a fixed cost per TP step
from the engine's step traces at TP > 1.

1. Sweep (benchmarks/tp/collectives.py, the engine's own all-reduce path): time = latency + bus
   bytes / bandwidth, bus bytes = 2 (n - 1) / n x message bytes; least squares on relative error
   (small messages matter as much as large), both terms >= 0.
2. Steps: each TP step's device time minus the compute the profile prices for it at that TP size
   with no communication (its roofline split over the ranks, the fitted multipliers of one GPU)
   is the step's communication, modelled as `step_s + (1 - overlap) x comm(step)`, comm from (1)
   over the forward's 2 x layers + 1 all-reduces; a non-negative least squares fit in relative
   error gives step_s and 1 - overlap. The compute model's own error at TP > 1 lands in these two
   terms too, which is what the simulator then adds (said so in the provenance).

Held out: a deterministic share of each run's steps (sim.calibrate.held_out); the fit reports the
held-out median |relative error| of the first-principles TP terms and of the fitted ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from engine.core.model_spec import ModelSpec, dtype_bytes
from sim.config import EngineConfig
from sim.cost_model import CostModel, CostProfile, TPTerms, step_table_seconds
from sim.hardware import GPUSpec

HELD_OUT_SHARE = 0.25
MAX_STEP_S = 0.05  # TPTerms.step_s's bound: more is a profile that does not fit the runs, not a TP cost


class TPFitError(ValueError):
    """Measurements a TP fit cannot use; the message names them and the fix."""


@dataclass(frozen=True, slots=True)
class LinkFit:
    latency_s: float
    bus_gb_per_s: float
    median_rel_error: float
    n: int


def fit_allreduce(rows: Sequence[dict[str, Any]], world_size: int) -> LinkFit:
    """Latency and bus bandwidth from sweep rows ({"bytes", "us"}), relative least squares."""
    if len(rows) < 3:
        raise TPFitError(f"the all-reduce sweep has {len(rows)} rows; at least 3 message sizes are needed")
    nbytes = np.array([r["bytes"] for r in rows], dtype=np.float64)
    t = np.array([r["us"] for r in rows], dtype=np.float64) * 1e-6
    bus = nbytes * 2 * (world_size - 1) / world_size
    X = np.stack([np.ones_like(t), bus], axis=1) / t[:, None]
    (lat, inv_bw), _ = nnls(X, np.ones_like(t))
    if inv_bw <= 0:
        raise TPFitError("the all-reduce sweep shows no time growing with message size; sweep up to >= 16 MiB")
    pred = lat + bus * inv_bw
    return LinkFit(float(lat), float(1 / inv_bw / 1e9), float(np.median(np.abs(pred - t) / t)), len(rows))


def comm_seconds(steps: dict[str, np.ndarray], model: ModelSpec, tp: int, link: LinkFit) -> np.ndarray:
    """Each step's all-reduce seconds at the swept latency and bandwidth, none hidden."""
    n = 2 * model.num_layers + 1
    bus_per_token = 2 * (tp - 1) / tp * model.hidden_size * dtype_bytes(model.dtype)
    tokens = steps["num_prefill_tokens"] + steps["num_decode_tokens"]
    return n * (link.latency_s + tokens * bus_per_token / (link.bus_gb_per_s * 1e9))


def compute_only(profile: CostProfile, tp: int) -> CostProfile:
    """The profile with every TP communication hidden: what it prices for the compute alone."""
    return profile.model_copy(update={"tp": TPTerms(tensor_parallel_size=tp, allreduce_latency_s=0.0,
                                                    allreduce_bus_gb_per_s=1.0, overlap_fraction=1.0)})


def _held(name: str, step_ids: np.ndarray) -> np.ndarray:
    from sim.calibrate import held_out

    return held_out(name, step_ids, HELD_OUT_SHARE)


@dataclass(frozen=True, slots=True)
class TPRun:
    """One engine run at TP > 1: its step table and the engine flags it ran with."""

    name: str
    steps: dict[str, np.ndarray]
    engine: EngineConfig


def _rows(runs: Sequence[TPRun], model: ModelSpec, gpu: GPUSpec, profile: CostProfile, link: LinkFit
          ) -> dict[str, np.ndarray]:
    """Per step: measured device seconds, compute-only prediction, swept comm, held-out flag."""
    parts: dict[str, list[np.ndarray]] = {"y": [], "compute": [], "comm": [], "held": [], "fp": []}
    for run in runs:
        s, tp = run.steps, run.engine.tensor_parallel_size
        y = s["gpu_s"] + np.nan_to_num(s.get("sample_s", np.zeros_like(s["gpu_s"])))
        keep = np.isfinite(y) & (y > 0)
        compute, _ = step_table_seconds(CostModel(model, gpu, run.engine, compute_only(profile, tp)), s)
        first_principles, _ = step_table_seconds(CostModel(model, gpu, run.engine, profile.model_copy(
            update={"tp": None})), s)
        for key, v in (("y", y), ("compute", compute), ("comm", comm_seconds(s, model, tp, link)),
                       ("held", _held(run.name, s["step_id"])), ("fp", first_principles)):
            parts[key].append(v[keep])
    return {k: np.concatenate(v) for k, v in parts.items()}


def _median_rel(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.median(np.abs(pred - y) / y)) if y.size else float("nan")


def fit_tp_terms(sweep: Sequence[dict[str, Any]], runs: Sequence[TPRun], model: ModelSpec, gpu: GPUSpec,
                 profile: CostProfile, provenance: dict[str, Any] | None = None) -> TPTerms:
    """TPTerms from the sweep rows and the TP runs' steps, `profile` pricing their compute."""
    if not runs:
        raise TPFitError("no engine runs at --tensor-parallel-size > 1 to fit the overlap from")
    tps = {r.engine.tensor_parallel_size for r in runs}
    if len(tps) != 1 or min(tps) < 2:
        raise TPFitError(f"the TP runs were recorded at tensor_parallel_size {sorted(tps)}; give runs of one "
                         "size > 1 (fit each size apart)")
    tp = tps.pop()
    link = fit_allreduce(sweep, tp)
    r = _rows(runs, model, gpu, profile, link)
    train = ~r["held"] if (~r["held"]).sum() >= 4 else np.ones_like(r["held"])
    # relative error: each step's residual (measured - compute) = step_s + hidden x comm, over y
    y, X = r["y"] - r["compute"], np.stack([np.ones_like(r["y"]), r["comm"]], axis=1)
    w = 1 / r["y"]
    (step_s, hidden), _ = nnls(X[train] * w[train, None], y[train] * w[train])
    unclipped = float(hidden)
    if hidden > 1:  # the steps' communication costs more than the sweep's: none hidden, the rest per step
        hidden = 1.0
        step_s = max(0.0, float(np.sum(w[train] ** 2 * (y[train] - X[train, 1])) / np.sum(w[train] ** 2)))
    if step_s > MAX_STEP_S:
        raise TPFitError(f"the TP steps cost {step_s * 1e3:.1f} ms per step beyond the compute the profile prices "
                         f"and the sweep's all-reduces (more than {MAX_STEP_S * 1e3:.0f} ms): the profile does not "
                         "describe these runs' GPU or model; fit it on one-GPU runs of the same call")
    terms = TPTerms(tensor_parallel_size=tp, allreduce_latency_s=link.latency_s,
                    allreduce_bus_gb_per_s=link.bus_gb_per_s, overlap_fraction=1 - hidden, step_s=float(step_s))
    pred = r["compute"] + step_s + hidden * r["comm"]
    test = r["held"] if r["held"].any() else train
    errors = {"sweep_median_rel_error": link.median_rel_error, "sweep_rows": link.n,
              "hidden_share_unclipped": unclipped,
              "steps": int(y.size), "held_out_steps": int(test.sum()),
              "held_out_median_rel_error": _median_rel(pred[test], r["y"][test]),
              "held_out_median_rel_error_first_principles": _median_rel(r["fp"][test], r["y"][test])}
    return terms.model_copy(update={"provenance": {"status": "measured", "gpu": gpu.name, "model": model.name,
                                                   **(provenance or {}), "fit": errors}})


# --------------------------------------------------------------------------- from files
def load_tp_run(folder: Path, default: EngineConfig | None = None) -> TPRun:
    """An engine run folder recorded at TP > 1 (run.json's engine_args say so)."""
    from sim.calibrate import load_run

    run = load_run(folder, default)
    args = (run.run_info or {}).get("engine_args") or {}
    tp = int(args.get("tensor_parallel_size") or 1)
    if tp < 2:
        raise TPFitError(f"{folder}: run.json engine_args.tensor_parallel_size is {tp}; --tp-runs takes runs "
                         "recorded with --tensor-parallel-size >= 2 (pass one-GPU runs as RUNS)")
    engine = EngineConfig(tensor_parallel_size=tp, async_scheduling=run.async_scheduling,
                          max_num_seqs=run.max_num_seqs, max_num_batched_tokens=run.max_num_batched_tokens)
    return TPRun(run.name, run.steps, engine)


def read_sweep(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The engine-path rows of a collectives.json (benchmarks/tp/collectives.py) and its world size."""
    data = json.loads(Path(path).read_text())
    rows = [r for r in data.get("sizes", []) if r.get("mode") == "engine"]
    if not rows:
        raise TPFitError(f"{path}: no 'engine' rows under 'sizes'; pass the collectives.json of "
                         "benchmarks/tp/h200x2.py")
    return rows, int(data.get("world_size", 2))


def one_gpu_profile(folder: Path, spec: ModelSpec, gpu: GPUSpec) -> tuple[CostProfile, str]:
    """A profile fitted on the same call's TP=1 'fit' runs of the model (what prices the TP runs'
    compute), or the first-principles default when they are missing or too few to fit; and which."""
    from sim.calibrate import fit_profile, load_run

    tp1 = sorted(p.parent for p in (folder / "tp1" / "fit").glob("*/run.json"))
    if not tp1:
        return CostProfile.load("default"), "default (first principles): no TP=1 runs of this model"
    try:
        return fit_profile([load_run(f) for f in tp1], spec, gpu).profile, f"fitted on {len(tp1)} TP=1 runs"
    except ValueError as e:
        return CostProfile.load("default"), f"default (first principles): the TP=1 fit failed: {e}"


def fit_from_folder(out: Path, profile: CostProfile | None = None) -> dict[str, Any]:
    """Per model of an h200x2 call's folder: TPTerms from its collectives.json and its TP 'fit' runs,
    their compute priced by `profile` or else by a profile fitted on the model's TP=1 runs."""
    from engine.core.model_spec import ModelSpec as Spec
    from sim.hardware import GPU_PRESETS, get_gpu

    sweep, _ = read_sweep(out / "collectives.json")
    result: dict[str, Any] = {}
    for model_dir in sorted((out / "runs").iterdir()):
        for tp_dir in sorted(model_dir.glob("tp[2-9]*")):
            folders = sorted(p.parent for p in (tp_dir / "fit").glob("*/run.json"))
            if not folders:
                continue
            info = json.loads((folders[0] / "run.json").read_text())
            spec = Spec.model_validate(info["model_shape"])
            # a dry run's "cpu" has no preset: its (meaningless) times are priced as an H200's
            gpu = get_gpu(info["gpu"] if info.get("gpu") in GPU_PRESETS else "h200")
            runs = [load_tp_run(f) for f in folders]
            base, how = (profile, profile.name) if profile is not None else one_gpu_profile(model_dir, spec, gpu)
            key = f"{model_dir.name}/{tp_dir.name}"
            try:
                terms = fit_tp_terms(sweep, runs, spec, gpu, base, {"runs": [f.name for f in folders],
                                                                     "source": str(tp_dir), "compute_priced_by": how})
            except TPFitError as e:
                result[key] = {"error": str(e), "compute_priced_by": how}
                continue
            result[key] = terms.model_dump(mode="json")
    return result


__all__ = ["LinkFit", "TPFitError", "TPRun", "comm_seconds", "compute_only", "fit_allreduce", "fit_from_folder",
           "fit_tp_terms", "load_tp_run", "read_sweep"]
