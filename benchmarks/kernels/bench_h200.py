#!/usr/bin/env python3
"""Paged-attention kernels on one GPU: correctness first, then timings against the limit and peers.

Llama-3.1-8B layer shape (32 query heads, 8 KV heads, head dim 128, bf16, block size 16):
decode at batch x context 1x4096 ... 32x32768 and prefill chunks of 8 x 2048 new tokens with 0
and 4096 tokens cached. For each: microseconds (median of triton.testing.do_bench, which flushes
L2 before every run), KV bandwidth against a streaming read measured in the same run, and speed
ratios against torch SDPA on contiguous KV, gather + SDPA, and FlashInfer (if importable).

    python3 benchmarks/kernels/bench_h200.py --out DIR          # on the GPU
    python3 benchmarks/kernels/bench_h200.py --dry-run --out DIR  # CPU interpreter, tiny shapes

Results go to DIR/results.json and DIR/results.md, rewritten after every step so that a run
cut short still leaves what it measured.
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
from pathlib import Path

ARGS: argparse.Namespace
T0 = time.time()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for results.json/results.md")
    p.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    p.add_argument("--no-flashinfer", action="store_true")
    p.add_argument("--no-sweep", action="store_true", help="time only the default dispatch")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip optional work past this")
    p.add_argument("--no-fa3", action="store_true", help="skip FlashInfer's FA3 prefill build")
    p.add_argument("--skip-checks", action="store_true", help="skip the device correctness checks")
    p.add_argument("--shapes", default="", help="only these, e.g. '32x32768,8x2048+0'")
    p.add_argument("--repeat", type=int, default=1, help="time each decode shape this many times")
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
    AttentionConfig,
    choose_config,
    choose_num_splits,
    num_sms_of,
    paged_attention,
)
from kernels.reference import paged_attention_ref

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

# a handful of reasoned alternatives per path, not an autotuner
DECODE_SWEEP = [
    AttentionConfig(16, 128, 4, 3),  # default: 64 KB of K+V per stage, 3 stages
    AttentionConfig(16, 64, 4, 3),  # half tiles: twice the programs resident per SM
    AttentionConfig(16, 128, 4, 2),  # shallower pipeline, more programs resident
    AttentionConfig(16, 128, 8, 2),
]
PREFILL_SWEEP = [
    AttentionConfig(128, 32, 4, 3),  # default
    AttentionConfig(128, 64, 8, 3),  # FA2 shape for D=128: two warpgroups, 64-key tiles
    AttentionConfig(128, 64, 4, 3),
    AttentionConfig(128, 32, 4, 4),
    AttentionConfig(128, 32, 8, 3),
    AttentionConfig(64, 32, 4, 3),
]

RESULTS: dict = {
    "meta": {},
    "stream": {},
    "checks": [],
    "decode": [],
    "prefill": [],
    "sweep": [],
    "graph": {},
    "errors": [],
    "targets": [],
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


def time_us(fn: Callable[[], object]) -> float:
    """Median microseconds; on the GPU do_bench flushes L2 before each run and times with events."""
    if DEVICE == "cpu":
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def time_graph_us(fn: Callable[[], object]) -> float:
    """Median microseconds of a CUDA-graph replay of ``fn`` (L2 still flushed before each run).

    Decode steps of a serving engine run as graph replays, and a replay has no Python launch
    cost, so this is the kernel time an engine sees; eager times carry ~10-40 us of host work
    per Triton launch that hides small kernels."""
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
        return time_us(graph.replay)
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

    def kv_bytes(self) -> int:
        return 2 * self.batch * self.seq_len * HKV * HEAD_DIM * self.k_cache.element_size()

    def useful_flops(self) -> float:
        """QK^T and PV over the causal pairs only: query i sees cached + i + 1 keys."""
        pairs = self.new * self.cached + self.new * (self.new + 1) / 2
        return 4.0 * HEAD_DIM * pairs * HQ * self.batch

    def ours(self, **kw) -> Callable[[], object]:
        args = (self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
                self.query_start_loc, SCALE, self.new, self.seq_len)  # fmt: skip
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


def fi_decode(case: Case) -> Callable[[], object]:
    wrapper = FI.BatchDecodeWithPagedKVCacheWrapper(FI_WORKSPACE, "NHD", use_tensor_cores=True)
    indptr, indices, last = fi_page_table(case)
    wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, BLOCK, q_data_type=DTYPE,
                 kv_data_type=DTYPE, sm_scale=SCALE)  # fmt: skip
    return lambda: wrapper.run(case.q, (case.k_cache, case.v_cache))


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
        try:
            fn = fi_decode(case)
            o = fn()
            row["flashinfer_rel_err_vs_ours"] = rel_err(o, case.out)
            t_fi = measure(row, "flashinfer", fn, nbytes, "tbps")
            row["speed_vs_flashinfer"] = t_fi / t
        except Exception as exc:  # noqa: BLE001
            record_error(f"flashinfer decode {name}", exc)
    row["ours_host_us_per_call"] = host_us_per_call(case.ours())
    if FI is not None and "flashinfer_us" in row:
        row["flashinfer_host_us_per_call"] = host_us_per_call(fi_decode(case))
    RESULTS["decode"].append(row)
    log(f"decode {name}: host {row['ours_host_us_per_call']:.1f} us/call; ours {t:.1f} us {row['ours_tbps']:.2f} TB/s (splits {splits}, err "
        f"{row['rel_err_vs_sdpa_fp32']:.1e}); sdpa {row.get('sdpa_contig_tbps', float('nan')):.2f}"
        f" TB/s; gather x{row.get('speed_vs_gather_sdpa', float('nan')):.1f}; flashinfer "
        f"{row.get('flashinfer_tbps', float('nan')):.2f} TB/s")  # fmt: skip
    save()
    if not ARGS.no_sweep and elapsed_s() < 0.6 * ARGS.budget_s:
        sms = num_sms_of(case.q.device)
        if batch * HKV < sms:
            split_options = [1, 2, 4, 8, 16, 32, 64]
        elif batch * HKV < 2 * sms:
            split_options = [1, 2, 4]
        else:
            split_options = [1]
        for sweep_cfg in DECODE_SWEEP:
            for s in split_options:
                try:
                    ts = time_graph_us(case.ours(config=sweep_cfg, num_splits=s))
                except Exception as exc:  # noqa: BLE001
                    record_error(f"sweep {name} {sweep_cfg} {s}", exc)
                    continue
                RESULTS["sweep"].append({"path": "decode", "shape": name, "config": vars(sweep_cfg),
                                         "splits": s, "us": ts, "timing": "graph",
                                         "tbps": nbytes / (ts * 1e-6) / 1e12})  # fmt: skip
        best = min((r for r in RESULTS["sweep"] if r["shape"] == name), key=lambda r: r["us"])
        row["sweep_best"] = best
        log(f"  sweep best {name}: {best['us']:.1f} us {best['tbps']:.2f} TB/s "
            f"{best['config']} splits {best['splits']}")  # fmt: skip
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
        f"{row['rel_err_vs_sdpa']:.1e}); sdpa {row.get('sdpa_contig_tflops', float('nan')):.0f}; "
        f"flashinfer {row.get('flashinfer_tflops', float('nan')):.0f}")  # fmt: skip
    save()
    if not ARGS.no_sweep and elapsed_s() < 0.7 * ARGS.budget_s:
        for sweep_cfg in PREFILL_SWEEP:
            try:
                ts = time_graph_us(case.ours(config=sweep_cfg, num_splits=1))
            except Exception as exc:  # noqa: BLE001
                record_error(f"sweep {name} {sweep_cfg}", exc)
                continue
            RESULTS["sweep"].append({"path": "prefill", "shape": name, "config": vars(sweep_cfg),
                                     "splits": 1, "us": ts,
                                     "tflops": flops / (ts * 1e-6) / 1e12})  # fmt: skip
        best = min((r for r in RESULTS["sweep"] if r["shape"] == name), key=lambda r: r["us"])
        row["sweep_best"] = best
        log(f"  sweep best {name}: {best['us']:.0f} us {best['tflops']:.0f} TFLOP/s "
            f"{best['config']}")  # fmt: skip
        save()


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
            add(f"decode {r['shape']} vs FlashInfer (>= 0.9)", r["speed_vs_flashinfer"], 0.9)
        if (b, c) == (1, 32768):
            add("decode 1x32768 TB/s via split-KV (>= 2)", r["ours_tbps"], 2.0, "TB/s")
    for r in RESULTS["prefill"]:
        if "frac_of_sdpa_tflops" in r:
            add(f"prefill {r['shape']} TFLOP/s vs SDPA (>= 0.6)", r["frac_of_sdpa_tflops"], 0.6)
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
    steps: list[tuple[str, Callable[[], None]]] = [("stream", measure_stream)]
    checks = [(0, 16, 4, torch.bfloat16, None), (1, 32, 8, torch.float16, None),
              (2, 64, 1, torch.bfloat16, None), (3, 16, 4, torch.bfloat16, 8),
              (4, 8, 4, torch.float32, 5), (5, 16, 4, torch.float32, None)]  # fmt: skip
    if not ARGS.skip_checks:
        for c in checks:
            steps.append((f"check {c}", lambda c=c: random_mixed_check(*c)))
        steps.append(("cache write check", cache_write_check))
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
    if DEVICE == "cuda" and not ARGS.no_fa3:
        steps.append(("flashinfer fa3", lambda: FI is not None and flashinfer_fa3_extra()))
    for name, step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - one failed step must not lose the rest
            record_error(name, exc)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    evaluate_targets()
    meta["wall_s"] = elapsed_s()
    save()
    print(markdown())


if __name__ == "__main__":
    main()
