"""Calibration sweep and held-out validation runs of a mixture-of-experts preset, one GPU call (issue 29, item 4).

The dense sweep (`gpu_sweep.py`) is ~8 minutes per model with its engine warm; an MoE preset's steps
are 2-3x slower (qwen3-30b-a3b: 61 GB of random bf16 weights, 48 layers; mixtral-8x7b: 93 GB) and its
build and warm-up take longer (the fused MoE kernels compile per tile configuration), so this wrapper
runs a smaller sweep of the same kinds, in an order that leaves both fitting and validation data if
the deadline cuts it short:

1. capacity probes of each validation source's request mix (other slice: fitting data; their
   throughput sets the validation loads);
2. decode grid: batch 1..256 x context 256 / 2K / 8K (capped by batch x context), sync, and async at
   a few batches;
3. mixed traffic with a 512-token budget (mixed CUDA graphs) and prefill alone / after a cached prefix;
4. the validation runs (never fitted on): chat at 0.6 and 0.95 of capacity (async; the second near
   saturation), long RAG prompts chunked by a 2,048-token budget (sync), the Mooncake conversation
   trace (prefix reuse, sync), code-bursty (async), chat with a KV pool small enough to preempt (sync);
5. skewed decode batches, mixed traffic at the default and a 2,048-token budget, a tight-KV sweep run.

Every run is an engine run folder (`gpu_sweep.Runner`), under OUT/work/<model>/{sweep,validation}; at
the end (also after an error) the folders are packed into OUT: `<model>-sweep.tar.xz`,
`<model>-validation.tar.xz` (each with the model's index.json; metrics.prom and scheduler_stats.json
left out: `costline calibrate` / `validate` read neither), `<model>-index.json` and the log is
whatever the caller tees to OUT. The fit and the validation table: `moe_validate.py`.

    python3 benchmarks/calibration/moe_sweep.py --model qwen3-30b-a3b --out $OUT/moecal --deadline-s 470
    python3 benchmarks/calibration/moe_sweep.py --model qwen3-30b-a3b --smoke --out $OUT/moecal   # 4 layers, 3 runs
    TRITON_INTERPRET=1 python3 benchmarks/calibration/moe_sweep.py --model tiny-moe --dry-run --out /tmp/moe
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import gpu_sweep as gs
from routing_probe import scale_standin

from benchmarks.engine.soak import (
    RANKING_LOAD,  # the dense ranking set's load: the MoE set runs at the same
)
from engine.core.config import EngineArgs
from engine.core.model_spec import get_model
from engine.engine_loop import EngineCore, build_model, resolve_device

log = gs.log
PACK_SKIP = ("metrics.prom", "scheduler_stats.json")  # read by neither calibrate nor validate


@dataclasses.dataclass(frozen=True)
class MoePlan:
    """The sweep's sizes for one preset (`gpu_sweep.Plan` holds the shared ones)."""

    base: gs.Plan
    async_batches: tuple[int, ...] = (1, 8, 64, 256)  # decode grid batches also run async
    mixed: tuple[tuple[float, int | None, bool], ...] = ((0.7, 512, True), (0.6, None, False), (0.9, 2048, True))
    early_mixed: int = 1  # how many of `mixed` run before the validation runs
    skew_async: tuple[int, ...] = (64,)
    validation: tuple[tuple[str, str, float, bool, dict], ...] = ()
    probe_sources: tuple[str, ...] = ()
    max_output_len: int = 0  # > 0: outputs capped (the CPU dry run: a step takes ~0.1-1 s there)


# name, source, load (fraction of the probed capacity), async, extra flags (tight: a KV pool that
# preempts; budget: the token budget, below the long prompts so chunked prefill splits them)
VALIDATION = (
    ("chat-mid", "chat-production", 0.6, True, {}),
    ("chat-near-saturation", "chat-production", 0.95, True, {}),
    ("rag-chunked-2048", "rag-long-prompt", 0.5, False, {"budget": 2048}),
    ("mooncake-prefix-reuse", "mooncake-conversation", 0.7, False, {}),
    ("code-bursty", "code-bursty", 0.7, True, {}),
    ("chat-tight-kv", "chat-production", 0.5, False, {"tight": True}),
)
SOURCES = ("chat-production", "rag-long-prompt", "mooncake-conversation", "code-bursty")

QWEN = MoePlan(
    base=gs.Plan(decode_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256), decode_contexts=(256, 2048, 8192),
                 decode_max_tokens=140_000, decode_steps=32, skew_batches=(4, 32, 128), skew_short=512,
                 skew_long=(8192,), prefill_lens=(16, 64, 256, 1024, 2048, 4096, 8192, 16384),
                 cached_prefixes=(2048,), cached_news=(64, 1024), mixed_s=8.0, probe_requests=200,
                 probe_tokens=160_000, validation_s=12.0, min_validation_requests=40, max_prompt_len=16384,
                 tight_sequences=24.0),
    validation=VALIDATION, probe_sources=SOURCES)
# mixtral: ~4x the active parameters per token (12.9 B), every expert read from batch ~17 (93 GB)
MIXTRAL = MoePlan(
    base=gs.Plan(decode_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256), decode_contexts=(256, 2048, 8192),
                 decode_max_tokens=66_000, decode_steps=24, skew_batches=(4, 32, 128), skew_short=512,
                 skew_long=(8192,), prefill_lens=(16, 64, 256, 1024, 2048, 4096, 8192, 16384),
                 cached_prefixes=(2048,), cached_news=(64, 1024), mixed_s=6.0, probe_requests=120,
                 probe_tokens=70_000, validation_s=10.0, min_validation_requests=30, max_prompt_len=16384,
                 tight_sequences=24.0),
    async_batches=(1, 8, 256), validation=VALIDATION, probe_sources=SOURCES)
# the GPU smoke test: 4 of qwen3's 48 layers, a probe, a decode run, one validation run
SMOKE = MoePlan(
    base=gs.Plan(decode_batches=(8,), decode_contexts=(256,), decode_max_tokens=10_000, decode_steps=16,
                 skew_batches=(), prefill_lens=(16, 2048), cached_prefixes=(1024,), cached_news=(64,), probe_requests=60, probe_tokens=40_000, validation_s=5.0,
                 min_validation_requests=20, max_prompt_len=8192),
    async_batches=(), mixed=(), early_mixed=0, validation=(VALIDATION[0],), probe_sources=("chat-production",))
# the CPU dry run (tiny-moe, Triton interpreter): every part, enough steps of each kind to fit
TINY = MoePlan(
    base=gs.Plan(decode_batches=(1, 2, 4, 8, 16), decode_contexts=(16, 64), decode_max_tokens=10_000, decode_steps=8,
                 skew_batches=(4, 8), skew_short=16, skew_long=(200,), prefill_lens=(16, 100, 300),
                 cached_prefixes=(32,), cached_news=(16,), mixed_s=16.0, probe_requests=16, probe_tokens=3000,
                 validation_s=4.0, min_validation_requests=8, max_prompt_len=200, tight_sequences=3.0),
    # token budgets of a few dozen: prompts of up to 200 tokens split into chunks, so the fit has
    # enough steps with prefill tokens
    mixed=((0.7, 24, True), (0.6, 48, False), (0.9, 32, True)),
    async_batches=(1, 8), skew_async=(8,), validation=VALIDATION, probe_sources=SOURCES, max_output_len=6)


def requests_of(p: MoePlan, source: str, n: int, rate_rps: float | None, *, other_slice: bool = False,
                seed: int | None = None) -> list:
    """`gpu_sweep.workload_requests`, outputs capped where the plan says so."""
    reqs = gs.workload_requests(source, n, rate_rps, p.base.max_prompt_len, other_slice=other_slice, seed=seed)
    if p.max_output_len:
        reqs = [dataclasses.replace(q, output_len=min(q.output_len, p.max_output_len)) for q in reqs]
    return reqs


def probe_capacity(r: gs.Runner, p: MoePlan, source: str) -> float | None:
    """`gpu_sweep.probe_capacity` (another slice than the validation runs', all at t=0, async)."""
    reqs = requests_of(p, source, p.base.probe_requests, None, other_slice=True)
    cum = np.cumsum([q.prompt_len for q in reqs])
    reqs = reqs[: max(20, int(np.searchsorted(cum, p.base.probe_tokens)))]
    summary = r.run("sweep", f"probe-{source}", reqs, honor_arrivals=False, async_scheduling=True,
                    description=f"first {len(reqs)} requests of {source} (other slice), all at t=0 (capacity probe)")
    if summary is None or not summary.get("request_throughput"):
        log(f"the capacity probe of {source} measured nothing (no time left?): its validation runs are skipped")
        return None
    return float(summary["request_throughput"])


def decode_grid(r: gs.Runner, p: MoePlan, ids: gs.Ids) -> None:
    """`gpu_sweep.decode_grid` with the plan's async batches."""
    b = p.base
    for async_ in (False, True):
        for ctx in b.decode_contexts:
            for n in b.decode_batches:
                if n * ctx > b.decode_max_tokens or (async_ and n not in p.async_batches):
                    continue
                reqs = [ids.request(0.0, ctx, b.decode_steps) for _ in range(n)]
                r.run("sweep", f"decode-b{n}-c{ctx}-{'async' if async_ else 'sync'}", reqs, honor_arrivals=False,
                      description=f"{n} x {ctx}-token prompts at t=0, {b.decode_steps} output tokens each",
                      async_scheduling=async_)


def decode_skew(r: gs.Runner, p: MoePlan, ids: gs.Ids) -> None:
    b = p.base
    for async_ in (False, True):
        for long in b.skew_long:
            for n in b.skew_batches:
                if async_ and n not in p.skew_async:
                    continue
                reqs = [ids.request(0.0, long, b.decode_steps)] + [
                    ids.request(0.0, b.skew_short, b.decode_steps) for _ in range(n - 1)]
                r.run("sweep", f"decode-skew-b{n}-l{long}-{'async' if async_ else 'sync'}", reqs,
                      honor_arrivals=False, async_scheduling=async_,
                      description=f"one {long}-token and {n - 1} x {b.skew_short}-token prompts at t=0, "
                                  f"{b.decode_steps} output tokens each")


def poisson_requests(ids: gs.Ids, seed: int, rate: float, n: int, prompts: tuple[int, int],
                     outputs: tuple[int, int]) -> list:
    """`n` requests at Poisson `rate` from time 0, prompt and output lengths uniform in [lo, hi)."""
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    return [ids.request(float(a), int(q), int(o)) for a, q, o in
            zip(arr, rng.integers(*prompts, n), rng.integers(*outputs, n))]


def mixed_runs(r: gs.Runner, p: MoePlan, capacity_rps: float, ids: gs.Ids, which: slice) -> None:
    """Poisson arrivals, prompts U[16, 4096) (capped), outputs U[16, 512): mixed steps of every size."""
    b = p.base
    top = min(4096, b.max_prompt_len)
    out_range = (1, p.max_output_len + 1) if p.max_output_len else (16, 512)
    for i, (load, budget, async_) in list(enumerate(p.mixed))[which]:
        rate = load * capacity_rps
        reqs = poisson_requests(ids, 7 + i, rate, max(20, int(rate * b.mixed_s)), (16, top), out_range)
        flags = {"async_scheduling": async_}
        if budget:
            flags["max_num_batched_tokens"] = min(budget, r.core.runner.max_num_batched_tokens)
        r.run("sweep", f"mixed-load{int(load * 100)}-budget{budget or 'default'}-{'async' if async_ else 'sync'}",
              reqs, honor_arrivals=True, max_wall_s=b.mixed_s * 2, description=f"Poisson {rate:.2f} req/s, prompts "
              f"U[16,{top}), outputs U[16,512)", **flags)


def validation_runs(r: gs.Runner, p: MoePlan, capacity: dict[str, float]) -> None:
    b = p.base
    for name, source, load, async_, extra in p.validation:
        if source not in capacity:
            log(f"SKIP validation/{name}: no capacity probe of {source}")
            continue
        rate = load * capacity[source]
        n = max(b.min_validation_requests, int(rate * b.validation_s))
        reqs = requests_of(p, source, n, rate)
        flags = {"async_scheduling": async_}
        if extra.get("tight"):
            flags["num_gpu_blocks_override"] = gs.tight_pool_blocks(reqs, r.core.config.block_size, b)
        if extra.get("budget"):
            flags["max_num_batched_tokens"] = min(extra["budget"], r.core.runner.max_num_batched_tokens)
        r.run("validation", name, reqs, honor_arrivals=True, max_wall_s=b.validation_s * 3,
              description=f"{source}: first {n} requests at {rate:.2f} req/s ({load:.0%} of the measured "
              f"capacity {capacity[source]:.2f} req/s); flags {flags}", **flags)


def chunked_rag_run(r: gs.Runner, p: MoePlan, capacity: dict[str, float]) -> None:
    """Long prompts (another slice of rag-long-prompt) under a 2,048-token budget: chunks of a
    mixed CUDA graph's size over contexts of up to 16K, the steps of the chunked validation run
    (the other runs' graph-sized chunks sit over short contexts)."""
    b = p.base
    if "rag-long-prompt" not in capacity:
        return
    rate = 0.4 * capacity["rag-long-prompt"]
    reqs = requests_of(p, "rag-long-prompt", max(20, int(rate * b.mixed_s)), rate, other_slice=True)
    r.run("sweep", "rag-budget2048-other-slice", reqs, honor_arrivals=True, max_wall_s=b.mixed_s * 2,
          description=f"rag-long-prompt (other slice) at {rate:.2f} req/s, token budget 2048 (chunked prompts)",
          async_scheduling=True, max_num_batched_tokens=min(2048, r.core.runner.max_num_batched_tokens))


def tight_sweep_run(r: gs.Runner, p: MoePlan, capacity_rps: float) -> None:
    b = p.base
    rate = 0.5 * capacity_rps
    reqs = requests_of(p, "chat-production", max(30, int(rate * b.mixed_s)), rate, other_slice=True)
    r.run("sweep", "chat-tight-kv-other-seed", reqs, honor_arrivals=True, max_wall_s=b.mixed_s * 3,
          description="chat-production (seed 1), tight KV pool (preemptions)",
          num_gpu_blocks_override=gs.tight_pool_blocks(reqs, r.core.config.block_size, b))


def sweep(r: gs.Runner, p: MoePlan, known: dict[str, float] | None = None,
          validation_scale: float = 1.0) -> dict[str, float]:
    """Every part in the order of the module's docstring; returns the probed capacities. `known`:
    capacities an earlier call of the same engine probed (no probe runs here); `validation_scale`: the
    held-out runs that many times as long (a p99 of 30-50 requests is one or two of them)."""
    ids = gs.Ids()
    capacity = dict(known or {})
    for source in p.probe_sources if not known else ():
        cap = probe_capacity(r, p, source)
        if cap is not None:
            capacity[source] = cap
    log(f"capacity (req/s): {capacity}{' (given)' if known else ''}")
    if validation_scale != 1.0:
        p = dataclasses.replace(p, base=dataclasses.replace(
            p.base, validation_s=validation_scale * p.base.validation_s,
            min_validation_requests=int(validation_scale * p.base.min_validation_requests)))
    if not capacity:
        raise RuntimeError("no capacity probe measured anything: no load to run the other parts at")
    chat = capacity.get("chat-production", next(iter(capacity.values())))
    decode_grid(r, p, ids)
    mixed_runs(r, p, chat, ids, slice(0, p.early_mixed))
    if p.mixed:
        chunked_rag_run(r, p, capacity)
    gs.prefill_sweep(r, p.base, ids)
    validation_runs(r, p, capacity)
    decode_skew(r, p, ids)
    mixed_runs(r, p, chat, ids, slice(p.early_mixed, None))
    if p.mixed:
        tight_sweep_run(r, p, chat)
    return capacity


def supplement(r: gs.Runner, p: MoePlan, capacity: dict[str, float]) -> dict[str, float]:
    """More mixed-step runs at the capacities an earlier sweep probed (its index.json), for a sweep
    the deadline cut short of the steps the fit needs: the skewed decode batches, the mixed runs it
    skipped and two more loads, each twice as long, then the tight-pool run. Packed as
    `<model>-extra-*`; moe_validate.py adds its sweep runs to the model's."""
    chat = capacity.get("chat-production", next(iter(capacity.values())))
    decode_skew(r, p, gs.Ids())
    more = dataclasses.replace(p, base=dataclasses.replace(p.base, mixed_s=2 * p.base.mixed_s),
                               mixed=(*p.mixed[p.early_mixed:], (0.8, None, True), (0.5, None, False)))
    mixed_runs(r, more, chat, gs.Ids(), slice(0, None))
    tight_sweep_run(r, p, chat)
    return capacity


def eager_supplement(r: gs.Runner, p: MoePlan, capacity: dict[str, float], loads: tuple[float, ...] = (0.35, 0.6),
                     seed: int = 11) -> dict[str, float]:
    """Async runs whose prefills land in eager steps of every size between the mixed graphs' capture
    size and the token budget (prompts U[1024, 6144), outputs U[16, 256), at `loads` of the probed
    chat capacity, each twice a mixed run's length, the i-th drawn with seed `seed + i`), at an
    earlier sweep's capacities: the sweep's own eager async steps are all budget-sized (8,192 tokens),
    so the fit of how long an eager step's launch blocks the host could not tell a constant from a
    share of the device work. Packed as `<model>-extra-*`; moe_validate.py adds its runs to the
    model's sweep."""
    b = p.base
    chat = capacity.get("chat-production", next(iter(capacity.values())))
    lo, hi = min(1024, b.max_prompt_len // 4), min(6144, b.max_prompt_len)
    outs = (1, p.max_output_len + 1) if p.max_output_len else (16, 256)
    ids = gs.Ids()
    for i, load in enumerate(loads):
        rate = load * chat
        reqs = poisson_requests(ids, seed + i, rate, max(20, int(rate * 2 * b.mixed_s)), (lo, hi), outs)
        r.run("sweep", f"eager-load{int(load * 100)}-async", reqs, honor_arrivals=True, max_wall_s=4 * b.mixed_s,
              description=f"Poisson {rate:.2f} req/s, prompts U[{lo},{hi}), outputs U[{outs[0]},{outs[1]}): "
              "eager prefill steps of every size", async_scheduling=True)
    return capacity


def small_mixed_supplement(r: gs.Runner, p: MoePlan, capacity: dict[str, float], seed: int = 31,
                           n: int = 120) -> dict[str, float]:
    """Steps that hold a prefill of a few tokens beside running decodes: the chat validation runs'
    prompts that hit the prefix cache leave 4-90 new tokens, and such a step (5-130 tokens, a mixed
    CUDA graph) was the sweep's rarest kind (6 of mixtral's sweep steps under 64 tokens), so the fit
    priced it from the big ones (+10-24% in the held-out runs). Per scheduling mode, `n` fresh prompts
    of U[4, 128) tokens at Poisson arrivals, outputs U[32, 200), so a decode batch of ~10-30 runs
    beside each arrival's prefill. Fresh prompts, not cached prefixes: decodes over shared prefix
    blocks read them partly from L2 (the mooncake runs' +9% decode steps), which would bias the decode
    fit; nor prompts at t=0 (one budget-sized eager step moved mixtral's async launch term 2x). The
    rate is the probed chat capacity x 4 (requests this short are served far faster than chat's).
    Packed as `<model>-<--extra-name>-*`; moe_validate.py adds its runs to the model's sweep."""
    b = p.base
    chat = capacity.get("chat-production", next(iter(capacity.values())))
    outs = (1, p.max_output_len + 1) if p.max_output_len else (32, 200)
    for i, async_ in enumerate((True, False)):
        rate = 4 * chat
        reqs = poisson_requests(gs.Ids(), seed + i, rate, n, (4, 128), outs)
        tag = "async" if async_ else "sync"
        r.run("sweep", f"small-mixed-{tag}", reqs, honor_arrivals=True, max_wall_s=4 * b.mixed_s + 30,
              description=f"Poisson {rate:.2f} req/s, prompts U[4,128), outputs U[{outs[0]},{outs[1]}): prefills "
              "of a few tokens beside running decodes", async_scheduling=async_)
    return capacity


def long_context_supplement(r: gs.Runner, p: MoePlan, capacity: dict[str, float], seed: int = 41,
                            n: int = 90) -> dict[str, float]:
    """Mixed steps beside one or two decodes far longer than the rest: the ranking set's chat slice
    held a decode of ~11K tokens beside 10-30 of ~2K, and the sweep held few such steps (its long
    decodes ran beside a handful of others, or beside decodes about as long), so the fit priced the
    longest decode's attention by a slope the few-decode steps set (mixed steps +9-13% there). Per
    scheduling mode, three long requests (prompts of 6,000 / 10,000 / 14,000 tokens, 700 output
    tokens each: they decode through the run) arrive at 1, 4 and 8 s among `n` fresh requests at
    Poisson arrivals (prompts U[32, 1536), outputs U[32, 320)) at 1.3x the probed chat capacity, so
    ~10-30 decodes run beside chunks of every size. Synthetic lengths, never the held-out slices.
    Packed as `<model>-<--extra-name>-*`; moe_validate.py adds its runs to the model's sweep."""
    b = p.base
    chat = capacity.get("chat-production", next(iter(capacity.values())))
    top = min(b.max_prompt_len, 14_000)
    longs = [(1.0, min(6_000, top)), (4.0, min(10_000, top)), (8.0, top)]
    long_out = p.max_output_len or 700
    outs = (1, p.max_output_len + 1) if p.max_output_len else (32, 320)
    for i, async_ in enumerate((True, False)):
        ids = gs.Ids()
        reqs = [ids.request(at, prompt, long_out) for at, prompt in longs]
        reqs += poisson_requests(ids, seed + i, 1.3 * chat, n, (32, min(1536, top)), outs)
        reqs.sort(key=lambda q: q.arrival_s)
        tag = "async" if async_ else "sync"
        r.run("sweep", f"long-context-{tag}", reqs, honor_arrivals=True, max_wall_s=4 * b.mixed_s + 30,
              description=f"3 long prompts ({', '.join(str(q) for _, q in longs)} tokens, {long_out} outputs) at 1/4/8 s "
              f"among {n} at Poisson {1.3 * chat:.2f} req/s, prompts U[32,1536), outputs U[{outs[0]},{outs[1]}): "
              "mixed steps beside decodes far longer than the rest", async_scheduling=async_)
    return capacity


def long_validation(r: gs.Runner, p: MoePlan, capacity: dict[str, float], scale: float) -> dict[str, float]:
    """The held-out runs again, `scale` times as long (and at least `scale` times the requests), at the
    capacities an earlier sweep probed (its index.json): a p99 of 30-50 requests is one or two of
    them, whose step a few milliseconds of phase decide. Packed as `<model>-long-*`; moe_validate.py
    --validation-set long validates on them (the fit stays the sweep's)."""
    longer = dataclasses.replace(p.base, validation_s=scale * p.base.validation_s,
                                 min_validation_requests=int(scale * p.base.min_validation_requests))
    validation_runs(r, dataclasses.replace(p, base=longer), capacity)
    return capacity


# The ranking set for a MoE preset: benchmarks/engine/soak.py's RANKING (one chat workload at its
# RANKING_LOAD of the probed capacity under several configurations) with the budgets the MoE engine's
# buffers hold (built for 8,192 tokens: the dense set's 16,384 would be the defaults again, and chunking off
# would raise the budget to the 40,960-token max_model_len past those buffers).
MOE_RANKING = (("defaults", {}), ("budget-1024", {"max_num_batched_tokens": 1024}),
               ("budget-2048", {"max_num_batched_tokens": 2048}), ("budget-4096", {"max_num_batched_tokens": 4096}),
               ("seqs-64", {"max_num_seqs": 64}), ("sync", {"async_scheduling": False}))


def ranking_runs(r: gs.Runner, p: MoePlan, capacity: dict[str, float], requests: int,
                 seed: int = 1) -> dict[str, float]:
    """The same `requests` chat requests (another slice than the held-out runs', never fitted on) at
    RANKING_LOAD of an earlier sweep's probed chat capacity, under each MOE_RANKING configuration
    (asynchronous scheduling unless it says otherwise): `costline validate --rank` then checks that the
    simulator orders the configurations' goodputs as the engine does. `seed` draws the slice (1: the
    first ranking set's; another: a fresh, blind slice). Packed as `<model>-rank-*` (seed 1) or
    `<model>-rank<seed>-*`."""
    if "chat-production" not in capacity:
        raise SystemExit("--ranking: the earlier sweep's index has no chat-production capacity")
    rate = RANKING_LOAD * capacity["chat-production"]
    reqs = requests_of(p, "chat-production", requests, rate, seed=seed)
    built = {"max_num_batched_tokens": r.core.runner.max_num_batched_tokens, "max_num_seqs": r.core.runner.max_num_seqs}
    for name, flags in MOE_RANKING:  # (the dry run's tiny engine holds less: its limits cap the flags)
        flags = {k: min(v, built[k]) if k in built else v for k, v in flags.items()}
        r.run("validation", f"rank-{name}", reqs, honor_arrivals=True, max_wall_s=4 * requests / rate,
              description=f"ranking set: chat-production (other slice, seed {seed}), {len(reqs)} requests at {rate:.2f} req/s "
                          f"({RANKING_LOAD:.0%} of the probed capacity), {name}", **{"async_scheduling": True, **flags})
    return capacity


def eager_loads(text: str) -> tuple[float, ...]:
    """--eager-loads "0.35,0.6" -> (0.35, 0.6); each a fraction of the probed capacity in (0, 1.5]."""
    try:
        loads = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--eager-loads {text!r}: give fractions of capacity separated by commas, e.g. 0.35,0.6")
    if not loads or not all(0 < x <= 1.5 for x in loads):
        raise SystemExit(f"--eager-loads {text!r}: every load must be in (0, 1.5], a fraction of the probed capacity")
    return loads


def earlier_capture_size(index: Path, ap: argparse.ArgumentParser) -> int:
    """The mixed-graph capture size of the sweep a partial call adds to (its index.json's): runs recorded
    at another one change the fitted profile's capture size, and with it how the simulator prices every
    held-out step between the two (mixtral's supplements of 2026-12-03, docs/validation.md). An index
    written before it recorded the size: an error asking for --max-cudagraph-capture-size."""
    size = json.loads(index.read_text()).get("max_cudagraph_capture_size")
    if not size:
        ap.error(f"{index} does not record the earlier sweep's mixed-graph capture size: give "
                 "--max-cudagraph-capture-size (2048 for the shipped mixtral-8x7b runs and qwen3's eager-step "
                 "supplements, 8192 for qwen3's sweep; benchmarks/calibration/README.md)")
    return int(size)


def build_engine(a: argparse.Namespace) -> EngineCore:
    """The preset's engine (random weights); `--layers N`: the preset's layer shapes, N layers."""
    kw = {"max_model_len": 1024, "dtype": "float32"} if a.dry_run else {}
    if a.cudagraph_mode or a.dry_run:  # the CPU captures no graphs: the dry run's runs say decode-only ones
        kw["cudagraph_mode"] = a.cudagraph_mode or "FULL_DECODE_ONLY"
    if a.max_cudagraph_capture_size:
        kw["max_cudagraph_capture_size"] = a.max_cudagraph_capture_size
    # the dry run: 16 sequences at most, so its token budgets of a few dozen are valid (>= max_num_seqs)
    args = EngineArgs(model=a.model, device=a.device, max_num_seqs=16 if a.dry_run else 256,
                      max_num_batched_tokens=8192, seed=0,
                      gpu_memory_utilization=a.gpu_memory_utilization, **kw)
    model = None
    if a.layers:  # the engine's own builder (random weights), with fewer layers of the same shape
        spec = get_model(a.model).model_copy(update={"num_layers": a.layers})
        model = build_model(args, resolve_device(a.device), args.max_model_len, spec=spec)
    return EngineCore(args, model=model)


def pack(work: Path, out: Path, model: str) -> list[Path]:
    """One .tar.xz per part (with the model's index.json), and the index beside them."""
    root = work / model
    written = []
    for part in ("sweep", "validation"):
        if not (root / part).is_dir():
            continue
        dest = out / f"{model}-{part}.tar.xz"
        members = [p for p in sorted((root / part).rglob("*")) if p.is_file() and p.name not in PACK_SKIP]
        if (root / "index.json").is_file():
            members.append(root / "index.json")
        lst = work / f".{part}.list"
        lst.write_text("".join(f"{p.relative_to(root)}\n" for p in members))
        if shutil.which("xz"):  # multi-threaded: the python module compresses on one core
            with dest.open("wb") as f:
                tar = subprocess.Popen(["tar", "cf", "-", "-C", str(root), "-T", str(lst)], stdout=subprocess.PIPE)
                subprocess.run(["xz", "-T0", "-6"], stdin=tar.stdout, stdout=f, check=True)
                tar.wait()
        else:
            with tarfile.open(dest, "w:xz") as t:
                for m in members:
                    t.add(m, arcname=str(m.relative_to(root)))
        written.append(dest)
    if (root / "index.json").is_file():
        shutil.copy(root / "index.json", out / f"{model}-index.json")
        written.append(out / f"{model}-index.json")
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="qwen3-30b-a3b, mixtral-8x7b, or tiny-moe (--dry-run)")
    ap.add_argument("--out", type=Path, required=True, help="the archives and index go here")
    ap.add_argument("--work", type=Path, default=Path("/tmp/moecal-work"),
                    help="run folders (outside OUT: a device call brings back at most 8 files)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny plan (with --model tiny-moe)")
    ap.add_argument("--smoke", action="store_true", help="GPU smoke test: --layers 4 unless given, 3 runs")
    ap.add_argument("--layers", type=int, default=0, help="build the preset with this many layers (smoke test)")
    ap.add_argument("--deadline-s", type=float, default=470.0,
                    help="start no run after this many seconds from the start (the build included)")
    ap.add_argument("--cudagraph-mode", default="", help="override the engine's (default FULL)")
    ap.add_argument("--max-cudagraph-capture-size", type=int, default=0,
                    help="override the engine's largest mixed-graph step (default 2,048 tokens); 8192, the "
                         "token budget, leaves no async step to launch its ~1,500 MoE kernels from Python")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    ap.add_argument("--supplement", type=Path, metavar="INDEX_JSON",
                    help="only the extra mixed runs, at the capacities of this earlier sweep's index.json")
    ap.add_argument("--eager-supplement", type=Path, metavar="INDEX_JSON",
                    help="only async runs with eager prefill steps of 1-6K tokens, at this earlier sweep's capacities")
    ap.add_argument("--eager-loads", default="0.35,0.6",
                    help="--eager-supplement's loads, fractions of the probed chat capacity, comma-separated")
    ap.add_argument("--eager-seed", type=int, default=11, help="--eager-supplement's first seed (one more a run)")
    ap.add_argument("--small-mixed-supplement", type=Path, metavar="INDEX_JSON",
                    help="only runs whose steps hold prefills of a few tokens beside decodes, at this earlier "
                         "sweep's capacities")
    ap.add_argument("--long-context-supplement", type=Path, metavar="INDEX_JSON",
                    help="mixed steps beside decodes far longer than the rest (two runs), on that sweep's capacity")
    ap.add_argument("--extra-name", default="extra",
                    help="the supplements' archive label (<model>-NAME-*); moe_validate adds every <model>-extra*")
    ap.add_argument("--long-validation", type=Path, metavar="INDEX_JSON",
                    help="only the held-out runs, --scale times as long, at this earlier sweep's capacities")
    ap.add_argument("--scale", type=float, default=3.0, help="--long-validation's length factor")
    ap.add_argument("--ranking", type=Path, metavar="INDEX_JSON",
                    help="only the ranking set (MOE_RANKING's configurations) at this earlier sweep's capacities")
    ap.add_argument("--ranking-requests", type=int, default=80, help="--ranking's requests a configuration")
    ap.add_argument("--ranking-seed", type=int, default=1, help="--ranking's slice of chat-production (1: the first "
                    "ranking set's; another draws a fresh one, packed as <model>-rank<seed>-*)")
    ap.add_argument("--capacity-from", type=Path, metavar="JSON",
                    help="the sweep without its capacity probes, at these capacities ({\"capacity_rps\": {source: "
                         "req/s}}, as an index.json has them) an earlier call of the same engine measured")
    ap.add_argument("--validation-scale", type=float, default=1.0,
                    help="the sweep's held-out runs this many times as long (and as many requests)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="> 0: requests sample at this temperature (seeded) instead of decoding greedily")
    ap.add_argument("--embed-scale", type=float, default=1.0,
                    help="the stand-in's token embeddings x this after the random init (routing that follows "
                         "the token: benchmarks/calibration/data/routing); recorded in run.json")
    ap.add_argument("--residual-scale", type=float, default=1.0,
                    help="the stand-in's residual branch outputs (o_proj, w2) x this after the random init "
                         "(with --embed-scale: routing that follows the token); recorded in run.json")
    a = ap.parse_args()
    for flag, value, ok in (("--temperature", a.temperature, a.temperature >= 0), ("--scale", a.scale, a.scale > 0),
                            ("--embed-scale", a.embed_scale, a.embed_scale > 0),
                            ("--residual-scale", a.residual_scale, a.residual_scale > 0),
                            ("--validation-scale", a.validation_scale, a.validation_scale > 0)):
        if not ok:
            ap.error(f"{flag} {value}: must be {'>= 0' if flag == '--temperature' else '> 0'}")
    partial = [path for path in (a.supplement, a.eager_supplement, a.small_mixed_supplement,
                                 a.long_context_supplement, a.long_validation, a.ranking) if path]
    earlier_index = partial[0] if partial else None  # a call that reruns part of that earlier sweep
    if len(partial) > 1:
        ap.error("--supplement, --eager-supplement, --small-mixed-supplement, --long-context-supplement, "
                 "--long-validation and --ranking: give "
                 "one (each reruns part of an earlier sweep)")
    if a.ranking_seed < 1:
        ap.error(f"--ranking-seed {a.ranking_seed}: give 1 (the first ranking set's slice) or more (a fresh slice; "
                 "seed 0 is the preset's own, the held-out runs' slice)")
    if a.ranking_requests < 10:
        ap.error(f"--ranking-requests {a.ranking_requests}: give 10 or more (fewer cannot tell the configurations "
                 "apart)")
    if not a.extra_name.startswith("extra") or not a.extra_name.replace("-", "").isalnum():
        ap.error(f"--extra-name {a.extra_name!r}: must start with 'extra' (moe_validate adds <model>-extra* "
                 "archives) and hold letters, digits and dashes only")
    if earlier_index and not a.max_cudagraph_capture_size:
        a.max_cudagraph_capture_size = earlier_capture_size(earlier_index, ap)
    if a.dry_run:
        a.device = "cpu"
    if a.smoke and not a.layers:
        a.layers = 4
    plan = TINY if a.dry_run else SMOKE if a.smoke else MIXTRAL if "mixtral" in a.model else QWEN
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.work
    if work.exists():
        shutil.rmtree(work)
    label = a.model if not a.layers else f"{a.model}-{a.layers}l"
    label += ("-long" if a.long_validation else f"-rank{'' if a.ranking_seed == 1 else a.ranking_seed}" if a.ranking
              else f"-{a.extra_name}" if earlier_index else "")  # else: a supplement
    t = time.perf_counter()
    meta, capacity, error = {}, {}, None
    r = None
    try:
        core = build_engine(a)
        scale_standin(core, a.embed_scale, a.residual_scale)
        log(f"engine {label}: built in {time.perf_counter() - t:.1f} s, {core.num_gpu_blocks} KV blocks, "
            f"graphs captured in {core.graph_capture_s:.1f} s")
        warm = core.warm_up()
        log(f"warm-up: {warm}")
        gpu = torch.cuda.get_device_name() if core.runner.is_cuda else "cpu"
        meta = {"gpu": "h200" if "H200" in gpu else gpu, "engine_commit": gs._commit(),
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "versions": {"torch": torch.__version__, "python": platform.python_version(),
                             "triton": gs._version("triton"), "cuda": torch.version.cuda},
                "warm_up": dataclasses.asdict(warm), "startup": core.startup.as_dict(), "build_s": round(time.perf_counter() - t, 1),
                "model": a.model,  # run.json's model: the preset, not the label (run folders' parent)
                "max_cudagraph_capture_size": core.config.max_cudagraph_capture_size,
                "layers": a.layers or get_model(a.model).num_layers, "plan": "dry-run" if a.dry_run else
                "smoke" if a.smoke else a.model}
        r = gs.Runner(core, work, label, meta | {"embed_scale": a.embed_scale, "residual_scale": a.residual_scale}, a.deadline_s, a.temperature)
        if earlier_index:
            earlier = json.loads(earlier_index.read_text())["capacity_rps"]
            capacity = (supplement(r, plan, earlier) if a.supplement
                        else eager_supplement(r, plan, earlier, eager_loads(a.eager_loads), a.eager_seed) if a.eager_supplement
                        else small_mixed_supplement(r, plan, earlier) if a.small_mixed_supplement
                        else long_context_supplement(r, plan, earlier) if a.long_context_supplement
                        else ranking_runs(r, plan, earlier, a.ranking_requests, a.ranking_seed) if a.ranking
                        else long_validation(r, plan, earlier, a.scale))
        else:
            known = json.loads(a.capacity_from.read_text())["capacity_rps"] if a.capacity_from else None
            capacity = sweep(r, plan, known, a.validation_scale)
    except Exception as exc:  # noqa: BLE001 - pack and report what ran, then fail
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    except KeyboardInterrupt:  # the call's `timeout -s INT`: pack what ran
        error = "interrupted (SIGINT)"
    finally:
        root = work / label
        if r is not None or root.is_dir():
            root.mkdir(parents=True, exist_ok=True)
            (root / "index.json").write_text(json.dumps({"capacity_rps": capacity, "runs": r.index if r else [],
                                                         "error": error, **meta}, indent=2) + "\n")
        files = pack(work, a.out, label)
        log(f"packed {[f'{p.name} {p.stat().st_size / 1e6:.2f} MB' for p in files]}"
            + (f"; ERROR {error}" if error else "; done"))
    if error:
        sys.exit(1)


if __name__ == "__main__":
    main()
