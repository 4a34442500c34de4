"""Reproduce published lab gains in the simulator, then re-measure them under production traffic.

    python benchmarks/papers/reproduce.py --out benchmarks/papers/results

Part 1 (lab): every figure in benchmarks/papers/claims.json simulated under the paper's own
setting (model, GPU, lengths, rates, SLO; stand-ins named in the claim), costline's figure beside
the paper's, the ratio and a status: "within 20%" or "explained" (the named, quantified difference
is written next to the row). Part 2 (production): each reproduced setting re-run on the shipped
production traces (Mooncake conversation, Azure code; rescaled to the lab's token load) and with
the seed's factors swapped in one at a time (`lab.production_variants`). Writes results.json,
table.md and two PNG charts; about 2-4 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.papers import lab
from sim.config import DisaggConfig, EngineConfig
from sim.workload_spec import PoissonArrival

TOLERANCE = 0.20
NO_APC = {"enable_prefix_caching": False}

# Prompts are cut to the model's context (the traces hold a few longer than Mistral's 32k / Llama-2's 4k).
SARATHI = lab.Target("mistral-7b", "a100-80gb", "a100-80gb-llama-3.1-8b", "llama-3.1-8b", max_prompt_len=32000)
LLAMA13 = lab.Target(lab.LLAMA2_13B, "a100-80gb", "a100-80gb-llama-3.1-8b", "llama-3.1-8b", max_prompt_len=4000)
H100 = lab.Target("llama-3.1-8b", "h100-sxm", "h100-sxm-llama-3.1-8b", "llama-3.1-8b")
H200X2 = lab.Target("llama-3.1-8b", "h200", "h200-llama-3.1-8b", "llama-3.1-8b", num_replicas=2)

# PR #1983's baseline engine at 25 QPS offered: 14.08 requests/s served (saturated).
PR1983_BASE_SATURATION_RPS = 14.08


def _engine(d: dict[str, Any]) -> EngineConfig:
    return EngineConfig(**d)


def _spec_engine(k: int, batch: int | None = None) -> EngineConfig:
    extra = {"max_num_seqs": batch} if batch else {}
    return EngineConfig(**NO_APC, **extra, speculative_config={"method": "eagle3", "num_speculative_tokens": k})


def status(ratio: float) -> str:
    return "within 20%" if math.isfinite(ratio) and abs(ratio - 1) <= TOLERANCE else "explained"


# ----------------------------------------------------------------------------- part 1: lab


def lab_sarathi(c: dict[str, Any]) -> dict[str, Any]:
    cl = c["costline"]
    make = lambda r: lab.requests_of(lab.sarathi_chat_spec(r))
    base = _engine(cl["baseline_engine"])
    cells = {}
    for cell, eng, tbt in (("strict", cl["optimized_engine"], 100.0), ("relaxed", cl["relaxed_optimized_engine"], 500.0)):
        b = lab.capacity(make, SARATHI, base, tbt, 1.0)
        o = lab.capacity(make, SARATHI, _engine(eng), tbt, 1.0)
        cells[cell] = {"tbt_slo_ms": tbt, "vllm_qps": round(b, 3), "sarathi_qps": round(o, 3), "gain": o / b}
    best = max(cells, key=lambda k: cells[k]["gain"])
    return {"costline": cells[best]["gain"], "cells": cells, "cell": best,
            "prod": {"kind": "capacity", "tbt_ms": cells["strict"]["tbt_slo_ms"], "rate": cells["strict"]["vllm_qps"],
                     "base": cl["baseline_engine"], "opt": cl["optimized_engine"]}}


def _pr1983_scale() -> tuple[float, dict[str, Any]]:
    """costline's saturation throughput of the PR's baseline engine over the PR's (14.08 req/s):
    the rates are scaled by it so that both run at the same utilisation."""
    base, opt = _pr1983_engines()
    reqs = lab.requests_of(lab.pr1983_spec(25.0), offline=True)
    b, o = lab.run_once(LLAMA13, base, reqs), lab.run_once(LLAMA13, opt, reqs)
    scale = b["request_throughput"] / PR1983_BASE_SATURATION_RPS
    return scale, {"base_saturation_rps": round(b["request_throughput"], 2),
                   "apc_saturation_rps": round(o["request_throughput"], 2),
                   "paper_base_rps_at_25qps": PR1983_BASE_SATURATION_RPS, "rate_scale": round(scale, 3),
                   "saturation_gain": o["request_throughput"] / b["request_throughput"]}


def _pr1983_engines() -> tuple[EngineConfig, EngineConfig]:
    cl = lab.claim("apc-pr1983-latency-10qps")["costline"]
    return _engine(cl["baseline_engine"]), _engine(cl["optimized_engine"])


def lab_pr1983(c: dict[str, Any], qps: float, scale: float, sat: dict[str, Any]) -> dict[str, Any]:
    base, opt = _pr1983_engines()
    out: dict[str, Any] = {"saturation": sat}
    for label, rate in (("paper_rate", qps), ("load_matched", qps * scale)):
        reqs = lab.requests_of(lab.pr1983_spec(rate))
        b, o = lab.run_once(LLAMA13, base, reqs), lab.run_once(LLAMA13, opt, reqs)
        out[label] = {"qps": round(rate, 2), "base_e2e_s": round(b["mean_e2el_ms"] / 1e3, 3),
                      "apc_e2e_s": round(o["mean_e2el_ms"] / 1e3, 3), "latency_gain": lab.e2e_gain(b, o),
                      "base_rps": round(b["request_throughput"], 2), "apc_rps": round(o["request_throughput"], 2),
                      "throughput_gain": o["request_throughput"] / b["request_throughput"],
                      "hit_rate": round(o["prefix_cache_hit_rate"], 3)}
    return out


def lab_eagle(batch: int) -> dict[str, Any]:
    reqs = lab.requests_of(lab.fixed_spec(128, 512, max(8, 4 * batch)), offline=True)
    b = lab.run_once(H100, EngineConfig(**NO_APC, max_num_seqs=batch), reqs)
    ks = {}
    for k in (2, 4):
        o = lab.run_once(H100, _spec_engine(k, batch), reqs)
        ks[k] = {"gain": o["output_throughput"] / b["output_throughput"],
                 "acceptance_length": round(o["spec_decode_acceptance_length"], 2)}
    k = max(ks, key=lambda x: ks[x]["gain"])
    # the tokens per verify step costline would need for the paper's figure: the step costs
    # (acceptance length / gain) plain steps, so figure x that cost is the length required
    step_cost = ks[k]["acceptance_length"] / ks[k]["gain"]
    return {"costline": ks[k]["gain"], "k": k, "by_k": ks, "base_tok_s": round(b["output_throughput"], 1),
            "step_cost_in_plain_steps": round(step_cost, 2),
            "prod": {"kind": "e2e", "rate": 0.9 * b["request_throughput"], "base": NO_APC,
                     "opt": {**NO_APC, "speculative_config": {"method": "eagle3", "num_speculative_tokens": k}},
                     "lengths": (128, 512)}}


def eagle_needed(figure: float, res: dict[str, Any], batch: int) -> dict[str, Any]:
    """What acceptance the paper's figure implies in costline's cost model, and costline's gain there."""
    need = figure * res["step_cost_in_plain_steps"]
    k = res["k"]
    # per-token acceptance alpha giving that expected length with k drafts: (1 - a^(k+1)) / (1 - a)
    lo, hi = 0.01, 0.999
    for _ in range(50):
        a = (lo + hi) / 2
        if (1 - a ** (k + 1)) / (1 - a) < need:
            lo = a
        else:
            hi = a
    reqs = lab.requests_of(lab.fixed_spec(128, 512, max(8, 4 * batch)), offline=True)
    b = lab.run_once(H100, EngineConfig(**NO_APC, max_num_seqs=batch), reqs)
    conc = 200.0
    eng = EngineConfig(**NO_APC, max_num_seqs=batch, speculative_config={
        "method": "eagle3", "num_speculative_tokens": k,
        "acceptance_beta": {"chat": (a * conc, (1 - a) * conc)}})
    o = lab.run_once(H100, eng, reqs)
    return {"tokens_per_step_needed": round(need, 2), "alpha_needed": round(a, 3),
            "costline_gain_at_alpha": round(o["output_throughput"] / b["output_throughput"], 3),
            "acceptance_length_at_alpha": round(o["spec_decode_acceptance_length"], 2)}


def lab_fp8() -> dict[str, Any]:
    sweep = {}
    for batch in (1, 8, 64, 256):
        reqs = lab.requests_of(lab.fixed_spec(1024, 128, max(8, 4 * batch)), offline=True)
        b = lab.run_once(H100, EngineConfig(max_num_seqs=batch), reqs)
        o = lab.run_once(H100, EngineConfig(max_num_seqs=batch, quantization="fp8"), reqs)
        sweep[batch] = {"gain": o["total_token_throughput"] / b["total_token_throughput"],
                        "base_rps": b["request_throughput"]}
    best = max(sweep, key=lambda x: sweep[x]["gain"])
    return {"costline": sweep[best]["gain"], "max_num_seqs": best,
            "sweep": {str(k): round(v["gain"], 3) for k, v in sweep.items()},
            "prod": {"kind": "e2e", "rate": 0.8 * sweep[256]["base_rps"], "base": {"max_num_seqs": 256},
                     "opt": {"max_num_seqs": 256, "quantization": "fp8"}, "lengths": (1024, 128)}}


DISAGG = DisaggConfig(num_prefill_replicas=1, num_decode_replicas=1, link="nvlink")


def lab_disagg() -> dict[str, Any]:
    reqs = lab.requests_of(lab.fixed_spec(1024, 128, 600), offline=True)
    b = lab.run_once(H200X2, EngineConfig(), reqs)
    o = lab.run_once(H200X2, EngineConfig(), reqs, disaggregation=DISAGG)
    return {"costline": o["request_throughput"] / b["request_throughput"],
            "aggregated_rps": round(b["request_throughput"], 2), "disagg_rps": round(o["request_throughput"], 2),
            "prod": {"kind": "e2e", "rate": 0.8 * b["request_throughput"], "base": {}, "opt": {}, "disagg": True,
                     "lengths": (1024, 128)}}


# ----------------------------------------------------------------------------- part 2: production


def _pair_gain(target: lab.Target, prod: dict[str, Any], reqs: list) -> tuple[float, dict[str, Any]]:
    b = lab.run_once(target, _engine(prod["base"]), reqs)
    o = lab.run_once(target, _engine(prod["opt"]), reqs, disaggregation=DISAGG if prod.get("disagg") else None)
    detail = {"base_e2e_ms": round(b["mean_e2el_ms"], 1), "opt_e2e_ms": round(o["mean_e2el_ms"], 1),
              "offered_rps": round(lab.rate_of(reqs), 3)}
    return lab.e2e_gain(b, o), detail


def _saturation_rps(target: lab.Target, prod: dict[str, Any], reqs: list) -> float:
    """The baseline's throughput with every request submitted at once: the load a rate is a share of."""
    from sim.workload_source import all_at_time_zero

    return lab.run_once(target, _engine(prod["base"]), all_at_time_zero(reqs))["request_throughput"]


def _capacity_gain(target: lab.Target, prod: dict[str, Any], make) -> tuple[float, dict[str, Any]]:
    b = lab.capacity(make, target, _engine(prod["base"]), prod["tbt_ms"], prod["rate"], iterations=6)
    o = lab.capacity(make, target, _engine(prod["opt"]), prod["tbt_ms"], prod["rate"], iterations=6)
    detail = {"base_capacity": round(b, 3), "opt_capacity": round(o, 3), "unit": "lab requests/s equivalent"}
    return (o / b if b > 0 else math.inf), detail


def production(name: str, target: lab.Target, lab_spec, prod: dict[str, Any]) -> dict[str, Any]:
    """The lab gain, the two traces' gains and each factor's gain, in one metric per row: capacity
    under the SLO for the capacity row, the advisor's mean-E2E gain for the others."""
    specs = {"lab": lab_spec, **lab.production_variants(lab_spec)}
    gains: dict[str, float] = {}
    detail: dict[str, Any] = {}
    lab_tokens = lab.mean_tokens(lab.requests_of(lab_spec))
    if prod["kind"] == "capacity":
        for key, spec in specs.items():
            make = lambda r, s=spec: lab.requests_of(_with_rate(s, r))
            gains[key], detail[key] = _capacity_gain(target, prod, make)
        for trace in lab.PRODUCTION_TRACES:
            make = lambda r, t=trace: lab.trace_requests(t, r * lab_tokens, 300)
            gains[trace], detail[trace] = _capacity_gain(target, prod, make)
    else:
        for key, spec in specs.items():
            gains[key], detail[key] = _pair_gain(target, prod, lab.requests_of(spec))
        # each trace at the lab's utilisation of the baseline: offered rate / the baseline's saturated
        # throughput on the same requests (a token-rate match would overload a prefill-heavy trace)
        lab_reqs = lab.requests_of(lab_spec)
        utilisation = lab.rate_of(lab_reqs) / _saturation_rps(target, prod, lab_reqs)
        for trace in lab.PRODUCTION_TRACES:
            first = lab.trace_requests(trace, lab.rate_of(lab_reqs) * lab_tokens)
            rate = utilisation * _saturation_rps(target, prod, first)
            reqs = lab.trace_requests(trace, rate * lab.mean_tokens(first))
            gains[trace], detail[trace] = _pair_gain(target, prod, reqs)
            detail[trace]["utilisation_of_baseline"] = round(utilisation, 3)
    factors = [k for k in specs if k != "lab"]
    moved = max(factors, key=lambda f: abs(gains[f] - gains["lab"]))
    return {"row": name, "metric": "capacity under the TBT SLO" if prod["kind"] == "capacity" else "mean E2E latency (advisor gap gain)",
            "gains": {k: (round(v, 3) if math.isfinite(v) else None) for k, v in gains.items()}, "detail": detail,
            "moved_most": moved,
            "moved_most_delta": round(gains[moved] - gains["lab"], 3)}


def _with_rate(spec, rate: float):
    a = spec.arrival
    if a.kind == "gamma":
        return spec.model_copy(update={"arrival": a.model_copy(update={"rate_rps": rate})})
    return spec.model_copy(update={"arrival": PoissonArrival(rate_rps=rate)})


# ----------------------------------------------------------------------------- driver


def reproduce() -> dict[str, Any]:
    t0 = time.perf_counter()
    cl = {c["id"]: c for c in lab.claims()}
    rows: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    prod_plans: list[tuple[str, lab.Target, Any, dict[str, Any]]] = []

    s = lab_sarathi(cl["sarathi-mistral7b-capacity"])
    details["sarathi-mistral7b-capacity"] = s
    cells = s["cells"]
    rows.append(_row(cl["sarathi-mistral7b-capacity"], s["costline"], "mistral-7b on a100-80gb with the scaled a100 "
                     f"Llama-3.1-8B profile; strict cell {cells['strict']['gain']:.2f}x ({cells['strict']['sarathi_qps']} vs "
                     f"{cells['strict']['vllm_qps']} QPS), relaxed {cells['relaxed']['gain']:.2f}x ({cells['relaxed']['sarathi_qps']} "
                     f"vs {cells['relaxed']['vllm_qps']} QPS)"))
    prod_plans.append(("chunked prefill (Sarathi-Serve, strict SLO)", SARATHI, lab.sarathi_chat_spec(s["prod"]["rate"]), s["prod"]))

    scale, sat = _pr1983_scale()
    details["pr1983_saturation"] = sat
    pr = {q: lab_pr1983(cl[f"apc-pr1983-latency-{q}qps"], float(q), scale, sat) for q in (10, 15, 25)}
    details["pr1983"] = {str(q): v for q, v in pr.items()}
    why_rate = (f"rates x{scale:.2f}: costline's engine saturates at {sat['base_saturation_rps']} req/s in this setting "
                f"where the PR's vLLM V0 served {PR1983_BASE_SATURATION_RPS} (same utilisation); at the PR's own rate: ")
    for q in (10, 15, 25):
        c = cl[f"apc-pr1983-latency-{q}qps"]
        lm, raw = pr[q]["load_matched"], pr[q]["paper_rate"]
        note = why_rate + f"{raw['latency_gain']:.2f}x"
        if q == 25:
            note += (f"; both arms overloaded here (PR: prefix cache served 19.81 of 25 req/s, costline's "
                     f"{sat['apc_saturation_rps']} vs base {sat['base_saturation_rps']} req/s, a saturated-throughput gain of "
                     f"{sat['saturation_gain']:.2f}x against the PR's 1.41x), so the latency ratio grows with the run length the PR does not state")
        elif q == 15:
            note += (f"; at 15 QPS the PR's base was already saturated (13.24 of 15 req/s served, mean latency 8.65 s) while "
                     f"costline's matched base keeps up ({lm['base_rps']} of {lm['qps']} req/s, {lm['base_e2e_s']} s): "
                     "the PR's base sits past its knee, costline's just below it")
        rows.append(_row(c, lm["latency_gain"], note))
    c = cl["apc-pr1983-throughput-25qps"]
    lm = pr[25]["load_matched"]
    rows.append(_row(c, lm["throughput_gain"], why_rate + f"{pr[25]['paper_rate']['throughput_gain']:.2f}x; costline's prefix "
                     f"cache removes {pr[25]['load_matched']['hit_rate']:.0%} of prefill tokens and its V1-style engine turns that into "
                     f"throughput (saturated gain {sat['saturation_gain']:.2f}x); the PR's V0 engine capped the cached arm at 19.81 req/s"))
    prod_plans.append(("prefix caching (PR #1983, 15 QPS matched)", LLAMA13, lab.pr1983_spec(15.0 * scale),
                       {"kind": "e2e", "base": cl["apc-pr1983-latency-10qps"]["costline"]["baseline_engine"],
                        "opt": cl["apc-pr1983-latency-10qps"]["costline"]["optimized_engine"]}))

    for cid, batch in (("eagle3-sglang-bs1", 1), ("eagle3-sglang-bs64", 64)):
        e = lab_eagle(batch)
        c = cl[cid]
        note = (f"llama-3.1-8b on the scaled h100-sxm profile, chain drafting k={e['k']}, costline acceptance length "
                f"{e['by_k'][e['k']]['acceptance_length']} tokens per verify step")
        if status(e["costline"] / c["figure"]) != "within 20%":
            need = eagle_needed(c["figure"], e, batch)
            e["needed"] = need
            note += (f"; the paper's {c['figure']}x needs {need['tokens_per_step_needed']} tokens per verify step in costline's "
                     f"cost model (a verify step costs {e['step_cost_in_plain_steps']} plain steps), i.e. per-token acceptance "
                     f"{need['alpha_needed']} instead of costline's EAGLE-3 chat prior 0.66; at that acceptance costline gives "
                     f"{need['costline_gain_at_alpha']}x. SGLang's EAGLE-3 drafts a tree, which accepts more per step than a chain")
        details[cid] = e
        rows.append(_row(c, e["costline"], note))
        prod_plans.append((f"speculative decoding (EAGLE-3, batch {batch})", H100,
                           lab.fixed_spec(128, 512, 400 if batch > 1 else 60, rate_rps=e["prod"]["rate"]), e["prod"]))

    f = lab_fp8()
    details["fp8-vllm-docs"] = f
    rows.append(_row(cl["fp8-vllm-docs"], f["costline"], f"llama-3.1-8b on the scaled h100-sxm profile; throughput gain by "
                     f"max_num_seqs {f['sweep']} (maximum reported, the docs say 'up to')"))
    prod_plans.append(("FP8 weights (vLLM docs)", H100, lab.fixed_spec(1024, 128, 600, rate_rps=f["prod"]["rate"]), f["prod"]))

    d = lab_disagg()
    details["disagg-vllm-docs"] = d
    r = _row(cl["disagg-vllm-docs"], d["costline"], f"validated h200 Llama-3.1-8B profile; 1P1D {d['disagg_rps']} req/s vs two "
             f"aggregated replicas {d['aggregated_rps']} req/s: the claim is an upper bound (<= 1.0x), which costline meets")
    r["status"] = "agrees (<= 1.0x)" if d["costline"] <= 1.0 else "explained"
    rows.append(r)
    prod_plans.append(("disaggregated prefill 1P1D (vLLM docs)", H200X2, lab.fixed_spec(1024, 128, 600, rate_rps=d["prod"]["rate"]),
                       d["prod"]))
    t_lab = time.perf_counter() - t0

    prod = [production(name, target, spec, plan) for name, target, spec, plan in prod_plans]
    return {"rows": rows, "production": prod, "summary": summarize(rows, prod), "details": details, "tolerance": TOLERANCE,
            "seconds": {"lab": round(t_lab, 1), "total": round(time.perf_counter() - t0, 1)}}


def summarize(rows: list[dict[str, Any]], prod: list[dict[str, Any]]) -> dict[str, Any]:
    """The numbers the conclusion quotes: how many figures reproduce, and what production keeps of
    each lab gain (production gain / lab gain, per trace) and of each factor alone."""
    kept = {f"{p['row']} / {t}": (p["gains"][t] / p["gains"]["lab"] if p["gains"][t] is not None else None)
            for p in prod for t in lab.PRODUCTION_TRACES}
    vals = sorted(v for v in kept.values() if v is not None)
    factor_kept = {f: sorted(p["gains"][f] / p["gains"]["lab"] for p in prod)
                   for f in ("bursts", "long-tailed lengths", "dynamic system prompts", "drifting task mix")}
    return {"figures": len(rows), "within_20pct": sum(r["status"] != "explained" for r in rows),
            "explained": sum(r["status"] == "explained" for r in rows),
            "trace_kept": {k: (round(v, 3) if v is not None else None) for k, v in kept.items()},
            "trace_kept_median": round(vals[len(vals) // 2 - 1] / 2 + vals[len(vals) // 2] / 2, 3) if len(vals) % 2 == 0
            else round(vals[len(vals) // 2], 3),
            "trace_halved_or_worse": sum(v <= 0.5 for v in vals), "trace_shrank": sum(v < 0.95 for v in vals),
            "trace_grew": sum(v > 1.05 for v in vals), "trace_cases": len(vals),
            "factor_kept_range": {f: [round(v[0], 3), round(v[-1], 3)] for f, v in factor_kept.items()}}


def _row(c: dict[str, Any], costline: float, note: str) -> dict[str, Any]:
    ratio = costline / c["figure"]
    return {"id": c["id"], "optimization": c["optimization"], "paper": c["figure"], "costline": round(costline, 3),
            "ratio": round(ratio, 3), "status": status(ratio), "metric": c["metric"], "source": c["source"]["url"],
            "note": note}


# ----------------------------------------------------------------------------- output


def table_md(res: dict[str, Any]) -> str:
    lines = ["| id | optimization | paper | costline | ratio | status | source |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['id']} | {r['optimization']} | {r['paper']:.2f}x | {r['costline']:.2f}x | {r['ratio']:.2f} | "
                     f"{r['status']} | {r['source']} |")
    lines += ["", "Notes (setting differences, stand-ins, quantified explanations):", ""]
    lines += [f"- **{r['id']}**: {r['note']}" for r in res["rows"]]
    keys = ["lab", "mooncake-conversation", "azure-code-2023", "bursts", "long-tailed lengths", "dynamic system prompts",
            "drifting task mix"]
    lines += ["", "| setting | metric | " + " | ".join(keys) + " | moved most |", "|---|---|" + "---|" * (len(keys) + 1)]
    for p in res["production"]:
        lines.append(f"| {p['row']} | {p['metric']} | " + " | ".join(_cell(p, k) for k in keys)
                     + f" | {p['moved_most']} ({p['moved_most_delta']:+.2f}) |")
    lines += ["", f"Regenerated in {res['seconds']['total']} s (lab part {res['seconds']['lab']} s)."]
    return "\n".join(lines) + "\n"


def _cell(p: dict[str, Any], key: str) -> str:
    g, d = p["gains"][key], p["detail"].get(key, {})
    if g is None:
        return f"unbounded (baseline: no rate meets the SLO; optimized {d.get('opt_capacity')})"
    return f"{g:.2f}x"


CHART_CAP = 8.0


def charts(res: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["paper"] for r in rows], 0.4, label="paper")
    ax.bar([i + 0.2 for i in x], [r["costline"] for r in rows], 0.4, label="costline")
    ax.set_xticks(list(x), [r["id"] for r in rows], fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("gain (x)")
    ax.set_title("Published lab gains vs costline under the same setting", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p1 = out / "lab_vs_paper.png"
    fig.savefig(p1)
    plt.close(fig)

    keys = ["lab", "mooncake-conversation", "azure-code-2023", "bursts", "long-tailed lengths", "dynamic system prompts",
            "drifting task mix"]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    n = len(keys)
    for j, p in enumerate(res["production"]):
        vals = [CHART_CAP if p["gains"][k] is None else min(p["gains"][k], CHART_CAP) for k in keys]
        ax.bar([i + (j - 2.5) * 0.13 for i in range(n)], vals, 0.13, label=p["row"])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(n), [k.replace(" ", "\n") for k in keys], fontsize=6)
    ax.set_ylabel(f"gain (x, bars cut at {CHART_CAP:g})")
    ax.set_title("Each optimization's gain: lab, production traces, one factor at a time", fontsize=9)
    ax.legend(fontsize=5)
    fig.tight_layout()
    p2 = out / "lab_vs_production.png"
    fig.savefig(p2)
    plt.close(fig)
    return [p1.name, p2.name]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = reproduce()
    res["charts"] = charts(res, out)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    (out / "table.md").write_text(table_md(res))
    print(table_md(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
