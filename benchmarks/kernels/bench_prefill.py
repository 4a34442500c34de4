#!/usr/bin/env python3
"""Prefill attention on one GPU: kernels/prefill_attention.py's launch variants vs torch SDPA.

Llama-3.1-8B layer (32 query heads, 8 KV heads, head dim 128, bf16, block size 16), causal
prefill of ``seqs x new + cached`` tokens: 8x2048+0 and 8x2048+4096 (the issue-16 targets,
>= 1.0x SDPA), then 1x8192+0 and 4x512+0 for the best variants. Every time is the median of
triton.testing.do_bench (L2 flushed before each run) over CUDA-graph replays of one call, and
SDPA is timed as benchmarks/kernels/bench_h200.py times it: the same inputs (same seeds),
K/V gathered to contiguous ``[B, Hq, S, D]`` with the KV heads repeated, ``is_causal`` without
a prefix and a bottom-right causal mask with one. Also timed: our current paged prefill
(kernels.paged_attention, its shipped config). Each variant is checked against SDPA's output
on the device first; a variant that fails the check cannot be the best.

Variants: tile shape, warps, stages, GQA packing, K/V source (the paged cache; or the new
tokens' rows of a fused QKV buffer, ``k_new``/``v_new``), tensor-descriptor (TMA) loads.

    python3 benchmarks/kernels/bench_prefill.py --out DIR            # GPU, ~2-3 min
    python3 benchmarks/kernels/bench_prefill.py --dry-run --out DIR  # CPU interpreter, tiny
    python3 benchmarks/kernels/bench_prefill.py --compile-only --out DIR  # no GPU: sm90 build

Writes DIR/prefill.json (every row, the best variant, the targets) and DIR/prefill.md after
every measurement, so a run cut short keeps what it measured. ``--budget-s`` stops starting
new measurements (compiles included) past that many seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for prefill.json/prefill.md")
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    p.add_argument("--budget-s", type=float, default=120.0,
                   help="start no new measurement past this many seconds")
    p.add_argument("--compile-only", action="store_true",
                   help="no GPU needed: compile every variant for sm90 with Triton's ptxas and "
                        "report registers, spills and shared memory (DIR/compile.json)")
    p.add_argument("--top", type=int, default=3,
                   help="variants timed at the extra shapes (best of the headline shapes)")
    return p.parse_args(argv)


ARGS = parse_args()
if ARGS.compile_only:
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("--compile-only compiles real kernels: unset TRITON_INTERPRET")
    ARGS.dry_run = False
elif ARGS.dry_run:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # after TRITON_INTERPRET is set: triton reads it on import
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels import _interpreter_compat
from kernels.paged_attention import PREFILL_CONFIG, paged_attention
from kernels.prefill_attention import SOURCE_NAMES, PrefillConfig, plan_prefill, prefill_attention

_interpreter_compat.apply()  # a no-op unless TRITON_INTERPRET=1 (the CPU dry run)

T0 = time.time()
DEVICE = "cpu" if ARGS.dry_run or ARGS.compile_only else "cuda"
DTYPE = torch.bfloat16
if ARGS.dry_run:
    HQ, HKV, HEAD_DIM, BLOCK = 8, 2, 64, 16
    HEADLINE = [(2, 32, 0), (2, 32, 48)]
    EXTRA = [(1, 64, 0), (2, 16, 0)]
    WIDE_BLOCKS = 32
else:
    HQ, HKV, HEAD_DIM, BLOCK = 32, 8, 128, 16
    HEADLINE = [(8, 2048, 0), (8, 2048, 4096)]  # (seqs, new tokens, cached tokens)
    EXTRA = [(1, 8192, 0), (4, 512, 0)]
    WIDE_BLOCKS = 64  # cache blocks a 64-key tile fits in: the prefix's descriptor path
SCALE = HEAD_DIM**-0.5
TARGET_VS_SDPA = 1.0


@dataclass(frozen=True)
class Variant:
    """One launch variant: a config, and whether the new tokens come from k_new/v_new."""

    config: PrefillConfig
    new_rows: bool

    @property
    def name(self) -> str:
        c = self.config
        return (f"{c.block_m}x{c.tile_n} w{c.num_warps} s{c.num_stages} "
                f"{'packed' if c.pack_gqa else 'one-head'}{' tma' if c.kv_tma else ''}"
                f"{' new-rows' if self.new_rows else ''}")  # fmt: skip


def variants() -> list[Variant]:
    """Reasoned candidates, most promising first (the budget may cut the tail). With the
    cache's 16-row blocks a 64/128-key tile spans several blocks, so kv_tma changes only the
    new-rows source; the cache part stays a per-key gather."""
    if ARGS.dry_run:
        cfgs = [PrefillConfig(32, 16, 4, 2), PrefillConfig(16, 16, 4, 2, pack_gqa=False)]
        return [Variant(c, False) for c in cfgs] + [
            Variant(PrefillConfig(32, 16, 4, 2, kv_tma=True), True)]
    # Register and shared-memory use of each on sm90 (--compile-only): 128-row tiles need 8
    # warps (4 warps spill the 128 x 128 fp32 accumulator); 128x128 tiles spill a little.
    cache = [
        PrefillConfig(128, 64, 8, 3),  # FA2/FA3's D=128 shape: two warpgroups, 64-key tiles
        PrefillConfig(64, 64, 4, 3),  # one warpgroup, two programs resident per SM
        PrefillConfig(128, 128, 8, 2),  # 128-key tiles: half the softmax rescales per key
        PrefillConfig(128, 32, 4, 3),  # the shipped paged kernel's shape, in this kernel
        PrefillConfig(128, 64, 8, 3, pack_gqa=False),  # one head per program: L2 reuse instead
        PrefillConfig(64, 64, 4, 3, pack_gqa=False),
    ]
    rows = [
        PrefillConfig(128, 64, 8, 3, kv_tma=True),  # contiguous rows: one TMA box per tile
        PrefillConfig(128, 64, 8, 4, kv_tma=True),
        PrefillConfig(64, 64, 4, 3, kv_tma=True),
        PrefillConfig(128, 128, 8, 2, kv_tma=True),
        PrefillConfig(128, 64, 8, 3, pack_gqa=False, kv_tma=True),
        PrefillConfig(128, 64, 8, 3),  # the same rows through pointers: what TMA adds
    ]
    return [Variant(c, False) for c in cache] + [Variant(c, True) for c in rows]


RESULTS: dict = {"meta": {}, "shapes": [], "rows": [], "best": None, "targets": [], "errors": []}


def elapsed_s() -> float:
    return time.time() - T0


def out_of_budget() -> bool:
    return elapsed_s() > ARGS.budget_s


def log(msg: str) -> None:
    print(f"[{elapsed_s():7.1f}s] {msg}", flush=True)


def record_error(where: str, exc: BaseException) -> None:
    RESULTS["errors"].append({"where": where, "error": repr(exc)[:500]})
    log(f"ERROR in {where}: {exc!r}")
    traceback.print_exc()
    save()


# ---------------------------------------------------------------- timing (as bench_h200.py)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def time_us(fn: Callable[[], object], rep_ms: int = 100) -> float:
    """Median microseconds; on the GPU do_bench flushes L2 before each run and times events."""
    if DEVICE == "cpu":
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median") * 1e3


def time_graph_us(fn: Callable[[], object], rep_ms: int = 100) -> float:
    """Median microseconds of CUDA-graph replays of one call of ``fn`` (eager on the CPU)."""
    if DEVICE == "cpu":
        return time_us(fn)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        return time_us(graph.replay, rep_ms)
    finally:
        del graph


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double()
    return float((out64 - ref64).norm() / ref64.norm())


# ---------------------------------------------------------------- inputs


class Case:
    """bench_h200.py's prefill batch, built the same way from the same seed (identical
    inputs), plus the new tokens' k/v as views of a fused [T, (Hq + 2 Hkv) * D] buffer."""

    def __init__(self, batch: int, new_tokens: int, cached: int, block_size: int = BLOCK) -> None:
        gen = torch.Generator(device=DEVICE).manual_seed(batch + new_tokens + cached)
        self.batch, self.new, self.cached, self.block_size = batch, new_tokens, cached, block_size
        self.seq_len = cached + new_tokens
        blocks_per_seq = triton.cdiv(self.seq_len, block_size)
        shape = (batch * blocks_per_seq, block_size, HKV, HEAD_DIM)
        self.k_cache = torch.randn(shape, device=DEVICE, dtype=DTYPE, generator=gen)
        self.v_cache = torch.randn(shape, device=DEVICE, dtype=DTYPE, generator=gen)
        perm = torch.randperm(batch * blocks_per_seq, device=DEVICE, generator=gen)
        self.block_tables = perm.view(batch, blocks_per_seq).to(torch.int32)
        self.seq_lens = torch.full((batch,), self.seq_len, device=DEVICE, dtype=torch.int32)
        self.query_start_loc = torch.arange(batch + 1, device=DEVICE, dtype=torch.int32) * new_tokens
        self.q = torch.randn(batch * new_tokens, HQ, HEAD_DIM, device=DEVICE, dtype=DTYPE,
                             generator=gen)  # fmt: skip
        self.out = torch.empty_like(self.q)
        self.k_new, self.v_new = self._new_rows()

    @property
    def name(self) -> str:
        blocks = "" if self.block_size == BLOCK else f" blocks of {self.block_size}"
        return f"{self.batch}x{self.new}+{self.cached}{blocks}"

    def gathered(self, cache: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, S, D] view of each sequence's context, gathered from the pages."""
        pages = cache[self.block_tables.long()]
        return pages.view(self.batch, -1, HKV, HEAD_DIM)[:, : self.seq_len].transpose(1, 2)

    def _new_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        fused = torch.empty(self.batch * self.new, HQ + 2 * HKV, HEAD_DIM, device=DEVICE, dtype=DTYPE)
        for part, cache in ((slice(HQ, HQ + HKV), self.k_cache), (slice(HQ + HKV, None), self.v_cache)):
            new = self.gathered(cache)[:, :, self.cached :]  # [B, Hkv, new, D]
            fused[:, part] = new.transpose(1, 2).reshape(-1, HKV, HEAD_DIM)
        return fused[:, HQ : HQ + HKV], fused[:, HQ + HKV :]

    def useful_flops(self) -> float:
        """QK^T and PV over the causal pairs only: query i sees cached + i + 1 keys."""
        pairs = self.new * self.cached + self.new * (self.new + 1) / 2
        return 4.0 * HEAD_DIM * pairs * HQ * self.batch

    def args(self) -> tuple:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
                self.query_start_loc, SCALE, self.new, self.seq_len)  # fmt: skip

    def ours(self, variant: Variant) -> Callable[[], object]:
        extra = {"k_new": self.k_new, "v_new": self.v_new} if variant.new_rows else {}
        return lambda: prefill_attention(*self.args(), out=self.out, config=variant.config, **extra)

    def paged(self) -> Callable[[], object]:
        return lambda: paged_attention(*self.args(), out=self.out, num_splits=1)


def sdpa_fn(case: Case) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    """bench_h200.py's SDPA call on contiguous repeated K/V, and its output in token layout."""
    q4 = case.q.view(case.batch, case.new, HQ, HEAD_DIM).transpose(1, 2).contiguous()
    k = case.gathered(case.k_cache).contiguous().repeat_interleave(HQ // HKV, dim=1)
    v = case.gathered(case.v_cache).contiguous().repeat_interleave(HQ // HKV, dim=1)
    if case.cached == 0:
        def fn() -> torch.Tensor:
            return F.scaled_dot_product_attention(q4, k, v, scale=SCALE, is_causal=True)
    else:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(case.new, case.cached + case.new)

        def fn() -> torch.Tensor:
            return F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, scale=SCALE)
    ref = fn().transpose(1, 2).reshape(-1, HQ, HEAD_DIM)
    return fn, ref


# ---------------------------------------------------------------- measurements


def add_row(case: Case, kernel: str, variant: Variant | None, us: float, err: float | None,
            baselines: dict[str, float]) -> dict:
    row = {"shape": case.name, "kernel": kernel, "variant": variant.name if variant else kernel,
           "us": us, "tflops": case.useful_flops() / (us * 1e-6) / 1e12, "rel_err_vs_sdpa": err,
           "ok": err is None or err <= 1e-2}  # fmt: skip
    if variant is not None:
        plan = plan_prefill(case.q, case.k_cache, case.batch, variant.config,
                            case.k_new if variant.new_rows else None)  # fmt: skip
        row.update(config=asdict(variant.config), new_rows=variant.new_rows,
                   sources=[SOURCE_NAMES[plan.ctx_source], SOURCE_NAMES[plan.new_source]])
    for name, t in baselines.items():
        row[f"vs_{name}"] = t / us  # > 1: faster than that baseline
    RESULTS["rows"].append(row)
    save()
    return row


def measure_kernel(case: Case, fn: Callable[[], object], ref: torch.Tensor, rep_ms: int) -> tuple[float, float]:
    """(graph-replay us, relative error vs SDPA's output) of one call; NaN-poisoned output
    first, so an element the kernel never writes shows as an error."""
    case.out.fill_(float("nan"))
    fn()
    sync()
    err = rel_err(case.out, ref)
    return time_graph_us(fn, rep_ms), err


@dataclass
class Prepared:
    """A shape ready for the variants: its inputs, SDPA's output and the baselines' times."""

    case: Case
    ref: torch.Tensor
    baselines: dict[str, float]


def prepare_shape(shape: tuple[int, ...]) -> Prepared:
    """The shape's inputs, timed with SDPA and with our paged prefill."""
    case = Case(*shape)
    sdpa, ref = sdpa_fn(case)
    t_sdpa = time_graph_us(sdpa)
    del sdpa  # frees the repeated K/V copies before our kernels run
    add_row(case, "sdpa", None, t_sdpa, None, {})
    baselines = {"sdpa": t_sdpa}
    t_paged, err = measure_kernel(case, case.paged(), ref, 100)
    row = add_row(case, "paged_attention", None, t_paged, err, baselines)
    row["config"] = asdict(PREFILL_CONFIG)
    baselines["paged"] = t_paged
    log(f"{case.name}: sdpa {t_sdpa:.0f} us, paged {t_paged:.0f} us "
        f"({row['tflops']:.0f} TFLOP/s, x{row['vs_sdpa']:.2f} sdpa)")  # fmt: skip
    RESULTS["shapes"].append({"shape": case.name, "useful_flops": case.useful_flops(),
                              "sdpa_us": t_sdpa, "paged_us": t_paged})  # fmt: skip
    return Prepared(case, ref, baselines)


def bench_variant(prep: Prepared, variant: Variant) -> None:
    case = prep.case
    try:
        us, err = measure_kernel(case, case.ours(variant), prep.ref, 50)
    except Exception as exc:  # noqa: BLE001 - one failed variant must not lose the rest
        record_error(f"{case.name} {variant.name}", exc)
        return
    row = add_row(case, "prefill", variant, us, err, prep.baselines)
    log(f"  {case.name} {variant.name}: {us:.0f} us {row['tflops']:.0f} TFLOP/s "
        f"x{row['vs_sdpa']:.2f} sdpa x{row['vs_paged']:.2f} paged err {err:.1e}"
        f"{'' if row['ok'] else ' FAIL'}")  # fmt: skip


def bench_shapes(shapes: list[tuple[int, ...]], chosen: list[Variant]) -> None:
    """Baselines at every shape, then each variant at every shape before the next variant,
    so a budget cut leaves whole variants (comparable across shapes), not whole shapes."""
    prepared = []
    for shape in shapes:
        if out_of_budget():
            log(f"skipping {shape}: out of time budget")
            continue
        try:
            prepared.append(prepare_shape(shape))
        except Exception as exc:  # noqa: BLE001
            record_error(f"shape {shape}", exc)
    for variant in chosen:
        if out_of_budget():
            log(f"out of time budget before {variant.name}")
            break
        for prep in prepared:
            bench_variant(prep, variant)
    del prepared
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def ranking(shapes: list[str]) -> list[tuple[float, str]]:
    """(geomean over ``shapes`` of time / best time there, variant) for the variants timed and
    correct at every one of them, best first."""
    rows = [r for r in RESULTS["rows"] if r["kernel"] == "prefill" and r["shape"] in shapes]
    best_at = {s: min(r["us"] for r in rows if r["shape"] == s) for s in shapes
               if any(r["shape"] == s for r in rows)}  # fmt: skip
    scores = []
    for name in {r["variant"] for r in rows}:
        mine = {r["shape"]: r for r in rows if r["variant"] == name}
        if set(mine) != set(best_at) or not all(r["ok"] for r in mine.values()):
            continue  # incomplete or wrong somewhere: cannot be the best
        logs = [math.log(mine[s]["us"] / best_at[s]) for s in best_at]
        scores.append((math.exp(sum(logs) / len(logs)), name))
    return sorted(scores)


def choose_best() -> None:
    headline = [f"{b}x{n}+{c}" for b, n, c in HEADLINE]
    ranked = ranking(headline)
    if not ranked:
        return
    score, name = ranked[0]
    rows = [r for r in RESULTS["rows"] if r["variant"] == name]
    RESULTS["best"] = {"variant": name, "config": rows[0]["config"], "new_rows": rows[0]["new_rows"],
                       "sources": rows[0]["sources"], "geomean_vs_best_per_shape": score,
                       "per_shape": {r["shape"]: {k: r[k] for k in ("us", "tflops", "vs_sdpa", "vs_paged")}
                                     for r in rows}}  # fmt: skip
    RESULTS["targets"] = [
        {"target": f"prefill {r['shape']} vs SDPA (>= {TARGET_VS_SDPA})", "value": r["vs_sdpa"],
         "met": bool(r["vs_sdpa"] >= TARGET_VS_SDPA)}
        for r in rows if r["shape"] in headline
    ]  # fmt: skip
    best_cache = next((n for _, n in ranked if "new-rows" not in n), None)
    RESULTS["best_cache_only"] = best_cache  # the best variant needing no engine change


# ---------------------------------------------------------------- report


def save() -> None:
    ARGS.out.mkdir(parents=True, exist_ok=True)
    (ARGS.out / "prefill.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    (ARGS.out / "prefill.md").write_text(markdown())


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown() -> str:
    m = RESULTS["meta"]
    lines = ["# Prefill attention variants vs SDPA", "",
             (f"{m.get('gpu', '?')}, torch {m.get('torch', '?')}, triton {m.get('triton', '?')}; "
              f"{m.get('date', '?')}; command `{m.get('command', '?')}`"), "",
             "Graph-replay medians (do_bench, L2 flushed). vs X = X's time / this time (> 1: faster).",
             "", ("| shape | kernel / variant | K/V sources (prefix, new) | us | TFLOP/s | vs SDPA | "
                  "vs paged | rel err vs SDPA |"), "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in RESULTS["rows"]:
        src = ", ".join(r.get("sources", [])) or "-"
        lines.append(f"| {r['shape']} | {r['variant']} | {src} | {r['us']:.0f} | {r['tflops']:.0f} | "
                     f"{fmt(r.get('vs_sdpa'), '.2f')} | {fmt(r.get('vs_paged'), '.2f')} | "
                     f"{fmt(r.get('rel_err_vs_sdpa'), '.1e')}{'' if r['ok'] else ' FAIL'} |")  # fmt: skip
    best = RESULTS["best"]
    if best:
        lines += ["", (f"Best variant over the headline shapes: **{best['variant']}** (sources "
                       f"{', '.join(best['sources'])}); best needing no k_new: "
                       f"{RESULTS.get('best_cache_only')}.")]
        lines += [f"- {t['target']}: {t['value']:.2f} {'met' if t['met'] else 'NOT met'}"
                  for t in RESULTS["targets"]]  # fmt: skip
    if RESULTS["errors"]:
        lines += ["", "Errors:"] + [f"- {e['where']}: {e['error']}" for e in RESULTS["errors"]]
    return "\n".join(lines) + "\n"


def describe_run() -> None:
    meta = RESULTS["meta"]
    meta.update({"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                 "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                 "python": platform.python_version(), "torch": torch.__version__,
                 "triton": triton.__version__, "dry_run": ARGS.dry_run, "budget_s": ARGS.budget_s,
                 "shape": {"num_q_heads": HQ, "num_kv_heads": HKV, "head_dim": HEAD_DIM,
                           "block_size": BLOCK, "dtype": str(DTYPE)}})  # fmt: skip
    meta["gpu"] = (torch.cuda.get_device_name(0) if DEVICE == "cuda"
                   else "none (CPU, TRITON_INTERPRET=1 dry run)")  # fmt: skip
    log(f"{meta['gpu']} torch {meta['torch']} triton {meta['triton']}")


def prefix_descriptor_pair() -> list[Variant]:
    """The best variant needing no k_new, and its twin with kv_tma: with cache blocks as wide
    as a tile, the twin loads the cached prefix by descriptor (what TMA does for the prefix)."""
    best = RESULTS.get("best_cache_only")
    found = [v for v in variants() if v.name == best]
    if not found:
        return []
    c = found[0].config
    twin = PrefillConfig(c.block_m, c.tile_n, c.num_warps, c.num_stages, c.pack_gqa, kv_tma=True)
    if WIDE_BLOCKS % c.tile_n:
        return [found[0]]
    return [found[0], Variant(twin, False)]


# ---------------------------------------------------------------- compile check (no GPU)


def kernel_signature(plan, variant: Variant, block_size: int) -> tuple[dict, dict, dict]:  # type: ignore[no-untyped-def]
    """(signature, constexprs, attrs) of _prefill_kernel for this shape and plan, specialised as
    a real launch is: 16-byte aligned pointers, strides divisible by 16."""
    from kernels.prefill_attention import SRC_DESC_PAGED, SRC_DESC_ROWS, _prefill_kernel

    cfg = variant.config
    desc = f"tensordesc<bf16[{cfg.tile_n}, {HEAD_DIM}]>"
    group = HQ // HKV
    row_heads = group if cfg.pack_gqa else 1
    constexprs = {"NUM_QUERIES_PER_KV": group, "ROW_HEADS": row_heads, "BLOCK_M": cfg.block_m,
                  "BLOCK_Q": plan.block_q, "HEAD_DIM": HEAD_DIM, "HEAD_DIM_PAD": HEAD_DIM,
                  "BLOCK_SIZE": block_size, "TILE_N": cfg.tile_n, "CTX_SRC": plan.ctx_source,
                  "NEW_SRC": plan.new_source, "DOT_PRECISION": "tf32", "KV_FP8": False}  # fmt: skip
    names = _prefill_kernel.arg_names
    sig = {n: "constexpr" if n in constexprs else "i32" for n in names}
    sig.update({n: "*bf16" for n in names if n.endswith("_ptr") or n in ("k_ctx", "v_ctx", "k_new", "v_new")})
    sig.update({n: "*i32" for n in ("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr")})
    sig["qk_scale"] = "fp32"
    if plan.ctx_source == SRC_DESC_PAGED:
        sig["k_ctx"] = sig["v_ctx"] = desc
    if plan.new_source == SRC_DESC_ROWS:
        sig["k_new"] = sig["v_new"] = desc
    unaligned = {"num_seqs", "qk_scale", "stride_k_scale", "stride_v_scale"}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items()
             if t in ("i32", "*bf16", "*i32") and n not in unaligned}  # fmt: skip
    return sig, constexprs, attrs


def compile_variant(variant: Variant, block_size: int = BLOCK) -> dict:
    """Compile for sm90 here and read ptxas's register, spill and shared-memory report."""
    import re
    import subprocess

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.prefill_attention import _prefill_kernel

    q = torch.empty(64, HQ, HEAD_DIM, dtype=DTYPE)
    cache = torch.empty(8, block_size, HKV, HEAD_DIM, dtype=DTYPE)
    k_new = torch.empty(64, HQ + 2 * HKV, HEAD_DIM, dtype=DTYPE)[:, HQ : HQ + HKV]
    plan = plan_prefill(q, cache, 2, variant.config, k_new if variant.new_rows else None)
    sig, constexprs, attrs = kernel_signature(plan, variant, block_size)
    t = time.time()
    kernel = triton.compile(ASTSource(_prefill_kernel, sig, constexprs, attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": variant.config.num_warps,
                                     "num_stages": variant.config.num_stages})  # fmt: skip
    ptx_path = ARGS.out / "kernel.ptx"
    ptx_path.write_text(kernel.asm["ptx"])
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    report = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", str(ptx_path), "-o", os.devnull],
                            capture_output=True, text=True, check=True).stderr  # fmt: skip
    ptx_path.unlink()
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, report)) else None
    return {"variant": variant.name, "block_size": block_size, "sources": [SOURCE_NAMES[plan.ctx_source], SOURCE_NAMES[plan.new_source]],
            "registers": number(r"Used (\d+) registers"), "spill_store_bytes": number(r"(\d+) bytes spill stores"),
            "shared_bytes": kernel.metadata.shared, "tma_loads": kernel.asm["ptx"].count("cp.async.bulk.tensor"),
            "cp_async": kernel.asm["ptx"].count("cp.async.cg") + kernel.asm["ptx"].count("cp.async.ca"),
            "compile_s": time.time() - t}  # fmt: skip


def compile_all() -> None:
    ARGS.out.mkdir(parents=True, exist_ok=True)
    rows = []
    wide = Variant(PrefillConfig(128, 64, 8, 3, kv_tma=True), False)  # the prefix by descriptor
    for variant, block_size in [(v, BLOCK) for v in variants()] + [(wide, WIDE_BLOCKS)]:
        try:
            rows.append(compile_variant(variant, block_size))
        except Exception as exc:  # noqa: BLE001 - report every variant
            rows.append({"variant": variant.name, "error": repr(exc)[:500]})
        r = rows[-1]
        log(f"{r['variant']} (blocks of {block_size}): " + (f"ERROR {r['error']}" if "error" in r else
            f"{r['registers']} regs, spills {r['spill_store_bytes']} B, shared {r['shared_bytes']} B, "
            f"{r['tma_loads']} TMA / {r['cp_async']} cp.async in the PTX ({', '.join(r['sources'])})"))
    (ARGS.out / "compile.json").write_text(json.dumps(rows, indent=1))


def main() -> None:
    if ARGS.compile_only:
        compile_all()
        return
    describe_run()
    save()
    chosen = variants()
    bench_shapes(HEADLINE, chosen)
    choose_best()
    top = {name for _, name in ranking([f"{b}x{n}+{c}" for b, n, c in HEADLINE])[: ARGS.top]}
    bench_shapes(EXTRA, [v for v in chosen if v.name in top])
    choose_best()
    bench_shapes([(*HEADLINE[1], WIDE_BLOCKS)], prefix_descriptor_pair())
    RESULTS["meta"]["wall_s"] = elapsed_s()
    save()
    print(markdown())


if __name__ == "__main__":
    main()
