"""How often the advisor's gain interval covers the gain the engine measured (issue 25, item 3).

The ranking set (one chat workload at 90% of capacity under six configurations, llama-3.1-8b on
the H200, benchmarks/calibration/README.md) gives, at each SLO, the engine's goodput gain of every
configuration over the defaults. The simulator replays each run as `costline validate` does, and
the interval is built as `costline advise` builds it (advisor/advise/uncertainty.py): the profile's
validation error turned into a goodput band by recounting the simulated requests at moved SLO
targets, both configurations' bands combined. One trace per configuration: no traffic part, and
no unmeasured input (none of these knobs rests on a prior).

    python benchmarks/calibration/gain_coverage.py runs/h200/llama-3.1-8b/validation/rank-* \
        --out benchmarks/calibration/gain_coverage.json
    python benchmarks/calibration/gain_coverage.py runs/moe-rank/validation/rank-* \
        --slo "ttft:250 tpot:18" --slo "ttft:400 tpot:20" --slo "ttft:1000 tpot:30" \
        --out benchmarks/calibration/gain_coverage_qwen3.json   # qwen3-30b-a3b's ranking set (moe_sweep.py --ranking)

The profile's validation error was measured on the validation runs, these six among them (never
fitted on): the band's width is an out-of-sample figure for the simulator, not for this check.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from advisor.advise.uncertainty import Sample, gain_interval, goodput_band, latency_error
from engine.core.run_summary import SLO
from sim.profile_files import load_profile
from sim.run import LoadedWorkload, SimConfig, run
from sim.validate import (
    engine_cut_s,
    engine_goodput,
    read_json_file,
    read_run_info,
    replayed_requests,
    resolve_profile,
    sim_engine_config,
)

SLOS = ("ttft:200 tpot:10", "ttft:300 tpot:12", "ttft:150 tpot:9", "ttft:1000 tpot:35")
BASELINE = "rank-defaults"


def simulated(run_dir: Path):
    info = read_run_info(run_dir)
    cut = engine_cut_s(run_dir, info, read_json_file(run_dir / "summary.json"))
    profile = resolve_profile(None, info.model, info.gpu)
    config = SimConfig(model=info.model, gpu=info.gpu, engine=sim_engine_config(info), skip_ahead=cut is None,
                       profile=profile, label=info.name)
    result = run(LoadedWorkload(replayed_requests(run_dir, info), info.name), config, until_s=cut)
    return info, result, load_profile(profile, info.model, info.gpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--slo", action="append", default=None,
                    help=f"an SLO to check at (repeat; default the dense set's {', '.join(SLOS)})")
    args = ap.parse_args()
    slos = {}  # text -> SLO, every one parsed before any run is simulated
    for text in args.slo or SLOS:
        try:
            slos[text] = SLO.parse(text)
        except ValueError as exc:
            ap.error(f"--slo {text!r}: {exc}")
    sims = {d.name: (d, *simulated(d)) for d in args.runs}
    if BASELINE not in sims:
        sys.exit(f"the runs must include {BASELINE}")
    rows = []
    for text, slo in slos.items():
        samples, engine = {}, {}
        for name, (d, _info, result, profile) in sims.items():
            err = latency_error(profile.validation, profile.status)
            duration = float(result.summary(slo).duration_s)
            low, high = goodput_band(result.requests, slo, duration, err)
            value = float(result.summary(slo).request_goodput)
            samples[name] = Sample(value, low, high)
            engine[name] = engine_goodput(d, slo)
        for name in sims:
            if name == BASELINE:
                continue
            g = gain_interval(samples[BASELINE], samples[name])
            eng = (engine[name] / engine[BASELINE] - 1) * 100 if engine[BASELINE] > 0 else float("nan")
            rows.append({"slo": text, "config": name, "engine_gain_pct": round(eng, 2), "sim_gain_pct": g.gain_pct,
                         "low_pct": g.low_pct, "high_pct": g.high_pct, "covered": g.low_pct <= eng <= g.high_pct})
    covered = sum(r["covered"] for r in rows)
    print(f"{'SLO':18s} {'config':18s} {'engine':>8s} {'sim':>8s}   90% interval        covered")
    for r in rows:
        print(f"{r['slo']:18s} {r['config']:18s} {r['engine_gain_pct']:+7.1f}% {r['sim_gain_pct']:+7.1f}%   "
              f"[{r['low_pct']:+6.1f}%, {r['high_pct']:+6.1f}%]   {'yes' if r['covered'] else 'NO'}")
    print(f"coverage: {covered} of {len(rows)} ({covered / len(rows):.0%}); target >= 80%")
    if args.out:
        args.out.write_text(json.dumps({
            "command": "python benchmarks/calibration/gain_coverage.py " + " ".join(str(d) for d in args.runs)
            + "".join(f" --slo {t!r}" for t in args.slo or ()),
            "date": datetime.now(UTC).strftime("%Y-%m-%d"), "rows": rows,
            "coverage": covered / len(rows)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
