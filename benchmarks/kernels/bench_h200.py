#!/usr/bin/env python3
"""Paged-attention kernels on one GPU: correctness first, then timings against the limit and peers.

Llama-3.1-8B layer shape (32 query heads, 8 KV heads, head dim 128, bf16, block size 16):
decode at batch x context 1x4096 ... 32x32768 and prefill chunks of 8 x 2048 new tokens with 0
and 4096 tokens cached. For each: microseconds (median of triton.testing.do_bench, which flushes
L2 before every run), KV bandwidth against a streaming read measured in the same run, and speed
ratios against torch SDPA on contiguous KV, gather + SDPA, and FlashInfer (if importable).
With an fp8 KV cache (e4m3, per-tensor scales): the same decode and prefill calls, tokens/s
against the bf16 cache's. A graph probe times 32x32768 eager and as CUDA-graph replays in both
orders and under the engine's capture (split count from max_model_len). Sweeps of the launch
parameters (tile, warps, stages, split count) come last, as time allows, and their best
configs are written as DIR/best_configs.json in the form of kernels/attention_configs.json
(copy it there to make them the kernels' defaults).

    python3 benchmarks/kernels/bench_h200.py --out DIR          # on the GPU, ~4-5 min
    python3 benchmarks/kernels/bench_h200.py --dry-run --out DIR  # CPU interpreter, tiny shapes

Results go to DIR/results.json and DIR/results.md, rewritten after every step so that a run
cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ARGS: argparse.Namespace
T0 = time.time()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for results.json/results.md")
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    p.add_argument("--no-flashinfer", action="store_true")
    p.add_argument("--no-sweep", action="store_true", help="time only the default dispatch")
    p.add_argument("--budget-s", type=float, default=270.0, help="skip optional work past this")
    p.add_argument("--fa3", action="store_true", help="also build and time FlashInfer's FA3 "
                   "prefill (its nvcc build takes minutes)")
    p.add_argument("--kv", default="bf16,fp8", help="KV-cache dtypes to time: bf16, fp8 or both")
    p.add_argument("--skip-checks", action="store_true", help="skip the device correctness checks")
    p.add_argument("--shapes", default="", help="only these, e.g. '32x32768,8x2048+0'")
    p.add_argument("--repeat", type=int, default=1, help="time each decode shape this many times")
    p.add_argument("--only", choices=["fp8-decode"], default=None,
                   help="fp8-decode: only the device checks of the fp8 variants and the focused fp8 "
                   "decode sweep (with bf16 and FlashInfer alongside), then best_configs.json")
    p.add_argument("--fp8-variants", default="", help="fp8 conversion variants the fp8 device "
                   "checks and the focused fp8 sweep run, e.g. 'words,fp16' (default: all)")
    return p.parse_args()


ARGS = parse_args()
if ARGS.dry_run:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels import _interpreter_compat
from kernels.cache_write import write_kv_cache
from kernels.paged_attention import (
    CONFIG_TABLE,
    CONFIG_TABLE_PATH,
    FP8_CONVERTS,
    KV_KINDS,
    AttentionConfig,
    choose_config,
    choose_num_splits,
    num_sms_of,
    paged_attention,
)
from kernels.reference import FP8_E4M3_MAX, paged_attention_ref, quantize_kv_ref

_interpreter_compat.apply()  # a no-op unless TRITON_INTERPRET=1 (the CPU dry run)

DEVICE = "cpu" if ARGS.dry_run else "cuda"
DTYPE = torch.bfloat16
if ARGS.dry_run:
    HQ, HKV, HEAD_DIM, BLOCK = 8, 2, 64, 16
    DECODE_SHAPES = [(1, 64), (2, 48)]
    PREFILL_SHAPES = [(2, 32, 0), (2, 32, 40)]
else:
    HQ, HKV, HEAD_DIM, BLOCK = 32, 8, 128, 16
    DECODE_SHAPES = [
        (1, 4096), (1, 32768), (8, 4096), (32, 2048),
        (64, 4096), (128, 1024), (256, 2048), (32, 32768),
    ]  # fmt: skip
    PREFILL_SHAPES = [(8, 2048, 0), (8, 2048, 4096)]  # (seqs, new tokens, cached tokens)
SCALE = HEAD_DIM**-0.5
KV_DTYPES = [k for k in ARGS.kv.split(",") if k]
FP8 = torch.float8_e4m3fn
# decode shapes swept (the sweep is the slow part): the fp8 target, the graph-replay gap, and
# the two split-KV shapes; the graph probe's shape; the small batches whose split count an
# engine's capture (max_seq_len = max_model_len) changes
if ARGS.dry_run:
    SWEEP_DECODE_SHAPES, PROBE_SHAPE, CAPTURE_PROBE_SHAPES = ["1x64", "2x48"], "2x48", ["1x64"]
else:
    SWEEP_DECODE_SHAPES = ["64x4096", "32x32768", "1x32768", "8x4096"]
    PROBE_SHAPE, CAPTURE_PROBE_SHAPES = "32x32768", ["1x4096", "8x4096", "1x32768"]
# the engine captures its decode graphs with max_seq_len = max_model_len (Llama-3.1: 131072)
CAPTURE_MAX_SEQ_LEN = 256 if ARGS.dry_run else 131072

# a handful of reasoned alternatives per path, not an autotuner. Shared memory per decode
# program ~ stages x (K + V tile bytes); the H200 allows 227 KB, so every decode config stays
# at or under the bf16 default's 192 KB
DECODE_SWEEP = [
    AttentionConfig(16, 128, 4, 3),  # default: 64 KB of K+V per stage, 3 stages
    AttentionConfig(16, 64, 4, 3),  # half tiles: twice the programs resident per SM
    AttentionConfig(16, 128, 4, 2),  # shallower pipeline, more programs resident
    AttentionConfig(16, 128, 8, 2),
    AttentionConfig(16, 64, 4, 5),  # small tiles, deep pipeline: 160 KB in flight
]
PREFILL_SWEEP = [
    AttentionConfig(128, 32, 4, 3),  # default
    AttentionConfig(128, 64, 8, 3),  # FA2 shape for D=128: two warpgroups, 64-key tiles
    AttentionConfig(128, 64, 4, 3),
    AttentionConfig(128, 32, 4, 4),
    AttentionConfig(128, 32, 8, 3),
    AttentionConfig(64, 32, 4, 3),
]

# The focused fp8 decode sweep: every conversion variant (kernels.paged_attention.FP8_CONVERTS)
# at each (tile_n, stages, warps), most promising points first so a cut budget still compares
# the variants: 256-key fp8 tiles move the bytes of the 128-key bf16 default per stage
# (each new point costs a compilation per variant, seconds each, so a short budget sees only the
# first few: the bf16 default's bytes per stage, today's fp8 tile, then shallower/deeper ones)
FP8_FOCUS_FIRST = [(256, 3, 4), (128, 3, 4), (256, 2, 4), (128, 4, 4), (512, 2, 4), (256, 3, 8)]
FP8_FOCUS_POINTS = FP8_FOCUS_FIRST + [(t, st, w) for t in (256, 128, 512) for st in (3, 2, 4)
                                      for w in (4, 8) if (t, st, w) not in FP8_FOCUS_FIRST]  # fmt: skip
if ARGS.dry_run:
    FP8_FOCUS_POINTS = [(16, 2, 4), (32, 2, 4)]
    FP8_FOCUS_SHAPES = ["2x48", "1x64"]
else:
    FP8_FOCUS_SHAPES = ["64x4096", "32x32768", "8x4096", "1x32768", "256x2048", "128x1024",
                        "32x2048", "1x4096"]  # fmt: skip
FP8_FOCUS_SMEM_BYTES = 227 * 1024  # H200 shared memory per block
FP8_FOCUS_TOP_K = 6  # configs of the first shape carried to the others
FP8_FOCUS_MAX_REL_ERR = 2e-2  # a config whose output strays this far from native's is dropped
# the variants' order at each point, most promising first, so that a cut budget still compares
# them: word loads + one fp16 dot each, the shipped fp16 widening, word loads + plane dots, the rest
FP8_FOCUS_LEADING = ("words", "fp16", "packed")


def fp8_focus_variants(wanted: str) -> tuple[str, ...]:
    """The variants named in --fp8-variants (all when empty), in the focused sweep's order."""
    order = [v for v in FP8_FOCUS_LEADING if v in FP8_CONVERTS]
    order += [v for v in FP8_CONVERTS if v not in order]
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = [w for w in names if w not in FP8_CONVERTS]
    if unknown:
        print(f"bench_h200.py: error: --fp8-variants: unknown {', '.join(unknown)}; choose from "
              f"{', '.join(FP8_CONVERTS)}", file=sys.stderr)  # fmt: skip
        sys.exit(2)
    return tuple(v for v in order if not names or v in names)


FP8_VARIANTS = fp8_focus_variants(ARGS.fp8_variants)


RESULTS: dict = {
    "meta": {},
    "stream": {},
    "checks": [],
    "decode": [],
    "prefill": [],
    "sweep": [],
    "graph": {},
    "graph_probe": [],
    "best_configs": {},
    "errors": [],
    "targets": [],
    "fp8_focus": [],
    "fp8_focus_best": [],
}


def elapsed_s() -> float:
    return time.time() - T0


def log(msg: str) -> None:
    print(f"[{elapsed_s():7.1f}s] {msg}", flush=True)


def save() -> None:
    ARGS.out.mkdir(parents=True, exist_ok=True)
    (ARGS.out / "results.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    (ARGS.out / "results.md").write_text(markdown())


def record_error(where: str, exc: BaseException) -> None:
    RESULTS["errors"].append({"where": where, "error": repr(exc)[:500]})
    log(f"ERROR in {where}: {exc!r}")
    traceback.print_exc()
    save()


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def time_us(fn: Callable[[], object], rep_ms: int = 100) -> float:
    """Median microseconds; on the GPU do_bench flushes L2 before each run and times with events."""
    if DEVICE == "cpu":
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median") * 1e3


def quantiles_us(fn: Callable[[], object]) -> list[float]:
    """10th, 50th and 90th percentile microseconds (a bimodal timing shows as a wide spread)."""
    if DEVICE == "cpu":
        return [time_us(fn)] * 3
    q = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.1, 0.5, 0.9])
    return [x * 1e3 for x in q]


def captured(fn: Callable[[], object]):
    """A CUDA graph of one call of ``fn`` (warmed up on a side stream first), or None on CPU."""
    if DEVICE == "cpu":
        return None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_graph_us(fn: Callable[[], object], rep_ms: int = 100) -> float:
    """Median microseconds of a CUDA-graph replay of ``fn`` (L2 still flushed before each run).

    Decode steps of a serving engine run as graph replays, and a replay has no Python launch
    cost, so this is the kernel time an engine sees; eager times carry ~10-40 us of host work
    per Triton launch that hides small kernels."""
    graph = captured(fn)
    if graph is None:
        return time_us(fn)
    try:
        return time_us(graph.replay, rep_ms)
    finally:
        del graph


def measure(row: dict, prefix: str, fn: Callable[[], object], work: float, unit: str) -> float:
    """Eager and graph medians into ``row``; returns the headline time (graph when it captures).

    ``work`` is bytes (unit "tbps") or FLOPs (unit "tflops") for the derived rate."""
    eager = time_us(fn)
    row[f"{prefix}_eager_us"] = eager
    try:
        graph = time_graph_us(fn)
        row[f"{prefix}_graph_us"] = graph
        row[f"{prefix}_timing"] = "graph"
    except Exception as exc:  # noqa: BLE001 - fall back to eager and say so
        row[f"{prefix}_timing"] = f"eager (graph capture failed: {exc!r:.120})"
        graph = None
        sync()
    t = graph if graph is not None else eager
    row[f"{prefix}_us"] = t
    row[f"{prefix}_{unit}"] = work / (t * 1e-6) / 1e12
    return t


def host_us_per_call(fn: Callable[[], object]) -> float:
    """Host (Python + launch) microseconds per eager call: enqueue many, sync once."""
    calls = 200 if DEVICE == "cuda" else 2
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    sync()
    return host


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double()
    return float((out64 - ref64).norm() / ref64.norm())


# ---------------------------------------------------------------- streaming read bandwidth


@triton.jit
def _stream_read_kernel(x_ptr, partial_ptr, n, BLOCK_ELEMS: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK_ELEMS + tl.arange(0, BLOCK_ELEMS)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), 0))


def measure_stream() -> None:
    n = (1 << 31) if DEVICE == "cuda" else (1 << 16)  # 4 GiB of bf16 on the GPU
    x = torch.randn(n, device=DEVICE, dtype=torch.float32).to(DTYPE)
    block = 16384
    partial = torch.empty(triton.cdiv(n, block), device=DEVICE, dtype=torch.float32)
    nbytes = n * x.element_size()

    def triton_read() -> None:
        _stream_read_kernel[(triton.cdiv(n, block),)](x, partial, n, BLOCK_ELEMS=block,
                                                      num_warps=8)  # fmt: skip

    t_read = time_us(triton_read)
    t_sum = time_us(lambda: x.sum(dtype=torch.float32))
    y = torch.empty_like(x)
    t_copy = time_us(lambda: y.copy_(x))
    read_tbps = nbytes / (min(t_read, t_sum) * 1e-6) / 1e12
    RESULTS["stream"] = {
        "bytes": nbytes,
        "triton_read_us": t_read,
        "torch_sum_us": t_sum,
        "copy_us": t_copy,
        "read_tbps": read_tbps,
        "triton_read_tbps": nbytes / (t_read * 1e-6) / 1e12,
        "torch_sum_tbps": nbytes / (t_sum * 1e-6) / 1e12,
        "copy_read_plus_write_tbps": 2 * nbytes / (t_copy * 1e-6) / 1e12,
    }
    log(f"stream read {read_tbps:.2f} TB/s (triton {RESULTS['stream']['triton_read_tbps']:.2f}, "
        f"torch.sum {RESULTS['stream']['torch_sum_tbps']:.2f}); copy r+w "
        f"{RESULTS['stream']['copy_read_plus_write_tbps']:.2f}")  # fmt: skip
    save()  # x, y and partial (4+ GiB on the GPU) are freed as this returns


# ---------------------------------------------------------------- batches


class Case:
    """One paged batch: each of ``batch`` sequences holds ``cached + new`` tokens in shuffled
    blocks of one cache, ``new`` of them are this step's queries."""

    def __init__(self, batch: int, new_tokens: int, cached: int, seed: int = 0) -> None:
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        self.batch, self.new, self.cached = batch, new_tokens, cached
        self.seq_len = cached + new_tokens
        self.blocks_per_seq = triton.cdiv(self.seq_len, BLOCK)
        num_blocks = batch * self.blocks_per_seq
        shape = (num_blocks, BLOCK, HKV, HEAD_DIM)
        self.k_cache = torch.randn(shape, device=DEVICE, dtype=DTYPE, generator=gen)
        self.v_cache = torch.randn(shape, device=DEVICE, dtype=DTYPE, generator=gen)
        perm = torch.randperm(num_blocks, device=DEVICE, generator=gen)
        self.block_tables = perm.view(batch, self.blocks_per_seq).to(torch.int32)
        self.seq_lens = torch.full((batch,), self.seq_len, device=DEVICE, dtype=torch.int32)
        self.query_start_loc = (
            torch.arange(batch + 1, device=DEVICE, dtype=torch.int32) * new_tokens
        )
        self.q = torch.randn(batch * new_tokens, HQ, HEAD_DIM, device=DEVICE, dtype=DTYPE,
                             generator=gen)  # fmt: skip
        self.out = torch.empty_like(self.q)
        self._fp8: tuple[torch.Tensor, ...] | None = None

    def fp8(self) -> tuple[torch.Tensor, ...]:
        """(k_cache, v_cache, k_scale, v_scale) in e4m3, made on first use: per-tensor scales
        amax / 448, as a calibration would set them."""
        if self._fp8 is None:
            parts = []
            for cache in (self.k_cache, self.v_cache):
                scale = (cache.abs().amax().float() / FP8_E4M3_MAX).reshape(1)
                parts.append((quantize_kv_ref(cache, scale), scale))
            (k8, ks), (v8, vs) = parts
            self._fp8 = (k8, v8, ks, vs)
        return self._fp8

    def kv_bytes(self, kv: str = "bf16") -> int:
        size = 1 if kv == "fp8" else self.k_cache.element_size()
        return 2 * self.batch * self.seq_len * HKV * HEAD_DIM * size

    def useful_flops(self) -> float:
        """QK^T and PV over the causal pairs only: query i sees cached + i + 1 keys."""
        pairs = self.new * self.cached + self.new * (self.new + 1) / 2
        return 4.0 * HEAD_DIM * pairs * HQ * self.batch

    def ours(self, kv: str = "bf16", max_seq_len: int | None = None, **kw) -> Callable[[], object]:
        """Our call on this batch over the ``kv`` cache; ``max_seq_len`` as the launch sees it
        (an engine's graph capture passes max_model_len, not the batch's longest sequence)."""
        k, v = self.k_cache, self.v_cache
        if kv == "fp8":
            k, v, kw["k_scale"], kw["v_scale"] = self.fp8()
        args = (self.q, k, v, self.block_tables, self.seq_lens, self.query_start_loc, SCALE,
                self.new, max_seq_len or self.seq_len)  # fmt: skip
        return lambda: paged_attention(*args, out=self.out, **kw)

    def gathered(self, cache: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, S, D] view of the contiguous copy of each sequence's context."""
        pages = cache[self.block_tables.long()]  # [B, blocks, BLOCK, Hkv, D]
        flat = pages.view(self.batch, -1, HKV, HEAD_DIM)[:, : self.seq_len]
        return flat.transpose(1, 2)

    def q4(self) -> torch.Tensor:
        return self.q.view(self.batch, self.new, HQ, HEAD_DIM).transpose(1, 2).contiguous()


def sdpa(q4: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cached: int, new: int):
    """SDPA with the kernel's causal rule (bottom-right aligned when keys outnumber queries)."""
    if new == 1:
        return F.scaled_dot_product_attention(q4, k, v, scale=SCALE, enable_gqa=k.shape[1] != HQ)
    if k.shape[1] != HQ:
        k = k.repeat_interleave(HQ // k.shape[1], dim=1)
        v = v.repeat_interleave(HQ // v.shape[1], dim=1)
    if cached == 0:
        return F.scaled_dot_product_attention(q4, k, v, scale=SCALE, is_causal=True)
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(new, cached + new)
    return F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, scale=SCALE)


def sdpa_to_tokens(o4: torch.Tensor) -> torch.Tensor:
    return o4.transpose(1, 2).reshape(-1, HQ, HEAD_DIM)


# ---------------------------------------------------------------- flashinfer

FI = None
FI_WORKSPACE = None


def load_flashinfer() -> None:
    global FI, FI_WORKSPACE
    if ARGS.no_flashinfer or DEVICE != "cuda":
        RESULTS["meta"]["flashinfer"] = "skipped"
        return
    try:
        t = time.time()
        import flashinfer

        FI = flashinfer
        FI_WORKSPACE = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
        RESULTS["meta"]["flashinfer"] = getattr(flashinfer, "__version__", "?")
        log(f"flashinfer {RESULTS['meta']['flashinfer']} imported in {time.time() - t:.1f}s")
    except Exception as exc:  # noqa: BLE001 - record and go on without the peer
        RESULTS["meta"]["flashinfer"] = f"unavailable: {exc!r}"
        record_error("import flashinfer", exc)


def fi_page_table(case: Case):
    indptr = torch.arange(case.batch + 1, device=DEVICE, dtype=torch.int32) * case.blocks_per_seq
    indices = case.block_tables.reshape(-1).contiguous()
    last = case.seq_len - (case.blocks_per_seq - 1) * BLOCK
    last_page_len = torch.full((case.batch,), last, device=DEVICE, dtype=torch.int32)
    return indptr, indices, last_page_len


def fi_decode(case: Case, kv: str = "bf16") -> Callable[[], object]:
    wrapper = FI.BatchDecodeWithPagedKVCacheWrapper(FI_WORKSPACE, "NHD", use_tensor_cores=True)
    indptr, indices, last = fi_page_table(case)
    caches, extra = (case.k_cache, case.v_cache), {}
    if kv == "fp8":
        k8, v8, ks, vs = case.fp8()
        caches, extra = (k8, v8), {"k_scale": float(ks), "v_scale": float(vs)}
    wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, BLOCK, q_data_type=DTYPE,
                 kv_data_type=caches[0].dtype, sm_scale=SCALE)  # fmt: skip
    return lambda: wrapper.run(case.q, caches, **extra)


def fi_prefill(case: Case, backend: str) -> Callable[[], object]:
    wrapper = FI.BatchPrefillWithPagedKVCacheWrapper(FI_WORKSPACE, "NHD", backend=backend)
    indptr, indices, last = fi_page_table(case)
    qo_indptr = case.query_start_loc
    wrapper.plan(qo_indptr, indptr, indices, last, HQ, HKV, HEAD_DIM, BLOCK, causal=True,
                 q_data_type=DTYPE, kv_data_type=DTYPE, sm_scale=SCALE)  # fmt: skip
    return lambda: wrapper.run(case.q, (case.k_cache, case.v_cache))


# ---------------------------------------------------------------- correctness on the device


def random_mixed_check(seed: int, block_size: int, qpkv: int, dtype, splits: int | None) -> None:
    """A ragged batch of decode tokens and prefill chunks (or decode only when splitting)."""
    gen = torch.Generator().manual_seed(seed)
    num_seqs = 5
    decode_only = splits is not None and splits > 1
    max_new, max_ctx = (20, 100) if ARGS.dry_run else (300, 3000)
    qlens = [1 if decode_only or i % 2 else int(torch.randint(2, max_new, (1,), generator=gen))
             for i in range(num_seqs)]  # fmt: skip
    ctx = [int(torch.randint(0, max_ctx, (1,), generator=gen)) for _ in range(num_seqs)]
    seq = [c + n for c, n in zip(ctx, qlens)]
    nb = [triton.cdiv(s, block_size) for s in seq]
    total = sum(nb) + 4
    kc = torch.randn(total, block_size, 2, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    vc = torch.randn(total, block_size, 2, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    perm = torch.randperm(total, generator=gen)
    bt = torch.zeros(num_seqs, max(nb), dtype=torch.int32)
    used = 0
    for b, n in enumerate(nb):
        bt[b, :n] = perm[used : used + n]
        used += n
    qsl = torch.zeros(num_seqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(qlens), 0)
    q = torch.randn(int(qsl[-1]), 2 * qpkv, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    bt, qsl, sl = bt.to(DEVICE), qsl.to(DEVICE), torch.tensor(seq, dtype=torch.int32).to(DEVICE)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kc, vc, bt, sl, qsl, SCALE, max(qlens), max(seq), out=out,
                    num_splits=splits)  # fmt: skip
    ref = paged_attention_ref(q.float(), kc.float(), vc.float(), bt, sl, qsl, SCALE,
                              max(qlens), max(seq))  # fmt: skip
    err = rel_err(out, ref)
    ok = bool(not torch.isnan(out).any()) and err <= (1e-5 if dtype == torch.float32 else 1e-2)
    RESULTS["checks"].append({"check": "random_mixed", "seed": seed, "block_size": block_size,
                              "queries_per_kv": qpkv, "dtype": str(dtype), "splits": splits,
                              "query_lens": qlens, "rel_err": err, "ok": ok})  # fmt: skip
    log(f"check mixed seed={seed} bs={block_size} qpkv={qpkv} {dtype} splits={splits}: "
        f"err {err:.2e} {'ok' if ok else 'FAIL'}")  # fmt: skip


def cache_write_check() -> None:
    tokens, bs = 300, 16
    k = torch.randn(tokens, HKV, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    v = torch.randn_like(k)
    kc = torch.zeros(64, bs, HKV, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(64 * bs, device=DEVICE)[:tokens]
    slots[::7] = -1
    write_kv_cache(k, v, kc, vc, slots)
    keep = slots >= 0
    s = slots[keep]
    ok = torch.equal(kc[s // bs, s % bs], k[keep]) and torch.equal(vc[s // bs, s % bs], v[keep])
    ok = ok and int((kc != 0).any(-1).any(-1).sum()) == int(keep.sum())
    RESULTS["checks"].append({"check": "cache_write_round_trip", "ok": bool(ok)})
    log(f"check cache write round trip: {'ok' if ok else 'FAIL'}")


def fp8_checks() -> None:
    """On the device: the fp8 cache writer against the torch quantisation bit for bit (the
    GPU's cvt rounding vs torch's), and decode/prefill attention over an fp8 cache against the
    float32 reference on the dequantised cache."""
    tokens, bs = 300, 16
    gen = torch.Generator(device=DEVICE).manual_seed(9)
    mag = 10 ** (torch.rand(tokens, HKV, HEAD_DIM, device=DEVICE, generator=gen) * 8 - 4)
    k = (torch.randn(mag.shape, device=DEVICE, generator=gen).sign() * mag).to(DTYPE)
    v = torch.randn_like(k)
    for scales in ((torch.tensor([0.37]), torch.tensor([0.05])),
                   (torch.rand(HKV) + 0.01, torch.rand(HKV) + 0.01)):
        ks, vs = (t.to(DEVICE) for t in scales)
        kc = torch.zeros(64, bs, HKV, HEAD_DIM, device=DEVICE, dtype=FP8)
        vc = torch.zeros_like(kc)
        slots = torch.randperm(64 * bs, device=DEVICE)[:tokens]
        slots[::7] = -1
        write_kv_cache(k, v, kc, vc, slots, ks, vs)
        keep = slots >= 0
        sl = slots[keep]
        ok = torch.equal(kc[sl // bs, sl % bs].view(torch.uint8),
                         quantize_kv_ref(k[keep], ks).view(torch.uint8))
        ok = ok and torch.equal(vc[sl // bs, sl % bs].view(torch.uint8),
                                quantize_kv_ref(v[keep], vs).view(torch.uint8))
        RESULTS["checks"].append({"check": "fp8_cache_write_bit_exact", "per_head": ks.numel() > 1,
                                  "ok": bool(ok)})
        log(f"check fp8 cache write (per head {ks.numel() > 1}): {'ok' if ok else 'FAIL'}")
    for new, cached in ((1, 700), (37, 300)):
        case = Case(3, new, cached, seed=new)
        k8, v8, ks, vs = case.fp8()
        ref = paged_attention_ref(case.q.float(), k8, v8, case.block_tables, case.seq_lens,
                                  case.query_start_loc, SCALE, new, case.seq_len, k_scale=ks,
                                  v_scale=vs)  # fmt: skip
        for variant in FP8_VARIANTS:  # each conversion variant, as the sweep may pick it
            cfg = dataclasses.replace(choose_config(new, HQ // HKV, kv_fp8=True), fp8_convert=variant)
            case.out.fill_(float("nan"))
            case.ours("fp8", config=cfg)()
            err = rel_err(case.out, ref)
            ok = bool(not torch.isnan(case.out).any()) and err <= 1e-2
            RESULTS["checks"].append({"check": "fp8_attention_vs_dequantised", "new_tokens": new,
                                      "fp8_convert": variant, "rel_err": err, "ok": ok})
            log(f"check fp8 attention new={new} {variant}: err {err:.2e} {'ok' if ok else 'FAIL'}")


def cuda_graph_check() -> None:
    """Capture one decode call in a CUDA graph (fails if the call syncs with the host)."""
    case = Case(4, 1, 2047, seed=5)
    fn = case.ours()
    fn()
    eager = case.out.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    case.out.fill_(float("nan"))
    graph.replay()
    sync()
    ok = torch.equal(case.out, eager)
    t_graph = time_us(graph.replay)
    t_eager = time_us(fn)
    RESULTS["graph"] = {"shape": "4x2048 decode", "captured": True, "replay_equals_eager": ok,
                        "graph_replay_us": t_graph, "eager_us": t_eager}  # fmt: skip
    log(f"cuda graph capture ok={ok}: replay {t_graph:.1f} us vs eager {t_eager:.1f} us")


# ---------------------------------------------------------------- timing


def bench_decode(batch: int, context: int) -> None:
    case = Case(batch, 1, context - 1, seed=batch * 7 + context)
    name = f"{batch}x{context}"
    nbytes = case.kv_bytes()
    read_tbps = RESULTS["stream"].get("read_tbps", float("nan"))
    row: dict = {"shape": name, "batch": batch, "context": context, "kv_bytes": nbytes}
    cfg = choose_config(1, HQ // HKV)
    block_q = cfg.block_m // (HQ // HKV)
    splits = choose_num_splits(batch // block_q + batch, HKV, 1, context, block_q,
                               num_sms_of(case.q.device))  # fmt: skip
    row["splits"] = splits
    row["config"] = vars(cfg)
    # correctness of this very shape against SDPA on the gathered context (fp32 softmax inside)
    k4, v4 = case.gathered(case.k_cache).contiguous(), case.gathered(case.v_cache).contiguous()
    q4 = case.q4()
    case.out.fill_(float("nan"))
    case.ours()()
    ref = sdpa_to_tokens(sdpa(q4.float(), k4.float(), v4.float(), case.cached, 1))
    row["rel_err_vs_sdpa_fp32"] = rel_err(case.out, ref)
    del ref
    t = measure(row, "ours", case.ours(), nbytes, "tbps")
    row["ours_frac_of_stream"] = row["ours_tbps"] / read_tbps
    row["bf16_tokens_per_s"] = batch / (t * 1e-6)
    if "fp8" in KV_DTYPES:
        decode_fp8(case, row, t)
    try:
        # F821: ruff flags the closure because of the `del k4, v4` below; it runs before that
        t_sdpa = measure(row, "sdpa_contig", lambda: sdpa(q4, k4, v4, case.cached, 1), nbytes,  # noqa: F821
                         "tbps")  # fmt: skip
        row["speed_vs_sdpa_contig"] = t_sdpa / t
    except Exception as exc:  # noqa: BLE001
        record_error(f"sdpa {name}", exc)
    del k4, v4
    try:
        def gather_sdpa():
            return sdpa(q4, case.gathered(case.k_cache), case.gathered(case.v_cache), case.cached, 1)

        t_g = measure(row, "gather_sdpa", gather_sdpa, nbytes, "tbps")
        row["speed_vs_gather_sdpa"] = t_g / t
    except Exception as exc:  # noqa: BLE001
        record_error(f"gather+sdpa {name}", exc)
    if FI is not None:
        flashinfer_decode(case, row, t)
    row["ours_host_us_per_call"] = host_us_per_call(case.ours())
    if FI is not None and "flashinfer_us" in row:
        row["flashinfer_host_us_per_call"] = host_us_per_call(fi_decode(case))
    RESULTS["decode"].append(row)
    log(f"decode {name}: host {row['ours_host_us_per_call']:.1f} us/call; ours {t:.1f} us {row['ours_tbps']:.2f} TB/s (splits {splits}, err "
        f"{row['rel_err_vs_sdpa_fp32']:.1e}); fp8 x{row.get('fp8_speedup', float('nan')):.2f}; "
        f"sdpa {row.get('sdpa_contig_tbps', float('nan')):.2f} TB/s; gather "
        f"x{row.get('speed_vs_gather_sdpa', float('nan')):.1f}; flashinfer "
        f"{row.get('flashinfer_tbps', float('nan')):.2f} TB/s")  # fmt: skip
    save()


def decode_fp8(case: Case, row: dict, t_bf16: float) -> None:
    """Our decode over the e4m3 copy of the cache: time, tokens/s against bf16's, and how far
    its output is from the bf16 cache's (the quantisation error, not a kernel error)."""
    bf16_out = case.out.clone()
    try:
        fn = case.ours("fp8")
        fn()
        row["fp8_rel_err_vs_bf16_cache"] = rel_err(case.out, bf16_out)
        t8 = measure(row, "fp8", fn, case.kv_bytes("fp8"), "tbps")
        row["fp8_tokens_per_s"] = case.batch / (t8 * 1e-6)
        row["fp8_speedup"] = t_bf16 / t8
    except Exception as exc:  # noqa: BLE001
        record_error(f"fp8 decode {row['shape']}", exc)
    finally:
        case.out.copy_(bf16_out)


def flashinfer_decode(case: Case, row: dict, t: float) -> None:
    name, nbytes = row["shape"], case.kv_bytes()
    try:
        fn = fi_decode(case)
        o = fn()
        row["flashinfer_rel_err_vs_ours"] = rel_err(o, case.out)
        t_fi = measure(row, "flashinfer", fn, nbytes, "tbps")
        row["speed_vs_flashinfer"] = t_fi / t
    except Exception as exc:  # noqa: BLE001
        record_error(f"flashinfer decode {name}", exc)
    if "fp8" in KV_DTYPES and "fp8_us" in row:
        try:
            fn = fi_decode(case, "fp8")
            fn()
            t_fi8 = measure(row, "flashinfer_fp8", fn, case.kv_bytes("fp8"), "tbps")
            row["fp8_speed_vs_flashinfer_fp8"] = t_fi8 / row["fp8_us"]
        except Exception as exc:  # noqa: BLE001
            record_error(f"flashinfer fp8 decode {name}", exc)


def split_options(batch: int, num_sms: int) -> list[int]:
    if ARGS.dry_run:
        return [1, 8]
    if batch * HKV < num_sms:
        return [1, 8, 16, 32, 64]
    if batch * HKV < 2 * num_sms:
        return [1, 2, 4]
    return [1, 2]


def sweep_decode(batch: int, context: int, kv: str) -> None:
    """Graph-replay times of each config x split count at one decode shape (after the headline
    rows, when the peers' buffers are gone)."""
    if elapsed_s() > ARGS.budget_s:
        log(f"skipping decode sweep {batch}x{context} {kv}: out of time budget")
        return
    case = Case(batch, 1, context - 1, seed=batch * 7 + context)
    name = f"{batch}x{context}"
    nbytes = case.kv_bytes(kv)
    configs = DECODE_SWEEP[: 2 if ARGS.dry_run else None]  # fp8: fp8_focus_sweep
    for cfg in configs:
        for s in split_options(batch, num_sms_of(case.q.device)):
            try:
                ts = time_graph_us(case.ours(kv, config=cfg, num_splits=s), rep_ms=50)
            except Exception as exc:  # noqa: BLE001
                record_error(f"sweep {name} {kv} {cfg} {s}", exc)
                continue
            RESULTS["sweep"].append({"path": "decode", "kv": kv, "shape": name, "config": vars(cfg),
                                     "splits": s, "us": ts, "timing": "graph",
                                     "tbps": nbytes / (ts * 1e-6) / 1e12})  # fmt: skip
    rows = [r for r in RESULTS["sweep"] if r["shape"] == name and r["kv"] == kv]
    if rows:
        best = min(rows, key=lambda r: r["us"])
        log(f"  sweep best {name} {kv}: {best['us']:.1f} us {best['tbps']:.2f} TB/s "
            f"{best['config']} splits {best['splits']}")  # fmt: skip
    save()


def fp8_focus_configs() -> list[AttentionConfig]:
    """The focused grid in priority order, every chosen variant (FP8_VARIANTS, in that order)
    at each point; points whose K+V tiles of (stages - 1) pipeline buffers cannot fit shared
    memory are left out."""
    configs = []
    for tile_n, stages, warps in FP8_FOCUS_POINTS:
        if (stages - 1) * tile_n * HEAD_DIM * 2 > FP8_FOCUS_SMEM_BYTES:
            continue
        configs += [AttentionConfig(16, tile_n, warps, stages, v) for v in FP8_VARIANTS]
    return configs


def focus_row(shape: str, kind: str, us: float, nbytes: int, t_bf16: float, **extra) -> dict:
    row = {"shape": shape, "kind": kind, "us": us, "gbps": nbytes / (us * 1e-6) / 1e9,
           "ratio_vs_bf16": t_bf16 / us, **extra}  # fmt: skip
    RESULTS["fp8_focus"].append(row)
    return row


def focus_peers(case: Case, shape: str) -> float:
    """bf16 (our default) and FlashInfer bf16/fp8 at one shape; returns the bf16 time."""
    t_bf16 = time_graph_us(case.ours())
    focus_row(shape, "bf16", t_bf16, case.kv_bytes(), t_bf16, config=vars(choose_config(1, HQ // HKV)))
    for kv in ("bf16", "fp8") if FI is not None else ():
        try:
            us = time_graph_us(fi_decode(case, kv))
            focus_row(shape, f"flashinfer_{kv}", us, case.kv_bytes(kv), t_bf16)
        except Exception as exc:  # noqa: BLE001
            record_error(f"fp8 focus flashinfer {kv} {shape}", exc)
    return t_bf16


def fp8_focus_shape(shape: str, configs: list[AttentionConfig], deadline_s: float) -> None:
    """Every config at one decode shape over the e4m3 cache (the heuristic's split count, as
    the engine runs it), each output first checked against the native default's."""
    b, c = map(int, shape.split("x"))
    case = Case(b, 1, c - 1, seed=b * 7 + c)
    t_bf16 = focus_peers(case, shape)
    case.ours("fp8", config=dataclasses.replace(CONFIG_TABLE["decode", "fp8"], fp8_convert="native"))()
    ref = case.out.clone()  # native widening is exact; fp8_checks held it to the reference
    nbytes = case.kv_bytes("fp8")
    for cfg in configs:
        if elapsed_s() > deadline_s:
            log(f"  fp8 focus {shape}: out of time budget after {cfg}")
            break
        try:
            fn = case.ours("fp8", config=cfg)
            case.out.fill_(float("nan"))
            fn()
            err = rel_err(case.out, ref)
            if not err <= FP8_FOCUS_MAX_REL_ERR:  # NaN fails too
                RESULTS["errors"].append({"where": f"fp8 focus {shape} {cfg}",
                                          "error": f"output rel err {err:.3g} vs native"})
                continue
            us = time_graph_us(fn, rep_ms=50)
        except Exception as exc:  # noqa: BLE001
            record_error(f"fp8 focus {shape} {cfg}", exc)
            continue
        focus_row(shape, "fp8", us, nbytes, t_bf16, variant=cfg.fp8_convert, config=vars(cfg),
                  rel_err_vs_native=err)  # fmt: skip
        RESULTS["sweep"].append({"path": "decode", "kv": "fp8", "shape": shape, "config": vars(cfg),
                                 "splits": "auto", "us": us, "timing": "graph",
                                 "tbps": nbytes / (us * 1e-6) / 1e12})  # fmt: skip
    save()


def fp8_focus_sweep() -> None:
    """The grid at the first shape (64x4096, the target) within ~60% of the remaining budget,
    then the shipped default, each variant's best and the best few overall at the other
    shapes, each shape only when the time per measurement so far says all of them fit."""
    wanted = [w for w in ARGS.shapes.split(",") if "x" in w and "+" not in w]
    shapes = wanted or FP8_FOCUS_SHAPES
    start = elapsed_s()
    fp8_focus_shape(shapes[0], fp8_focus_configs(), start + 0.6 * (ARGS.budget_s - start))
    first = sorted((r for r in RESULTS["fp8_focus"] if r["shape"] == shapes[0] and r["kind"] == "fp8"),
                   key=lambda r: r["us"])  # fmt: skip
    # the shipped default, each variant's best, then the overall best few
    per_variant = [next((r for r in first if r["variant"] == v), None) for v in FP8_VARIANTS]
    picked = [r for r in per_variant if r is not None] + first[:FP8_FOCUS_TOP_K]
    top = list(dict.fromkeys([CONFIG_TABLE["decode", "fp8"]] + [AttentionConfig(**r["config"]) for r in picked]))
    per_measure_s = (elapsed_s() - start) / max(len(first) + 3, 1)
    for shape in shapes[1:]:
        if elapsed_s() + per_measure_s * (len(top) + 3) > ARGS.budget_s:
            log(f"  fp8 focus: skipping {shape}, it would not fit the time budget")
            continue
        fp8_focus_shape(shape, top, ARGS.budget_s)
    fp8_focus_summary()


def fp8_focus_summary() -> None:
    """Per shape and variant: the best config's time, GB/s of fp8 bytes and tokens/s against
    our bf16 default (and FlashInfer's fp8 alongside)."""
    best_rows = []
    for shape in dict.fromkeys(r["shape"] for r in RESULTS["fp8_focus"]):
        rows = [r for r in RESULTS["fp8_focus"] if r["shape"] == shape]
        peers = {r["kind"]: r for r in rows if r["kind"] != "fp8"}
        for variant in FP8_VARIANTS:
            mine = [r for r in rows if r.get("variant") == variant]
            if not mine:
                continue
            best = min(mine, key=lambda r: r["us"])
            fi8 = peers.get("flashinfer_fp8")
            vs_fi8 = fi8["us"] / best["us"] if fi8 else None
            best_rows.append({"shape": shape, "variant": variant, "us": best["us"], "gbps": best["gbps"],
                              "ratio_vs_bf16": best["ratio_vs_bf16"], "config": best["config"],
                              "vs_flashinfer_fp8": vs_fi8})  # fmt: skip
            cfg = best["config"]
            log(f"fp8 {shape} {variant:>6}: {best['us']:.1f} us, {best['gbps']:.0f} GB/s of fp8 bytes, "
                f"x{best['ratio_vs_bf16']:.2f} of bf16 tokens/s (bf16 {peers['bf16']['gbps']:.0f} GB/s), "
                f"x{fmt(vs_fi8, '.2f')} vs FlashInfer fp8; tile {cfg['tile_n']} stages "
                f"{cfg['num_stages']} warps {cfg['num_warps']}")  # fmt: skip
    RESULTS["fp8_focus_best"] = best_rows
    save()


def graph_probe(batch: int, context: int) -> None:
    """Why a shape can be slower as a CUDA-graph replay than eager (32x32768 was 0.88x of
    FlashInfer as a replay, 0.99x eager): the same call timed eager and as replays in both
    orders, a second capture, 10/50/90th percentiles (a bimodal replay shows as a wide spread),
    explicit split counts, and the capture an engine makes (max_seq_len = max_model_len)."""
    case = Case(batch, 1, context - 1, seed=batch * 7 + context)
    name = f"{batch}x{context}"
    nbytes = case.kv_bytes()

    def add(label: str, timing: str, us: float, **extra) -> None:
        RESULTS["graph_probe"].append({"shape": name, "label": label, "timing": timing, "us": us,
                                       "tbps": nbytes / (us * 1e-6) / 1e12, **extra})
        log(f"  probe {name} {label} [{timing}]: {us:.1f} us")

    fn = case.ours()
    add("default, graph first", "graph", time_graph_us(fn))
    add("default", "eager", time_us(fn))
    graph = captured(fn)
    replay = graph.replay if graph is not None else fn
    add("default, second capture", "graph", time_us(replay))
    q10, q50, q90 = quantiles_us(replay)
    add("default, second capture (p10/p50/p90)", "graph", q50, p10_us=q10, p90_us=q90)
    q10, q50, q90 = quantiles_us(fn)
    add("default (p10/p50/p90)", "eager", q50, p10_us=q10, p90_us=q90)
    del graph
    for s in (1, 2, 4):
        add(f"splits {s}", "graph", time_graph_us(case.ours(num_splits=s)))
    add(f"engine capture: max_seq_len {CAPTURE_MAX_SEQ_LEN}", "graph",
        time_graph_us(case.ours(max_seq_len=CAPTURE_MAX_SEQ_LEN)))
    if "fp8" in KV_DTYPES:
        add("fp8 default", "graph", time_graph_us(case.ours("fp8")))
        add("fp8 default", "eager", time_us(case.ours("fp8")))
    if FI is not None:
        fi = fi_decode(case)
        add("flashinfer", "graph", time_graph_us(fi))
        add("flashinfer", "eager", time_us(fi))
    save()


def engine_capture_probe(batch: int, context: int) -> None:
    """A small batch as the engine's decode graph sees it: launched with max_model_len's split
    count, the real length deciding the segments that work, against the real-length launch."""
    case = Case(batch, 1, context - 1, seed=batch * 7 + context)
    name = f"{batch}x{context}"
    for label, kw in (("real max_seq_len", {}), ("engine capture", {"max_seq_len": CAPTURE_MAX_SEQ_LEN})):
        us = time_graph_us(case.ours(**kw))
        RESULTS["graph_probe"].append({"shape": name, "label": label, "timing": "graph", "us": us,
                                       "tbps": case.kv_bytes() / (us * 1e-6) / 1e12})
        log(f"  probe {name} {label}: {us:.1f} us")
    save()


def bench_prefill(batch: int, new: int, cached: int) -> None:
    case = Case(batch, new, cached, seed=batch + new + cached)
    name = f"{batch}x{new}+{cached}"
    flops = case.useful_flops()
    row: dict = {"shape": name, "batch": batch, "new_tokens": new, "cached": cached,
                 "useful_flops": flops, "config": vars(choose_config(new, HQ // HKV))}  # fmt: skip
    q4 = case.q4()
    k4, v4 = case.gathered(case.k_cache).contiguous(), case.gathered(case.v_cache).contiguous()
    case.out.fill_(float("nan"))
    case.ours()()
    ref = sdpa_to_tokens(sdpa(q4, k4, v4, cached, new))  # bf16 SDPA: FA2 math, fp32 softmax
    row["rel_err_vs_sdpa"] = rel_err(case.out, ref)
    del ref
    t = measure(row, "ours", case.ours(), flops, "tflops")
    if "fp8" in KV_DTYPES:
        bf16_out = case.out.clone()
        try:
            fn = case.ours("fp8")
            fn()
            row["fp8_rel_err_vs_bf16_cache"] = rel_err(case.out, bf16_out)
            row["fp8_speedup"] = t / measure(row, "fp8", fn, flops, "tflops")
        except Exception as exc:  # noqa: BLE001
            record_error(f"fp8 prefill {name}", exc)
    try:
        k_rep = k4.repeat_interleave(HQ // HKV, dim=1)
        v_rep = v4.repeat_interleave(HQ // HKV, dim=1)
        # F821: as in bench_decode, the closure runs before the `del` that frees the copies
        t_sdpa = measure(row, "sdpa_contig", lambda: sdpa(q4, k_rep, v_rep, cached, new), flops,  # noqa: F821
                         "tflops")  # fmt: skip
        row["frac_of_sdpa_tflops"] = t_sdpa / t
        del k_rep, v_rep
    except Exception as exc:  # noqa: BLE001
        record_error(f"sdpa prefill {name}", exc)
    del k4, v4
    try:
        def gather_sdpa():
            return sdpa(q4, case.gathered(case.k_cache), case.gathered(case.v_cache), cached, new)

        t_g = measure(row, "gather_sdpa", gather_sdpa, flops, "tflops")
        row["speed_vs_gather_sdpa"] = t_g / t
    except Exception as exc:  # noqa: BLE001
        record_error(f"gather+sdpa prefill {name}", exc)
    if FI is not None:
        try:
            fn = fi_prefill(case, "fa2")
            o = fn()
            row["flashinfer_rel_err_vs_ours"] = rel_err(o, case.out)
            t_fi = measure(row, "flashinfer", fn, flops, "tflops")
            row["speed_vs_flashinfer"] = t_fi / t
            row["flashinfer_backend"] = "fa2"
        except Exception as exc:  # noqa: BLE001
            record_error(f"flashinfer prefill {name}", exc)
    RESULTS["prefill"].append(row)
    log(f"prefill {name}: ours {t:.0f} us {row['ours_tflops']:.0f} TFLOP/s (err "
        f"{row['rel_err_vs_sdpa']:.1e}); fp8 x{row.get('fp8_speedup', float('nan')):.2f}; sdpa "
        f"{row.get('sdpa_contig_tflops', float('nan')):.0f}; flashinfer "
        f"{row.get('flashinfer_tflops', float('nan')):.0f}")  # fmt: skip
    save()


def sweep_prefill(batch: int, new: int, cached: int, kv: str) -> None:
    if elapsed_s() > ARGS.budget_s:
        log(f"skipping prefill sweep {batch}x{new}+{cached} {kv}: out of time budget")
        return
    case = Case(batch, new, cached, seed=batch + new + cached)
    name = f"{batch}x{new}+{cached}"
    flops = case.useful_flops()
    for cfg in PREFILL_SWEEP[: 2 if ARGS.dry_run else None]:
        try:
            ts = time_graph_us(case.ours(kv, config=cfg, num_splits=1), rep_ms=50)
        except Exception as exc:  # noqa: BLE001
            record_error(f"sweep {name} {kv} {cfg}", exc)
            continue
        RESULTS["sweep"].append({"path": "prefill", "kv": kv, "shape": name, "config": vars(cfg),
                                 "splits": 1, "us": ts, "tflops": flops / (ts * 1e-6) / 1e12})
    rows = [r for r in RESULTS["sweep"] if r["shape"] == name and r["kv"] == kv]
    if rows:
        best = min(rows, key=lambda r: r["us"])
        log(f"  sweep best {name} {kv}: {best['us']:.0f} us {best['tflops']:.0f} TFLOP/s "
            f"{best['config']}")  # fmt: skip
    save()


def best_configs() -> None:
    """The config table (kernels/attention_configs.json's form) the sweep points to: per path
    and KV kind, the config with the lowest geometric mean over the swept shapes of its time
    (at its best split count) relative to the best time at that shape. Entries without sweep
    data keep the shipped values. Written to DIR/best_configs.json."""
    table = json.loads(CONFIG_TABLE_PATH.read_text())
    table["about"] = (f"written by bench_h200.py on {RESULTS['meta'].get('gpu', '?')}, "
                      f"{RESULTS['meta'].get('date', '?')}; copy to kernels/attention_configs.json")
    for path in ("decode", "prefill"):
        for kind in KV_KINDS:
            kv = "fp8" if kind == "fp8" else "bf16"
            rows = [r for r in RESULTS["sweep"] if r["path"] == path and r["kv"] == kv]
            pick = _geomean_best(rows)
            if pick is None:
                continue
            cfg, score, shapes = pick
            table[path][kind] = {**cfg, "source": (
                f"sweep: geomean {score:.3f}x of the best time per shape over {', '.join(shapes)}; "
                f"shipped {vars(CONFIG_TABLE[path, kind])}")}
    RESULTS["best_configs"] = table
    (ARGS.out / "best_configs.json").write_text(json.dumps(table, indent=1))


def _geomean_best(rows: list[dict]) -> tuple[dict, float, list[str]] | None:
    shapes = sorted({r["shape"] for r in rows})
    if not shapes:
        return None
    best_at = {s: min(r["us"] for r in rows if r["shape"] == s) for s in shapes}
    scores = {}
    for key in {json.dumps(r["config"], sort_keys=True) for r in rows}:
        times = [min((r["us"] for r in rows if r["shape"] == s and
                      json.dumps(r["config"], sort_keys=True) == key), default=None) for s in shapes]
        if None in times:  # a config that failed somewhere cannot be the default
            continue
        scores[key] = math.exp(sum(math.log(t / best_at[s]) for t, s in zip(times, shapes)) / len(shapes))
    if not scores:
        return None
    key = min(scores, key=scores.get)
    return json.loads(key), scores[key], shapes


def flashinfer_fa3_extra() -> None:
    """FlashInfer's Hopper (FA3) prefill, if time is left: its JIT build is the slow one."""
    for row in RESULTS["prefill"]:
        if elapsed_s() > ARGS.budget_s - 150:  # its nvcc build alone can take minutes
            log("skipping FlashInfer fa3 prefill: out of time budget")
            return
        try:
            case = Case(row["batch"], row["new_tokens"], row["cached"], seed=1)
            fn = fi_prefill(case, "fa3")
            fn()
            measure(row, "flashinfer_fa3", fn, row["useful_flops"], "tflops")
            log(f"flashinfer fa3 prefill {row['shape']}: {row['flashinfer_fa3_tflops']:.0f} TFLOP/s")
            save()
        except Exception as exc:  # noqa: BLE001
            record_error(f"flashinfer fa3 prefill {row['shape']}", exc)
            return


# ---------------------------------------------------------------- targets and report


def evaluate_targets() -> None:
    targets = []
    read = RESULTS["stream"].get("read_tbps", float("nan"))

    def add(name: str, value: float, floor: float, unit: str = "") -> None:
        targets.append({"target": name, "value": value, "floor": floor, "unit": unit,
                        "met": bool(value >= floor)})  # fmt: skip

    for r in RESULTS["decode"]:
        b, c = r["batch"], r["context"]
        if b * c >= 64 * 4096 and b >= 64 or (b, c) == (32, 32768):
            add(f"decode {r['shape']} TB/s (>= 3.5)", r["ours_tbps"], 3.5, "TB/s")
        if b >= 32 and "speed_vs_sdpa_contig" in r:
            add(f"decode {r['shape']} vs SDPA contiguous (>= 0.9)", r["speed_vs_sdpa_contig"], 0.9)
        if "speed_vs_gather_sdpa" in r:
            add(f"decode {r['shape']} vs gather+SDPA (>= 3)", r["speed_vs_gather_sdpa"], 3.0)
        if "speed_vs_flashinfer" in r:
            add(f"decode {r['shape']} vs FlashInfer, graph replays (>= 1.0)", r["speed_vs_flashinfer"], 1.0)
        if "fp8_speedup" in r and (b, c) == (64, 4096):
            add("decode 64x4096 fp8 vs bf16 tokens/s, default configs (>= 1.8)", r["fp8_speedup"], 1.8)
            best = {kv: min((s["us"] for s in RESULTS["sweep"] if s["path"] == "decode"
                             and s["kv"] == kv and s["shape"] == "64x4096"), default=None)
                    for kv in ("bf16", "fp8")}
            if None not in best.values():
                add("decode 64x4096 fp8 vs bf16 tokens/s, best swept configs (>= 1.8)",
                    best["bf16"] / best["fp8"], 1.8)
        if (b, c) == (1, 32768):
            add("decode 1x32768 TB/s via split-KV (>= 2)", r["ours_tbps"], 2.0, "TB/s")
    for r in RESULTS["fp8_focus_best"]:
        if r["shape"] == "64x4096":
            add(f"decode 64x4096 fp8 ({r['variant']}, best focused config) vs bf16 default "
                "tokens/s (>= 1.8)", r["ratio_vs_bf16"], 1.8)
    for r in RESULTS["prefill"]:
        if "frac_of_sdpa_tflops" in r:
            add(f"prefill {r['shape']} vs SDPA (>= 1.0)", r["frac_of_sdpa_tflops"], 1.0)
        if "speed_vs_gather_sdpa" in r:
            add(f"prefill {r['shape']} vs gather+SDPA (>= 3)", r["speed_vs_gather_sdpa"], 3.0)
        if "speed_vs_flashinfer" in r:
            add(f"prefill {r['shape']} vs FlashInfer fa2 (>= 0.9)", r["speed_vs_flashinfer"], 0.9)
    RESULTS["targets"] = targets
    RESULTS["meta"]["stream_read_tbps"] = read


def fmt(x: float | None, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def markdown() -> str:
    m = RESULTS["meta"]
    s = RESULTS["stream"]
    lines = [
        "# Paged attention on the GPU: results",
        "",
        (f"{m.get('gpu', '?')}, torch {m.get('torch', '?')}, triton {m.get('triton', '?')}, "
        f"flashinfer {m.get('flashinfer', '?')}; {m.get('date', '?')}"),
        f"Command: `{m.get('command', '?')}`",
        (f"Streaming read measured in this run: {fmt(s.get('read_tbps'), '.2f')} TB/s "
        f"(copy, read+write: {fmt(s.get('copy_read_plus_write_tbps'), '.2f')} TB/s)."),
        ("Times are medians of triton.testing.do_bench (L2 flushed before each run) over CUDA-graph "
        "replays of each call (what a serving engine's decode step runs; 'eager' adds the Python "
        "launch cost). Speed ratios are other time / our time (> 1: ours faster)."),
        "",
        "## Decode (32 q heads, 8 KV heads, D 128, bf16, block 16)",
        "",
        ("| batch x context | splits | ours us | ours eager us | ours TB/s | % of read | "
        "SDPA contig TB/s | vs SDPA | vs gather+SDPA | FlashInfer TB/s | vs FlashInfer |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in RESULTS["decode"]:
        lines.append(
            f"| {r['shape']} | {r['splits']} | {fmt(r.get('ours_us'), '.1f')} | "
            f"{fmt(r.get('ours_eager_us'), '.1f')} | {fmt(r.get('ours_tbps'), '.2f')} | {fmt(100 * r.get('ours_frac_of_stream', float('nan')), '.0f')} | "
            f"{fmt(r.get('sdpa_contig_tbps'), '.2f')} | {fmt(r.get('speed_vs_sdpa_contig'), '.2f')} | "
            f"{fmt(r.get('speed_vs_gather_sdpa'), '.1f')} | {fmt(r.get('flashinfer_tbps'), '.2f')} | "
            f"{fmt(r.get('speed_vs_flashinfer'), '.2f')} |"
        )  # fmt: skip
    lines += [
        "",
        "## Prefill (causal, new tokens already in the cache)",
        "",
        ("| seqs x new + cached | ours us | ours TFLOP/s | SDPA contig TFLOP/s | ours/SDPA | "
        "vs gather+SDPA | FlashInfer fa2 TFLOP/s | vs FlashInfer | FlashInfer fa3 TFLOP/s |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in RESULTS["prefill"]:
        lines.append(
            f"| {r['shape']} | {fmt(r.get('ours_us'), '.0f')} | {fmt(r.get('ours_tflops'), '.0f')} | "
            f"{fmt(r.get('sdpa_contig_tflops'), '.0f')} | {fmt(r.get('frac_of_sdpa_tflops'), '.2f')} | "
            f"{fmt(r.get('speed_vs_gather_sdpa'), '.1f')} | {fmt(r.get('flashinfer_tflops'), '.0f')} | "
            f"{fmt(r.get('speed_vs_flashinfer'), '.2f')} | {fmt(r.get('flashinfer_fa3_tflops'), '.0f')} |"
        )  # fmt: skip
    lines += fp8_markdown() + fp8_focus_markdown() + probe_markdown() + sweep_markdown()
    if RESULTS["targets"]:
        lines += ["", "## Targets", "", "| target | value | met |", "|---|---|---|"]
        for t in RESULTS["targets"]:
            lines.append(f"| {t['target']} | {t['value']:.2f} {t['unit']} | "
                         f"{'yes' if t['met'] else 'NO'} |")  # fmt: skip
    checks = RESULTS["checks"]
    if checks:
        bad = [c for c in checks if not c["ok"]]
        lines += ["", f"Correctness checks on the device: {len(checks) - len(bad)}/{len(checks)} "
                  "passed" + (f"; FAILED: {bad}" if bad else ".")]  # fmt: skip
    g = RESULTS["graph"]
    if g:
        lines.append(f"CUDA graph: captured, replay equals eager: {g['replay_equals_eager']}; "
                     f"{g['shape']} replay {g['graph_replay_us']:.1f} us vs eager "
                     f"{g['eager_us']:.1f} us.")  # fmt: skip
    if RESULTS["errors"]:
        lines += ["", "Errors:"] + [f"- {e['where']}: {e['error']}" for e in RESULTS["errors"]]
    return "\n".join(lines) + "\n"


def fp8_markdown() -> list[str]:
    rows = [r for r in RESULTS["decode"] + RESULTS["prefill"] if "fp8_us" in r]
    if not rows:
        return []
    lines = ["", "## FP8 (e4m3) KV cache vs bf16 (per-tensor scales amax/448; graph replays)", "",
             ("| shape | bf16 us | fp8 us | fp8 / bf16 tokens/s | fp8 TB/s or TFLOP/s | "
             "output rel err vs bf16 cache | FlashInfer fp8 us | ours vs FlashInfer fp8 |"),
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rate = r.get("fp8_tbps", r.get("fp8_tflops"))
        lines.append(
            f"| {r['shape']} | {fmt(r.get('ours_us'), '.1f')} | {fmt(r.get('fp8_us'), '.1f')} | "
            f"{fmt(r.get('fp8_speedup'), '.2f')} | {fmt(rate, '.2f')} | "
            f"{fmt(r.get('fp8_rel_err_vs_bf16_cache'), '.3f')} | "
            f"{fmt(r.get('flashinfer_fp8_us'), '.1f')} | {fmt(r.get('fp8_speed_vs_flashinfer_fp8'), '.2f')} |"
        )  # fmt: skip
    return lines


def fp8_focus_markdown() -> list[str]:
    rows = RESULTS["fp8_focus_best"]
    if not rows:
        return []
    lines = ["", "## FP8 decode by conversion variant (best focused config per shape; graph replays)", "",
             ("| shape | variant | us | GB/s of fp8 bytes | fp8 / bf16 tokens/s | vs FlashInfer fp8 | "
              "tile_n, stages, warps |"), "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        c = r["config"]
        lines.append(f"| {r['shape']} | {r['variant']} | {r['us']:.1f} | {r['gbps']:.0f} | "
                     f"{r['ratio_vs_bf16']:.2f} | {fmt(r['vs_flashinfer_fp8'], '.2f')} | "
                     f"{c['tile_n']}, {c['num_stages']}, {c['num_warps']} |")  # fmt: skip
    peers = [r for r in RESULTS["fp8_focus"] if r["kind"] != "fp8"]
    lines += ["", "Alongside (same run): " + "; ".join(
        f"{r['shape']} {r['kind']} {r['us']:.1f} us {r['gbps']:.0f} GB/s" for r in peers)]
    return lines


def probe_markdown() -> list[str]:
    if not RESULTS["graph_probe"]:
        return []
    lines = ["", "## Graph-replay probe (same call eager and as CUDA-graph replays)", "",
             "| shape | variant | timing | us (p50) | p10 / p90 us | TB/s |", "|---|---|---|---|---|---|"]
    for r in RESULTS["graph_probe"]:
        spread = f"{r['p10_us']:.1f} / {r['p90_us']:.1f}" if "p10_us" in r else "-"
        lines.append(f"| {r['shape']} | {r['label']} | {r['timing']} | {r['us']:.1f} | {spread} | "
                     f"{r['tbps']:.2f} |")  # fmt: skip
    return lines


def sweep_markdown() -> list[str]:
    rows = RESULTS["sweep"]
    if not rows:
        return []
    lines = ["", "## Sweep: best launch parameters per shape (graph replays)", "",
             ("| path | kv | shape | best us | config (block_m, tile_n, warps, stages) | splits | "
             "default's us | default / best |"), "|---|---|---|---|---|---|---|---|"]
    for key in sorted({(r["path"], r["kv"], r["shape"]) for r in rows}):
        mine = [r for r in rows if (r["path"], r["kv"], r["shape"]) == key]
        best = min(mine, key=lambda r: r["us"])
        kind = "fp8" if key[1] == "fp8" else "16bit"
        default = vars(CONFIG_TABLE[key[0], kind])
        dflt = [r["us"] for r in mine if r["config"] == default]
        c = best["config"]
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {best['us']:.1f} | {c['block_m']}, {c['tile_n']}, "
            f"{c['num_warps']}, {c['num_stages']}{', ' + c['fp8_convert'] if key[1] == 'fp8' else ''} | "
            f"{best['splits']} | "
            f"{fmt(min(dflt) if dflt else None, '.1f')} | "
            f"{fmt(min(dflt) / best['us'] if dflt else None, '.2f')} |"
        )  # fmt: skip
    if RESULTS["best_configs"]:
        lines += ["", "Config table the sweep points to (written as best_configs.json):", ""]
        for path in ("decode", "prefill"):
            for kind in KV_KINDS:
                e = RESULTS["best_configs"][path][kind]
                lines.append(f"- {path} {kind}: block_m {e['block_m']}, tile_n {e['tile_n']}, "
                             f"warps {e['num_warps']}, stages {e['num_stages']}, fp8_convert "
                             f"{e.get('fp8_convert', 'native')} ({e['source']})")
    return lines


def probe_and_sweep_steps(wanted: set[str]) -> list[tuple[str, Callable[[], None]]]:
    """After the headline rows: the graph probes, then the sweeps in order of what they decide
    (fp8 decode defaults, the 32x32768 replay gap, prefill vs SDPA), each skipped past the
    time budget."""
    def chosen(shape: str) -> bool:
        return not wanted or shape in wanted

    steps: list[tuple[str, Callable[[], None]]] = []
    b, c = map(int, PROBE_SHAPE.split("x"))
    if chosen(PROBE_SHAPE):
        steps.append((f"graph probe {PROBE_SHAPE}", lambda: graph_probe(b, c)))
    for small in CAPTURE_PROBE_SHAPES:
        sb, sc = map(int, small.split("x"))
        if chosen(small):
            steps.append((f"engine capture probe {small}", lambda sb=sb, sc=sc: engine_capture_probe(sb, sc)))
    if ARGS.no_sweep:
        return steps
    if "fp8" in KV_DTYPES:  # the fp8 decode configs (conversion variants included) come from here
        steps.append(("fp8 decode focus sweep", fp8_focus_sweep))
    order = [(k, shape) for shape in SWEEP_DECODE_SHAPES[:2] for k in ("fp8", "bf16")]
    order += [(k, shape) for shape in SWEEP_DECODE_SHAPES[2:] for k in ("fp8", "bf16")]
    for kv, shape in order:
        if kv in KV_DTYPES and kv != "fp8" and chosen(shape):
            sb, sc = map(int, shape.split("x"))
            steps.append((f"sweep decode {shape} {kv}",
                          lambda sb=sb, sc=sc, kv=kv: sweep_decode(sb, sc, kv)))
        if (kv, shape) == ("bf16", PROBE_SHAPE):  # prefill sweeps after the probe shape
            for pb, n, pc in PREFILL_SHAPES:
                for pkv in KV_DTYPES:
                    if chosen(f"{pb}x{n}+{pc}"):
                        steps.append((f"sweep prefill {pb}x{n}+{pc} {pkv}",
                                      lambda pb=pb, n=n, pc=pc, pkv=pkv: sweep_prefill(pb, n, pc, pkv)))
    return steps


def main() -> None:
    meta = RESULTS["meta"]
    meta.update({
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dry_run": ARGS.dry_run,
        "shape": {"num_q_heads": HQ, "num_kv_heads": HKV, "head_dim": HEAD_DIM,
                  "block_size": BLOCK, "dtype": str(DTYPE)},
    })  # fmt: skip
    if DEVICE == "cuda":
        props = torch.cuda.get_device_properties(0)
        meta.update({"gpu": props.name, "num_sms": props.multi_processor_count,
                     "cuda": torch.version.cuda,
                     "gpu_memory_gib": round(props.total_memory / 2**30, 1)})  # fmt: skip
    else:
        meta["gpu"] = "none (CPU, TRITON_INTERPRET=1 dry run)"
    log(f"{meta['gpu']} torch {meta['torch']} triton {meta['triton']}")
    save()
    if ARGS.only == "fp8-decode":
        run_steps(fp8_decode_steps())
        finish()
        return
    steps: list[tuple[str, Callable[[], None]]] = [("stream", measure_stream)]
    checks = [(0, 16, 4, torch.bfloat16, None), (1, 32, 8, torch.float16, None),
              (2, 64, 1, torch.bfloat16, None), (3, 16, 4, torch.bfloat16, 8),
              (4, 8, 4, torch.float32, 5), (5, 16, 4, torch.float32, None)]  # fmt: skip
    if not ARGS.skip_checks:
        for c in checks:
            steps.append((f"check {c}", lambda c=c: random_mixed_check(*c)))
        steps.append(("cache write check", cache_write_check))
        if "fp8" in KV_DTYPES:
            steps.append(("fp8 checks", fp8_checks))
        if DEVICE == "cuda":
            steps.append(("cuda graph", cuda_graph_check))
    steps.append(("flashinfer import", load_flashinfer))
    wanted = {w for w in ARGS.shapes.split(",") if w}
    meta["repeat"] = ARGS.repeat
    for b, c in DECODE_SHAPES:
        if not wanted or f"{b}x{c}" in wanted:
            for _ in range(ARGS.repeat):
                steps.append((f"decode {b}x{c}", lambda b=b, c=c: bench_decode(b, c)))
    for b, n, c in PREFILL_SHAPES:
        if not wanted or f"{b}x{n}+{c}" in wanted:
            steps.append((f"prefill {b}x{n}+{c}", lambda b=b, n=n, c=c: bench_prefill(b, n, c)))
    steps += probe_and_sweep_steps(wanted)
    if DEVICE == "cuda" and ARGS.fa3:
        steps.append(("flashinfer fa3", lambda: FI is not None and flashinfer_fa3_extra()))
    run_steps(steps)
    finish()


def fp8_decode_steps() -> list[tuple[str, Callable[[], None]]]:
    """--only fp8-decode: the streaming read, the fp8 device checks (every chosen variant), FlashInfer,
    the focused sweep."""
    steps: list[tuple[str, Callable[[], None]]] = [("stream", measure_stream)]
    if not ARGS.skip_checks:
        steps.append(("fp8 checks", fp8_checks))
    return steps + [("flashinfer import", load_flashinfer), ("fp8 decode focus sweep", fp8_focus_sweep)]


def run_steps(steps: list[tuple[str, Callable[[], None]]]) -> None:
    for name, step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - one failed step must not lose the rest
            record_error(name, exc)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def finish() -> None:
    try:
        best_configs()
    except Exception as exc:  # noqa: BLE001
        record_error("best configs", exc)
    evaluate_targets()
    RESULTS["meta"]["wall_s"] = elapsed_s()
    save()
    print(markdown())


if __name__ == "__main__":
    main()
