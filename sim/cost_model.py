"""How long one engine step takes, from the batch's composition (roofline + CPU terms).

GPU time is a sum of roofline terms, each `max(FLOPs / rate, bytes / bandwidth)`:

* GEMMs (all decoder layers' projections and MLP, plus the LM head on the rows that
  are sampled): FLOPs grow with the batched tokens, bytes are the weights read once
  per step. Small batches are bandwidth-bound, big prefills compute-bound.
* prefill attention: FLOPs of the causal (query, key) pairs, bytes of the context's KV.
* decode attention: FLOPs of (1 + k) queries against each sequence's context, bytes of
  that context's KV (the term that grows with batch x context length).
* element-wise traffic (norms, RoPE, activations) per token, tensor-parallel
  all-reduces (two per layer, ring formula), and a fixed launch overhead per step.

CPU time per step (schedule + prepare inputs + detokenize) has terms per step, per
scheduled sequence, per allocated KV block and per hashed block (prefix caching), and
per n-gram proposal. Without async scheduling CPU and GPU time add; with
`async_scheduling` the CPU work of step i+1 overlaps the GPU work of step i, so the step
takes the larger of the two.

The coefficients (efficiencies, overheads) live in a versioned `CostProfile` JSON that
states which hardware, model and engine it describes. `sim/profiles/default.json` is a
first-principles profile from datasheet rates; fitted profiles replace it per hardware and model.

For the simulator's skip-ahead, a pure-decode step of B sequences with total context c
costs `a(B) + b * c` GPU seconds exactly (decode attention is linear in c), so the time
of n consecutive decode steps, whose context grows by B per step, has a closed form
(`DecodeRun`).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from engine.model_spec import ModelSpec, dtype_bytes
from sim.config import EngineConfig
from sim.hardware import GB, GPUSpec

PROFILES_DIR = Path(__file__).with_name("profiles")
PROFILE_SCHEMA_VERSION = 1


class CostProfile(BaseModel):
    """Coefficients of the step cost model, and what they were measured on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = PROFILE_SCHEMA_VERSION
    name: str
    hardware: str = "*"  # GPU preset the coefficients describe ("*" = any, from datasheets)
    model: str = "*"
    engine: str = "vllm-0.33"
    source: str = "first principles"
    # fractions of the datasheet rate that kernels reach
    gemm_compute_efficiency: float = Field(default=0.70, gt=0, le=1)
    gemm_memory_efficiency: float = Field(default=0.85, gt=0, le=1)
    attn_compute_efficiency: float = Field(default=0.50, gt=0, le=1)
    attn_memory_efficiency: float = Field(default=0.70, gt=0, le=1)
    elementwise_memory_efficiency: float = Field(default=0.70, gt=0, le=1)
    allreduce_efficiency: float = Field(default=0.70, gt=0, le=1)
    allreduce_latency_s: float = Field(default=8e-6, ge=0)
    gpu_step_overhead_s: float = Field(default=1.5e-4, ge=0)  # launches / graph replay per forward
    draft_pass_overhead_s: float = Field(default=8e-5, ge=0)  # per proposer forward
    # CPU per step (scheduler + input preparation + output processing)
    cpu_step_s: float = Field(default=4e-4, ge=0)
    cpu_per_seq_s: float = Field(default=1.2e-5, ge=0)
    cpu_per_block_allocated_s: float = Field(default=1.5e-6, ge=0)
    cpu_per_block_hashed_s: float = Field(default=1.0e-6, ge=0)
    ngram_cpu_per_seq_s: float = Field(default=2.0e-5, ge=0)

    @classmethod
    def load(cls, name_or_path: str | Path = "default") -> CostProfile:
        """A profile from a JSON path, or a name under sim/profiles/."""
        p = Path(name_or_path)
        if not p.suffix:
            p = PROFILES_DIR / f"{name_or_path}.json"
        if not p.is_file():
            have = sorted(q.stem for q in PROFILES_DIR.glob("*.json"))
            raise ValueError(f"cost profile {str(name_or_path)!r} not found; built-in profiles: {have}")
        data = json.loads(p.read_text())
        if data.get("schema_version") != PROFILE_SCHEMA_VERSION:
            raise ValueError(f"{p}: schema_version {data.get('schema_version')!r} is not "
                             f"{PROFILE_SCHEMA_VERSION}; regenerate the profile")
        return cls.model_validate(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.model_dump(), indent=2) + "\n")


class BatchComposition(Protocol):
    """What the cost model reads of a step: the scheduler's `SchedulerOutput` and the step table's
    `StepRecord` both have these fields (context sums are KV lengths after the step)."""

    num_prefill_tokens: int
    num_prefill_seqs: int
    prefill_attn_pairs: int  # sum over prefill chunks of q*c + q*(q+1)/2 (causal pairs)
    sum_prefill_context: int  # KV the prefill chunks' attention reads
    num_decode_seqs: int
    num_decode_tokens: int  # decode seqs x (1 + k): verification tokens included
    sum_decode_context: int
    num_blocks_allocated: int
    num_blocks_hashed: int


class CostModel:
    """Step time of one replica (a TP group) running `model` on `gpu` with `engine` flags.

    Coefficients are folded into plain floats once, so a step's time is a handful of
    multiply-adds (the simulator asks once per step).
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig,
                 profile: CostProfile | None = None, draft: ModelSpec | None = None) -> None:
        self.model, self.gpu, self.engine = model, gpu, engine
        self.profile = p = profile or CostProfile.load("default")
        tp = engine.tensor_parallel_size
        self.async_scheduling = engine.async_scheduling
        wdt = engine.weight_dtype or model.dtype
        act_b = dtype_bytes(model.dtype)
        gemm_rate = gpu.tflops(wdt) * 1e12 * p.gemm_compute_efficiency
        attn_rate = gpu.bf16_tflops * 1e12 * p.attn_compute_efficiency
        bw = gpu.hbm_gb_per_s * GB
        L, h = model.num_layers, model.hidden_size
        layer_params = L * model.params_per_layer
        head_params = model.vocab_size * h
        # GEMM: seconds per token / per sampled row (compute side), weights (memory side)
        self._gemm_s_per_token = 2 * layer_params / tp / gemm_rate
        self._gemm_s_per_row = 2 * head_params / tp / gemm_rate
        self._weights_s = (layer_params + head_params) * dtype_bytes(wdt) / tp / (bw * p.gemm_memory_efficiency)
        # attention: per (query, key) pair and per KV token read
        self._attn_s_per_pair = 4 * L * model.num_heads * model.head_dim / tp / attn_rate
        kv_tok_bytes = model.kv_bytes_per_token(engine.kv_cache_dtype) / tp
        self._kv_s_per_token = kv_tok_bytes / (bw * p.attn_memory_efficiency)
        # element-wise traffic per token: norms/residual/RoPE (~8 h) and SwiGLU (3 x inter)
        ew_bytes = L * (8 * h + 3 * model.intermediate_size / tp) * act_b
        self._ew_s_per_token = ew_bytes / (bw * p.elementwise_memory_efficiency)
        # two all-reduces per layer of tokens x hidden activations (ring: 2 (tp-1)/tp of the bytes)
        if tp > 1:
            link = gpu.interconnect_gb_per_s * GB * p.allreduce_efficiency
            self._ar_fixed_s = 2 * L * p.allreduce_latency_s
            self._ar_s_per_token = 2 * L * 2 * (tp - 1) / tp * h * act_b / link
        else:
            self._ar_fixed_s = self._ar_s_per_token = 0.0
        self._gpu_fixed_s = p.gpu_step_overhead_s
        self._decode_terms: dict[int, tuple[float, float, float]] = {}  # num_seqs -> decode_linear()
        self._cpu_step_s, self._cpu_seq_s = p.cpu_step_s, p.cpu_per_seq_s
        self._cpu_blk_s, self._cpu_hash_s = p.cpu_per_block_allocated_s, p.cpu_per_block_hashed_s
        # proposer
        spec = engine.speculative_config
        self.k = spec.num_speculative_tokens if spec else 0
        self.spec_method = spec.method if spec else None
        self._ngram_s_per_seq = p.ngram_cpu_per_seq_s if self.spec_method == "ngram" else 0.0
        self.draft: CostModel | None = None
        if draft is not None and self.k:
            dengine = EngineConfig(tensor_parallel_size=spec.draft_tensor_parallel_size or tp,
                                   kv_cache_dtype=engine.kv_cache_dtype, quantization=engine.quantization)
            dprof = p.model_copy(update={"gpu_step_overhead_s": p.draft_pass_overhead_s})
            self.draft = CostModel(draft, gpu, dengine, dprof)

    # --- GPU ----------------------------------------------------------------------
    def forward_s(self, num_tokens: int, num_rows: int, prefill_pairs: float, prefill_kv_tokens: float,
                  decode_pairs: float, decode_kv_tokens: float) -> float:
        """GPU seconds of one forward pass (roofline per term, summed)."""
        if num_tokens <= 0:
            return 0.0
        gemm = max(self._gemm_s_per_token * num_tokens + self._gemm_s_per_row * num_rows, self._weights_s)
        pre = max(self._attn_s_per_pair * prefill_pairs, self._kv_s_per_token * prefill_kv_tokens)
        dec = max(self._attn_s_per_pair * decode_pairs, self._kv_s_per_token * decode_kv_tokens)
        return (gemm + pre + dec + self._ew_s_per_token * num_tokens
                + self._ar_fixed_s + self._ar_s_per_token * num_tokens + self._gpu_fixed_s)

    def gpu_time_s(self, b: BatchComposition) -> float:
        """Target forward plus the proposer's forwards."""
        tokens = b.num_prefill_tokens + b.num_decode_tokens
        q_per_seq = b.num_decode_tokens / b.num_decode_seqs if b.num_decode_seqs else 0.0
        t = self.forward_s(tokens, b.num_prefill_seqs + b.num_decode_tokens, b.prefill_attn_pairs,
                           b.sum_prefill_context, q_per_seq * b.sum_decode_context, b.sum_decode_context)
        if self.draft is not None:
            t += self.proposer_gpu_s(b)
        return t

    def proposer_gpu_s(self, b: BatchComposition) -> float:
        """Draft model / EAGLE head: one pass over the prefill chunks, k passes over the decodes."""
        d = self.draft
        if d is None:
            return 0.0
        t = d.forward_s(b.num_prefill_tokens, b.num_prefill_seqs, b.prefill_attn_pairs,
                        b.sum_prefill_context, 0.0, 0.0) if b.num_prefill_tokens else 0.0
        if b.num_decode_seqs:
            n, c = b.num_decode_seqs, b.sum_decode_context
            t += self.k * d.forward_s(n, n, 0.0, 0.0, c, c)
        return t

    # --- CPU ----------------------------------------------------------------------
    def cpu_time_s(self, b: BatchComposition, block_scale: int = 1) -> float:
        """Host seconds of the step. `block_scale`: engine blocks per scheduler block (the
        simulator's KV block coarsening), as the CPU cost is per engine block."""
        seqs = b.num_prefill_seqs + b.num_decode_seqs
        return (self._cpu_step_s + self._cpu_seq_s * seqs + self._ngram_s_per_seq * b.num_decode_seqs
                + self.block_cpu_s(b.num_blocks_allocated * block_scale, b.num_blocks_hashed * block_scale))

    def block_cpu_s(self, num_blocks_allocated: int, num_blocks_hashed: int) -> float:
        """CPU seconds of block allocation and hashing (charged apart in skip-ahead)."""
        return self._cpu_blk_s * num_blocks_allocated + self._cpu_hash_s * num_blocks_hashed

    def combine(self, gpu_s: float, cpu_s: float) -> float:
        """A step's duration: CPU and GPU add, or overlap with async scheduling."""
        return max(gpu_s, cpu_s) if self.async_scheduling else gpu_s + cpu_s

    # --- closed forms ---------------------------------------------------------------
    def decode_linear(self, num_seqs: int) -> tuple[float, float, float]:
        """(a, b, cpu) with GPU time = a + b * sum_context for a pure decode of `num_seqs`
        sequences without speculation, and CPU time `cpu` (block terms excluded)."""
        a = self.forward_s(num_seqs, num_seqs, 0.0, 0.0, 0.0, 0.0)
        per_ctx = max(self._attn_s_per_pair, self._kv_s_per_token)
        cpu = self._cpu_step_s + self._cpu_seq_s * num_seqs
        return a, per_ctx, cpu

    def decode_run(self, num_seqs: int, sum_context: int, num_steps: int) -> DecodeRun:
        """`num_steps` pure-decode steps; the first sees `sum_context` tokens of context."""
        # a skip-ahead asks for a few batch sizes thousands of times: their terms are kept
        terms = self._decode_terms.get(num_seqs)
        if terms is None:
            terms = self._decode_terms[num_seqs] = self.decode_linear(num_seqs)
        a, per_ctx, cpu = terms
        return DecodeRun(g0=a + per_ctx * sum_context, slope=per_ctx * num_seqs, cpu=cpu,
                         n=num_steps, overlap=self.async_scheduling)

    def decode_stretch(self, segments: Sequence[tuple[int, int, int]]) -> DecodeRuns:
        """Consecutive pure-decode segments, each (num_seqs, sum_context of its first step, num_steps)."""
        return DecodeRuns([self.decode_run(b, c, k) for b, c, k in segments])


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """n decode steps whose GPU time grows linearly: gpu_i = g0 + slope * i (i = 0..n-1).

    Step i takes `max(gpu_i, cpu)` with overlap (async scheduling), else `gpu_i + cpu`.
    """

    g0: float
    slope: float
    cpu: float
    n: int
    overlap: bool

    def dt(self, i: int) -> float:
        g = self.g0 + self.slope * i
        return max(g, self.cpu) if self.overlap else g + self.cpu

    def elapsed_s(self, m: int) -> float:
        """Seconds taken by the first m steps (closed form)."""
        if m <= 0:
            return 0.0
        if not self.overlap:
            return m * (self.g0 + self.cpu) + self.slope * m * (m - 1) / 2
        # steps before i_star are CPU-bound (cpu), from i_star on GPU-bound
        if self.g0 >= self.cpu:
            i_star = 0
        elif self.slope <= 0:
            i_star = m
        else:
            x = (self.cpu - self.g0) / self.slope
            i_star = m if x >= m else math.ceil(x)
        k = m - i_star
        return i_star * self.cpu + k * self.g0 + self.slope * (i_star * k + k * (k - 1) / 2)

    def steps_started_before(self, elapsed: float, extra_s: Callable[[int], float] | None = None) -> int:
        """How many of the n steps start strictly before `elapsed` seconds into the run.

        `extra_s(m)`, if given, adds time spent in the first m steps beyond the closed form
        (the CPU cost of the blocks they allocate and hash); it must be non-decreasing.
        """
        return _steps_started_before(self.elapsed_s, self.n, elapsed, extra_s)


class DecodeRuns:
    """Consecutive `DecodeRun`s: a decode stretch whose batch shrinks where requests finish
    (one run per constant batch), timed as one sequence of steps."""

    def __init__(self, runs: Sequence[DecodeRun]) -> None:
        self.runs = list(runs)
        self.first_steps = [0]  # step index where each run starts (and, last, the end)
        self._elapsed_before = [0.0]  # seconds before each run starts (and, last, the total)
        n = 0
        elapsed = 0.0
        for r in self.runs:
            n += r.n
            elapsed += r.elapsed_s(r.n)
            self.first_steps.append(n)
            self._elapsed_before.append(elapsed)
        self.n = n

    def _run_of(self, i: int) -> int:
        return bisect_right(self.first_steps, i) - 1

    def dt(self, i: int) -> float:
        k = self._run_of(i)
        return self.runs[k].dt(i - self.first_steps[k])

    def elapsed_s(self, m: int) -> float:
        """Seconds taken by the first m steps."""
        if m <= 0:
            return 0.0
        if m >= self.n:
            return self._elapsed_before[-1]
        k = self._run_of(m)
        return self._elapsed_before[k] + self.runs[k].elapsed_s(m - self.first_steps[k])

    def steps_started_before(self, elapsed: float, extra_s: Callable[[int], float] | None = None) -> int:
        """As `DecodeRun.steps_started_before`, over the whole stretch."""
        return _steps_started_before(self.elapsed_s, self.n, elapsed, extra_s)


def _steps_started_before(elapsed_s: Callable[[int], float], n: int, elapsed: float,
                          extra_s: Callable[[int], float] | None) -> int:
    """How many of n steps start strictly before `elapsed`, step m starting at
    elapsed_s(m) (+ extra_s(m)); both non-decreasing in m."""
    lo, hi = 0, n  # invariant: step lo-1 starts before `elapsed` (or lo == 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if elapsed_s(mid - 1) < elapsed:
            lo = mid
        else:
            hi = mid - 1
    if extra_s is not None:
        # extra time only delays starts, so the answer is at most lo; it is tiny (block CPU
        # time), so stepping down rarely takes more than one check
        while lo > 0 and elapsed_s(lo - 1) + extra_s(lo - 1) >= elapsed:
            lo -= 1
    return lo


__all__ = ["PROFILES_DIR", "BatchComposition", "CostModel", "CostProfile", "DecodeRun"]
