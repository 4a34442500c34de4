"""FP8 weights: fit their price from the engine's FP8 steps, then check the predicted gain.

Reads the folders `fp8_weights_runs.py` wrote (DIR/{bf16,fp8}/<model>/...):

1. fit (`--fit-profile NAME`): the async FP8 sweep runs' steps (forward + sampler device time)
   through `sim.fp8_weights_fit.fit_fp8_weights` against the profile's bf16 terms; the profile
   file gets `fp8_gemm_speedup`, `fp8_step_s` and `fp8_fit` (runs, steps, errors, engine commit).
2. check: every workload's bf16 and FP8 runs replayed in the simulator as `costline validate`
   replays them (the profile on disk after step 1). Gains of FP8 over bf16, engine vs simulator:
   output throughput at saturation (the burst runs) and goodput at 80% load at an SLO half the
   bf16 engine's requests meet (TTFT <= its p90, TPOT <= its median: a target where the knob
   decides attainment), with the advisor's 90% interval (advisor/advise/uncertainty.py: the
   profile's validation band, both configurations).

    python benchmarks/calibration/fp8_weights_report.py DIR --fit-profile h200-llama-3.1-8b \\
        --out benchmarks/calibration/fp8_weights
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from advisor.advise.uncertainty import Sample, gain_interval, goodput_band, latency_error
from benchmarks.calibration.gain_coverage import simulated
from engine.core.model_spec import get_model
from engine.core.run_summary import SLO
from sim.calibrate import read_steps
from sim.config import EngineConfig
from sim.cost_model import CostProfile
from sim.fp8_weights_fit import fit_fp8_weights
from sim.hardware import get_gpu
from sim.validate import engine_goodput, read_json_file

MATCH = 0.10  # |(1 + predicted) / (1 + measured) - 1| at most this: the "within 10%"


def fit(root: Path, profile_name: str) -> dict:
    runs = sorted(d for d in (root / "fp8").glob("*/sweep/*") if (d / "run.json").is_file())
    tables, used = [], []
    for d in runs:
        info = json.loads((d / "run.json").read_text())
        if not info["engine_args"].get("async_scheduling"):
            continue  # a sync step's sampler time is host wall time: not device work
        s = read_steps(next(d.glob("steps.jsonl*")))
        s["gpu_s"] = s["gpu_s"] + np.nan_to_num(s["sample_s"])
        tables.append(s)
        used.append(d.name)
    info = json.loads((runs[0] / "run.json").read_text())
    path = ROOT / "sim" / "profiles" / f"{profile_name}.json"
    profile = CostProfile.load(path)
    result = fit_fp8_weights(tables, get_model(info["model"]), get_gpu(info["gpu"]),
                             EngineConfig(quantization="fp8"), profile)
    data = json.loads(path.read_text())
    data["fp8_gemm_speedup"] = result.speedup
    data["fp8_step_s"] = round(result.step_s, 7)
    data["fp8_fit"] = {**result.as_dict(), "runs": used, "engine_commit": info.get("engine_commit"),
                       "date": info.get("date"), "gpu": info["gpu"], "model": info["model"],
                       "method": "sim/fp8_weights_fit.py: grid over the speed-up, closed-form per-forward "
                                 "cost, the profile's bf16 terms held fixed; held-out = odd step ids"}
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"fit: speed-up {result.speedup:.2f}x, per-forward {result.step_s * 1e3:.3f} ms; held-out median "
          f"{result.held_out_median_error:.1%} p90 {result.held_out_p90_error:.1%} ({result.held_out_steps} steps;"
          f" datasheet prior {result.bf16_terms_median_error:.1%})")
    return data["fp8_fit"]


def _pct(new: float, base: float) -> float:
    return (new / base - 1) * 100 if base > 0 else float("nan")


def check(root: Path) -> list[dict]:
    rows = []
    for bdir in sorted((root / "bf16").glob("*/check/*")):
        fdir = root / "fp8" / bdir.relative_to(root / "bf16")
        if not (fdir / "summary.json").is_file():
            continue
        (_, rb, prof), (_, rf, _) = simulated(bdir), simulated(fdir)
        eb, ef = read_json_file(bdir / "summary.json"), read_json_file(fdir / "summary.json")
        if bdir.name.startswith("burst-"):
            metric, slo = "output throughput (saturation)", None
            meas = _pct(ef["output_throughput"], eb["output_throughput"])
            sb, sf = rb.summary(None).to_json_dict(), rf.summary(None).to_json_dict()
            err = latency_error(prof.validation, prof.status)
            vb, vf = float(sb["output_throughput"]), float(sf["output_throughput"])
            base = err.get("throughput", 0.0)
            g = gain_interval(Sample(vb, vb * (1 - base), vb * (1 + base)), Sample(vf, vf * (1 - base), vf * (1 + base)))
        else:
            slo = SLO(ttft_ms=float(eb["p90_ttft_ms"]), tpot_ms=float(eb["median_tpot_ms"]))
            metric = f"goodput at ttft:{slo.ttft_ms:.0f} tpot:{slo.tpot_ms:.1f}"
            meas = _pct(engine_goodput(fdir, slo), engine_goodput(bdir, slo))
            err = latency_error(prof.validation, prof.status)
            samples = []
            for r in (rb, rf):
                s = r.summary(slo).to_json_dict()
                lo, hi = goodput_band(r.requests, slo, float(s["duration"]), err)
                samples.append(Sample(float(s["request_goodput"]), lo, hi))
            g = gain_interval(*samples)
            sb, sf = rb.summary(slo).to_json_dict(), rf.summary(slo).to_json_dict()
        ratio = (1 + g.gain_pct / 100) / (1 + meas / 100) - 1
        rows.append({"run": bdir.name, "metric": metric, "engine_gain_pct": round(meas, 2),
                     "sim_gain_pct": round(g.gain_pct, 2), "low_pct": round(g.low_pct, 2),
                     "high_pct": round(g.high_pct, 2), "covered": g.low_pct <= meas <= g.high_pct,
                     "ratio_error": round(ratio, 4), "within_10pct": abs(ratio) <= MATCH,
                     "tpot_mean_ms": {"engine": [eb.get("mean_tpot_ms"), ef.get("mean_tpot_ms")],
                                      "sim": [sb.get("mean_tpot_ms"), sf.get("mean_tpot_ms")]},
                     "slo": slo.as_dict() if slo else None})
    return rows


def write(rows: list[dict], fit_info: dict | None, out: Path, command: str) -> None:
    lines = ["# FP8 weights: predicted vs measured gain (llama-3.1-8b shape, H200)", "",
             f"`{command}`", ""]
    if fit_info:
        lines += [(f"Fit: FP8 GEMM speed-up **{fit_info['speedup']:.2f}x** bf16, **{fit_info['step_s'] * 1e3:.3f} ms** "
                  f"per forward; held-out steps' median error {fit_info['held_out_median_error']:.1%} (p90 "
                  f"{fit_info['held_out_p90_error']:.1%}, {fit_info['held_out_steps']} steps) against "
                  f"{fit_info['datasheet_prior_median_error']:.1%} with the datasheet prior. Engine commit "
                  f"{fit_info.get('engine_commit')}."), ""]
    lines += ["| run | metric | engine gain | predicted | 90% interval | covered | within 10% |",
              "|---|---|---:|---:|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['metric']} | {r['engine_gain_pct']:+.1f}% | {r['sim_gain_pct']:+.1f}% | "
                     f"[{r['low_pct']:+.1f}%, {r['high_pct']:+.1f}%] | {'yes' if r['covered'] else 'NO'} | "
                     f"{'yes' if r['within_10pct'] else 'NO'} ({r['ratio_error']:+.1%}) |")
    n = len(rows)
    lines += ["", (f"Covered: {sum(r['covered'] for r in rows)} of {n}; within 10%: "
              f"{sum(r['within_10pct'] for r in rows)} of {n}.")]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"command": command, "date": datetime.now(UTC).strftime("%Y-%m-%d"),
                                                    "fit": fit_info, "rows": rows}, indent=2) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--fit-profile", default=None)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    fit_info = fit(a.root, a.fit_profile) if a.fit_profile else None
    rows = check(a.root)
    write(rows, fit_info, a.out, "python benchmarks/calibration/fp8_weights_report.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
