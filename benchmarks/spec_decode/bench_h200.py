"""Speculative decoding on an H200 with a byte-level pair that predicts real text: one GPU call.

Phases (each in try/except: a failure is logged, recorded in results.json and the next phase runs;
results.json is rewritten after every phase):

  train       train the target (byte-lm-100m) and draft (byte-lm-10m) on the code/prose/json
              corpora (train_pair.py), or reuse `--weights DIR` (DIR/target, DIR/draft)
  gpu_check   benchmarks/spec_decode/gpu_check.py's `check(...)`, when that module exists
  acceptance  per task (code, prose, json), method (draft_model, ngram) and k = 1..6: acceptance
              rate, mean acceptance length, per-position acceptance, on held-out prompts, greedy,
              eager, all requests at t = 0; spec off alongside; the best k per method is the one
              with the highest output throughput over the three tasks
  serve-*     spec off, draft_model and ngram at their best k: closed loop at concurrency 1..256
              (max_num_seqs = concurrency, twice that many requests at t = 0) on a mixed task
              workload: TPOT p50/p99, throughput, goodput; KV blocks and memory with / without the
              draft. Then timed replays with Poisson arrivals (code-heavy, prose-chat, json-mixed)
              and, with the draft, the drift run (code first, prose later: acceptance per window).
              Every replay is written as an engine run folder (run.json, workload.jsonl,
              requests/steps jsonl, summary.json: what sim/calibrate.py and sim/validate.py read)

Every engine is warmed up before it is measured (`EngineCore.warm_up`); scheduling is synchronous.
Under `--out` (at most 8 files come back from a device call): results.json, bench.log, train.json
and runs.tar.xz (the run folders and gpu_check's output, written under `--work`). Then, on a CPU:
`python3 benchmarks/spec_decode/fit_sim.py --results OUT/results.json --runs OUT/runs.tar.xz`.

    python3 benchmarks/spec_decode/bench_h200.py --out $OUT               # H200, ~9 min
    python3 benchmarks/spec_decode/bench_h200.py --out DIR --dry-run      # CPU, tiny sizes, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import importlib
import inspect
import itertools
import json
import math
import platform
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.spec_decode import corpora, train_pair
from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.engine_loop import EngineCore, content_hash_ids
from engine.loader import load_model
from engine.replay import ReplayResult, replay

T0 = time.perf_counter()
HASH_BLOCK = 16
METHODS = ("draft_model", "ngram")
NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
# task shares of the timed replays
REPLAYS = {"code-heavy": {"code": 0.8, "prose": 0.2}, "prose-chat": {"prose": 1.0},
           "json-mixed": {"json": 0.5, "code": 0.25, "prose": 0.25}}
MIXED = {"code": 1 / 3, "prose": 1 / 3, "json": 1 / 3}
ASYNC_SCHEDULING = False  # the verify step needs the previous step's accepted tokens on the host


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes: the H200 run, or the CPU dry run (every phase, in seconds)."""

    target_s: float = 130.0
    draft_s: float = 35.0
    max_model_len: int = 1024
    prompt_len: int = 256  # acceptance and sweep prompts (bytes = tokens)
    output_len: int = 128
    acc_prompts: int = 16  # per task
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    concurrencies: tuple[int, ...] = (1, 4, 16, 64, 256)
    min_sweep_requests: int = 8
    replay_s: float = 10.0  # arrivals span of each timed replay
    replay_load: float = 0.3  # of the spec-off closed-loop request rate at the highest concurrency
    prompt_range: tuple[int, int] = (64, 512)
    output_range: tuple[int, int] = (32, 256)
    drift_requests: int = 96
    deadline_s: float = 525.0  # no replay starts after this (the call's limit is 570 s: imports and packing)
    tiny: bool = False


DRY = Plan(target_s=1.0, draft_s=0.7, max_model_len=256, prompt_len=32, output_len=8, acc_prompts=2, ks=(1, 2),
           concurrencies=(1, 4), min_sweep_requests=2, replay_s=0.5, replay_load=0.5, prompt_range=(16, 48),
           output_range=(4, 12), drift_requests=4, deadline_s=600.0, tiny=True)


LOG_FILE: list[Path] = []  # bench.log under --out, once main has set it


def log(*a: Any) -> None:
    line = " ".join(str(x) for x in (f"[{time.perf_counter() - T0:6.1f}s]", *a))
    print(line, flush=True)
    for path in LOG_FILE:
        with path.open("a") as f:
            f.write(line + "\n")


def spec_config(method: str, k: int, draft_dir: Path) -> dict:
    """The engine's --speculative-config for a method at k drafts."""
    if method == "draft_model":
        return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": k}
    return {"method": "ngram", "num_speculative_tokens": k, **NGRAM_LOOKUP}


# ---------------------------------------------------------------------------- requests
class Prompts:
    """Held-out prompt bytes per task and length, handed out in order without repeats (seeded)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.next_id = seed, 0
        self.cache: dict[tuple[str, int], list[bytes]] = {}
        self.used: dict[tuple[str, int], int] = {}

    def text(self, task: str, prompt_len: int) -> bytes:
        key = (task, prompt_len)
        i = self.used.get(key, 0)
        self.used[key] = i + 1
        if i >= len(self.cache.get(key, ())):  # corpora.prompts(n) is a prefix of prompts(2n)
            self.cache[key] = corpora.prompts(task, max(64, 2 * (i + 1)), prompt_len, seed=self.seed)
        return self.cache[key][i]

    def request(self, task: str, arrival_s: float, prompt_len: int, output_len: int) -> Request:
        toks = tuple(corpora.encode(self.text(task, prompt_len)).tolist())
        self.next_id += 1
        return Request(self.next_id - 1, arrival_s, len(toks), output_len, content_hash_ids(toks, HASH_BLOCK),
                       hash_block_size=HASH_BLOCK, category=task, prompt_token_ids=toks)


def task_sequence(shares: dict[str, float], n: int, rng: np.random.Generator) -> list[str]:
    tasks = list(shares)
    p = np.array([shares[t] for t in tasks])
    return [tasks[i] for i in rng.choice(len(tasks), size=n, p=p / p.sum())]


def closed_loop(prompts: Prompts, plan: Plan, shares: dict[str, float], n: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [prompts.request(t, 0.0, plan.prompt_len, plan.output_len) for t in task_sequence(shares, n, rng)]


def poisson(prompts: Prompts, plan: Plan, shares: dict[str, float], rate_rps: float, span_s: float,
            seed: int) -> list[Request]:
    """Poisson arrivals over `span_s`, prompt and output lengths uniform in the plan's ranges."""
    rng = np.random.default_rng(seed)
    n = max(4, int(rate_rps * span_s))
    arrivals = np.cumsum(rng.exponential(span_s / n, n))  # at least 4 requests, still within the span
    lo, hi = plan.prompt_range
    return [prompts.request(t, float(a), int(rng.integers(lo, hi)), int(rng.integers(*plan.output_range)))
            for t, a in zip(task_sequence(shares, n, rng), arrivals)]


def write_workload(reqs: list[Request], path: Path) -> None:
    """Mooncake JSONL (ms timestamps from the first arrival) with content hash ids, plus the task."""
    t0 = reqs[0].arrival_s
    with path.open("w") as f:
        for r in reqs:
            f.write(json.dumps({"timestamp": round((r.arrival_s - t0) * 1000), "input_length": r.prompt_len,
                                "output_length": r.output_len, "hash_ids": list(r.hash_ids),
                                "category": r.category}) + "\n")


# ---------------------------------------------------------------------------- measures
def spec_stats(requests: dict[str, np.ndarray]) -> dict[str, Any]:
    """Acceptance over a request table (engine columns num_spec_*)."""
    drafts = float(np.nansum(requests["num_spec_drafts"]))
    drafted = float(np.nansum(requests["num_spec_draft_tokens"]))
    accepted = float(np.nansum(requests["num_spec_accepted_tokens"]))
    return {"num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None}


def per_request_spec(requests: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """Each request's spec counters and output length (the fit counts its decode steps from them)."""
    return {k: np.nan_to_num(requests[c]).astype(int).tolist() for k, c in
            (("drafts", "num_spec_drafts"), ("drafted", "num_spec_draft_tokens"),
             ("accepted", "num_spec_accepted_tokens"), ("output_tokens", "num_output_tokens"))}


def latency_row(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("output_throughput", "request_throughput", "median_tpot_ms", "p99_tpot_ms", "median_ttft_ms",
            "p99_ttft_ms", "completed", "duration", "spec_decode_acceptance_rate", "spec_decode_acceptance_length",
            "spec_decode_per_position_acceptance_rates")
    return {k: summary.get(k) for k in keys}


def goodput_rps(requests: dict[str, np.ndarray], duration_s: float, tpot_ms: float, ttft_ms: float) -> float:
    ok = ((requests["status"] == "finished") & (requests["tpot_s"] * 1e3 <= tpot_ms)
          & (requests["ttft_s"] * 1e3 <= ttft_ms))
    return float(ok.sum() / duration_s) if duration_s > 0 else math.nan


def acceptance_windows(steps: dict[str, np.ndarray], num_windows: int) -> list[dict[str, float]]:
    """Acceptance rate per equal slice of the run's time (step columns num_spec_*)."""
    t = steps["t_start_s"]
    if t.size == 0:
        return []
    edges = np.linspace(t.min(), t.max() + 1e-9, num_windows + 1)
    out = []
    for lo, hi in itertools.pairwise(edges):
        m = (t >= lo) & (t < hi)
        drafted = float(steps["num_spec_tokens"][m].sum())
        accepted = float(steps["num_spec_accepted_tokens"][m].sum())
        out.append({"t_from_s": float(lo - edges[0]), "t_to_s": float(hi - edges[0]), "steps": int(m.sum()),
                    "acceptance_rate": accepted / drafted if drafted else None})
    return out


# ---------------------------------------------------------------------------- the bench
class Bench:
    def __init__(self, out: Path, work: Path, plan: Plan, device: str) -> None:
        self.out, self.work, self.plan, self.device = out, work, plan, device
        self.runs = work / "runs"  # many files: only their archive goes to `out`
        self.results: dict[str, Any] = {"plan": dataclasses.asdict(plan), "phases": {}, "meta": _meta(device)}
        self.prompts = Prompts(seed=0)
        self.target = self.draft = None
        self.target_dir = self.draft_dir = None

    def time_left(self) -> float:
        return self.plan.deadline_s - (time.perf_counter() - T0)

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=_jsonable) + "\n")

    def phase(self, name: str, fn: Callable[[], Any]) -> None:
        """Run one phase; record ok/error and its time; results.json after each."""
        t = time.perf_counter()
        log(f"=== {name} ({self.time_left():.0f} s left)")
        try:
            fn()
            self.results["phases"][name] = {"ok": True, "s": round(time.perf_counter() - t, 1)}
        except Exception as exc:  # noqa: BLE001 - one phase failing must not cost the others
            log(f"phase {name} FAILED: {exc!r}\n{traceback.format_exc()}")
            self.results["phases"][name] = {"ok": False, "s": round(time.perf_counter() - t, 1),
                                            "error": f"{type(exc).__name__}: {exc}"}
        finally:
            _free()
            self.save()

    # -------------------------------------------------------------- models and engines
    def load(self, weights: Path) -> None:
        self.target_dir, self.draft_dir = weights / "target", weights / "draft"
        backend = "triton" if self.device == "cuda" else "torch"
        kw = {"device": self.device, "attention_backend": backend, "max_positions": self.plan.max_model_len}
        self.target = load_model(self.target_dir, **kw)
        self.draft = load_model(self.draft_dir, **kw)
        self.results["models"] = {"target": _model_facts(self.target), "draft": _model_facts(self.draft)}

    def core(self, spec: dict | None, max_num_seqs: int, *, eager: bool) -> EngineCore:
        extra: dict[str, Any] = {} if spec is None else {"speculative_config": spec}
        if self.plan.tiny:
            extra |= {"dtype": "float32", "num_gpu_blocks_override": 4096}
        args = EngineArgs(model=str(self.target_dir), device=self.device, max_num_seqs=max_num_seqs,
                          max_model_len=self.plan.max_model_len, seed=0, enforce_eager=eager,
                          async_scheduling=ASYNC_SCHEDULING, **extra)
        kw = {"draft_model": self.draft} if spec and spec["method"] == "draft_model" else {}
        try:
            core = EngineCore(args, model=self.target, **kw)
        except Exception as exc:  # graphs may not cover a proposer: measure it eagerly
            if eager:
                raise
            log(f"engine with CUDA graphs failed ({exc!r}); eager instead")
            _free()
            return self.core(spec, max_num_seqs, eager=True)
        # kernels compile on first use: a warm-up keeps compilation out of every measured replay
        warm = core.warm_up()
        self.results.setdefault("warm_up", []).append(
            {"spec": spec, "eager": eager, "max_num_seqs": max_num_seqs, **dataclasses.asdict(warm)})
        return core

    def replay(self, core: EngineCore, reqs: list[Request], *, honor_arrivals: bool,
               max_wall_s: float | None = None) -> ReplayResult:
        core.start_over()
        cap = max(5.0, min(max_wall_s or 1e9, self.time_left()))
        return replay(core, reqs, honor_arrivals=honor_arrivals, max_wall_s=cap)

    def write_run(self, purpose: str, name: str, core: EngineCore, reqs: list[Request], res: ReplayResult,
                  honor_arrivals: bool, description: str, spec: dict | None) -> dict:
        """An engine run folder (sim/validate.py's schema) for one replay; returns its summary."""
        folder = self.runs / purpose / name
        folder.mkdir(parents=True, exist_ok=True)
        write_workload(reqs, folder / "workload.jsonl")
        summary = res.write_files(folder)
        run = {"schema": "costline-engine-run/1", "name": name, "purpose": purpose,
               "model": self.results["models"]["target"]["preset"], "gpu": self.results["meta"]["gpu"],
               "engine_args": core.config.model_dump(mode="json"), "hash_block_size": HASH_BLOCK,
               "honor_arrivals": honor_arrivals, "num_gpu_blocks": core.num_gpu_blocks,
               "memory": getattr(core.runner, "memory_report", None), "description": description,
               "speculative_config": spec, "draft_model": self.results["models"]["draft"]["preset"] if spec and
               spec["method"] == "draft_model" else None, "unfinished_ids": len(res.unfinished_ids),
               **self.results["meta"]}
        (folder / "run.json").write_text(json.dumps(run, indent=1, default=_jsonable) + "\n")
        return summary

    # -------------------------------------------------------------- phases
    def train(self, weights: Path | None) -> None:
        if weights is None:
            weights = self.work / "weights"
            reports = train_pair.train_pair(weights, self.plan.target_s, self.plan.draft_s,
                                            torch.device(self.device), tiny=self.plan.tiny, log=log)
            self.results["train"] = {"reports": reports, "unigram_bits_held_out": train_pair.unigram_bits(True)}
            (self.out / "train.json").write_text(json.dumps(self.results["train"], indent=1) + "\n")
        self.load(weights)

    def gpu_check(self) -> None:
        try:
            mod = importlib.import_module("benchmarks.spec_decode.gpu_check")
        except ImportError as exc:
            self.results["gpu_check"] = {"skipped": f"gpu_check.py not importable: {exc}"}
            return
        offered = {"target": self.target_dir, "target_dir": self.target_dir, "model": self.target_dir,
                   "draft": self.draft_dir, "draft_dir": self.draft_dir, "draft_model": self.draft_dir,
                   "out": self.work / "gpu_check", "out_dir": self.work / "gpu_check",
                   "out_json": self.work / "gpu_check" / "verdict.json", "device": self.device,
                   "dry_run": self.plan.tiny, "tiny": self.plan.tiny, "log": log,
                   "time_budget_s": min(60.0, self.time_left() / 6)}
        params = inspect.signature(mod.check).parameters
        kw = {k: v for k, v in offered.items() if k in params}
        self.results["gpu_check"] = mod.check(**kw)

    def acceptance(self) -> None:
        p = self.plan
        reqs = {t: [self.prompts.request(t, 0.0, p.prompt_len, p.output_len) for _ in range(p.acc_prompts)]
                for t in corpora.TASKS}
        rows = self.results.setdefault("acceptance", [])
        configs = [("off", 0)] + [(m, k) for m in METHODS for k in p.ks]
        for method, k in configs:
            if self.time_left() < 200:  # the serving phases need the rest
                log(f"acceptance: stop before {method} k={k}: {self.time_left():.0f} s left")
                break
            spec = None if method == "off" else spec_config(method, k, self.draft_dir)
            core = self.core(spec, max_num_seqs=p.acc_prompts, eager=True)
            for task in corpora.TASKS:
                res = self.replay(core, reqs[task], honor_arrivals=False)
                row = {"method": method, "k": k, "task": task, **latency_row(res.summary().to_json_dict())}
                if spec:
                    row |= spec_stats(res.requests) | {"per_request": per_request_spec(res.requests)}
                rows.append(row)
                log(json.dumps({x: row.get(x) for x in ("method", "k", "task", "acceptance_rate",
                                                        "mean_acceptance_length", "output_throughput")}))
            del core
            _free()
        self.results["best_k"] = best_k(rows)
        log(f"best k: {self.results['best_k']}")

    def serve(self, name: str, spec: dict | None) -> None:
        """Closed-loop sweep, then timed replays (and the drift run with the draft model)."""
        p = self.plan
        core = self.core(spec, max_num_seqs=max(p.concurrencies), eager=False)
        mem = self.results.setdefault("memory", {})
        mem[name] = {"num_gpu_blocks": core.num_gpu_blocks, "memory_report": getattr(core.runner, "memory_report",
                                                                                         None)}
        sweep = self.results.setdefault("sweep", {}).setdefault(name, [])
        for c in p.concurrencies:
            if self.time_left() < 30:
                break
            reqs = closed_loop(Prompts(seed=c), p, MIXED, max(p.min_sweep_requests, 2 * c), seed=c)
            core.start_over(max_num_seqs=c)
            res = replay(core, reqs, honor_arrivals=False, max_wall_s=max(5.0, self.time_left() - 20))
            summary = self.write_run("sweep", f"{name}-c{c}", core, reqs, res, False,
                                     f"closed loop: {len(reqs)} mixed-task requests at t=0, max_num_seqs={c}",
                                     spec)
            row = {"concurrency": c, **latency_row(summary)}
            if spec:
                row |= spec_stats(res.requests)
            row["_tables"] = res.requests  # dropped before saving: goodput needs the spec-off TPOT first
            sweep.append(row)
            log(name, json.dumps({k: v for k, v in row.items() if not k.startswith("_")}, default=_jsonable))
        self._goodput(name)
        self.results["break_even"] = break_even(self.results["sweep"])
        self.results["draft_memory"] = draft_memory(mem)
        if name == "draft_model":
            self.drift(core, spec)
        self.timed_replays(name, core, spec)

    def _goodput(self, name: str) -> None:
        """Requests/s meeting TTFT <= 1 s and TPOT <= 2 x the spec-off single-stream TPOT p50."""
        tables = {r["concurrency"]: r.pop("_tables", None) for r in self.results["sweep"][name]}
        off = self.results["sweep"].get("off") or []
        base = next((r["median_tpot_ms"] for r in off if r["concurrency"] == 1 and r["median_tpot_ms"]), None)
        if base is None:
            return
        slo = {"tpot_ms": 2 * base, "ttft_ms": 1000.0}
        self.results["goodput_slo"] = slo
        for row in self.results["sweep"][name]:
            if tables.get(row["concurrency"]) is not None:
                row["goodput_rps"] = goodput_rps(tables[row["concurrency"]], row["duration"] or 0.0, slo["tpot_ms"],
                                                 slo["ttft_ms"])

    def drift(self, core: EngineCore, spec: dict) -> None:
        """Code requests arrive first, prose later: acceptance per tenth of the run."""
        p = self.plan
        half = p.drift_requests // 2
        rate = self._replay_rate() or 4.0
        span = p.drift_requests / rate
        reqs = poisson(self.prompts, p, {"code": 1.0}, rate, span / 2, seed=11)[:half]
        later = poisson(self.prompts, p, {"prose": 1.0}, rate, span / 2, seed=12)[:half]
        reqs += [dataclasses.replace(r, arrival_s=r.arrival_s + span / 2) for r in later]
        res = self.replay(core, reqs, honor_arrivals=True, max_wall_s=span * 3)
        self.write_run("drift", "code-then-prose", core, reqs, res, True,
                       "code requests in the first half, prose in the second (Poisson)", spec)
        by_task = {t: spec_stats({k: v[res.requests["category"] == t] for k, v in res.requests.items()})
                   for t in ("code", "prose")}
        self.results["drift"] = {"windows": acceptance_windows(res.steps, 10), "by_task": by_task}
        log("drift", json.dumps(self.results["drift"], default=_jsonable))

    def _replay_rate(self) -> float | None:
        off = self.results.get("sweep", {}).get("off") or []
        c = max((r for r in off if r.get("request_throughput")), key=lambda r: r["concurrency"], default=None)
        return None if c is None else self.plan.replay_load * min(c["request_throughput"], 200.0)

    def timed_replays(self, name: str, core: EngineCore, spec: dict | None) -> None:
        rate = self._replay_rate()
        if rate is None:
            raise RuntimeError("no spec-off sweep to size the replays' arrival rate from")
        index = self.results.setdefault("replays", [])
        for i, (wl, shares) in enumerate(REPLAYS.items()):
            if self.time_left() < self.plan.replay_s + 10:
                log(f"replays: no time for {wl}")
                break
            prompts = Prompts(seed=100 + i)  # the same requests for every method
            reqs = poisson(prompts, self.plan, shares, rate, self.plan.replay_s, seed=100 + i)
            res = self.replay(core, reqs, honor_arrivals=True, max_wall_s=self.plan.replay_s * 3)
            summary = self.write_run("validation", f"{wl}-{name}", core, reqs, res, True,
                                     f"{wl}: {len(reqs)} requests, Poisson {rate:.1f} req/s, tasks {shares}", spec)
            index.append({"workload": wl, "config": name, "requests": len(reqs), **latency_row(summary),
                          **(spec_stats(res.requests) if spec else {})})
            log(json.dumps(index[-1], default=_jsonable))

    def pack(self) -> None:
        if not self.runs.is_dir():
            return
        with tarfile.open(self.out / "runs.tar.xz", "w:xz", preset=6) as tar:
            tar.add(self.runs, arcname="runs")
            if (self.work / "gpu_check").is_dir():
                tar.add(self.work / "gpu_check", arcname="gpu_check")
        log(f"packed runs: {(self.out / 'runs.tar.xz').stat().st_size / 1e6:.1f} MB")


def break_even(sweep: dict[str, list[dict]]) -> dict[str, Any]:
    """Per method and concurrency, spec-on over spec-off output throughput and TPOT p50, and the
    first concurrency where the method's throughput falls to or below spec-off's (it stops paying)."""
    off = {r["concurrency"]: r for r in sweep.get("off", [])}
    out: dict[str, Any] = {}
    for method, rows in sweep.items():
        if method == "off":
            continue
        ratios = []
        for r in rows:
            base = off.get(r["concurrency"])
            if base and base.get("output_throughput") and r.get("output_throughput"):
                ratios.append({"concurrency": r["concurrency"],
                               "throughput_ratio": r["output_throughput"] / base["output_throughput"],
                               "tpot_p50_ratio": (r["median_tpot_ms"] / base["median_tpot_ms"]
                                                  if r.get("median_tpot_ms") and base.get("median_tpot_ms") else None)})
        stops = next((x["concurrency"] for x in ratios if x["throughput_ratio"] <= 1.0), None)
        out[method] = {"by_concurrency": ratios, "stops_paying_at_concurrency": stops}
    return out


def draft_memory(memory: dict[str, dict]) -> dict[str, Any] | None:
    """KV blocks the draft model costs (its weights and its own KV cache), against spec off."""
    off, draft = memory.get("off"), memory.get("draft_model")
    if not off or not draft or not off.get("num_gpu_blocks"):
        return None
    lost = off["num_gpu_blocks"] - draft["num_gpu_blocks"]
    return {"kv_blocks_off": off["num_gpu_blocks"], "kv_blocks_draft": draft["num_gpu_blocks"],
            "kv_blocks_lost": lost, "kv_blocks_lost_share": lost / off["num_gpu_blocks"]}


def best_k(rows: list[dict]) -> dict[str, int]:
    """Per method, the k whose summed output throughput over the tasks is highest."""
    out = {}
    for method in METHODS:
        tput: dict[int, float] = {}
        for r in rows:
            if r["method"] == method and r.get("output_throughput"):
                tput[r["k"]] = tput.get(r["k"], 0.0) + r["output_throughput"]
        if tput:
            out[method] = max(tput, key=tput.get)
    return out


def _model_facts(model) -> dict[str, Any]:
    from engine.core.model_spec import MODEL_PRESETS

    s = model.spec
    preset = next((n for n, m in MODEL_PRESETS.items()
                   if m.model_copy(update={"name": s.name}) == s.model_copy(update={"dtype": m.dtype})), s.name)
    return {"preset": preset, "num_params": s.num_params, "weight_bytes": s.weight_bytes(),
            "kv_bytes_per_token": s.kv_bytes_per_token()}


def _meta(device: str) -> dict[str, Any]:
    gpu = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else "cpu"
    return {"gpu": "h200" if "H200" in gpu else gpu, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "versions": {"torch": torch.__version__, "python": platform.python_version(), "cuda": torch.version.cuda}}


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return str(x)


def main(argv: list[str] | None = None) -> Bench:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--weights", type=Path, help="reuse a trained pair: DIR/target and DIR/draft")
    ap.add_argument("--work", type=Path, default=Path("/tmp/costline-spec"),
                    help="weights, run folders and gpu_check output (packed into OUT/runs.tar.xz)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny models and sizes: every phase in seconds")
    ap.add_argument("--phases", default="train,gpu_check,acceptance,serve",
                    help="comma-separated: gpu_check, acceptance, serve (or serve-off, serve-draft_model, "
                         "serve-ngram); the models are always trained or loaded")
    ap.add_argument("--best-k", default="", help="k per method when the acceptance phase is skipped, "
                                                   "e.g. draft_model=2,ngram=6 (default 3)")
    ap.add_argument("--train-s", type=float, nargs=2, metavar=("TARGET_S", "DRAFT_S"),
                    help="training budgets (default 130 and 35 s on the GPU)")
    a = ap.parse_args(argv)
    global T0
    T0 = time.perf_counter()  # the deadline counts from the start of this run, not from the import
    plan = DRY if a.dry_run else Plan()
    if a.train_s:
        plan = dataclasses.replace(plan, target_s=a.train_s[0], draft_s=a.train_s[1])
    device = "cpu" if a.dry_run else "cuda"
    if a.dry_run:  # tiny models gain nothing from intra-op threads and lose much on shared cores
        torch.set_num_threads(1)
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    LOG_FILE[:] = [a.out / "bench.log"]
    bench = Bench(a.out, a.work, plan, device)
    phases = set(a.phases.split(","))
    bench.phase("train", lambda: bench.train(a.weights))
    if bench.target is None:
        log("no models: nothing else can run")
        return bench
    if "gpu_check" in phases:
        bench.phase("gpu_check", bench.gpu_check)
    if "acceptance" in phases:
        bench.phase("acceptance", bench.acceptance)
    k = bench.results.get("best_k") or {m: int(v) for m, v in (x.split("=") for x in a.best_k.split(",") if x)}
    if phases & {"serve", "serve-off"}:
        bench.phase("serve-off", lambda: bench.serve("off", None))
    for method in METHODS:
        if phases & {"serve", f"serve-{method}"}:
            bench.phase(f"serve-{method}",
                        lambda m=method: bench.serve(m, spec_config(m, k.get(m, 3), bench.draft_dir)))
    bench.phase("pack", bench.pack)
    log("done")
    return bench


if __name__ == "__main__":
    main()
