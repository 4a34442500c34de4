"""A synthetic engine step trace with KNOWN cost coefficients, for the calibration tests: batch
compositions like the engine's (decode-only steps of 1..max_num_seqs sequences, prefill chunks
with and without cached prefix, mixed batches), step times from the coefficients plus noise,
outliers and a compilation spike on the first step."""

from __future__ import annotations

import numpy as np

from engine.core.cuda_graphs import decode_graph_bucket
from engine.core.model_spec import ModelSpec
from sim.calibrate import FIXED_MULTIPLIERS, EngineRun
from sim.config import EngineConfig
from sim.cost_model import CpuTerms, GpuTerms, OverlapTerms, Roofline
from sim.hardware import GPUSpec

EW = FIXED_MULTIPLIERS["elementwise"]
# decode attention: worst where the padded batch stops splitting the KV (16), best at 64-128
KV_BY_BATCH = ((1, 1.2), (2, 1.25), (4, 1.3), (8, 1.35), (16, 1.9), (32, 1.4), (64, 1.1), (128, 1.05), (256, 1.1))
# the longest sequence's attention: no split-KV from padded batch 16 on
MAX_KV_BY_BATCH = ((2, 0.0), (4, 0.0), (8, 0.0), (16, 0.9), (32, 0.8), (64, 0.6), (128, 0.0), (256, 0.0))
# a graph replay's fixed seconds by padded batch: not linear in the batch (the split count changes
# the attention's programs at 16, the sampler's shapes at 128)
STEP_BY_BATCH = ((1, 1.2e-3), (2, 1.21e-3), (4, 1.23e-3), (8, 1.26e-3), (16, 1.45e-3), (32, 1.38e-3),
                 (64, 1.5e-3), (128, 1.95e-3), (256, 2.6e-3))
TRUE_DECODE = GpuTerms(gemm=1.15, elementwise=EW, decode_kv_by_batch=KV_BY_BATCH,
                       decode_max_kv_by_batch=MAX_KV_BY_BATCH, decode_step_by_batch=STEP_BY_BATCH)
TRUE_MIXED = GpuTerms(gemm=1.25, prefill_attention=1.6, decode_kv=1.4, decode_max_kv=0.5, elementwise=EW,
                      step_s=2.5e-3, per_seq_s=2e-5)
TRUE_CPU = CpuTerms(step_s=3e-4, per_seq_s=2.5e-5, per_token_s=2e-7, per_context_token_s=3e-9,
                    per_block_allocated_s=1.5e-6, per_block_hashed_s=1e-6)
TRUE_OVERLAP = OverlapTerms(async_gpu_gap_s=1e-4, async_host_s=2e-4, async_eager_launch_s=4e-3, sync_extra_s=5e-5)
MAX_NUM_SEQS = 256
SAMPLER_GPU_S = 4e-5  # the sampler's kernels per step (H200: 42-46 us on a 128K vocabulary)
BLOCK = 16


def _compositions(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    cols = {c: np.zeros(n) for c in ("num_prefill_tokens", "num_prefill_seqs", "sum_prefill_context",
                                     "prefill_attn_pairs", "num_decode_tokens", "num_decode_seqs",
                                     "sum_decode_context", "max_decode_context", "num_blocks_allocated",
                                     "num_blocks_hashed")}
    decode = rng.random(n) < 0.6
    for i in range(n):
        if decode[i]:
            b = round(2 ** rng.uniform(0, np.log2(MAX_NUM_SEQS)))  # log-uniform, as a sweep grid
        else:
            b = int(rng.integers(0, 65))
            seqs = int(rng.integers(1, 9))
            chunks = rng.integers(8, 2048, size=seqs)
            cached = np.where(rng.random(seqs) < 0.5, rng.integers(0, 8192, size=seqs), 0)
            cols["num_prefill_tokens"][i] = chunks.sum()
            cols["num_prefill_seqs"][i] = seqs
            cols["sum_prefill_context"][i] = (cached + chunks).sum()
            cols["prefill_attn_pairs"][i] = (chunks * cached + chunks * (chunks + 1) // 2).sum()
            if rng.random() < 0.5:  # prefix caching on for half the steps: hashing apart from tokens
                cols["num_blocks_hashed"][i] = (chunks // BLOCK).sum()
            # a chunk whose blocks a cached prefix already holds allocates none
            fresh = rng.random(seqs) < 0.6
            cols["num_blocks_allocated"][i] = (-(-chunks[fresh] // BLOCK)).sum()
        cols["num_decode_seqs"][i] = cols["num_decode_tokens"][i] = b
        mean_ctx = rng.integers(64, 32768)
        cols["sum_decode_context"][i] = b * mean_ctx if b else 0
        # the longest sequence: 1 to 8 times the mean (at most the whole sum)
        cols["max_decode_context"][i] = round(mean_ctx * rng.uniform(1, min(b, 8))) if b else 0
        cols["num_blocks_allocated"][i] += rng.binomial(b, 1 / BLOCK)
    return cols


def true_gpu_s(cols: dict[str, np.ndarray], rates: Roofline) -> np.ndarray:
    """Forward + sampling seconds of each step under the true coefficients (decode-only steps
    padded to their CUDA graph's batch)."""
    n_dec = cols["num_decode_seqs"]
    is_dec = cols["num_prefill_tokens"] == 0
    pad = np.array([decode_graph_bucket(int(b), MAX_NUM_SEQS) for b in n_dec], dtype=float)
    tokens = np.where(is_dec, pad, cols["num_prefill_tokens"] + n_dec)
    rows = np.where(is_dec, pad, cols["num_prefill_seqs"] + n_dec)
    f = rates.features(tokens, rows, cols["prefill_attn_pairs"], cols["sum_prefill_context"],
                       np.where(n_dec > 0, 1.0, 0.0), cols["sum_decode_context"], cols["max_decode_context"])
    seqs = cols["num_prefill_seqs"] + np.where(is_dec, pad, n_dec)  # a graph runs its padding rows
    knots, mult = np.log2([k for k, _ in KV_BY_BATCH]), [c for _, c in KV_BY_BATCH]
    decode_mult = np.interp(np.log2(np.maximum(pad, 1)), knots, mult)  # linear in log2(batch)
    mknots, mmult = np.log2([k for k, _ in MAX_KV_BY_BATCH]), [c for _, c in MAX_KV_BY_BATCH]
    max_mult = np.where(pad > 1, np.interp(np.log2(np.maximum(pad, 1)), mknots, mmult), 0.0)
    sknots, sfixed = np.log2([k for k, _ in STEP_BY_BATCH]), [c for _, c in STEP_BY_BATCH]
    decode_fixed = np.interp(np.log2(np.maximum(pad, 1)), sknots, sfixed)
    out = np.zeros(n_dec.size)
    for t, mask, dkv, dmax, fixed in (
            (TRUE_DECODE, is_dec, decode_mult, max_mult, decode_fixed),
            (TRUE_MIXED, ~is_dec, TRUE_MIXED.decode_kv, TRUE_MIXED.decode_max_kv, 0.0)):
        g = (t.gemm * f["gemm"] + t.prefill_attention * f["prefill_attention"] + dkv * f["decode_kv"]
             + dmax * f["decode_max_kv"]
             + t.elementwise * f["elementwise"] + t.step_s + t.per_seq_s * seqs + fixed)
        out = np.where(mask, g, out)
    return out


def true_cpu_s(cols: dict[str, np.ndarray]) -> np.ndarray:
    c = TRUE_CPU
    return (c.step_s + c.per_seq_s * (cols["num_prefill_seqs"] + cols["num_decode_seqs"])
            + c.per_token_s * (cols["num_prefill_tokens"] + cols["num_decode_tokens"])
            + c.per_context_token_s * (cols["sum_decode_context"] + cols["sum_prefill_context"])
            + c.per_block_allocated_s * cols["num_blocks_allocated"] + c.per_block_hashed_s * cols["num_blocks_hashed"])


def synthetic_run(model: ModelSpec, gpu: GPUSpec, *, n: int = 3000, seed: int = 0, noise: float = 0.01,
                  outlier_share: float = 0.02, async_scheduling: bool = True, name: str = "synth") -> EngineRun:
    """One run's step table (engine/core/records.py column names) with known costs."""
    rng = np.random.default_rng(seed)
    cols = _compositions(rng, n)
    rates = Roofline.of(model, gpu, EngineConfig())
    gpu_total = true_gpu_s(cols, rates) * (1 + noise * rng.standard_normal(n))
    cpu_total = true_cpu_s(cols) * (1 + noise * rng.standard_normal(n))
    spoiled = rng.random(n) < outlier_share
    gpu_total = np.where(spoiled, gpu_total * 3.0, gpu_total)
    gpu_total[0] += 1.1  # kernel compilation on the first step
    cols |= timing_columns(gpu_total, cpu_total, async_scheduling, eager=cols["num_prefill_tokens"] > 0)
    return EngineRun(name=name, steps=cols, async_scheduling=async_scheduling, max_num_seqs=MAX_NUM_SEQS)


def timing_columns(gpu: np.ndarray, cpu: np.ndarray, async_scheduling: bool,
                   eager: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """A step table's clock columns from each step's GPU and host seconds, as TRUE_OVERLAP says:
    the GPU time split into the forward and SAMPLER_GPU_S of sampling, the host's 4:6 into
    scheduling and input preparation. As the engine records them, a synchronous step's `sample_s`
    is host wall time: the sampler's GPU time plus a third of its preparation's host time (the
    copy, the wait and the bookkeeping of the sampled tokens). Async: the engine's loop event by
    event (`async_periods`); `eager` steps (no CUDA graph) spend TRUE_OVERLAP's launch seconds
    launching, their device work running meanwhile."""
    o, n = TRUE_OVERLAP, len(gpu)
    if async_scheduling:
        launch = np.zeros(n) if eager is None else np.where(eager, o.async_eager_launch_s, 0.0)
        total = async_periods(gpu + o.async_gpu_gap_s, cpu + o.async_host_s, launch)
    else:
        total = gpu + cpu + o.sync_extra_s
    host_sampling = np.zeros(n) if async_scheduling else 0.2 * cpu
    return {"step_id": np.arange(n, dtype=float), "t_start_s": np.concatenate([[0.0], np.cumsum(total)[:-1]]),
            "total_s": total, "gpu_s": gpu - SAMPLER_GPU_S, "sample_s": SAMPLER_GPU_S + host_sampling,
            "schedule_s": 0.4 * cpu, "prepare_s": 0.6 * cpu - host_sampling}


def async_periods(device: np.ndarray, host: np.ndarray, launch: np.ndarray,
                  block: np.ndarray | None = None, block_s: np.ndarray | None = None) -> np.ndarray:
    """The async engine's periods, written as its events (engine/engine_loop.py `_step_async`): iteration
    i starts at T, prepares for host[i], launches for launch[i] while its device work starts as
    soon as the device is free (the launch returning no earlier than block[i] of that work plus
    block_s[i] seconds of it have run, at most all of it), then waits for step i-1's device work; the
    next iteration starts when both are done."""
    t = gpu_free = 0.0
    out = np.empty(len(device))
    block = np.zeros(len(device)) if block is None else block
    block_s = np.zeros(len(device)) if block_s is None else block_s
    for i in range(len(device)):
        start = max(t + host[i], gpu_free)
        launched = max(t + host[i] + launch[i], start + min(device[i], block_s[i] + block[i] * device[i]))
        done = max(launched, gpu_free)  # step i-1 collected
        gpu_free = start + max(device[i], launch[i])
        out[i], t = done - t, done
    return out
