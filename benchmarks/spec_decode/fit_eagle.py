"""Fit the simulator's EAGLE-3 terms to eagle_h200.py's H200 run and check its speed-up (CPU).

Input: what eagle_h200.py brought back (results.json, runs.tar.xz or its extracted runs/ folder).

1. Acceptance: per task and k (2, 4), the Beta (a, b) of per-request acceptance by maximum
   likelihood on each request's verify-step and accepted totals (`sim.speculative.fit_acceptance_beta`),
   "default" pooling the tasks -> sim/profiles/eagle3-acceptance-byte-lm-100m.json, which the
   simulator reads for method eagle3 on target byte-lm-100m (provenance "measured"; other targets
   keep the prior table).
2. Cost: `SpecTerms.eagle3_pass_s`, an EAGLE-3 head forward's cost beyond its roofline math: on every
   decode step with drafts of the eagle3 closed-loop sweeps, (propose_s - the cost model's head
   passes with no fixed cost) / k (the engine runs k head forwards per step: the catch-up over the
   verified positions, then k - 1 single-token ones), median -> the h200-byte-lm-100m profile's spec
   terms (its other terms unchanged).
3. Check: every concurrency of the sweeps, spec off and eagle3 at each k, simulated on the same
   requests with the engine's flags and KV blocks: the simulator's speed-up (eagle3 over off output
   tok/s) beside the engine's, and the engine's error bar (spec off measured twice on other prompts:
   a ratio of two such runs carries sqrt(2) x that spread) -> data/h200-eagle/sim_check.json, which
   tests/sim/test_eagle3_measured.py re-simulates.

    python3 benchmarks/spec_decode/fit_eagle.py --results R/results.json --runs R/runs.tar.xz
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.spec_decode import fit_sim
from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.core.run_summary import jsonable
from sim.calibrate import robust_nnls
from sim.config import EngineConfig
from sim.cost_model import PROFILES_DIR, CostModel, CostProfile, SpecTerms
from sim.hardware import get_gpu
from sim.memory import draft_spec
from sim.run import LoadedWorkload, SimConfig, run
from sim.speculative import MEASURED_ACCEPTANCE_FILES, fit_acceptance_beta
from sim.validate import read_run_info, replayed_requests, sim_engine_config

HERE = Path(__file__).resolve().parent
TARGET, GPU, METHOD = fit_sim.TARGET, fit_sim.GPU, "eagle3"
ACCEPTANCE_OUT = PROFILES_DIR / MEASURED_ACCEPTANCE_FILES[(METHOD, TARGET)]
PROFILE = fit_sim.PROFILE_OUT
CHECK_OUT = HERE / "data" / "h200-eagle" / "sim_check.json"
TASKS = ("code", "prose", "json")


# A task whose requests all accept alike fits an unbounded Beta concentration (a + b -> inf: no
# spread between requests); kept at this, the mean unchanged (16 requests cannot show a spread
# below ~1/sqrt(1000) anyway).
MAX_CONCENTRATION = 1000.0


def _capped(ab: tuple[float, float]) -> tuple[float, float]:
    a, b = ab
    total = a + b
    return ab if total <= MAX_CONCENTRATION else (a / total * MAX_CONCENTRATION, b / total * MAX_CONCENTRATION)


def fit_acceptance(results: dict) -> dict[str, Any]:
    """Per k: Beta (a, b) per task and pooled ("default"), with the measured rates beside."""
    by_k, measured = {}, {}
    for cfg in results.get("configs", {}).values():
        if cfg.get("method") != METHOD:
            continue
        k = int(cfg["k"])
        table, rates = {}, {}
        pooled = {"accepted": [], "drafted": [], "drafts": []}
        for task in TASKS:
            row = (cfg.get("acceptance") or {}).get(task) or {}
            pr = row.get("per_request")
            if not pr:
                continue
            table[task] = _capped(fit_acceptance_beta(pr["accepted"], pr["drafted"], k, pr["drafts"]))
            for key in pooled:
                pooled[key] += pr[key]
            rates[task] = {x: row.get(x) for x in ("acceptance_rate", "mean_acceptance_length",
                                                    "spec_decode_per_position_acceptance_rates")}
        if pooled["drafts"]:
            table["default"] = _capped(fit_acceptance_beta(pooled["accepted"], pooled["drafted"], k,
                                                           pooled["drafts"]))
        by_k[str(k)], measured[str(k)] = table, rates
    if not by_k:
        raise ValueError(f"results.json has no {METHOD} acceptance rows with per-request counters")
    return {"by_k": by_k, "measured": measured}


def eagle_folders(root: Path) -> dict[tuple[str, int], Path]:
    """Sweep run folders by (config name, concurrency)."""
    out = {}
    for f in fit_sim.run_folders(root):
        info = read_run_info(f)
        if info.purpose == "sweep" and "-c" in info.name:
            name, c = info.name.rsplit("-c", 1)
            out[(name, int(c))] = f
    return out


def head_cost_model(profile: CostProfile, folder: Path, spec: dict) -> CostModel:
    """The cost model of an eagle3 run folder, the head priced as the simulator prices it."""
    sim_spec = fit_sim._sim_spec(spec, None)
    cfg = sim_engine_config(read_run_info(folder)).model_copy(update={"speculative_config": sim_spec})
    target = get_model(TARGET)
    return CostModel(target, get_gpu(GPU), cfg, profile, draft=draft_spec(target, sim_spec))


def fit_pass_cost(profile: CostProfile, folders: list[Path]) -> dict[str, Any]:
    """eagle3_pass_s + eagle3_pass_per_seq_s x decodes, per head forward beyond its roofline, from
    the eagle3 sweeps' decode steps with drafts (see the module docstring): a robust fit of
    (propose_s - the head's roofline passes) / k against the step's decoding sequences."""
    zero = profile.model_copy(update={"spec": (profile.spec or SpecTerms()).model_copy(
        update={"eagle3_pass_s": 0.0, "eagle3_pass_per_seq_s": 0.0})})
    per_pass, seqs, by_c = [], [], {}
    for f in folders:
        spec = fit_sim.spec_of(f)
        cm = head_cost_model(zero, f, spec)
        c = int(read_run_info(f).name.rsplit("-c", 1)[1])
        for row in fit_sim._raw_steps(f):
            if row.get("num_decode_seqs") and row.get("num_spec_tokens") and not row.get("num_prefill_tokens"):
                x = (row["propose_s"] - cm.proposer_gpu_s(fit_sim._composition(row))) / cm.k
                per_pass.append(x)
                seqs.append(row["num_decode_seqs"])
                by_c.setdefault(c, []).append((x, row["num_decode_seqs"]))
    if not per_pass:
        raise ValueError("no eagle3 decode step with drafts in the sweeps")
    y, n = np.asarray(per_pass), np.asarray(seqs, dtype=float)
    keep = y > 0  # the relative-error fit needs positive targets (a step faster than its roofline: none seen)
    coef = robust_nnls(np.column_stack([np.ones(int(keep.sum())), n[keep]]), y[keep]).coef
    pred = coef[0] + coef[1] * n
    return {"value": float(coef[0]), "per_seq": float(coef[1]), "steps": len(per_pass),
            "median_abs_rel_error": float(np.median(np.abs(pred / y - 1))),
            "median_by_concurrency": {c: float(np.median([x for x, _ in v])) for c, v in sorted(by_c.items())},
            "fitted_by_concurrency": {c: float(coef[0] + coef[1] * np.median([m for _, m in v]))
                                      for c, v in sorted(by_c.items())}}


def run_setup(folder: Path) -> dict[str, Any]:
    """What the simulator needs of a sweep run: the engine's flags (and KV blocks), each request's
    task and lengths (closed loop: all at t = 0, prompts without shared prefixes)."""
    info = read_run_info(folder)
    spec = fit_sim.spec_of(folder)
    cfg = sim_engine_config(info)
    if spec is not None:
        cfg = cfg.model_copy(update={"speculative_config": fit_sim._sim_spec(spec, None)})
    reqs = fit_sim.categorized(folder, replayed_requests(folder, info))
    return {"engine": cfg.model_dump(mode="json", exclude_none=True), "categories": [r.category for r in reqs],
            "prompt_lens": [r.prompt_len for r in reqs], "output_lens": [r.output_len for r in reqs]}


def simulate(setup: dict[str, Any], profile: str | Path = PROFILE, seed: int = 0) -> float:
    """The simulator's output tok/s on a sweep run's setup (`run_setup`)."""
    reqs = [Request(request_id=i, arrival_s=0.0, prompt_len=p, output_len=o,
                    hash_ids=tuple(range(1000 * i, 1000 * i + -(-p // 16))), category=c)
            for i, (c, p, o) in enumerate(zip(setup["categories"], setup["prompt_lens"], setup["output_lens"]))]
    cfg = SimConfig(model=TARGET, gpu=GPU, engine=EngineConfig.model_validate(setup["engine"]), profile=str(profile),
                    seed=seed)
    return float(run(LoadedWorkload(reqs, "eagle-sweep"), cfg).summary().output_throughput)


SIM_SEEDS = (0, 1, 2)  # the simulator's acceptance draws: its seed-to-seed spread beside the engine's


def sim_speedups(setup_on: dict, setup_off: dict, profile: str | Path = PROFILE) -> list[float]:
    """eagle3 over off output tok/s in the simulator, one per seed of SIM_SEEDS."""
    off = simulate(setup_off, profile)  # no random draws without speculation
    return [simulate(setup_on, profile, seed) / off for seed in SIM_SEEDS]


def speedup_check(results: dict, folders: dict[tuple[str, int], Path], profile_path: Path) -> dict[str, Any]:
    """Per k and concurrency: engine and simulator speed-ups of eagle3 over spec off."""
    spread = {int(c): v for c, v in (results.get("off_repeat_spread") or {}).items()}
    rows = []
    off_tput = {r["concurrency"]: r["output_throughput"] for r in results["configs"]["off"]["sweep"]}
    for name, cfg in results["configs"].items():
        if cfg.get("method") != METHOD:
            continue
        for r in cfg["sweep"]:
            c = r["concurrency"]
            if (name, c) not in folders or ("off", c) not in folders or not off_tput.get(c):
                continue
            setup_on, setup_off = run_setup(folders[(name, c)]), run_setup(folders[("off", c)])
            sims = sim_speedups(setup_on, setup_off, profile_path)
            measured = r["output_throughput"] / off_tput[c]
            err = math.sqrt(2) * spread.get(c, float("nan")) * measured
            rows.append({"k": int(cfg["k"]), "concurrency": c, "engine_speedup": measured, "engine_error": err,
                         "sim_speedup": float(np.mean(sims)), "sim_speedup_by_seed": sims,
                         "sim_tok_s_off": simulate(setup_off, profile_path),
                         "engine_tok_s": {"off": off_tput[c], "eagle3": r["output_throughput"]},
                         "setup": {"off": setup_off, "eagle3": setup_on}})
    return {"rows": rows, "error_bar": "sqrt(2) x the spec-off run-to-run spread of tok/s at that concurrency "
                                      "(other prompts, same engine) x the measured speed-up"}


def write_profile(profile: CostProfile, cost: dict[str, Any], results: dict, out: Path) -> CostProfile:
    spec = (profile.spec or SpecTerms()).model_copy(update={"eagle3_pass_s": cost["value"],
                                                            "eagle3_pass_per_seq_s": cost["per_seq"]})
    prov = dict(profile.provenance or {})
    prov["eagle3_pass_s"] = {"fitted_by": "benchmarks/spec_decode/fit_eagle.py", "gpu": results["meta"]["gpu"],
                             "date": results["meta"]["date"], "steps": cost["steps"],
                             "runs": "benchmarks/spec_decode/data/h200-eagle (eagle3 closed-loop sweeps)"}
    new = profile.model_copy(update={"spec": spec, "provenance": prov})
    new.save(out)
    return new


def refit_target(folders: dict[tuple[str, int], Path], profile_path: Path) -> dict[str, Any]:
    """The profile's target terms refitted on this run's spec-off sweeps (fit_sim.fit_cost), its
    draft-model / n-gram / verification terms on their sweeps (fit_sim.fit_proposer): the engine
    the EAGLE-3 runs measured, not the one an older profile was fitted on. Saved to
    `profile_path`; returns the fit reports."""
    off = [f for (name, _), f in sorted(folders.items()) if name in ("off", "off-repeat")]
    others = [f for (name, _), f in sorted(folders.items()) if name.startswith(("draft_model", "ngram"))]
    profile, cost = fit_sim.fit_cost(off)
    profile, proposer = fit_sim.fit_proposer(profile, others)
    prov = dict(profile.provenance or {}) | {"refitted_by": "benchmarks/spec_decode/fit_eagle.py --refit-target "
                                                            "(data/h200-eagle: spec-off, draft and n-gram sweeps)"}
    profile.model_copy(update={"provenance": prov}).save(profile_path)
    return {"cost": cost, "proposer": proposer}


def fit(results: dict, runs_root: Path, profile_path: Path = PROFILE, acceptance_out: Path = ACCEPTANCE_OUT,
        check_out: Path = CHECK_OUT, *, refit: bool = False) -> dict[str, Any]:
    """Acceptance, eagle3_pass_s and the speed-up check (see the module docstring); with
    `refit`, the profile's other terms first (`refit_target`)."""
    acceptance = fit_acceptance(results)
    acceptance_out.write_text(json.dumps(jsonable(
        {"method": METHOD, "target": TARGET, "gpu": results["meta"]["gpu"], "date": results["meta"]["date"],
         "source": f"measured on the engine: {TARGET} + its EAGLE-3 head, {results['meta']['gpu']} "
                   f"{results['meta']['date'][:10]} (benchmarks/spec_decode/data/h200-eagle)",
         **acceptance}), indent=1) + "\n")
    folders = eagle_folders(runs_root)
    refitted = refit_target(folders, profile_path) if refit else None
    eagle = [f for (name, _), f in sorted(folders.items()) if name.startswith(METHOD)]
    cost = fit_pass_cost(CostProfile.load(str(profile_path)), eagle)
    write_profile(CostProfile.load(str(profile_path)), cost, results, profile_path)
    check = speedup_check(results, folders, profile_path)
    report = {"acceptance": acceptance, "eagle3_pass_s": cost, "speedup_check": check, "refit_target": refitted}
    check_out.parent.mkdir(parents=True, exist_ok=True)
    check_out.write_text(json.dumps(jsonable(report), indent=1) + "\n")
    return report


def _f(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(results: dict, report: dict[str, Any]) -> list[str]:
    """The EAGLE-3 section of results.md: acceptance, costs, speed-ups, the simulator's check."""
    meta, cfgs = results["meta"], results["configs"]
    head = (results.get("train") or {}).get("eagle3") or {}
    lines = [fit_sim.EAGLE_MARKER, "", (f"## EAGLE-3 vs draft model vs n-gram ({meta['gpu']}, {meta['date'][:10]}; "
             "data/h200-eagle, eagle_h200.py + fit_eagle.py)"), ""]
    if head:
        lines += [(f"Head: one layer on the target's layers {head.get('aux_layers')} (fused), {head['head_params'] / 1e6:.1f}M "
                  f"own parameters, trained {head['train_s']:.0f} s ({head['tokens'] / 1e6:.0f}M tokens); held-out "
                  f"top-1 agreement with the target by draft step: {json.dumps(head['held_out_top1_by_step'])}."), ""]
    lines += [("Acceptance (greedy, 16 held-out prompts per task, 128 tokens): rate / mean acceptance length / "
              "per position"), "", "| config | code | prose | json |", "|---|---|---|---|"]
    for name, cfg in cfgs.items():
        if name == "off":
            continue
        cells = []
        for t in TASKS:
            r = (cfg.get("acceptance") or {}).get(t) or {}
            pos = " ".join(_f(x) for x in r.get("spec_decode_per_position_acceptance_rates") or [])
            cells.append(f"{_f(r.get('acceptance_rate'), '.3f')} / {_f(r.get('mean_acceptance_length'))} / {pos}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    conc = sorted({r["concurrency"] for c in cfgs.values() for r in c.get("sweep", [])})
    sp = results.get("speedup", {})
    lines += ["", "Output tok/s by concurrency (closed loop, mixed tasks; x spec off), and where it stops paying:", "",
              "| config | " + " | ".join(str(c) for c in conc) + " | break-even concurrency |",
              "|---|" + "---|" * (len(conc) + 1)]
    for name, cfg in cfgs.items():
        by = {r["concurrency"]: r for r in cfg.get("sweep", [])}
        ratio = (sp.get(name) or {}).get("by_concurrency", {})
        cells = [f"{_f(by.get(c, {}).get('output_throughput'), ',.0f')}"
                 + (f" ({ratio[str(c)] if str(c) in ratio else ratio[c]:.2f}x)" if (c in ratio or str(c) in ratio) else "")
                 for c in conc]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_f((sp.get(name) or {}).get('break_even_concurrency'), '.1f')} |")
    lines += ["", f"Spec-off run-to-run spread of tok/s (other prompts): {json.dumps(results.get('off_repeat_spread'))}.",
              "", ("Proposer per forward in the engine (median propose_s / k on decode steps), and the CUDA-graph "
              "replay alone (batch 1 / 128), ms:"), ""]
    for name, cfg in cfgs.items():
        if cfg.get("method") in ("eagle3", "draft_model"):
            per = {r["concurrency"]: r.get("median_propose_ms_per_forward") for r in cfg.get("sweep", [])}
            g = (cfg.get("step_cost_ms") or {})
            step = g.get("eagle3_step") or g.get("draft_step") or {}
            lines.append(f"- {name}: engine " + ", ".join(f"c={c} {_f(v, '.3f')}" for c, v in per.items())
                         + f"; graph {_f(step.get('1') or step.get(1), '.3f')} / {_f(step.get('128') or step.get(128), '.3f')}")
    cost = report["eagle3_pass_s"]
    lines += ["", (f"Simulator: `SpecTerms.eagle3_pass_s` = {cost['value'] * 1e3:.3f} ms + "
                   f"{cost['per_seq'] * 1e6:.2f} us per decoding sequence, per head forward beyond its roofline (robust "
                   f"fit on {cost['steps']} decode steps, median |error| {cost['median_abs_rel_error']:.1%}; measured "
                   f"medians by concurrency, ms: "
                   + ", ".join(f"{c}: {v * 1e3:.3f}" for c, v in cost["median_by_concurrency"].items())
                   + "); acceptance per task and k from `sim/profiles/eagle3-acceptance-byte-lm-100m.json` "
                   "(provenance measured)."), "",
              "| k | concurrency | engine speed-up | engine error | simulator (3 seeds) | gap | spec-off tok/s sim / engine |",
              "|---|---|---|---|---|---|---|"]
    for r in report["speedup_check"]["rows"]:
        lines.append(f"| {r['k']} | {r['concurrency']} | {r['engine_speedup']:.3f} | \u00b1{_f(r['engine_error'], '.3f')} | "
                     f"{r['sim_speedup']:.3f} | {r['sim_speedup'] - r['engine_speedup']:+.3f} | "
                     f"{r['sim_tok_s_off']:,.0f} / {r['engine_tok_s']['off']:,.0f} |")
    return lines + [""] + notes(results, report)


def notes(results: dict, report: dict[str, Any]) -> list[str]:
    """What the tables say, in words, with the figures they rest on."""
    out = ["What it shows:", ""]
    eq, eq32 = results.get("equality_bf16") or {}, results.get("equality_fp32") or {}
    if eq:
        same = {n: v["first_divergence_at"] for n, v in eq.items() if v["identical"] < v["requests"]}
        shared = [a for a in same for b in same if a < b and same[a] == same[b]]
        out.append("- Greedy equality: " + ", ".join(f"{n} {v['identical']}/{v['requests']}" for n, v in eq.items())
                   + f" identical to spec off in bf16; fp32 (eagle3 k={eq32.get('k')}) {eq32.get('identical')}/"
                   f"{eq32.get('requests')}. "
                   + (f"{' and '.join(sorted(set(shared) | {b for a in shared for b in same if same[b] == same[a]}))} "
                      "diverge on the same requests at the same positions: the divergence follows the verify batch's "
                      "shape (1 + k tokens per sequence, bf16 near-ties in the target's own logits), not the "
                      "proposer." if shared else ""))
    rows = report["speedup_check"]["rows"]
    outside = [r for r in rows if abs(r["sim_speedup"] - r["engine_speedup"])
               > r["engine_error"] + (max(r["sim_speedup_by_seed"]) - min(r["sim_speedup_by_seed"])) / 2]
    inside = len(rows) - len(outside)
    out.append(f"- The simulator's EAGLE-3 speed-up is within the measurement's error at {inside} of {len(rows)} points"
               + ("; outside: " + "; ".join(
                   f"k={r['k']} c={r['concurrency']} (sim {r['sim_speedup']:.2f} vs {r['engine_speedup']:.2f} "
                   f"\u00b1 {r['engine_error']:.2f}; spec off simulated at {r['sim_tok_s_off']:,.0f} tok/s vs "
                   f"{r['engine_tok_s']['off']:,.0f} measured)" for r in outside)
                  + ". The gap is the spec-off baseline: h200-byte-lm-100m's target terms were fitted on an older, "
                    "slower engine (run 1 of bench_h200.py) and this run's sweeps hold too few eager steps to refit "
                    "them (fit_eagle.py --refit-target refuses: 11 eager steps, 70 needed); EAGLE-3's own throughput "
                    "there is simulated at " + ", ".join(
                        f"{r['sim_speedup'] * r['sim_tok_s_off'] / r['engine_tok_s']['eagle3'] - 1:+.0%} (k={r['k']})"
                        for r in outside) + " of the measured." if outside else "."))
    out.append("- The proposer is host-bound: the head's CUDA graph replays in 0.06 ms, the engine spends ~0.3 ms per "
               "head forward at concurrency 1 (preparing each round's inputs on the host, index uploads); the draft "
               "model, whose graph takes 0.16 ms, spends the same. EAGLE-3 wins on acceptance at the same "
               f"per-forward cost: per-token alpha (Beta mean, k=2) {_alphas(report['acceptance']['by_k'].get('2', {}))} "
               f"against the draft model's {_alphas(_draft_table())} (bench_h200.py run 1).")
    skipped = results.get("skipped") or []
    if skipped:
        out.append(f"- Not measured in this run (the call's time budget): {', '.join(skipped)}; n-gram's sweeps of "
                   "run 1 of bench_h200.py (above) stand for it.")
    return out + [""]


def _alphas(table: dict) -> str:
    return ", ".join(f"{t} {a / (a + b):.2f}" for t, (a, b) in table.items() if t in TASKS)


def _draft_table() -> dict:
    path = PROFILES_DIR / "spec-acceptance-byte-lm.json"
    return (json.loads(path.read_text()).get("acceptance_beta") or {}).get("draft_model", {}) if path.is_file() else {}


def write_section(path: Path, lines: list[str]) -> None:
    """Replace (or add) the EAGLE-3 section at the end of results.md."""
    old = path.read_text() if path.is_file() else ""
    head = old[:old.index(fit_sim.EAGLE_MARKER)] if fit_sim.EAGLE_MARKER in old else old
    path.write_text(head.rstrip("\n") + "\n\n" + "\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, required=True, help="eagle_h200.py's results.json")
    ap.add_argument("--runs", type=Path, required=True, help="runs.tar.xz or the extracted runs/ folder")
    ap.add_argument("--refit-target", action="store_true",
                    help="refit the profile's target, draft and verification terms on this run's sweeps first")
    a = ap.parse_args(argv)
    results = json.loads(a.results.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        report = fit(results, fit_sim.runs_root(a.runs, Path(tmp)), refit=a.refit_target)
    write_section(HERE / "results.md", markdown(results, report))
    for row in report["speedup_check"]["rows"]:
        print(json.dumps({k: row[k] for k in ("k", "concurrency", "engine_speedup", "engine_error", "sim_speedup")}))


if __name__ == "__main__":
    main()
