#!/usr/bin/env python3
"""Fused mixture-of-experts on the H200 (issue 29): correctness, time by tokens, and the engine.

Part 1, correctness: kernels.fused_moe.fused_moe on bf16 weights against the per-expert float32
loop (kernels.moe_reference.fused_moe_ref) at several T, routed by random router logits,
including a batch where every token picks the same experts; torch._grouped_mm's path too.

Part 2, speed: one MoE layer of each preset's shapes (qwen3-30b-a3b: H 2048, N 768, 128 experts,
top 8; mixtral-8x7b: H 4096, N 14336, 8 experts, top 2), T = 1 .. 4096 tokens, routing from
random router logits (near uniform). Timed as CUDA-graph replays of several calls that cycle
over COPIES layers' weights (so one call's experts are not in L2 for the next):
  fused         kernels.fused_moe (grouping + two grouped GEMM launches + the k-sum), the best
                of a few tile configs (each config's time is kept)
  loop          a per-expert torch loop (sort once, one host sync for the counts, F.linear per
                touched expert), eager: the sync forbids graph capture
  grouped_mm    torch._grouped_mm (CUTLASS grouped GEMM on sm90) on the expert-sorted rows
against the roofline of the experts actually touched: max(touched experts' bytes / 4.2 TB/s,
FLOPs / 790 TFLOP/s) -- the rates the brief of issue 29 fixed for the H200 (bf16 dense peak
~790 of the 989 datasheet TFLOP/s, HBM ~4.2 of 4.8 TB/s in a device copy).

Part 3 (budget allowing), engine steps: LlamaModel with a reduced-layer qwen3-30b-a3b (4 layers,
the full per-layer shapes; say so wherever quoted), decode steps by batch (CUDA graph when the
engine captures one, else eager) and prefill steps by tokens, each step's time, to fit the
simulator's MoE terms.

    python3 benchmarks/kernels/bench_moe_h200.py --out DIR                 # H200, <= 3 min
    python3 benchmarks/kernels/bench_moe_h200.py --out DIR --dry-run       # CPU interpreter, tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# the step sizes, in the order measured: run 2's misses first (qwen3 T = 1, 2, 4, 256, 4096), so a
# budget cut drops the sizes that already met their target
TS = (1, 2, 4, 256, 4096, 1024, 128, 8, 16, 32, 64)
HBM_BYTES_PER_S = 4.2e12
BF16_FLOPS_PER_S = 790e12
L2_BYTES = 50 * 2**20  # H200's L2 (the weights cycle over enough copies to defeat it)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    p.add_argument("--budget-s", type=float, default=170.0, help="stop starting new measurements after this")
    p.add_argument("--skip", default="", help="comma list of parts to skip: check,speed,engine")
    p.add_argument("--paths", default="old,new",
                   help="comma list of fused paths to time: old (run 2: one-program/torch grouping, run 2's tiles, "
                        "torch k-sum), new (multi-program grouping, direct small-step path, tile sweep)")
    p.add_argument("--probe-only", action="store_true", help=argparse.SUPPRESS)  # the subprocess of probe()
    p.add_argument("--alternatives", action="store_true",
                   help="also time the per-expert torch loop and torch._grouped_mm (run 2 has them)")
    p.add_argument("--focus", action="store_true",
                   help="run 4's fast mode: run 3's best plan and the new ones (kernels.moe_plans) side by side at "
                        "--tokens of --presets, each new plan checked against the float32 loop, phases per launch; "
                        "no old path, no engine")
    p.add_argument("--run6", action="store_true",
                   help="with --focus: run 5's best plan (kernels.moe_plans.run5_best) as the baseline and run 6's "
                        "candidates (run6_candidates), the round whose rule the engine runs")
    p.add_argument("--presets", nargs="+", default=None, help="presets to time (default: both; --focus: qwen3-30b-a3b)")
    p.add_argument("--tokens", nargs="+", type=int, default=None, help="step sizes T in the order timed")
    return p.parse_args()


ARGS = parse_args()
if ARGS.dry_run:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

from benchmarks.kernels.graph_timing import time_calls_us
from engine.core.model_spec import get_model
from kernels import _interpreter_compat
from kernels.fused_moe import (
    DirectTiles,
    MoeTiles,
    align_by_expert,
    down_grouped,
    fused_moe,
    gate_up_grouped,
    moe_sum,
    run2_tiles,
    run3_tiles,
)
from kernels.moe_align import _align_hist
from kernels.moe_direct import down_direct, gate_up_direct
from kernels.moe_plans import (
    DIRECT_RUN4,
    PREFILL_RUN4,
    PREFILL_RUN6,
    plan_key,
    run3_best,
    run4_candidates,
    run5_best,
    run6_candidates,
)
from kernels.moe_reference import fused_moe_ref, route_ref

_interpreter_compat.apply()
DEVICE = "cpu" if ARGS.dry_run else "cuda"
DTYPE = torch.float32 if ARGS.dry_run else torch.bfloat16
T0 = time.time()
RESULTS: dict = {"meta": {}, "check": [], "speed": [], "engine": [], "errors": []}
SKIP = set(filter(None, ARGS.skip.split(","))) | ({"engine"} if ARGS.focus else set())
PROBE_FAILED: set[str] = set()  # the features whose probe failed (their plans are not timed)
CHECK_FAILED: set[str] = set()  # --focus: plans whose check failed (not timed)
PATHS = set(filter(None, ARGS.paths.split(",")))


@dataclasses.dataclass(frozen=True)
class FocusRound:
    """One --focus round: its number, the baseline (the previous round's best plan at T), the new
    candidates at (T, k, E), and the prefill plans the dry run walks shrunk."""

    number: int
    baseline: Callable[[int], MoeTiles | DirectTiles]
    candidates: Callable[[int, int, int], list]
    dry_prefill: list

    @property
    def baseline_name(self) -> str:
        """The baseline's name as the results record it (`run5_best`, ...): its function's."""
        return self.baseline.__name__


FOCUS_ROUNDS = {
    4: FocusRound(4, run3_best, run4_candidates, PREFILL_RUN4[:3] + [q for q in PREFILL_RUN4 if q.joint][:1]),
    6: FocusRound(6, run5_best, run6_candidates, PREFILL_RUN6),
}
ROUND = FOCUS_ROUNDS[6 if ARGS.run6 else 4]

# the new grouped path's tile sweep (block_m, block_n, block_k, warps, stages[, group_m]); the big-M
# ones only from 4 rows per expert
TILE_CANDIDATES = [MoeTiles(16, 32, 128, 4, 4), MoeTiles(16, 64, 128, 4, 4), MoeTiles(32, 64, 128, 4, 3),
                   MoeTiles(64, 128, 64, 4, 3), MoeTiles(128, 128, 64, 8, 3), MoeTiles(128, 128, 64, 8, 4),
                   MoeTiles(128, 128, 64, 8, 3, group_m=1), MoeTiles(128, 64, 128, 8, 3),
                   # weight tiles through TMA descriptors
                   MoeTiles(16, 64, 128, 4, 4, tma=True), MoeTiles(64, 128, 64, 4, 3, tma=True),
                   MoeTiles(128, 128, 64, 8, 3, tma=True), MoeTiles(128, 128, 64, 8, 4, tma=True)]
# tried on the best grouped tiles from 1,024 tokens: the down projection's own tile (K = N is short)
DOWN_VARIANTS = [{"down_block_n": 256, "down_block_k": 64, "down_num_warps": 8, "down_num_stages": 3},
                 {"down_block_n": 128, "down_block_k": 128, "down_num_warps": 8, "down_num_stages": 3},
                 {"down_block_n": 64, "down_block_k": 64, "down_num_warps": 4, "down_num_stages": 4}]
# the direct path's sweep, up to DIRECT_MAX_SWEEP_PAIRS (token, expert) pairs
# (gate+up block_n, block_k, down block_n, block_k, warps, stages, dot, pdl): the down FMA tile holds
# k * block_n rows (all of a token's experts), so its bytes per K step are k times block_n's
DIRECT_CANDIDATES = [DirectTiles(16, 256, 8, 128, 4), DirectTiles(32, 128, 16, 64, 4),
                     DirectTiles(16, 512, 8, 256, 8), DirectTiles(8, 512, 16, 128, 8),
                     DirectTiles(32, 128, 32, 128, 4, 4, use_dot=True), DirectTiles(16, 256, 16, 256, 4, 3, use_dot=True),
                     DirectTiles(16, 512, 16, 512, 8),  # mixtral (k=2): 16 KB per down K step
                     DirectTiles(16, 256, 8, 128, 4, pdl=True)]
DIRECT_MAX_SWEEP_PAIRS = 128


def legacy_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles:
    """Run 2's tiles and grouping: the old path."""
    return run2_tiles(num_tokens, top_k, num_experts)


def old_moe(x, w13, w2, tw, ids):
    """Run 2's path: its grouping (one program up to 4,096 pairs, torch ops above), its tiles, torch k-sum."""
    t, k = ids.shape
    return fused_moe(x, w13, w2, tw, ids, legacy_tiles(t, k, w13.shape[0]))


tiles_key = plan_key  # a plan's name in the tables (kernels.moe_plans)


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def over_budget(share: float = 1.0) -> bool:
    """Past `share` of --budget-s (the speed part stops at SPEED_SHARE, leaving the engine its part),
    or, in the speed part, past the current preset's share of it (SPEED_DEADLINE)."""
    late = time.time() - T0 > ARGS.budget_s * share
    return late or (share == SPEED_SHARE and time.time() > SPEED_DEADLINE)


SPEED_SHARE = 1.0 if "engine" in SKIP else 0.7
SPEED_DEADLINE = float("inf")  # set per preset by speed(): each preset gets its share of what is left


def save() -> None:
    ARGS.out.mkdir(parents=True, exist_ok=True)
    (ARGS.out / "moe.json").write_text(json.dumps(RESULTS, indent=1) + "\n")
    (ARGS.out / "moe.md").write_text(focus_markdown(RESULTS) if ARGS.focus else markdown(RESULTS))


# ------------------------------------------------------------------------------- shapes, routing
def layer_shapes() -> dict[str, tuple[int, int, int, int]]:
    """preset -> (hidden H, expert width N, experts E, top k)."""
    if ARGS.dry_run:
        return {"tiny-moe": (64, 32, 8, 2)}
    out = {}
    for name in ("qwen3-30b-a3b", "mixtral-8x7b"):
        m = get_model(name)
        out[name] = (m.hidden_size, m.moe_intermediate_size, m.num_experts, m.experts_per_token)
    return out


def make_weights(h: int, n: int, e: int, copies: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return [((torch.randn(e, 2 * n, h, generator=g, device=DEVICE) / h**0.5).to(DTYPE),
             (torch.randn(e, h, n, generator=g, device=DEVICE) / n**0.5).to(DTYPE)) for _ in range(copies)]


def make_routing(t: int, h: int, e: int, k: int, seed: int):
    """x [T, H] and its routing from a random router (N(0, 1/H) weights: near-uniform experts)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(t, h, generator=g, device=DEVICE).to(DTYPE)
    router = (torch.randn(e, h, generator=g, device=DEVICE) / h**0.5).to(DTYPE)
    w, ids = route_ref(x @ router.t(), k, renormalize=True)
    return x, w, ids


def expected_distinct(e: int, k: int, t: int) -> float:
    """Uniform top-k routing: each expert is missed by one token with probability 1 - k/E."""
    return e * (1 - (1 - k / e) ** t)


def roofline_us(touched: float, t: int, h: int, n: int, k: int) -> dict:
    """Seconds (as us) of the touched experts' bytes at HBM rate and of the FLOPs at the bf16 rate."""
    esize = 2  # bf16
    weight_bytes = touched * 3 * h * n * esize
    act_bytes = t * h * esize * 2 + t * k * (n + h) * esize * 2  # x in, out; act and per-pair rows
    flops = 2 * t * k * 3 * h * n
    mem_us = (weight_bytes + act_bytes) / HBM_BYTES_PER_S * 1e6
    cmp_us = flops / BF16_FLOPS_PER_S * 1e6
    return {"weight_bytes": weight_bytes, "flops": flops, "mem_us": mem_us, "compute_us": cmp_us,
            "roofline_us": max(mem_us, cmp_us)}


# ------------------------------------------------------------------------------- variants
def loop_moe(x, w13, w2, topk_w, topk_ids):
    """The per-expert torch loop: sort the pairs once, one host sync for the counts, F.linear per
    touched expert, a weighted index_add back."""
    _t, k = topk_ids.shape
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    rows = order // k
    wts = topk_w.reshape(-1)[order].to(x.dtype)
    out = torch.zeros_like(x)
    n = w2.shape[-1]
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        r = rows[start:start + c]
        gu = F.linear(x[r], w13[e])
        y = F.linear(F.silu(gu[:, :n]) * gu[:, n:], w2[e])
        out.index_add_(0, r, y * wts[start:start + c, None])
        start += c
    return out


def grouped_mm_moe(x, w13, w2, topk_w, topk_ids):
    """torch._grouped_mm on the expert-sorted rows: offs = the cumulative row count per expert."""
    _t, k = topk_ids.shape
    e, n = w13.shape[0], w2.shape[-1]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    rows = order // k
    gu = torch._grouped_mm(x[rows], w13.transpose(1, 2), offs)
    y = torch._grouped_mm(F.silu(gu[:, :n]) * gu[:, n:], w2.transpose(1, 2), offs)
    y = y * topk_w.reshape(-1)[order].to(x.dtype)[:, None]
    return torch.zeros_like(x).index_add_(0, rows, y)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------- timing
def graph_time_us(calls: list) -> float:
    """Median us per call of a CUDA graph of `calls` (CPU: one eager pass)."""
    return time_calls_us(calls, DEVICE == "cpu", reps=1)


def eager_time_us(calls: list, reps: int = 3) -> float:
    """Median us per call, eager, after one warm pass (the loop syncs on the host every call)."""
    for c in calls:
        c()
    if DEVICE == "cpu":
        return graph_time_us(calls)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        s = time.perf_counter()
        for c in calls:
            c()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - s) * 1e6 / len(calls))
    return sorted(times)[len(times) // 2]


# ------------------------------------------------------------------------------- part 1: check
def check_grouping() -> None:
    """The Triton groupings (run 3's many-program "blocks", run 2's one program) against the torch one
    (same stable output), up to 4,096 tokens of each preset's routing shape."""
    g = torch.Generator(device=DEVICE).manual_seed(5)
    shapes = ((8, 2, 1), (8, 2, 37), (8, 2, 300)) if ARGS.dry_run else (
        (128, 8, 1), (128, 8, 300), (128, 8, 4096), (8, 2, 37), (8, 2, 2048), (8, 2, 4096))
    for e, k, t in shapes:
        ids = torch.stack([torch.randperm(e, generator=g, device=DEVICE)[:k] for _ in range(t)])
        for method in ("blocks", "blocks2", "one_program"):
            if method == "one_program" and t * k > 4096:
                continue
            for block_m in (16, 128):
                try:
                    a = align_by_expert(ids, e, block_m, method=method)
                    b = align_by_expert(ids, e, block_m, method="torch")
                    same = all(torch.equal(x, y) for x, y in zip(a, b))
                except Exception as exc:  # noqa: BLE001
                    same = False
                    RESULTS["errors"].append(f"{method} grouping E={e} k={k} T={t}: {exc!r}"[:400])
                RESULTS["check"].append({"preset": f"grouping E={e} k={k} M={block_m}", "T": t,
                                         "case": f"{method} == torch grouping", "fused_rel_err": 0.0 if same else 1.0,
                                         "ok": same})


def check_variants(t: int, k: int, e: int) -> dict:
    """The paths checked at T tokens: run 2's, the default, the direct path, the grouped one with the
    atomic k-sum and with its own down tile."""
    out = {"old": lambda *a: old_moe(*a), "default": lambda *a: fused_moe(*a, run3_tiles(t, k, e))}
    if "new" not in PATHS:
        return {"old": out["old"]}
    if t * k <= DIRECT_MAX_SWEEP_PAIRS or ARGS.dry_run:
        out["direct"] = lambda *a: fused_moe(*a, DIRECT_CANDIDATES[0])
        out["direct_dot"] = lambda *a: fused_moe(*a, next(c for c in DIRECT_CANDIDATES if c.use_dot))
    big = MoeTiles(128, 128, 64, 8, 3)
    out["grouped_atomic"] = lambda *a: fused_moe(*a, MoeTiles(32, 64, 128, 4, 3, atomic_sum=True))
    out["grouped_down_tile"] = lambda *a: fused_moe(*a, dataclasses.replace(big, **DOWN_VARIANTS[0]))
    if any(c.tma for c in TILE_CANDIDATES):  # TMA passed the probe
        out["grouped_tma"] = lambda *a: fused_moe(*a, dataclasses.replace(big, tma=True, atomic_sum=True))
    return out


def check() -> None:
    """Every path against the float32 per-expert loop, bf16 tolerance 1e-2."""
    check_grouping()
    # the dry run: T = 1 (the direct path by default) and 20 (grouped, two 16-row blocks on the same experts)
    ts = (1, 20) if ARGS.dry_run else (1, 7, 64, 300)
    for name, (h, n, e, k) in layer_shapes().items():
        (w13, w2), = make_weights(h, n, e, 1, seed=1)
        ref_w = (w13.float(), w2.float())
        for t in ts:
            x, tw, ids = make_routing(t, h, e, k, seed=t)
            cases = {"random": ids, "same_experts": torch.arange(k, device=DEVICE).expand(t, k).contiguous()}
            for case, cids in cases.items():
                ref = fused_moe_ref(x.float(), *ref_w, tw, cids)
                row = {"preset": name, "T": t, "case": case, "errors_by_path": {}}
                for path, fn in check_variants(t, k, e).items():
                    try:
                        row["errors_by_path"][path] = rel(fn(x, w13, w2, tw, cids), ref)
                    except Exception as exc:  # noqa: BLE001 - record, keep going
                        row["errors_by_path"][path] = 1.0
                        RESULTS["errors"].append(f"check {name} T={t} {case} {path}: {exc!r}"[:400])
                row["fused_rel_err"] = max(row["errors_by_path"].values())
                row["ok"] = row["fused_rel_err"] <= 1e-2
                RESULTS["check"].append(row)
                log(f"check {name} T={t} {case}: " + " ".join(f"{p} {v:.1e}" for p, v in row["errors_by_path"].items()))
        del w13, w2, ref_w


PROBE_FEATURES = ("core", "tma", "pdl", "early", "pipe", "hist", "joint", "sorted")


def probe_plans() -> dict:
    """Each feature's plans: core (the direct path, the many-program grouping, the atomic k-sum), TMA
    weight tiles, programmatic dependent launch; run 4: the early launch with the L2 prefetch (inline
    PTX), the direct path's pipelined loops, the "hist" grouping with the Triton k-sum, the joint gate+up dot;
    run 5: sorted activations with the TMA-fed / persistent down launch."""
    return {"core": [DIRECT_CANDIDATES[0], next(c for c in DIRECT_CANDIDATES if c.use_dot),
                     MoeTiles(16, 64, 128, 4, 4, atomic_sum=True), MoeTiles(64, 128, 64, 4, 3)],
            "tma": [c for c in TILE_CANDIDATES if c.tma][:2],
            "pdl": [c for c in DIRECT_CANDIDATES if c.pdl],
            "early": [c for c in DIRECT_RUN4 if c.early and not c.pipeline][:2],
            "pipe": [c for c in DIRECT_RUN4 if c.pipeline][:2],
            "joint": [MoeTiles(64, 64, 64, 4, 3, tma=True, joint=True, align="hist", ksum="triton")],
            # run 5: activations in sorted order, the TMA-fed down launch (one tile a program, persistent)
            "sorted": [MoeTiles(64, 64, 64, 4, 3, tma=True, joint=True, align="hist", ksum="triton", sorted_act=True),
                       MoeTiles(64, 64, 64, 4, 3, tma=True, joint=True, align="hist", sorted_act=True, persistent=1,
                                atomic_sum=True)],
            "hist": [MoeTiles(64, 128, 64, 4, 3, align="hist", ksum="triton"), MoeTiles(16, 64, 128, 4, 4, align="hist")]}


def probe_body(features: tuple[str, ...]) -> None:
    """Each feature's plans on a small layer, eager and in a CUDA graph, against the reference; prints
    `PROBE_OK feature` for each that passes (a crash stops the later ones: they count as failed)."""
    h, n, e, k = (64, 32, 8, 2) if ARGS.dry_run else (256, 128, 16, 4)
    (w13, w2), = make_weights(h, n, e, 1, seed=3)
    for feature in features:
        try:
            for t in (9,) if ARGS.dry_run else (2, 40, 1100):  # 1100 x 4: the hist grouping's two launches
                x, tw, ids = make_routing(t, h, e, k, seed=3)
                ref = fused_moe_ref(x.float(), w13.float(), w2.float(), tw, ids)
                for plan in probe_plans()[feature]:
                    if not ARGS.dry_run:  # the capture is what is probed; on the CPU it would only run the call twice
                        graph_time_us([lambda p=plan, a=(x, w13, w2, tw, ids): fused_moe(*a, p)])
                    err = rel(fused_moe(x, w13, w2, tw, ids, plan), ref)
                    assert err <= 1e-2, f"{tiles_key(plan)} T={t}: relative error {err:.2e}"
            print(f"PROBE_OK {feature}", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported, the next feature still tried
            print(f"PROBE_FAIL {feature}: {exc!r}"[:400], flush=True)


def probe() -> None:
    """The new kernels' features tried first in a subprocess (a failed graph capture or a faulting
    kernel must not break this process's CUDA context); a failing feature's plans leave the sweep
    (core failing: only the old path is measured). CPU dry run: core and TMA in this process."""
    global DIRECT_CANDIDATES, TILE_CANDIDATES, PATHS
    if DEVICE == "cuda":
        import subprocess

        try:
            done = subprocess.run([sys.executable, __file__, "--out", str(ARGS.out / "probe"), "--probe-only"],
                                  capture_output=True, text=True, timeout=150, check=False)
            out = done.stdout + done.stderr[-600:]
        except subprocess.TimeoutExpired as exc:
            out = f"timeout: {exc!r}"
        ok = {f for f in PROBE_FEATURES if f"PROBE_OK {f}" in out}
        if ok != set(PROBE_FEATURES):
            RESULTS["errors"].append(f"probe: only {sorted(ok)} passed: " + out[-500:])
    else:
        import contextlib
        import io

        buf = io.StringIO()
        # the interpreter: only what is timed (focus: its plans' features; else the direct path's PDL and
        # TMA tiles beside the core: the other features' plans are timed only in focus mode)
        wanted = focus_features() if ARGS.focus else ("core", "tma", "pdl")
        with contextlib.redirect_stdout(buf):
            probe_body(wanted)  # the interpreter skips the gdc waits and the prefetch (kernels.moe_direct)
        ok = {f for f in wanted if f"PROBE_OK {f}" in buf.getvalue()}
    RESULTS["meta"]["probe_ok"] = sorted(ok)
    PROBE_FAILED.update(set(PROBE_FEATURES) - ok)
    if "pdl" not in ok:
        DIRECT_CANDIDATES = [c for c in DIRECT_CANDIDATES if not c.pdl]
    if "tma" not in ok:
        TILE_CANDIDATES = [c for c in TILE_CANDIDATES if not c.tma]
    if "core" not in ok:
        PATHS = PATHS & {"old"}
        RESULTS["errors"].append("probe: the new kernels failed; only run 2's path is measured")


# ------------------------------------------------------------------------------- part 2: speed
def copies_for(h: int, n: int, k: int) -> int:
    """Weight copies the timed calls cycle over: their touched bytes at T=1 at least 4x the L2."""
    if ARGS.dry_run:
        return 1
    touched_t1 = k * 3 * h * n * 2
    return max(1, min(4, math.ceil(4 * L2_BYTES / touched_t1)))


def phase_times(weights: list, routes: list, tiles: MoeTiles | DirectTiles, e: int, k: int, reps: int,
                align: str = "blocks") -> dict:
    """us per call of the grouping, the gate+up launch and the down launch (+ k-sum) of `tiles`, each alone."""
    if isinstance(tiles, DirectTiles):
        acts = [gate_up_direct(r[0], w[0], r[2], tiles) for w, r in zip(weights, routes)]
        return {"align_us": 0.0,
                "gate_up_us": graph_time_us([lambda w=w, r=r: gate_up_direct(r[0], w[0], r[2], tiles)
                                             for w, r in zip(weights, routes)] * reps),
                "down_us": graph_time_us([lambda w=w, r=r, a=a: down_direct(a, w[1], r[1], r[2], tiles)
                                          for w, r, a in zip(weights, routes, acts)] * reps)}
    groups = [align_by_expert(r[2], e, tiles.block_m, method=align) for r in routes]
    acts = [gate_up_grouped(r[0], w[0], *gr, k, tiles) for w, r, gr in zip(weights, routes, groups)]
    out = {}
    if align == "blocks":  # the grouping always in two launches (count, scatter), for comparison
        out["align_two_launch_us"] = graph_time_us([lambda r=r: align_by_expert(r[2], e, tiles.block_m, method="blocks2")
                                                    for r in routes] * reps)
    return out | {
        "align_us": graph_time_us([lambda r=r: align_by_expert(r[2], e, tiles.block_m, method=align)
                                   for r in routes] * reps),
        "gate_up_us": graph_time_us([lambda w=w, r=r, gr=gr: gate_up_grouped(r[0], w[0], *gr, k, tiles)
                                     for w, r, gr in zip(weights, routes, groups)] * reps),
        "down_us": graph_time_us([lambda w=w, r=r, gr=gr, a=a: down_grouped(a, w[1], *gr, r[1], tiles)
                                  for w, r, gr, a in zip(weights, routes, groups, acts)] * reps),
    }


def candidates(t: int, k: int, e: int) -> list:
    """The new path's plans timed at T: direct (few pairs), grouped tiles by rows per expert."""
    rows_per_expert = t * k / e
    cands = [c for c in DIRECT_CANDIDATES if t * k <= DIRECT_MAX_SWEEP_PAIRS]
    cands += [c for c in TILE_CANDIDATES if c.block_m <= 32 or rows_per_expert > 4]
    if ARGS.dry_run:  # one of each kind, small tiles
        cands = [DIRECT_CANDIDATES[0], MoeTiles(16, 16, 16, 4, 1)] + ([DIRECT_CANDIDATES[4]] if t == 1 else [])
        cands += [dataclasses.replace(MoeTiles(16, 16, 16, 4, 1), atomic_sum=True)] if t == 4 else []
    return cands


def time_plans(fn_calls, plans: list, into: dict, name: str, t: int) -> None:
    for tiles in plans:
        key = tiles_key(tiles)
        if key in into or over_budget(SPEED_SHARE):
            continue
        try:
            into[key] = graph_time_us(fn_calls(tiles))
        except Exception as exc:  # noqa: BLE001
            RESULTS["errors"].append(f"fused {name} T={t} {key}: {exc!r}"[:400])


def sweep_new(row: dict, calls, name: str, t: int, k: int, e: int) -> MoeTiles | DirectTiles | None:
    """Times every candidate, then on the best grouped tiles the atomic k-sum and (from 1,024 tokens)
    the down projection's own tiles; returns the best plan."""
    by = row["fused_by_tiles"]
    plans = {tiles_key(c): c for c in candidates(t, k, e)}
    time_plans(lambda c: calls(fused_moe, tiles=c), list(plans.values()), by, name, t)
    grouped = [key for key in by if not key.startswith("direct")]
    big = t >= 1024 or (ARGS.dry_run and t == 16)  # prefill sizes (the dry run walks this code at T=16)
    if grouped:
        best_g = plans[min(grouped, key=by.get)]
        extra = [dataclasses.replace(best_g, atomic_sum=True)]
        if big:
            extra += [dataclasses.replace(best_g, **v) for v in DOWN_VARIANTS]
        plans.update({tiles_key(c): c for c in extra})
        time_plans(lambda c: calls(fused_moe, tiles=c), extra, by, name, t)
        downs = [key for key in by if "/down" in key and "atomic" not in key]
        if big and downs:  # the best down tile with the atomic k-sum too
            c = dataclasses.replace(plans[min(downs, key=by.get)], atomic_sum=True)
            plans[tiles_key(c)] = c
            time_plans(lambda c: calls(fused_moe, tiles=c), [c], by, name, t)
    d = run3_tiles(t, k, e)  # run 3's rule (its measured plans per T are kernels.moe_plans.RUN3_BEST)
    plans.setdefault(tiles_key(d), d)
    time_plans(lambda c: calls(fused_moe, tiles=c), [d], by, name, t)
    row["default_tiles"] = tiles_key(d)
    row["default_us"] = by.get(tiles_key(d))
    if not by:
        return None
    best = min(by, key=by.get)
    return plans[best]


def speed_one(name: str, h: int, n: int, e: int, k: int, t: int, weights: list) -> dict:
    routes = [make_routing(t, h, e, k, seed=1000 * t + i) for i in range(len(weights))]
    touched = sum(len(torch.unique(ids)) for _, _, ids in routes) / len(routes)
    roof = roofline_us(touched, t, h, n, k)
    reps = 1 if ARGS.dry_run else max(1, min(10, math.ceil(2000 / (roof["roofline_us"] * len(weights)))))

    def calls(fn, **kw):
        return [lambda w=w, r=r: fn(r[0], w[0], w[1], r[1], r[2], **kw) for w, r in zip(weights, routes)] * reps

    row = {"preset": name, "T": t, "H": h, "N": n, "E": e, "k": k, "copies": len(weights), "calls": len(weights) * reps,
           "touched_experts": touched, "expected_touched_uniform": expected_distinct(e, k, t), **roof, "fused_by_tiles": {}}
    if "old" in PATHS:
        try:
            row["old_us"] = graph_time_us(calls(old_moe))
            row["old_vs_roofline"] = row["old_us"] / roof["roofline_us"]
            row["old_tiles"] = tiles_key(legacy_tiles(t, k, e))
            row["old_phases"] = phase_times(weights, routes, legacy_tiles(t, k, e), e, k, reps, align="legacy")
        except Exception as exc:  # noqa: BLE001
            RESULTS["errors"].append(f"old {name} T={t}: {exc!r}"[:400])
    best = sweep_new(row, calls, name, t, k, e) if "new" in PATHS else None
    if best is not None:
        key = tiles_key(best)
        row["fused_us"], row["fused_tiles"] = row["fused_by_tiles"][key], key
        row["fused_vs_roofline"] = row["fused_us"] / roof["roofline_us"]
        row["fused_tflops"] = roof["flops"] / row["fused_us"] / 1e6
        try:  # the grouping, and each launch, alone (their shares of the fused time)
            row.update(phase_times(weights, routes, best, e, k, reps))
        except Exception as exc:  # noqa: BLE001
            row["phase_error"] = repr(exc)[:300]
    alternatives = (("loop", loop_moe, eager_time_us), ("grouped_mm", grouped_mm_moe, graph_time_us))
    for label, fn, timer in alternatives if ARGS.alternatives else ():
        try:
            row[f"{label}_us"] = timer(calls(fn)[: len(weights)] if label == "loop" else calls(fn))
        except Exception as exc:  # noqa: BLE001
            row[f"{label}_error"] = repr(exc)[:300]
    return row


def speed() -> None:
    global SPEED_DEADLINE
    ts = (1, 4, 16) if ARGS.dry_run else TS
    shapes = layer_shapes()
    by_preset_t = lambda r: (list(shapes).index(r["preset"]), r["T"])  # rows by T, as before run 3
    for i, (name, shape) in enumerate(shapes.items()):
        left = T0 + ARGS.budget_s * SPEED_SHARE - time.time()
        SPEED_DEADLINE = time.time() + left / (len(shapes) - i)  # this preset's share of what is left
        rows_over_tokens(name, shape, ts, speed_one, lambda row: (
            f"speed {row['preset']} T={row['T']}: touched {row['touched_experts']:.1f} roof "
            f"{row['roofline_us']:.1f}us old {row.get('old_us', float('nan')):.1f}us new "
            f"{row.get('fused_us', float('nan')):.1f}us ({row.get('fused_tiles')}) default "
            f"{row.get('default_us') or float('nan'):.1f}us"), order=by_preset_t)


def rows_over_tokens(name: str, shape: tuple[int, int, int, int], ts, one, describe, order=None) -> None:
    """`one(name, h, n, e, k, t, weights)` for each T of `ts` while the speed budget lasts, over one set
    of the preset's weights: each row appended to RESULTS["speed"] (sorted by `order` when given),
    logged as `describe(row)` says, saved; a T that raises is recorded in RESULTS["errors"]."""
    h, n, e, k = shape
    weights = make_weights(h, n, e, copies_for(h, n, k), seed=7)
    for t in ts:
        if over_budget(SPEED_SHARE):
            RESULTS["errors"].append(f"budget spent before speed {name} T={t}")
            break
        try:
            row = one(name, h, n, e, k, t, weights)
        except Exception as exc:  # noqa: BLE001
            RESULTS["errors"].append(f"speed {name} T={t}: {exc!r}"[:400])
            log(traceback.format_exc())
            continue
        RESULTS["speed"].append(row)
        if order is not None:
            RESULTS["speed"].sort(key=order)
        log(describe(row))
        save()
    del weights
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------- run 4: --focus
FOCUS_TS = (4096, 1, 2, 1024, 4, 8)  # the prefill target first, then decode's misses
FOCUS_PRESETS = ("qwen3-30b-a3b",)


def plan_features(plan: MoeTiles | DirectTiles) -> set[str]:
    """The probe features a plan needs."""
    if isinstance(plan, DirectTiles):
        return ({"core"} | ({"pdl"} if plan.pdl else set()) | ({"early"} if plan.early and plan.pdl else set())
                | ({"pipe"} if plan.pipeline else set()))
    return ({"core"} | ({"tma"} if plan.tma else set())
            | ({"hist"} if plan.align == "hist" or (plan.ksum == "triton" and not plan.atomic_sum) else set())
            | ({"joint"} if plan.joint and plan.tma else set()) | ({"sorted"} if plan.sorted_act else set()))


def focus_candidates(t: int, k: int, e: int) -> list[MoeTiles | DirectTiles]:
    """The baseline and the run's candidates at T (the dry run also walks the prefill tiles, shrunk,
    at its largest T), before any probe or check result."""
    plans = [ROUND.baseline(t), *ROUND.candidates(t, k, e)]
    if ARGS.dry_run and t == max(focus_tokens()):
        plans += [dataclasses.replace(p, block_m=16, block_n=16, block_k=16, num_stages=1,
                                      down_block_n=16, down_block_k=16, down_num_stages=1) for p in ROUND.dry_prefill]
    return plans


def focus_plans(t: int, k: int, e: int) -> dict:
    """key -> plan at T: the baseline first, then the candidates whose features passed the probe and
    whose check passed."""
    return {tiles_key(p): p for p in focus_candidates(t, k, e)
            if not plan_features(p) & PROBE_FAILED and tiles_key(p) not in CHECK_FAILED}


def focus_tokens() -> tuple[int, ...]:
    if ARGS.tokens:
        return tuple(ARGS.tokens)
    return (1, 4, 16) if ARGS.dry_run else FOCUS_TS


def focus_features() -> tuple[str, ...]:
    """The probe features of the plans the focus mode would time (before any probe result)."""
    need = {"core"}
    for _h, _n, e, k in focus_shapes().values():
        for t in focus_tokens():
            for plan in focus_candidates(t, k, e):
                need |= plan_features(plan)
    return tuple(f for f in PROBE_FEATURES if f in need)


def focus_shapes() -> dict:
    shapes = layer_shapes()
    if ARGS.dry_run:
        return shapes
    names = ARGS.presets or FOCUS_PRESETS
    unknown = [n for n in names if n not in shapes]
    if unknown:
        raise SystemExit(f"--presets: {unknown} not among {sorted(shapes)}")
    return {n: shapes[n] for n in names}


def focus_check() -> None:
    """The new groupings against the torch one (up to 32K pairs), and every plan the speed part will
    time against the float32 per-expert loop (direct plans at T = 1, 3; grouped at 7, 300, 600 and
    every token on the same experts; 2200: experts of one full 128-row block and a part-filled one); a
    plan that fails is not timed."""
    g = torch.Generator(device=DEVICE).manual_seed(5)
    shapes = ((8, 2, 37), (128, 8, 20)) if ARGS.dry_run else ((128, 8, 1), (128, 8, 300), (128, 8, 1500),
                                                              (128, 8, 4096), (8, 2, 37))
    for e, k, t in shapes:
        ids = torch.stack([torch.randperm(e, generator=g, device=DEVICE)[:k] for _ in range(t)])
        same = torch.arange(k, device=DEVICE).expand(t, k).contiguous()
        for case, routing in (("random", ids), ("same_experts", same)):
            for method in ("hist", "hist2"):
                for block_m in (16, 64, 128):
                    try:
                        same_out = all(torch.equal(a, b) for a, b in zip(
                            align_by_expert(routing, e, block_m, method=method),
                            align_by_expert(routing, e, block_m, method="torch")))
                    except Exception as exc:  # noqa: BLE001
                        same_out = False
                        RESULTS["errors"].append(f"{method} grouping E={e} k={k} T={t}: {exc!r}"[:400])
                    RESULTS["check"].append({"preset": f"grouping E={e} k={k} M={block_m}", "T": t, "case": case,
                                             "path": f"{method} == torch", "fused_rel_err": 0.0 if same_out else 1.0,
                                             "ok": same_out})
    for name, (h, n, e, k) in focus_shapes().items():
        (w13, w2), = make_weights(h, n, e, 1, seed=1)
        plans = {}
        for t in focus_tokens():
            plans.update(focus_plans(t, k, e))
        for t in (1, 3, 5, 20) if ARGS.dry_run else (1, 3, 7, 300, 600, 2200):
            x, tw, ids = make_routing(t, h, e, k, seed=t)
            cases = {"random": ids}
            if t >= 7:
                cases["same_experts"] = torch.arange(k, device=DEVICE).expand(t, k).contiguous()
            for case, cids in cases.items():
                ref = fused_moe_ref(x.float(), w13.float(), w2.float(), tw, cids)
                for key, plan in plans.items():
                    if isinstance(plan, DirectTiles) != (t <= 3):
                        continue
                    try:
                        err = rel(fused_moe(x, w13, w2, tw, cids, plan), ref)
                    except Exception as exc:  # noqa: BLE001 - record, keep going
                        err = 1.0
                        RESULTS["errors"].append(f"check {name} T={t} {case} {key}: {exc!r}"[:400])
                    RESULTS["check"].append({"preset": name, "T": t, "case": case, "path": key,
                                             "fused_rel_err": err, "ok": err <= 1e-2})
                    if err > 1e-2:
                        CHECK_FAILED.add(key)
            log(f"check {name} T={t}: worst {max(r['fused_rel_err'] for r in RESULTS['check']):.1e}")
        del w13, w2


def ksum_us(ys: list, k: int, how: str, reps: int) -> float:
    """us per k-sum of the per-pair rows: torch's strided sum or kernels.fused_moe.moe_sum."""
    if how == "triton":
        return graph_time_us([lambda y=y: moe_sum(y, k) for y in ys] * reps)
    return graph_time_us([lambda y=y: y.view(-1, k, y.shape[1]).sum(dim=1) for y in ys] * reps)


def focus_phases(weights: list, routes: list, plan: MoeTiles | DirectTiles, e: int, k: int, reps: int) -> dict:
    """A plan's launches each alone (grouping, gate+up, down, k-sum); for a grouped plan also every
    grouping method and both k-sums, so the table sets old and new side by side."""
    if isinstance(plan, DirectTiles):
        return phase_times(weights, routes, plan, e, k, reps)
    out = phase_times(weights, routes, plan, e, k, reps, align=plan.align)
    out.pop("align_two_launch_us", None)
    for method in ("blocks", "hist", "hist2"):
        if "hist" in PROBE_FAILED and method != "blocks":
            continue
        out[f"align_{method}_us"] = graph_time_us([lambda r=r, m=method: align_by_expert(r[2], e, plan.block_m, method=m)
                                                   for r in routes] * reps)
    for chunk in () if "hist" in PROBE_FAILED else (128, 256, 512):  # the hist grouping's two launches by chunk
        out[f"align_hist2_c{chunk}_us"] = graph_time_us([lambda r=r, c=chunk: _align_hist(r[2], e, plan.block_m, 0, c)
                                                         for r in routes] * reps)
    if not plan.atomic_sum:
        groups = [align_by_expert(r[2], e, plan.block_m, method="torch") for r in routes]
        ys = [down_grouped(gate_up_grouped(r[0], w[0], *gr, k, plan), w[1], *gr, r[1], plan)
              for w, r, gr in zip(weights, routes, groups)]
        for how in ("torch", "triton"):
            if how == "triton" and "hist" in PROBE_FAILED:
                continue
            out[f"ksum_{how}_us"] = ksum_us(ys, k, how, reps)
        out["ksum_us"] = out.get(f"ksum_{plan.ksum}_us")
        del ys
    return out


def focus_one(name: str, h: int, n: int, e: int, k: int, t: int, weights: list) -> dict:
    routes = [make_routing(t, h, e, k, seed=1000 * t + i) for i in range(len(weights))]
    touched = sum(len(torch.unique(ids)) for _, _, ids in routes) / len(routes)
    roof = roofline_us(touched, t, h, n, k)
    reps = 1 if ARGS.dry_run else max(1, min(10, math.ceil(2000 / (roof["roofline_us"] * len(weights)))))

    def calls(plan):
        return [lambda w=w, r=r: fused_moe(r[0], w[0], w[1], r[1], r[2], plan)
                for w, r in zip(weights, routes)] * reps

    plans = focus_plans(t, k, e)
    base = tiles_key(ROUND.baseline(t))
    row = {"preset": name, "T": t, "H": h, "N": n, "E": e, "k": k, "copies": len(weights), "calls": len(weights) * reps,
           "touched_experts": touched, **roof, "run3_plan": base, "fused_by_tiles": {}}
    time_plans(calls, list(plans.values()), row["fused_by_tiles"], name, t)
    by = row["fused_by_tiles"]
    if not by:
        return row
    row["run3_us"] = by.get(base)
    best = min(by, key=by.get)
    new = [key for key in by if key != base]
    row.update(fused_tiles=best, fused_us=by[best], fused_vs_roofline=by[best] / roof["roofline_us"],
               fused_tflops=roof["flops"] / by[best] / 1e6)
    if new:
        best_new = min(new, key=by.get)
        row.update(new_tiles=best_new, new_us=by[best_new], new_vs_roofline=by[best_new] / roof["roofline_us"])
    # the best plan with the Triton k-sum (its k-sum phase: the prefill target's)
    ksum_keys = [key for key in by if "ksum-triton" in key]
    row["ksum_best_tiles"] = min(ksum_keys, key=by.get) if ksum_keys else None
    for label, key in (("run3", base), ("new", row.get("new_tiles")), ("ksum_best", row["ksum_best_tiles"])):
        if label == "ksum_best" and key == row.get("new_tiles"):
            continue
        if key in plans and key in by and not over_budget(SPEED_SHARE):
            try:
                row[f"{label}_phases"] = focus_phases(weights, routes, plans[key], e, k, reps)
            except Exception as exc:  # noqa: BLE001
                RESULTS["errors"].append(f"phases {name} T={t} {key}: {exc!r}"[:400])
    return row


def focus_speed() -> None:
    for name, shape in focus_shapes().items():
        rows_over_tokens(name, shape, focus_tokens(), focus_one, lambda row: (
            f"focus {row['preset']} T={row['T']}: roof {row['roofline_us']:.1f}us run3 "
            f"{row.get('run3_us') or float('nan'):.1f}us best new {row.get('new_us', float('nan')):.1f}us "
            f"({row.get('new_tiles')})"))


def focus_markdown(res: dict) -> str:
    m = res["meta"]
    ph = ("align_us", "gate_up_us", "down_us", "ksum_us")
    run, base = f"run {ROUND.number}", f"baseline ({ROUND.baseline_name})"
    lines = [f"# Fused MoE, {run} focus, on {m.get('gpu', '?')} ({m.get('date', '?')})", "",
             (f"`{m.get('command', '')}`; torch {m.get('torch')}, triton {m.get('triton')}; probe ok: "
              f"{', '.join(m.get('probe_ok', []))}. Roofline: touched experts' bytes / 4.2 TB/s vs FLOPs / 790 "
              "TFLOP/s. Times: median us per call of CUDA-graph replays; phases: each launch alone "
              "(grouping / gate+up / down / k-sum)."), ""]
    if res["check"]:
        worst = max(r["fused_rel_err"] for r in res["check"])
        bad = [f"{r['preset']} T={r['T']} {r.get('path')}" for r in res["check"] if not r["ok"]]
        lines += [(f"Correctness: {len(res['check'])} cases (groupings == torch's; every plan against the float32 "
                   f"loop), worst relative error {worst:.2e}: {'ok' if not bad else 'FAILED: ' + '; '.join(bad[:8])}."), ""]
    lines += [(f"| preset | T | roofline us | {base} us (plan) | x | best new us (plan) | x | TFLOP/s (best) | "
               f"{base} phases | new phases | grouping blocks / hist / hist2 us | k-sum torch / triton us |"),
              "|---|---:|---:|---|---:|---|---:|---:|---|---|---|---|"]
    for r in res["speed"]:
        r3, nw = r.get("run3_phases", {}), r.get("new_phases", {})
        kb = r.get("ksum_best_phases", {})
        grp = next((p for p in (nw, kb, r3) if "align_hist_us" in p), {})
        ks = next((p for p in (nw, kb, r3) if "ksum_torch_us" in p), {})
        lines.append(
            f"| {r['preset']} | {r['T']} | {r['roofline_us']:.1f} | {_f(r.get('run3_us'))} ({r.get('run3_plan')}) | "
            f"{_f((r.get('run3_us') or 0) / r['roofline_us'] or None, '.2f')} | {_f(r.get('new_us'))} ({r.get('new_tiles', '-')}) | "
            f"{_f(r.get('new_vs_roofline'), '.2f')} | {_f(r.get('fused_tflops'), '.0f')} | "
            f"{_phases(r3, ph)} | {_phases(nw, ph)} | "
            f"{' / '.join(_f(grp.get(f'align_{x}_us')) for x in ('blocks', 'hist', 'hist2'))} "
            f"(chunks 128/256/512: {' / '.join(_f(grp.get(f'align_hist2_c{c}_us')) for c in (128, 256, 512))}) | "
            f"{_f(ks.get('ksum_torch_us'))} / {_f(ks.get('ksum_triton_us'))} |")
    lines += ["", "Every plan (us per call):", ""]
    for r in res["speed"]:
        cells = ", ".join(f"{k_} {v:.1f}" for k_, v in sorted(r["fused_by_tiles"].items(), key=lambda kv: kv[1]))
        lines.append(f"- {r['preset']} T={r['T']}: {cells}")
    if res["errors"]:
        lines += ["", "Errors:", *[f"- {e}" for e in res["errors"]]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- report
def _phases(p: dict, names: tuple) -> str:
    """A plan's phases as `a / b / c / d`."""
    return " / ".join(_f(p.get(x)) for x in names)


def _f(v, fmt=".1f") -> str:
    return "-" if v is None else format(v, fmt)


def markdown(res: dict) -> str:
    m = res["meta"]
    lines = [f"# Fused MoE on {m.get('gpu', '?')} ({m.get('date', '?')})", "",
             (f"`{m.get('command', '')}`; torch {m.get('torch')}, triton {m.get('triton')}. Roofline: touched "
             f"experts' bytes / {HBM_BYTES_PER_S / 1e12:.1f} TB/s vs FLOPs / {BF16_FLOPS_PER_S / 1e12:.0f} TFLOP/s "
             "(rates fixed in issue 29's brief). Times: median us per call, CUDA-graph replays (loop: eager)."), ""]
    if res["check"]:
        worst = max(r["fused_rel_err"] for r in res["check"])
        lines += [(f"Correctness: {len(res['check'])} cases, worst fused relative error {worst:.2e} "
                  f"({'ok' if all(r['ok'] for r in res['check']) else 'FAILED'}, bound 1e-2)."), ""]
    lines += [("| preset | T | experts touched (uniform formula) | roofline us | old us | x | new us (best plan) | x "
               "| TFLOP/s | new grouping / gate+up / down us | default plan us | loop us | grouped_mm us |"),
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(res["speed"], key=lambda r: (r["preset"], r["T"])):
        lines.append(f"| {r['preset']} | {r['T']} | {r['touched_experts']:.1f} ({r['expected_touched_uniform']:.1f}) | "
                     f"{r['roofline_us']:.1f} | {_f(r.get('old_us'))} | {_f(r.get('old_vs_roofline'), '.2f')} | "
                     f"{_f(r.get('fused_us'))} ({r.get('fused_tiles', '-')}) | "
                     f"{_f(r.get('fused_vs_roofline'), '.2f')} | {_f(r.get('fused_tflops'), '.0f')} | "
                     f"{_f(r.get('align_us'))} / {_f(r.get('gate_up_us'))} / {_f(r.get('down_us'))} | "
                     f"{_f(r.get('default_us'))} | {_f(r.get('loop_us'))} | {_f(r.get('grouped_mm_us'))} |")
    sweep = sorted((r for r in res["speed"] if r.get("fused_by_tiles")), key=lambda r: (r["preset"], r["T"]))
    if sweep:
        lines += ["", "Sweep of the new path (us per call by plan; old = run 2's path in this run):", ""]
        for r in sweep:
            cells = ", ".join(f"{k_} {v:.1f}" for k_, v in sorted(r["fused_by_tiles"].items(), key=lambda kv: kv[1]))
            old = r.get("old_phases", {})
            lines.append(f"- {r['preset']} T={r['T']}: {cells}; old phases {_f(old.get('align_us'))} / "
                         f"{_f(old.get('gate_up_us'))} / {_f(old.get('down_us'))}")
    if res["engine"]:
        lines += ["", ("Engine steps: random weights, greedy, prompts of 128 tokens; GPU ms per step (median of decode "
                       "steps). `-4l`: a reduced-layer model (full per-layer shapes, 4 of the 48 layers)."), "",
                  "| model | graphs | batch | prefill steps (tokens: ms) | decode ms (median) | decode steps |",
                  "|---|---|---:|---|---:|---:|"]
        keys = sorted({(r.get("model", "-"), r["graphs"], r["batch"]) for r in res["engine"]},
                      key=lambda k: (k[0], not k[1], k[2]))
        for model, graphs, b in keys:
            rows = [r for r in res["engine"] if r.get("model", "-") == model and r["graphs"] == graphs
                    and r["batch"] == b]
            pre = ", ".join(f"{r['tokens']}: {r['step_ms']:.2f}" for r in rows if r["kind"] != "decode")
            dec = sorted(r["step_ms"] for r in rows if r["kind"] == "decode")
            med = dec[len(dec) // 2] if dec else None
            lines.append(f"| {model} | {graphs} | {b} | {pre} | {_f(med, '.3f')} | {len(dec)} |")
    if res["errors"]:
        lines += ["", "Errors:", *[f"- {e}" for e in res["errors"]]]
    return "\n".join(lines) + "\n"


def main() -> None:
    RESULTS["meta"] = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "command": " ".join(["python3", *sys.argv]), "hbm_bytes_per_s": HBM_BYTES_PER_S,
                       "bf16_flops_per_s": BF16_FLOPS_PER_S, "has_grouped_mm": hasattr(torch, "_grouped_mm"),
                       # --focus: the baseline plan whose time the speed rows' run3_us / run3_plan hold
                       "focus_baseline": ROUND.baseline_name}
    try:
        import triton
        RESULTS["meta"]["triton"] = triton.__version__
    except ImportError:
        pass
    parts = (("probe", probe), ("check", check), ("speed", speed), ("engine", engine_steps))
    if ARGS.focus:
        parts = (("probe", probe), ("check", focus_check), ("speed", focus_speed))
    for part, fn in parts:
        if part in SKIP:
            continue
        if over_budget():
            RESULTS["errors"].append(f"budget spent before {part}")
            break
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - keep what the other parts measured
            RESULTS["errors"].append(f"{part}: {exc!r}"[:600])
            log(traceback.format_exc())
        save()
    save()
    log(f"done in {time.time() - T0:.0f}s; errors: {RESULTS['errors']}")


ENGINE_LAYERS = 4  # the reduced-layer qwen3-30b-a3b of part 3 (full per-layer shapes)
FULL_MODEL_MIN_LEFT_S = 45  # part 4 (the whole 48-layer model) starts only with this much budget left


def engine_spec(layers: int | None = ENGINE_LAYERS):
    """The engine's model: tiny-moe on the CPU; qwen3-30b-a3b with `layers` layers (None: all 48)."""
    if ARGS.dry_run:
        return get_model("tiny-moe").model_copy(update={"name": "tiny-moe-all"} if layers is None else {})
    full = get_model("qwen3-30b-a3b")
    if layers is None:
        return full
    return full.model_copy(update={"name": f"qwen3-30b-a3b-{layers}l", "num_layers": layers})


def engine_run(llm, batch: int, prompt_len: int, out_len: int, graphs: bool, record: bool = True) -> None:
    """`batch` prompts of `prompt_len` random tokens, `out_len` greedy tokens each; one row per step
    (`record` False: a warm-up pass, which compiles the eager steps' kernel variants)."""
    from engine.sampling import SamplingParams

    g = torch.Generator().manual_seed(batch)
    vocab = llm.engine.spec.vocab_size
    prompts = [torch.randint(16, vocab, (prompt_len,), generator=g).tolist() for _ in range(batch)]
    llm.step_traces.clear()
    llm.generate(prompts, SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True))
    for st in llm.step_traces if record else ():
        kind = "decode" if st.num_prefill_tokens == 0 else "prefill" if st.num_decode_seqs == 0 else "mixed"
        RESULTS["engine"].append({
            "model": llm.engine.spec.name, "kind": kind, "graphs": graphs, "batch": batch,
            "tokens": st.num_batched_tokens, "seqs": st.num_prefill_seqs + st.num_decode_seqs, "step_ms": st.gpu_s * 1e3,
            "record": {f.name: getattr(st, f.name) for f in dataclasses.fields(st)},  # the sim's BatchComposition
            "graph": graphs and kind == "decode"})


def engine_case(spec, batches: tuple[int, ...], graphs: bool, memory_share: float) -> None:
    """One engine (graphs or eager) on `spec`: a warm-up pass over the step shapes, then the recorded one."""
    from engine.llm import LLM
    from engine.model import LlamaModel

    plen, olen = (8, 3) if ARGS.dry_run else (128, 12)
    t = time.time()
    RESULTS.setdefault("engine_specs", {})[spec.name] = spec.model_dump()
    model = LlamaModel(spec, max_positions=2048, device=DEVICE, attention_backend="torch" if ARGS.dry_run else "triton",
                       seed=0)
    # the preset's name (the engine args want a known model); the model built here may have fewer layers
    llm = LLM("tiny-moe" if ARGS.dry_run else "qwen3-30b-a3b", llm_model=model, device=DEVICE,
              dtype=spec.dtype if ARGS.dry_run else "bfloat16", gpu_memory_utilization=memory_share, max_model_len=2048,
              max_num_seqs=max(batches), max_num_batched_tokens=8192,
              cudagraph_mode="FULL_DECODE_ONLY" if graphs else "NONE", enforce_eager=not graphs)
    log(f"engine {spec.name} graphs={graphs}: built in {time.time() - t:.1f}s (capture {llm.engine.graph_capture_s:.1f}s)")
    for b in batches:  # the same steps once, unrecorded: Triton compiles the eager steps' variants here
        engine_run(llm, b, plen, 2, graphs, record=False)
    log(f"engine {spec.name} graphs={graphs}: warmed up ({time.time() - t:.1f}s)")
    for b in batches:
        if over_budget():
            RESULTS["errors"].append(f"budget spent before engine {spec.name} graphs={graphs} batch={b}")
            break
        engine_run(llm, b, plen, olen, graphs)
        dec = sorted(r["step_ms"] for r in RESULTS["engine"] if r["batch"] == b and r["kind"] == "decode"
                     and r["graphs"] == graphs and r["model"] == spec.name)
        log(f"engine {spec.name} graphs={graphs} batch {b}: decode median {dec[len(dec) // 2] if dec else float('nan'):.3f} ms")
        save()
    del llm, model
    gc.collect()  # the runner's graphs and KV cache sit in reference cycles: free them before the next model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def engine_steps() -> None:
    """Part 3: the engine's steps on a reduced-layer MoE model, decode by batch and prefill by tokens,
    with CUDA graphs for decode (FULL_DECODE_ONLY), then eager. Part 4, budget allowing: the whole
    48-layer qwen3-30b-a3b (random weights, 61 GB), decode graphs only."""
    batches = (1, 4) if ARGS.dry_run else (1, 8, 32, 64, 128)
    for graphs in (True, False):
        if over_budget():
            RESULTS["errors"].append(f"budget spent before engine graphs={graphs}")
            return
        engine_case(engine_spec(), batches if graphs else batches[::2], graphs, 0.3)
    if ARGS.budget_s - (time.time() - T0) < FULL_MODEL_MIN_LEFT_S:
        RESULTS["errors"].append("budget too short for the whole-model engine part (part 4): skipped")
        return
    full = engine_spec(None)
    engine_case(full, (1,) if ARGS.dry_run else (1, 8, 32, 64), True, 0.9)


if __name__ == "__main__":
    if ARGS.probe_only:
        probe_body(PROBE_FEATURES)
        sys.exit(0)
    main()
