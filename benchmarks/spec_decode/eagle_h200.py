"""EAGLE-3 on one H200, side by side with the draft model and n-gram lookup: one GPU call (~7 min).

Phases (each in try/except, results.json rewritten after each; the `--budget-s` guard skips what
would not finish):

  train     the byte-level pair (train_pair.py: byte-lm-100m target, byte-lm-10m draft) and the
            EAGLE-3 head on that target (train_eagle.py), or reuse `--weights DIR`
  configs   for each of off, eagle3 k=2/4, draft_model k=2/4, ngram k=2/4 (in that order, one
            engine each, CUDA graphs, max_num_seqs 128, warmed up):
              acceptance  per task (corpora: code, prose, json): 16 held-out prompts of 256 bytes,
                          128 greedy tokens, all at t = 0; acceptance rate, mean acceptance length,
                          per-position acceptance (1..k), and the output tokens (the equality check)
              sweep       closed loop on a mixed-task workload at concurrency 1, 4, 16, 64, 128
                          (max_num_seqs = concurrency, max(8, 2 x concurrency) requests at t = 0):
                          output tok/s, TPOT p50, per-step proposer and target times; each run
                          written as an engine run folder (runs.tar.xz); spec off twice (other prompts:
                          the run-to-run spread)
              step cost   CUDA-graph replays timed alone: the target's decode step, the draft's and
                          the head's single-token step, the head's catch-up (1 + k tokens per
                          sequence) and the target's verify step, by batch size
  equality  greedy tokens of every spec config against spec off on the acceptance prompts (bf16:
            near-ties may flip; fp32 with the same head: `--fp32-check`, eager, a few prompts)
  summary   speed-up over spec off by concurrency, the break-even concurrency (log-linear between
            the last concurrency that pays and the first that does not), proposer ms per step

Writes under --out: results.json, results.md, train.json, bench.log, runs.tar.xz.

    python3 benchmarks/spec_decode/eagle_h200.py --out $OUT/eagle --budget-s 400       # H200
    python3 benchmarks/spec_decode/eagle_h200.py --out /tmp/eagle-dry --dry-run        # CPU, tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import itertools

from benchmarks.spec_decode import bench_h200 as bh
from benchmarks.spec_decode import corpora, train_eagle, train_pair

CONFIGS = (("off", 0), ("eagle3", 2), ("eagle3", 4), ("draft_model", 2), ("draft_model", 4), ("ngram", 2),
           ("ngram", 4))
CONCURRENCIES = (1, 4, 16, 64, 128)


@dataclasses.dataclass(frozen=True)
class EaglePlan:
    target_s: float = 100.0
    draft_s: float = 25.0
    head_s: float = 50.0
    max_model_len: int = 1024
    prompt_len: int = 256
    output_len: int = 128
    acc_prompts: int = 16
    concurrencies: tuple[int, ...] = CONCURRENCIES
    min_sweep_requests: int = 8
    config_s: float = 30.0  # a config is skipped when less than this is left
    fp32_prompts: int = 6
    fp32_tokens: int = 64
    tiny: bool = False


DRY = EaglePlan(target_s=0.3, draft_s=0.2, head_s=0.3, max_model_len=256, prompt_len=32, output_len=8,
                acc_prompts=2, concurrencies=(1, 4), min_sweep_requests=2, config_s=0.0, fp32_prompts=2,
                fp32_tokens=6, tiny=True)


def spec_of(method: str, k: int, weights: Path) -> dict | None:
    if method == "off":
        return None
    if method == "eagle3":
        return {"method": "eagle3", "model": str(weights / "eagle3"), "num_speculative_tokens": k}
    return bh.spec_config(method, k, weights / "draft")


class EagleBench:
    def __init__(self, out: Path, work: Path, plan: EaglePlan, device: str, budget_s: float) -> None:
        self.plan, self.device, self.budget_s = plan, device, budget_s
        self.t0 = time.perf_counter()
        bplan = dataclasses.replace(bh.DRY if plan.tiny else bh.Plan(), max_model_len=plan.max_model_len,
                                    deadline_s=budget_s)
        self.bench = bh.Bench(out, work, bplan, device)
        self.results = self.bench.results
        self.results["plan"] = dataclasses.asdict(plan) | {"budget_s": budget_s}
        self.tokens: dict[str, dict[int, list[int]]] = {}
        self.weights: Path | None = None

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def phase(self, name: str, fn) -> None:
        self.bench.phase(name, fn)

    # ------------------------------------------------------------------ train
    def train(self, weights: Path | None) -> None:
        p = self.plan
        if weights is None:
            weights = self.bench.work / "weights"
            reports = train_pair.train_pair(weights, p.target_s, p.draft_s, torch.device(self.device), tiny=p.tiny,
                                            log=bh.log)
            head = train_eagle.train_head(weights / "target", weights / "eagle3", p.head_s, torch.device(self.device),
                                          tiny=p.tiny, log=bh.log)
            self.results["train"] = {"reports": reports, "eagle3": head}
            (self.bench.out / "train.json").write_text(json.dumps(self.results["train"], indent=1) + "\n")
        self.weights = weights
        self.bench.load(weights)

    # ------------------------------------------------------------------ one config
    def config(self, method: str, k: int, prompts: dict[str, list]) -> None:
        name = method if method == "off" else f"{method}-k{k}"
        spec = spec_of(method, k, self.weights)
        if method != "eagle3":  # an earlier eagle3 engine left the shared target copying them
            self.bench.target.disable_aux_hidden()
        core = self.bench.core(spec, max_num_seqs=max(self.plan.concurrencies), eager=False)
        row: dict[str, Any] = {"method": method, "k": k, "num_gpu_blocks": core.num_gpu_blocks,
                               "memory_report": getattr(core.runner, "memory_report", None),
                               "graph_capture_s": core.graph_capture_s}
        self.results.setdefault("configs", {})[name] = row
        row["acceptance"] = self.acceptance(core, prompts, name)
        row["sweep"] = self.sweep(core, spec, name)
        if method == "off":  # the same sweep on other prompts: the run-to-run spread of tok/s
            row["sweep_repeat"] = self.sweep(core, spec, "off-repeat", seed_base=1000)
        row["forwards"] = forward_counts(core)
        self.bench.save()
        self.summary()  # results.md and the speed-ups so far: a crash later keeps them
        row["step_cost_ms"] = step_costs(core, k)
        self.bench.save()
        del core

    def acceptance(self, core, prompts: dict[str, list], name: str) -> dict[str, Any]:
        out, toks = {}, {}
        for task, reqs in prompts.items():
            res = self.bench.replay(core, reqs, honor_arrivals=False)
            s = res.summary().to_json_dict()
            out[task] = bh.latency_row(s) | ((bh.spec_stats(res.requests)
                                              | {"per_request": bh.per_request_spec(res.requests)})
                                             if core.spec_k else {})
            toks |= {rid: list(st.output_token_ids) for rid, st in core.requests.items()}
        self.tokens[name] = toks
        bh.log(name, "acceptance", json.dumps({t: (r.get("acceptance_rate"), r.get("mean_acceptance_length"))
                                              for t, r in out.items()}))
        return out

    def sweep(self, core, spec: dict | None, name: str, seed_base: int = 0) -> list[dict[str, Any]]:
        p, rows = self.plan, []
        for c in p.concurrencies:
            if self.left() < 10:
                bh.log(f"{name}: no time for concurrency {c}")
                break
            seed = seed_base + c
            reqs = bh.closed_loop(bh.Prompts(seed=seed), self._bplan(), bh.MIXED, max(p.min_sweep_requests, 2 * c),
                                  seed=seed)
            core.start_over(max_num_seqs=c)
            res = bh.replay(core, reqs, honor_arrivals=False, max_wall_s=max(5.0, self.left() - 5))
            summary = self.bench.write_run("sweep", f"{name}-c{c}", core, reqs, res, False,
                                           f"closed loop: {len(reqs)} mixed-task requests at t=0, max_num_seqs={c}",
                                           spec)
            row = {"concurrency": c, **bh.latency_row(summary), **step_split(res.steps, core.spec_k)}
            if spec:
                row |= bh.spec_stats(res.requests)
            rows.append(row)
            bh.log(name, json.dumps(row, default=bh._jsonable))
        return rows

    def _bplan(self) -> bh.Plan:
        return dataclasses.replace(self.bench.plan, prompt_len=self.plan.prompt_len, output_len=self.plan.output_len)

    def configs(self) -> None:
        p = self.plan
        prompts = {t: [self.bench.prompts.request(t, 0.0, p.prompt_len, p.output_len) for _ in range(p.acc_prompts)]
                   for t in corpora.TASKS}
        for method, k in CONFIGS:
            if self.left() < p.config_s:
                bh.log(f"skip {method} k={k}: {self.left():.0f} s left")
                self.results.setdefault("skipped", []).append(f"{method}-k{k}")
                continue
            self.phase(f"config {method} k={k}", lambda m=method, kk=k: self.config(m, kk, prompts))

    # ------------------------------------------------------------------ checks and summary
    def equality(self) -> None:
        off = self.tokens.get("off") or {}
        out = {}
        for name, toks in self.tokens.items():
            if name == "off" or not off:
                continue
            same = sum(toks.get(r) == t for r, t in off.items())
            first = [_first_diff(toks.get(r) or [], t) for r, t in off.items() if toks.get(r) != t]
            out[name] = {"requests": len(off), "identical": same, "first_divergence_at": first[:8]}
        self.results["equality_bf16"] = out
        bh.log("equality (bf16)", json.dumps(out))

    def fp32_check(self) -> None:
        """Greedy tokens with eagle3 k=4 == without, the target and head in fp32, eager."""
        from engine.core.config import EngineArgs
        from engine.engine_loop import EngineCore
        from engine.loader import load_model
        from engine.spec_decode.eagle import load_head

        p = self.plan
        target = load_model(self.weights / "target", device=self.device, dtype=torch.float32,
                            attention_backend="triton" if self.device == "cuda" else "torch",
                            max_positions=p.max_model_len)
        reqs = [self.bench.prompts.request(t, 0.0, p.prompt_len, p.fp32_tokens) for t in corpora.TASKS
                for _ in range(p.fp32_prompts // len(corpora.TASKS) or 1)]
        outs = {}
        for name, spec in (("off", None), ("eagle3", {"method": "eagle3", "model": str(self.weights / "eagle3"),
                                                     "num_speculative_tokens": 4})):
            args = EngineArgs(model=str(self.weights / "target"), device=self.device, dtype="float32",
                              max_num_seqs=len(reqs), max_model_len=p.max_model_len, seed=0, enforce_eager=True,
                              async_scheduling=False, speculative_config=spec,
                              **({"num_gpu_blocks_override": 4096} if p.tiny else {}))
            head = load_head(self.weights / "eagle3", target) if spec else None
            core = EngineCore(args, model=target, draft_model=head)
            bh.replay(core, reqs, honor_arrivals=False, max_wall_s=max(5.0, self.left() - 5))
            outs[name] = {rid: list(st.output_token_ids) for rid, st in core.requests.items()}
            del core
        same = sum(outs["eagle3"].get(r) == t for r, t in outs["off"].items())
        self.results["equality_fp32"] = {"requests": len(reqs), "identical": same, "k": 4}
        bh.log("equality (fp32)", json.dumps(self.results["equality_fp32"]))

    def summary(self) -> None:
        """Speed-ups, results.md and runs.tar.xz from what ran so far (after every config)."""
        configs = self.results.get("configs", {})
        self.results["speedup"] = speedups(configs)
        self.results["off_repeat_spread"] = repeat_spread(configs.get("off") or {})
        write_md(self.results, self.bench.out / "results.md")
        self.bench.save()
        self.bench.pack()


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def forward_counts(core) -> dict[str, dict[str, int]]:
    """Forwards served by a CUDA graph and run eagerly, per runner, since the engine was built
    (warm-up included): whether the proposer's steps replay graphs."""
    runners = {"target": core.runner}
    prop = core.eagle or core.drafter
    if prop is not None:
        runners["eagle3" if core.eagle is not None else "draft"] = prop.runner
    return {k: {"graph": r.num_graph_replays, "eager": r.num_eager_forwards} for k, r in runners.items()}


def step_split(steps: dict[str, np.ndarray], k: int) -> dict[str, Any]:
    """Median per-step seconds of the decode-only steps: the proposer and the target forward
    (gpu_s - propose_s), and the proposer per head/draft forward (k forwards: catch-up + k - 1)."""
    if not len(steps.get("gpu_s", [])):
        return {}
    m = (steps["num_prefill_tokens"] == 0) & (steps["num_decode_seqs"] > 0)
    if not m.any():
        return {}
    prop = steps["propose_s"][m]
    out = {"decode_steps": int(m.sum()), "median_decode_seqs": float(np.median(steps["num_decode_seqs"][m])),
           "median_target_ms": float(np.median(steps["gpu_s"][m] - prop) * 1e3),
           "median_step_ms": float(np.median(steps["total_s"][m]) * 1e3)}
    if k:
        out |= {"median_propose_ms": float(np.median(prop) * 1e3),
                "median_propose_ms_per_forward": float(np.median(prop) * 1e3 / k)}
    return out


@torch.inference_mode()
def _replay_ms(graph, reps: int) -> float:
    graph.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        graph.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / reps


def _safe_inputs(runner, q: int, context: int) -> None:
    """Inputs every captured graph can replay alone: token 0 at position 0 written nowhere (slot
    -1), each sequence attending `context` tokens (q of them its own) through the same valid
    blocks, query offsets q apart. A graph replayed over what the last step left (another
    batch's offsets and lengths) can read past its buffers: the first GPU run crashed so."""
    runner.d_input_ids.zero_()
    runner.d_positions.zero_()
    runner.d_slots.fill_(-1)
    runner.d_seq_lens.fill_(context)
    runner.d_qsl.copy_(q * torch.arange(runner.max_num_seqs + 1, dtype=torch.int32, device=runner.device))
    runner.reset_block_tables()
    blocks = -(-context // runner.block_size)
    runner.d_block_tables[:, :blocks].copy_(torch.arange(blocks, dtype=torch.int32, device=runner.device))
    runner.d_work_counts.zero_()
    if runner.is_cuda:
        torch.cuda.synchronize()


def step_costs(core, k: int, sizes=(1, 4, 16, 64, 128), reps: int = 30, context: int = 320
               ) -> dict[str, dict[int, float]]:
    """ms per CUDA-graph replay by batch size, each sequence attending `context` tokens: the
    target's decode and verify steps, the draft's or head's single-token step and its catch-up
    graph. Empty on a CPU (no graphs). Leaves the runners' inputs unusable: the engine is
    dropped afterwards."""
    out: dict[str, dict[int, float]] = {}
    graphs = [("target_decode", core.runner, core.runner.graphs, 1)]
    if k:
        graphs.append(("target_verify", core.runner, core.runner.verify_graphs, core.runner.verify_q))
    prop = core.eagle or core.drafter
    if prop is not None:
        name = "eagle3" if core.eagle is not None else "draft"
        r = prop.runner
        graphs += [(f"{name}_step", r, r.graphs, 1), (f"{name}_catch_up", r, r.verify_graphs, r.verify_q)]
    for key, runner, by_size, q in graphs:
        if not by_size or context > runner.max_model_len or runner.num_blocks * runner.block_size < context:
            continue
        _safe_inputs(runner, q, context)
        out[key] = {b: round(_replay_ms(by_size[b], reps), 4) for b in sizes if b in by_size}
    return out


def speedups(configs: dict[str, dict]) -> dict[str, Any]:
    """Per spec config: output throughput over spec off's at each concurrency, and where it stops
    paying (log-linear interpolation of the ratio between the last concurrency above 1 and the
    first at or below; None when it pays everywhere measured, 0 when nowhere)."""
    off = {r["concurrency"]: r for r in (configs.get("off") or {}).get("sweep", [])}
    out = {}
    for name, cfg in configs.items():
        if name == "off":
            continue
        ratios = []
        for r in cfg.get("sweep", []):
            base = off.get(r["concurrency"])
            if base and base.get("output_throughput") and r.get("output_throughput"):
                ratios.append((r["concurrency"], r["output_throughput"] / base["output_throughput"]))
        out[name] = {"by_concurrency": {c: round(x, 4) for c, x in ratios}, "break_even_concurrency": break_even(ratios)}
    return out


def repeat_spread(off: dict[str, Any]) -> dict[int, float]:
    """Per concurrency, |repeat / first - 1| of spec-off output tok/s (other prompts, same
    engine): the run-to-run noise a speed-up ratio carries from each of its two runs."""
    first = {r["concurrency"]: r.get("output_throughput") for r in off.get("sweep", [])}
    out = {}
    for r in off.get("sweep_repeat", []):
        a, b = first.get(r["concurrency"]), r.get("output_throughput")
        if a and b:
            out[r["concurrency"]] = round(abs(b / a - 1), 4)
    return out


def break_even(ratios: list[tuple[int, float]]) -> float | None:
    for (c0, r0), (c1, r1) in itertools.pairwise(ratios):
        if r0 > 1.0 >= r1:
            f = (r0 - 1.0) / (r0 - r1)
            return round(math.exp(math.log(c0) + f * (math.log(c1) - math.log(c0))), 2)
    if ratios and ratios[0][1] <= 1.0:
        return 0.0
    return None


def write_md(results: dict[str, Any], path: Path) -> None:
    configs = results.get("configs", {})
    lines = [f"# EAGLE-3 vs draft model vs n-gram ({results['meta']['gpu']}, {results['meta']['date']})", ""]
    head = (results.get("train") or {}).get("eagle3") or {}
    if head:
        lines += [(f"Head: {head.get('head_params', 0) / 1e6:.1f}M parameters, {head.get('steps')} steps in "
                  f"{head.get('train_s', 0):.0f} s; held-out top-1 by draft step {head.get('held_out_top1_by_step')}"), ""]
    lines += ["## Acceptance by task (rate; mean acceptance length; per position)", "",
              "| config | code | prose | json |", "|---|---|---|---|"]
    for name, cfg in configs.items():
        if name == "off":
            continue
        cells = []
        for t in corpora.TASKS:
            r = (cfg.get("acceptance") or {}).get(t) or {}
            pos = r.get("spec_decode_per_position_acceptance_rates") or []
            cells.append(f"{_f(r.get('acceptance_rate'))}; {_f(r.get('mean_acceptance_length'), '.2f')}; "
                         f"[{', '.join(_f(x, '.2f') for x in pos)}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    conc = sorted({r["concurrency"] for c in configs.values() for r in c.get("sweep", [])})
    lines += ["", "## Output tok/s by concurrency (speed-up over off)", "",
              "| config | " + " | ".join(str(c) for c in conc) + " | break-even |",
              "|---|" + "---|" * (len(conc) + 1)]
    sp = results.get("speedup", {})
    for name, cfg in configs.items():
        by = {r["concurrency"]: r for r in cfg.get("sweep", [])}
        ratio = (sp.get(name) or {}).get("by_concurrency", {})
        cells = [f"{_f(by.get(c, {}).get('output_throughput'), ',.0f')}"
                 + (f" ({ratio[c]:.2f}x)" if c in ratio else "") for c in conc]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_f((sp.get(name) or {}).get('break_even_concurrency'), '.1f')} |")
    lines += ["", "## Proposer ms per forward (median over decode-only steps) by concurrency", "",
              "| config | " + " | ".join(str(c) for c in conc) + " |", "|---|" + "---|" * len(conc)]
    for name, cfg in configs.items():
        if name == "off":
            continue
        by = {r["concurrency"]: r for r in cfg.get("sweep", [])}
        lines.append(f"| {name} | " + " | ".join(_f(by.get(c, {}).get("median_propose_ms_per_forward"), ".3f")
                                                 for c in conc) + " |")
    lines += ["", "## CUDA-graph replay ms by batch size", ""]
    for name, cfg in configs.items():
        for key, by in (cfg.get("step_cost_ms") or {}).items():
            lines.append(f"- {name} {key}: " + ", ".join(f"b={b}: {ms:.3f}" for b, ms in by.items()))
    lines += ["", f"Spec-off run-to-run spread of tok/s by concurrency: {json.dumps(results.get('off_repeat_spread'))}"]
    lines += ["", f"Equality (bf16): {json.dumps(results.get('equality_bf16'))}",
              f"Equality (fp32): {json.dumps(results.get('equality_fp32'))}", ""]
    path.write_text("\n".join(lines) + "\n")


def _f(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main(argv: list[str] | None = None) -> EagleBench:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/costline-eagle"))
    ap.add_argument("--weights", type=Path, help="reuse DIR/target, DIR/draft, DIR/eagle3")
    ap.add_argument("--budget-s", type=float, default=400.0, help="wall seconds for everything, training included")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny models and sizes")
    ap.add_argument("--no-fp32-check", action="store_true")
    a = ap.parse_args(argv)
    bh.T0 = time.perf_counter()
    plan = DRY if a.dry_run else EaglePlan()
    device = "cpu" if a.dry_run else "cuda"
    if a.dry_run:
        torch.set_num_threads(1)
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    bh.LOG_FILE[:] = [a.out / "bench.log"]
    eb = EagleBench(a.out, a.work, plan, device, a.budget_s)
    eb.phase("train", lambda: eb.train(a.weights))
    if eb.bench.target is None:
        bh.log("no models: nothing else can run")
        return eb
    eb.configs()
    eb.phase("equality", eb.equality)
    if not a.no_fp32_check and eb.left() > 25:
        eb.phase("fp32_check", eb.fp32_check)
    eb.phase("summary", eb.summary)
    bh.log(f"done in {time.perf_counter() - eb.t0:.0f} s")
    return eb


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 - whatever was written so far still comes back
        traceback.print_exc()
        sys.exit(1)
