"""Feed the simulator the measured KV link and validate it against the engine's 1P1D runs.

Reads a bench_h200x2.py output folder: fits the link (sim/link_fit.py) on the 1P1D serving
runs' transfer records (what the link did while serving; the sweep's fit is reported beside
it), simulates each 1P1D workload with `DisaggConfig(1, 1, link_gb_per_s, link_latency_s)`
folded from the fit, the same engine flags and KV pool as the engine, and compares TTFT and
TPOT p50/p99 and output throughput; writes the table and the median |error| to results.md.

    python benchmarks/disagg/fit_sim.py --bench DIR [--dry-run] [--out benchmarks/disagg/results.md]
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.disagg.bench_h200x2 import Plan
from sim.config import DisaggConfig, EngineConfig
from sim.link_fit import fit_link
from sim.run import SimConfig, run

METRICS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "output_tok_per_s")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def metrics_of(requests: dict[str, np.ndarray], wall_s: float) -> dict[str, float]:
    done = np.asarray(requests["status"]) == "finished"
    out = {f"{m}_p{q}_ms": float(np.percentile(np.asarray(requests[f"{m}_s"], dtype=float)[done], q) * 1e3)
           for m in ("ttft", "tpot") for q in (50, 99)}
    out["output_tok_per_s"] = float(np.asarray(requests["num_output_tokens"])[done].sum() / wall_s)
    return out


def _columns(rows: list[dict]) -> dict[str, np.ndarray]:
    return {k: np.asarray([r[k] if r[k] is not None else np.nan for r in rows]) for k in rows[0]}


def engine_run(folder: Path) -> tuple[dict, list[dict], dict]:
    reqs = _columns(_jsonl(folder / "requests.jsonl"))
    summary = json.loads((folder / "summary.json").read_text())
    finish = np.nanmax(np.asarray(reqs["finish_s"], dtype=float))
    return metrics_of(reqs, finish - float(np.nanmin(reqs["arrival_s"]))), _jsonl(folder / "transfers.jsonl"), summary


def simulate(plan: Plan, index: int, link: dict, num_gpu_blocks: int, profile: str = "auto") -> dict:
    name, prompt, output, rate = plan.workloads[index]
    e = plan.engine
    engine = EngineConfig(block_size=e.block_size, max_model_len=e.max_model_len, num_gpu_blocks_override=num_gpu_blocks,
                          max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
                          attention_backend="costline")
    cfg = SimConfig(model=plan.model, gpu="h200", engine=engine, label=f"pd-{name}", profile=profile,
                    disaggregation=DisaggConfig(num_prefill_replicas=1, num_decode_replicas=1, link="nvlink", **link))
    res = run(plan.requests(prompt, output, rate, seed=index), cfg)
    r = res.requests
    done = np.asarray(r["status"]) == "finished"
    wall = float(np.nanmax(np.asarray(r["finish_s"], dtype=float)[done]) - np.nanmin(r["arrival_s"]))
    return metrics_of(r, wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, required=True, help="bench_h200x2.py --out folder")
    ap.add_argument("--dry-run", action="store_true", help="the bench ran with --dry-run")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("sim_vs_engine.md"))
    ap.add_argument("--link", choices=("sweep", "serving"), default="sweep",
                    help="simulate with the link fitted on the transfer sweep (the link alone: default) or on "
                         "the serving runs' transfers (the link while both GPUs compute)")
    ap.add_argument("--profile", default="auto",
                    help="cost profile (name or JSON path); auto = the shipped one. The shipped 8B profile is "
                         "fitted on these runs' steps too: the out-of-sample check names the one before "
                         "(data/h200x2/profile-h200-llama-3.1-8b-b79adfb.json)")
    args = ap.parse_args()
    plan = Plan(args.dry_run)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(args.bench / "runs.tar.xz") as tar:
            tar.extractall(tmp, filter="data")
        runs = {i: engine_run(Path(tmp) / "runs" / f"pd-{w[0]}") for i, w in enumerate(plan.workloads)
                if (Path(tmp) / "runs" / f"pd-{w[0]}" / "requests.jsonl").exists()}
    transfers = [t for _, ts, _ in runs.values() for t in ts]
    serving = fit_link(transfers)
    bb, transport = transfers[0]["block_bytes"], transfers[0]["transport"]
    fits = {"serving": serving}
    if (args.bench / "sweep.jsonl").exists():
        fits["sweep"] = fit_link([dict(r, status="done") for r in _jsonl(args.bench / "sweep.jsonl")
                                  if r["transport"] == transport])
    elif args.link == "sweep":
        raise SystemExit(f"{args.bench}/sweep.jsonl missing: give the folder of a run with the sweep phase, "
                         "or --link serving")
    fit = fits[args.link]
    link = fit.disagg_fields(bb, num_descriptors=transfers[0]["num_descriptors"])
    rows = []
    for i, (eng, _, summary) in runs.items():
        sim = simulate(plan, i, link, int(summary.get("num_gpu_blocks") or plan.engine.num_gpu_blocks_override or 0),
                       args.profile)
        rows.append((plan.workloads[i][0], eng, sim))
    write_md(args.out, args, fits, link, rows)


def _fit_line(fit) -> str:
    return (f"bandwidth {fit.bandwidth_gb_per_s:.1f} GB/s, latency {fit.latency_s * 1e6:.1f} us per transfer, "
            f"{fit.per_block_s * 1e6:.2f} us per block, {fit.per_descriptor_s * 1e6:.2f} us per descriptor "
            f"({fit.num_records} transfers, median |error| {fit.median_abs_error_s * 1e3:.3f} ms; "
            f"not identified: {', '.join(fit.unidentified) or 'none'}).")


def write_md(out: Path, args, fits: dict, link: dict, rows: list) -> None:
    err = {m: [abs(s[m] / e[m] - 1) for _, e, s in rows if e[m]] for m in METRICS}
    dry = " (DRY RUN on CPU: the code path only, not a result)" if args.dry_run else ""
    source = (f"Source: `{args.bench}`{dry}, cost profile `{args.profile}`; regenerate with "
              f"`python benchmarks/disagg/fit_sim.py --bench {args.bench} --profile {args.profile}`.")
    fields = (f"Simulated with the {args.link} fit: DisaggConfig link_gb_per_s = {link['link_gb_per_s']:.2f}, "
              f"link_latency_s = {link['link_latency_s']:.6f}")
    lines = ["# Disaggregated prefill: simulator vs engine, 1P1D (issue 15)", "", source, "",
             "## Link fits (sim/link_fit.py)", ""]
    for name, fit in fits.items():
        what = "transfer sweep (the link alone)" if name == "sweep" else "1P1D serving transfers (while serving)"
        lines += [f"- {what}: " + _fit_line(fit)]
    lines += ["", fields, "", "## Per workload (engine / simulator)", "",
              "| workload | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for name, e, s in rows:
        lines.append(f"| {name} | " + " | ".join(f"{e[m]:.1f} / {s[m]:.1f}" for m in METRICS) + " |")
    lines += ["", "Median |error| over workloads: " + ", ".join(
        f"{m} {100 * float(np.median(v)):.1f}%" for m, v in err.items() if v), ""]
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
