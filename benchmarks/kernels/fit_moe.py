#!/usr/bin/env python3
"""Fit the cost model's mixture-of-experts terms from bench_moe_h200.py's results, and price its engine steps.

    python3 benchmarks/kernels/fit_moe.py RESULTS/moe.json            # print the fit and the step errors
    python3 benchmarks/kernels/fit_moe.py RESULTS/moe.json --write    # also write sim/profiles/h200-<preset>.json

Per preset: `MoeTerms` fitted from the fused MoE layer's times (sim/moe_fit.py) on top of the
first-principles profile (sim/profiles/default.json: nothing else of these profiles is fitted), the
routing skew left at 0 (uniform: a real checkpoint's routing was not measured; the skew that fits
the bench's random router is reported). Then the engine steps of part 3 (a reduced-layer
qwen3-30b-a3b) priced by that profile against their measured GPU time: a check of the MoE terms
inside whole steps, not a calibration (the engine's other terms stay first principles).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.core.model_spec import ModelSpec
from sim.config import EngineConfig
from sim.cost_model import PROFILES_DIR, CostModel, CostProfile
from sim.hardware import get_gpu
from sim.moe import fit_routing_skew
from sim.moe_fit import fit_layer_fixed, fit_moe_terms, layer_roofline


def profile_for(preset: str, rows: list[dict], meta: dict, gpu: str) -> tuple[CostProfile, list[dict], float]:
    base = CostProfile.load("default")
    e, k = rows[0]["E"], rows[0]["k"]
    skew = fit_routing_skew(e, k, [(r["T"], r["touched_experts"]) for r in rows if r["T"] < 1024])
    source = (f"measured: benchmarks/kernels/bench_moe_h200.py on {meta.get('gpu')} ({meta.get('date')}), one "
              f"{preset} MoE layer (fused Triton kernels, random bf16 weights and router), T = 1..4096; routing skew "
              f"0 = uniform prior (the bench's random router fits skew {skew:g}; a real checkpoint's is unmeasured)")
    terms, table = fit_moe_terms(rows, get_gpu(gpu), base, source=source)
    prof = base.model_copy(update={
        "name": f"{gpu}-{preset}", "hardware": gpu, "model": preset, "moe": terms,
        "source": "first principles (sim/profiles/default.json) + measured mixture-of-experts kernel factors",
        "provenance": {"moe": {"bench": "benchmarks/kernels/bench_moe_h200.py", "gpu": meta.get("gpu"),
                               "date": meta.get("date"), "torch": meta.get("torch"), "triton": meta.get("triton"),
                               "rows": len(table)}}})
    return prof, table, skew


def leave_one_out(rows: list[dict], gpu: str) -> list[tuple[int, float]]:
    """(T, error) of each interior T's layer time predicted by the fit of the other T's: how far the
    knot tables are from the truth between measured T's."""
    base = CostProfile.load("default")
    out = []
    for i in range(1, len(rows) - 1):
        rest = rows[:i] + rows[i + 1:]
        terms, _ = fit_moe_terms(rest, get_gpu(gpu), base, source="leave-one-out")
        lr = layer_roofline(rows[i], get_gpu(gpu), base)
        t = rows[i]["T"]
        model = max(lr.compute_s * terms.flops_multiplier(t), lr.memory_s * terms.bytes_multiplier(t))
        out.append((t, model / (rows[i]["fused_us"] * 1e-6) - 1))
    return out


def engine_errors(res: dict, profile: CostProfile, gpu: str) -> list[dict]:
    """Each recorded engine step priced by `profile` (the step's own model spec) against its GPU time."""
    specs = {name: ModelSpec.model_validate(d) for name, d in res.get("engine_specs", {}).items()}
    if "engine_spec" in res:  # run 1's format: one spec for every row
        specs.setdefault(res["engine_spec"]["name"], ModelSpec.model_validate(res["engine_spec"]))
    out = []
    for name, spec in specs.items():
        for graphs in (True, False):
            rows = [r for r in res["engine"] if r.get("model", name) == name and r["graphs"] == graphs and "record" in r]
            if not rows:
                continue
            cm = CostModel(spec, get_gpu(gpu), EngineConfig(max_num_seqs=max(r["batch"] for r in rows)), profile)
            for r in rows:
                model = cm.gpu_time_s(SimpleNamespace(**r["record"]))
                out.append({"model": name, "graphs": graphs, "kind": r["kind"], "batch": r["batch"],
                            "tokens": r["tokens"], "measured_ms": r["step_ms"], "model_ms": model * 1e3,
                            "rel_error": model * 1e3 / r["step_ms"] - 1})
    return out


def with_fixed(profile: CostProfile, per_layer_s: float, per_step_s: float) -> CostProfile:
    moe = profile.moe.model_copy(update={"layer_fixed_s": round(per_layer_s, 9)})
    return profile.model_copy(update={"moe": moe, "gpu_step_overhead_s": round(
        max(profile.gpu_step_overhead_s + per_step_s, 0.0), 9)})


def fit_fixed(res: dict, profile: CostProfile, gpu: str) -> tuple[CostProfile, dict]:
    """The per-layer and per-step fixed costs of MoE decode steps (CUDA graphs) the roofline terms
    miss, fitted from the engine's decode steps of models with different layer counts; checked
    first on held-out batches (fit on every other batch size, priced on the rest)."""
    layers = {n: d["num_layers"] for n, d in res.get("engine_specs", {}).items()}
    errs = [e for e in engine_errors(res, profile, gpu) if e["graphs"] and e["kind"] == "decode"]
    if not errs or not layers:
        return profile, {}
    batches = sorted({e["batch"] for e in errs})
    fit_b = set(batches[::2])

    def rows(bs):
        return [(layers[e["model"]], e["measured_ms"] / 1e3, e["model_ms"] / 1e3) for e in errs if e["batch"] in bs]

    held = with_fixed(profile, *fit_layer_fixed(rows(fit_b)))
    held_errs = [e for e in engine_errors(res, held, gpu) if e["graphs"] and e["kind"] == "decode"
                 and e["batch"] not in fit_b]
    per_layer, per_step = fit_layer_fixed(rows(set(batches)))
    info = {"per_layer_s": per_layer, "per_step_s": per_step, "fit_batches": sorted(fit_b),
            "held_out_median_abs_error": float(np.median([abs(e["rel_error"]) for e in held_errs])) if held_errs else None,
            "held_out_max_abs_error": float(max(abs(e["rel_error"]) for e in held_errs)) if held_errs else None}
    return with_fixed(profile, per_layer, per_step), info


def transfer_fixed(profile: CostProfile, fitted: CostProfile, source_preset: str) -> CostProfile:
    """`profile` with `fitted`'s fixed costs (per MoE layer, per step), marked as transferred: the same
    engine's routing/grouping/sum kernels and launches, measured on `source_preset` only."""
    moe = profile.moe.model_copy(update={"layer_fixed_s": fitted.moe.layer_fixed_s})
    return profile.model_copy(update={
        "moe": moe, "gpu_step_overhead_s": fitted.gpu_step_overhead_s,
        "source": profile.source + f"; moe.layer_fixed_s and gpu_step_overhead_s transferred from {source_preset}'s "
                  "engine fit (same engine and kernels; not measured on this model)",
        "provenance": {**(profile.provenance or {}), "engine_fixed_terms": {"transferred_from": source_preset}}})


def summary(errs: list[dict]) -> list[str]:
    lines = ["| model | graphs | kind | batch | steps | measured ms (median) | model ms | median error |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    keys = sorted({(e["model"], e["graphs"], e["kind"], e["batch"]) for e in errs}, key=lambda k: (k[0], not k[1], k[2], k[3]))
    for model, graphs, kind, b in keys:
        e = [x for x in errs if (x["model"], x["graphs"], x["kind"], x["batch"]) == (model, graphs, kind, b)]
        lines.append(f"| {model} | {graphs} | {kind} | {b} | {len(e)} | {np.median([x['measured_ms'] for x in e]):.3f} | "
                     f"{np.median([x['model_ms'] for x in e]):.3f} | {np.median([x['rel_error'] for x in e]):+.1%} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, help="moe.json of bench_moe_h200.py")
    p.add_argument("--gpu", default="h200")
    p.add_argument("--write", action="store_true", help="write sim/profiles/<gpu>-<preset>.json")
    p.add_argument("--force", action="store_true", help="replace an existing profile file")
    args = p.parse_args()
    res = json.loads(args.results.read_text())
    presets = sorted({r["preset"] for r in res["speed"]})
    profiles = {}
    for preset in presets:
        rows = [r for r in res["speed"] if r["preset"] == preset]
        prof, table, skew = profile_for(preset, rows, res["meta"], args.gpu)
        profiles[preset] = prof
        print(f"\n## {preset}: flops factors {prof.moe.flops_factor_by_tokens}, bytes factors {prof.moe.bytes_factor_by_tokens}, "
              f"bench router skew {skew}\n")
        print("| T | measured us | compute us | memory us | bound | model us | error |\n|---:|---:|---:|---:|---|---:|---:|")
        for t in table:
            print(f"| {t['T']} | {t['measured_us']:.1f} | {t['compute_us']:.1f} | {t['memory_us']:.1f} | {t['bound']} | "
                  f"{t['model_us']:.1f} | {t['rel_error']:+.1%} |")
        loo = leave_one_out(sorted(rows, key=lambda r: r["T"]), args.gpu)
        print("\nleave one T out (each interior T predicted from the others' knots): "
              + ", ".join(f"T={t} {e:+.1%}" for t, e in loo))
    if res.get("engine"):
        engine_preset = "qwen3-30b-a3b" if "qwen3-30b-a3b" in profiles else presets[0]
        prof = profiles[engine_preset]
        print(f"\n## engine steps priced by {prof.name}, kernel terms only (GPU time of the step's forward)\n")
        print("\n".join(summary(engine_errors(res, prof, args.gpu))))
        fitted, info = fit_fixed(res, prof, args.gpu)
        if info:
            profiles[engine_preset] = fitted.model_copy(update={
                "provenance": {**(fitted.provenance or {}), "engine_fixed_terms": info},
                "source": fitted.source + "; moe.layer_fixed_s and gpu_step_overhead_s fitted from the engine's "
                          "decode CUDA-graph steps (4- and 48-layer qwen3-30b-a3b, random weights); every other term "
                          "first principles"})
            print(f"\n## with the fixed costs fitted from the engine's decode graphs: {info}\n")
            print("\n".join(summary(engine_errors(res, fitted, args.gpu))))
            for other in presets:  # same engine and kernels: the fixed costs carry over, labelled as transferred
                if other != engine_preset:
                    profiles[other] = transfer_fixed(profiles[other], fitted, engine_preset)
    if args.write:
        for prof in profiles.values():
            out = PROFILES_DIR / f"{prof.name}.json"
            if out.exists() and not args.force:
                sys.exit(f"{out} exists; pass --force to replace it")
            prof.save(out)
            print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
