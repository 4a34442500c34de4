"""How long one engine step takes, from the batch's composition (roofline + CPU terms).

GPU time is a sum of roofline terms, each `max(FLOPs / rate, bytes / bandwidth)`:

* GEMMs (all decoder layers' projections and MLP, plus the LM head on the rows that
  are sampled): FLOPs grow with the batched tokens, bytes are the weights read once
  per step. Small batches are bandwidth-bound, big prefills compute-bound. A mixture of
  experts adds its experts as a roofline term of their own (one grouped-GEMM pair per layer):
  FLOPs of the k experts each token runs through, bytes of the experts the step's tokens
  touch, which grow with the batch until all are read (sim/moe.py); `MoeTerms` holds the
  routing skew and the fused kernel's measured efficiency against that roofline.
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

For the simulator's skip-ahead, a pure-decode step of B sequences with total context c and
longest context m costs `a(B) + b(B) * c + d(B) * m` GPU seconds exactly (decode attention is
linear in both: the summed KV read, and the longest sequence's, which bounds the kernel once it
stops splitting a sequence's KV over several programs), so the time of n consecutive decode
steps, whose context grows by B and whose longest context by 1 per step, has a closed form
(`DecodeRun`).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.core.cuda_graphs import VERIFY_GRAPH_MAX_TOKENS, decode_graph_bucket, mixed_graph_bucket
from engine.core.flags import CUDAGRAPH_MODES
from engine.core.model_spec import ModelSpec, dtype_bytes
from sim.config import EngineConfig
from sim.expert_parallel import all_to_all_s_per_token, max_pairs_per_token, max_touched_per_gpu
from sim.hardware import GB, GPUSpec
from sim.kv_dtype_costs import kv_dtype_cost
from sim.moe import ExpertRouting, padded_rows_ratio

PROFILES_DIR = Path(__file__).with_name("profiles")
PROFILE_SCHEMA_VERSION = 2  # what `save` writes; version 1 (first principles only) still loads
SUPPORTED_SCHEMA_VERSIONS = (1, 2)
# decode: a decode CUDA graph; mixed: prefill tokens, eager; mixed_graph: prefill tokens within the
# engine's capture size under cudagraph_mode FULL, a full CUDA graph of the padded token bucket
StepKind = Literal["decode", "mixed", "mixed_graph"]
STEP_KINDS: tuple[StepKind, ...] = ("decode", "mixed", "mixed_graph")
# the one CostProfile.status value per kind of evidence behind a profile
STATUS_VALIDATED = "validated"
STATUS_FITTED = "fitted, not validated"
STATUS_SCALED = "scaled, not validated"
STATUS_FIRST_PRINCIPLES = "first principles"

_COEF = Field(default=0.0, ge=0)

class GpuTerms(BaseModel):
    """A fitted forward pass (plus sampling) of one step kind: seconds = sum of each roofline
    feature (seconds at the datasheet rates, efficiency 1) times its multiplier, plus counts.

    Multipliers keep their physical meaning (1 / efficiency), so the same profile scales to a GPU
    with other rates; the count terms (launches, metadata, sampling per sequence) carry over."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gemm: float = _COEF  # x max(GEMM FLOPs / peak, weight bytes / bandwidth)
    prefill_attention: float = _COEF  # x max(causal pair FLOPs / peak, prefill KV bytes / bandwidth)
    decode_kv: float = _COEF  # x decode attention per context token (linear: DecodeRun stays exact)
    elementwise: float = _COEF  # x norms / RoPE / activations bytes per token / bandwidth
    step_s: float = _COEF  # per forward (launches, graph replay, sampler)
    per_seq_s: float = _COEF  # per sequence (eager: scheduled; graph: the padded batch)
    # decode-only steps: the decode attention multiplier by padded batch, (batch, multiplier) knots
    # interpolated in log2(batch) (replaces `decode_kv`): how well the attention kernel fills the
    # GPU depends on how many sequences it splits the KV over
    decode_kv_by_batch: tuple[tuple[int, float], ...] = ()
    # x the LONGEST decoding sequence's attention (one sequence's KV / bandwidth), added to the
    # summed term: once the kernel stops splitting a sequence's KV over several programs (padded
    # batch >= 16 on an H200), the program holding the longest sequence finishes last.
    # `decode_max_kv` for eager steps, by padded-batch knot for decode-only steps
    decode_max_kv: float = _COEF
    decode_max_kv_by_batch: tuple[tuple[int, float], ...] = ()
    # steps with prefill: the longest decode's context the `decode_max_kv` term prices, as the decodes'
    # mean context + this weight x its excess over that mean (`longest_decode_context`). Below 1 when
    # the tokens a longest program walks after the others have finished cost less than those it walks
    # beside them (qwen3-30b-a3b's sweep with long decodes among ~20 short ones: 0.5). 1: the whole
    # longest context (profiles fitted before the weight); decode-only steps always take the whole.
    decode_max_excess: float = Field(default=1.0, ge=0, le=1)
    # decode-only steps: seconds per replay of the graph of a padded batch, (batch, seconds) knots
    # interpolated in log2(batch), added to step_s + per_seq_s x batch (a fit with knots leaves those
    # two at 0). A graph's fixed cost is not linear in its batch: the attention kernel's split count
    # (so its programs and the merge), the sampler's shapes and the GEMM tiles change by batch.
    decode_step_by_batch: tuple[tuple[int, float], ...] = ()
    # a mixture of experts: x the experts' time as the profile's MoE terms price it (their measured
    # factors at gemm_compute/memory_efficiency); None (profiles fitted before it): the experts'
    # roofline at efficiency 1 inside `gemm`, times the gemm multiplier
    experts: float | None = Field(default=None, ge=0)

    def decode_kv_multiplier(self, padded_batch: int) -> float:
        return _by_knot(self.decode_kv_by_batch, self.decode_kv, padded_batch)

    def decode_max_kv_multiplier(self, padded_batch: int) -> float:
        if padded_batch <= 1 and self.decode_max_kv_by_batch:  # one sequence: the summed term is it
            return 0.0
        return _by_knot(self.decode_max_kv_by_batch, self.decode_max_kv, padded_batch)

    def decode_step_extra_s(self, padded_batch: int) -> float:
        """Seconds a decode graph of `padded_batch` costs beyond step_s + per_seq_s x batch."""
        return _by_knot(self.decode_step_by_batch, 0.0, padded_batch)


def longest_decode_context(max_context: Any, sum_context: Any, num_decodes: Any, excess: float) -> Any:
    """The longest decode's context as a step with prefill prices it (`GpuTerms.decode_max_excess`):
    the decodes' mean context + `excess` x how far the longest lies beyond it (scalars, as the
    simulator's step loop asks, in plain Python; numpy arrays for the fit; no decodes: 0)."""
    if excess == 1.0:  # mean + (longest - mean): the longest itself (0 without decodes)
        return max_context
    if isinstance(max_context, np.ndarray):
        mean = sum_context / np.maximum(num_decodes, 1)
        return np.where(num_decodes > 0, mean + excess * np.maximum(max_context - mean, 0.0), 0.0)
    if not num_decodes:
        return 0.0
    mean = sum_context / num_decodes
    return mean + excess * max(max_context - mean, 0.0)


def _by_knot(by_batch: tuple[tuple[int, float], ...], default: float, padded_batch: int) -> float:
    """A multiplier interpolated between (batch, multiplier) knots; `default` without knots."""
    if not by_batch:
        return default
    knots = [k for k, _ in by_batch]
    return sum(c * w for (_, c), w in zip(by_batch, knot_weights(padded_batch, knots)))


def knot_weights(x: float, knots: Sequence[float]) -> list[float]:
    """Hat-function weights of x over increasing knots, linear in log2 (clamped at both ends):
    sum(w) = 1, at most two non-zero."""
    w = [0.0] * len(knots)
    lx = math.log2(max(x, 1e-300))
    lk = [math.log2(k) for k in knots]
    if lx <= lk[0]:
        w[0] = 1.0
    elif lx >= lk[-1]:
        w[-1] = 1.0
    else:
        j = bisect_right(lk, lx) - 1
        t = (lx - lk[j]) / (lk[j + 1] - lk[j])
        w[j], w[j + 1] = 1 - t, t
    return w


class CpuTerms(BaseModel):
    """Host seconds of a step (the engine's schedule_s + prepare_s), fitted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_s: float = _COEF
    per_seq_s: float = _COEF
    per_token_s: float = _COEF
    per_context_token_s: float = _COEF  # per KV token of the scheduled sequences (block tables staged)
    per_block_allocated_s: float = _COEF
    per_block_hashed_s: float = _COEF


class OverlapTerms(BaseModel):
    """How a step's GPU and CPU time make its wall time, fitted from the engine's `total_s`.

    Async scheduling (the simulator's pipelined loop): a step's host part is `cpu +
    async_host_s` (the collect/update work no column records), then, for a step that runs
    eagerly, `async_eager_launch_s` of kernel launches from Python, during which its device work
    already runs; its device part is `gpu + async_gpu_gap_s` (host work the GPU waits on at a
    boundary). An eager step's launch also returns no earlier than `async_eager_block_s` plus
    `async_eager_block` of its device work after that work began (at most all of it): past a few
    hundred queued kernels the host blocks on the device (the MoE presets' eager steps, ~1,200
    launches: their launch returned after 72-100% of the step's GPU time on the H200, about
    14 ms + 0.67 x its GPU time, so the step before it is collected that late). Synchronous: `gpu + cpu +
    sync_extra_s` (the launches overlap the step's own GPU work)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    async_gpu_gap_s: float = _COEF
    async_host_s: float = _COEF
    async_eager_launch_s: float = _COEF
    async_eager_block: float = Field(default=0.0, ge=0.0, le=1.0)
    async_eager_block_s: float = _COEF
    sync_extra_s: float = _COEF


class TPTerms(BaseModel):
    """Tensor parallelism's price, measured (`costline calibrate --tp-runs`, sim/tp_fit.py) on a
    GPU pair: each forward issues `2 x layers + 1` all-reduces of its [tokens, hidden] activations
    (attention and MLP per layer, the vocab-parallel embedding), each `allreduce_latency_s +
    bus bytes / allreduce_bus_gb_per_s` (bus bytes = 2 (tp - 1) / tp x message bytes, the ring's
    and nccl-tests' definition), of which `overlap_fraction` hides behind compute; `step_s` is what
    else a TP step costs per forward (the logits all-gather, rank 0's step message). Measured at
    `tensor_parallel_size`; another size scales the latency by (tp - 1) / (measured tp - 1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tensor_parallel_size: int = Field(ge=2)
    allreduce_latency_s: float = Field(ge=0, le=1e-2)
    allreduce_bus_gb_per_s: float = Field(gt=0)
    overlap_fraction: float = Field(default=0.0, ge=0, le=1)
    step_s: float = Field(default=0.0, ge=0, le=0.05)
    provenance: dict[str, Any] | None = None  # "measured": GPU, model, runs, commit, fit errors

    def comm_terms(self, model: ModelSpec, tp: int) -> tuple[float, float]:
        """(fixed seconds, seconds per token) of a forward's TP communication at `tp` ranks."""
        n = 2 * model.num_layers + 1
        lat = self.allreduce_latency_s * (tp - 1) / (self.tensor_parallel_size - 1)
        per_token_bytes = 2 * (tp - 1) / tp * model.hidden_size * dtype_bytes(model.dtype)
        hidden = 1 - self.overlap_fraction
        return hidden * n * lat + self.step_s, hidden * n * per_token_bytes / (self.allreduce_bus_gb_per_s * GB)


class MemoryTerms(BaseModel):
    """What the engine's KV sizing used, per GPU, so the simulator computes the same block count:
    blocks = (total x utilization - weights - activations - non-torch) / block bytes, where the
    profiling run's activations are `activation_bytes + activation_bytes_per_batched_token x
    max_num_batched_tokens`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_bytes: float | None = Field(default=None, gt=0)  # device memory as measured; None: datasheet
    weights_bytes: float = Field(ge=0)
    activation_bytes: float = Field(ge=0)
    activation_bytes_per_batched_token: float = Field(ge=0)
    non_torch_bytes: float = Field(ge=0)


class SpecTerms(BaseModel):
    """Speculative decoding as the engine runs it, fitted from spec-on step traces
    (benchmarks/spec_decode/fit_sim.py). Without them a profile prices verify steps eagerly and
    the proposer from first principles, as it always did.

    With them: a uniform verify batch (every sequence a decode with k drafts) within the verify
    graphs' token cap replays a CUDA graph like a decode; the draft model runs one catch-up
    forward over the step's new tokens (prefill chunks and each decode's last token) and k - 1
    single-token forwards over the decodes, each forward costing `draft_pass_s` beyond its
    roofline math (a small draft is launch and read-back bound); verification adds host work
    (rejection, bookkeeping of 1 + k logits rows per sequence). An EAGLE head's forwards cost
    `eagle3_pass_s` each instead, where it was measured (None: `draft_pass_s`); its catch-up runs
    over every position the target verified (1 + k per decode), not one token per decode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    draft_pass_s: float = _COEF  # per draft forward, beyond its roofline math
    # per EAGLE-3 head forward beyond its roofline math, measured on this GPU x model's engine
    # (benchmarks/spec_decode/fit_eagle.py); None: not measured
    eagle3_pass_s: float | None = Field(default=None, ge=0)
    # and per decoding sequence of the step, per head forward (the proposer's host work grows
    # with the batch: its inputs are prepared per sequence for each of its k forwards)
    eagle3_pass_per_seq_s: float = Field(default=0.0, ge=0)
    verify_cpu_step_s: float = _COEF  # host seconds per verify step
    verify_cpu_per_seq_s: float = _COEF  # host seconds per verifying sequence


class MoeTerms(BaseModel):
    """How a mixture-of-experts model's experts are priced (ignored for a dense model).

    The experts' roofline per step is max(FLOPs of k experts per token, bytes of the experts the
    step touches), each at the dense GEMMs' rates (so a fitted `gemm` multiplier scales both);
    these factors say how much slower the fused MoE kernel runs than that roofline, measured on
    the GPU (benchmarks/kernels/bench_moe_h200.py) -- by tokens per step for the bytes side (small
    grouped GEMMs stream the weights less well), one factor for the FLOPs side."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    routing_skew: float = Field(default=0.0, ge=0, le=4)  # Zipf exponent of expert popularity, 0 = uniform
    # (tokens per step, factor on the touched experts' bytes) knots, interpolated in log2(tokens)
    bytes_factor_by_tokens: tuple[tuple[int, float], ...] = ()
    bytes_factor: float = Field(default=1.0, gt=0)  # without knots
    # (tokens per step, factor on the experts' FLOPs) knots: grouped GEMMs of few rows per expert
    # fill the tensor cores less well than big ones
    flops_factor_by_tokens: tuple[tuple[int, float], ...] = ()
    flops_factor: float = Field(default=1.0, gt=0)  # without knots
    # (tokens per step, rows per expert block) knots of the grouped GEMMs' plan, a step function (the
    # last knot at or below the step's tokens; none: 1, no padding). With them the FLOPs side prices
    # the rows the kernel computes, each expert's pairs rounded up to whole blocks
    # (sim.moe.padded_rows_ratio), and flops_factor_by_tokens is per computed row
    block_rows_by_tokens: tuple[tuple[int, int], ...] = ()
    # GPU seconds per MoE layer and forward beyond the roofline terms (routing softmax/top-k, the
    # grouping, the k-sum: small kernels whose launch and latency no byte or FLOP count covers),
    # fitted from the engine's decode steps
    layer_fixed_s: float = Field(default=0.0, ge=0, le=1e-3)
    source: str = "prior: uniform routing, experts at the dense GEMMs' efficiency"

    def routing(self, model: ModelSpec) -> ExpertRouting:
        return ExpertRouting(model.num_experts, model.experts_per_token, self.routing_skew)

    def bytes_multiplier(self, tokens: float) -> float:
        return _by_knot(self.bytes_factor_by_tokens, self.bytes_factor, max(round(tokens), 1))

    def flops_multiplier(self, tokens: float) -> float:
        return _by_knot(self.flops_factor_by_tokens, self.flops_factor, max(round(tokens), 1))

    def block_rows(self, tokens: float) -> int:
        """Rows per expert block of the grouped GEMMs at a step of `tokens` tokens (1: unpadded)."""
        i = bisect_right(self.block_rows_by_tokens, (max(round(tokens), 1), math.inf)) - 1
        return self.block_rows_by_tokens[i][1] if i >= 0 else 1

    def padding(self, routing: ExpertRouting, tokens: float) -> float:
        """Computed rows over needed rows at `tokens` tokens (`padded_rows_ratio`; 1 without blocks)."""
        if not self.block_rows_by_tokens:
            return 1.0
        return padded_rows_ratio(routing, max(round(tokens), 1), self.block_rows(tokens))


class CostProfile(BaseModel):
    """Coefficients of the step cost model, and what they were measured on.

    Version 1 is first principles (efficiency factors on datasheet rates). Version 2 adds fitted
    terms (`decode`, `mixed`, `cpu`, `cpu_sync`, `overlap`, `memory`) and provenance; the v1
    factors still price what a fit did not see (tensor-parallel all-reduces, a proposer's
    forwards)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1, 2] = PROFILE_SCHEMA_VERSION
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
    # --- version 2: fitted from engine step traces (sim/calibrate.py)
    decode: GpuTerms | None = None  # decode-only steps (CUDA graph, batch padded to its bucket)
    mixed: GpuTerms | None = None  # steps with prefill tokens (eager)
    # steps with prefill tokens that replay a full CUDA graph (tokens padded to the graph's bucket):
    # recorded with cudagraph_mode FULL, up to max_cudagraph_capture_size tokens. None: every
    # step with prefill tokens is priced eagerly (profiles fitted before mixed graphs existed, or
    # from runs with too few such steps)
    mixed_graph: GpuTerms | None = None
    # the engine's CUDA-graph settings of the runs fitted (run.json engine_args); None: recorded
    # before the engine had them (FULL_DECODE_ONLY: decode graphs only)
    cudagraph_mode: str | None = None
    max_cudagraph_capture_size: int | None = Field(default=None, ge=1)
    cpu: CpuTerms | None = None
    # synchronous scheduling's own host terms (None: `cpu`): the sync sweep runs' fixed cost is
    # lower and their per-context cost higher than the async runs' (docs/calibration.md)
    cpu_sync: CpuTerms | None = None
    overlap: OverlapTerms | None = None
    memory: MemoryTerms | None = None
    spec: SpecTerms | None = None  # speculative decoding as measured (None: first principles)
    # tensor parallelism as measured on a GPU pair (None: the all-reduce from the link's datasheet
    # bandwidth x allreduce_efficiency plus allreduce_latency_s, first principles)
    tp: TPTerms | None = None
    # FP8 weights (--quantization fp8): the decoder GEMMs' compute rate over bf16's. None: the
    # datasheet's FP8 rate (2x on Hopper), a prior. The weights' bytes halve either way; the LM head
    # stays 16-bit (as in vLLM). `fp8_step_s`: GPU seconds FP8 weights add to every forward (the
    # activations' dynamic quantization: two small kernels and a memset per projection). Both are
    # fitted from the engine's FP8 steps (sim/fp8_weights_fit.py) where `fp8_fit` says so.
    fp8_gemm_speedup: float | None = Field(default=None, gt=0, le=4)
    fp8_step_s: float | None = Field(default=None, ge=0, le=0.05)
    fp8_fit: dict[str, Any] | None = None  # how the two were measured: runs, steps, errors, commit
    moe: MoeTerms | None = None  # mixture-of-experts pricing (None: MoeTerms() defaults, a prior)
    scaled_from: str | None = None  # the fitted profile whose multipliers this one reuses
    provenance: dict[str, Any] | None = None  # engine commit, GPU, date, runs, steps used
    fit_error: dict[str, Any] | None = None  # per step kind: held-out median / p90 relative error
    validation: dict[str, Any] | None = None  # filled by `costline validate`: its error figures

    @model_validator(mode="after")
    def _v2_is_complete(self) -> CostProfile:
        fitted = (self.decode, self.mixed, self.cpu, self.overlap)
        if self.schema_version == 1 and any(t is not None for t in (*fitted, self.memory, self.cpu_sync)):
            raise ValueError("fitted terms need schema_version 2")
        if self.schema_version == 2 and any(t is None for t in fitted):
            raise ValueError("a schema_version 2 profile needs decode, mixed, cpu and overlap terms")
        if self.cudagraph_mode is not None and self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(f"cudagraph_mode {self.cudagraph_mode!r} is not one of {CUDAGRAPH_MODES}")
        if self.mixed_graph is not None and (self.schema_version == 1 or self.cudagraph_mode != "FULL"
                                             or self.max_cudagraph_capture_size is None):
            raise ValueError("mixed_graph terms need schema_version 2, cudagraph_mode FULL and "
                             "max_cudagraph_capture_size")
        return self

    @property
    def is_fitted(self) -> bool:
        return self.schema_version == 2

    @property
    def status(self) -> str:
        """How far to trust it: validated against the engine, fitted, scaled, or first principles."""
        if self.validation:
            return STATUS_VALIDATED
        if self.scaled_from:
            return STATUS_SCALED
        return STATUS_FITTED if self.is_fitted else STATUS_FIRST_PRINCIPLES

    @classmethod
    def load(cls, name_or_path: str | Path = "default") -> CostProfile:
        """A profile from a JSON path, or a name under sim/profiles/."""
        p = Path(name_or_path)
        if p.suffix != ".json" and not p.is_file():  # a name; names hold dots ("h200-llama-3.1-8b")
            p = PROFILES_DIR / f"{name_or_path}.json"
        if not p.is_file():
            have = sorted(q.stem for q in PROFILES_DIR.glob("*.json"))
            raise ValueError(f"cost profile {str(name_or_path)!r} not found; built-in profiles: {have}")
        data = json.loads(p.read_text())
        if data.get("schema_version") not in SUPPORTED_SCHEMA_VERSIONS:
            raise ValueError(f"{p}: schema_version {data.get('schema_version')!r} is not one of "
                             f"{SUPPORTED_SCHEMA_VERSIONS}; regenerate the profile")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"{p}: not a valid cost profile: {_first_error(exc)}") from None

    @classmethod
    def for_target(cls, model: str, gpu: str) -> CostProfile:
        """The shipped profile fitted (or scaled) for this model on this GPU, else first principles."""
        p = PROFILES_DIR / f"{gpu.lower()}-{model.lower()}.json"
        return cls.load(p) if p.is_file() else cls.load("default")

    @classmethod
    def resolve(cls, name_or_path: str | Path, model: str, gpu: str) -> CostProfile:
        """`auto` (or None-like empty) picks `for_target`; anything else loads by name or path."""
        if str(name_or_path) in ("auto", ""):
            return cls.for_target(model, gpu)
        return cls.load(name_or_path)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2) + "\n"


def _first_error(exc: ValidationError) -> str:
    e = exc.errors()[0]
    where = ".".join(str(x) for x in e["loc"])
    return f"{where}: {e['msg']}" if where else e["msg"]


def graph_routed(tokens: Any, padded: Any) -> Any:
    """Tokens whose routing decides the experts a CUDA graph of `padded` tokens reads when
    `tokens` of them are real: the padding tokens are copies of one dummy token and route alike
    (scalars or numpy arrays)."""
    return np.minimum(padded, tokens + 1) if np.ndim(tokens) else min(padded, tokens + 1)


@lru_cache(maxsize=4096)
def _touched(routing: ExpertRouting, tokens: float) -> float:
    """Expected distinct experts per layer (cached: the simulator asks for a few step sizes often)."""
    return routing.expected_touched(tokens)


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
    max_decode_context: int  # the longest decoding sequence's KV
    num_blocks_allocated: int
    num_blocks_hashed: int


@dataclass(frozen=True, slots=True)
class Roofline:
    """Seconds per unit of work at the GPU's datasheet rates (efficiency 1), for one replica."""

    gemm_s_per_token: float  # matmul FLOPs of the decoder layers per token
    gemm_s_per_row: float  # LM-head FLOPs per sampled row
    weights_s: float  # reading every weight once
    attn_s_per_pair: float  # attention FLOPs per (query, key) pair (decode)
    kv_s_per_token: float  # reading one token's KV (decode; prefill's memory side)
    prefill_s_per_pair: float  # prefill attention per (query, key) pair: attn_s_per_pair x the
    # KV dtype's measured prefill ratio (an fp8 cache converts each K/V tile per query tile)
    ew_s_per_token: float  # element-wise traffic per token
    # mixture of experts (zero for a dense model): the experts' FLOPs per token (k experts, all
    # layers) and the bytes of one expert in every layer; gemm_s_per_token and weights_s hold the
    # rest (attention projections, router, LM head)
    moe_s_per_token: float = 0.0
    expert_s: float = 0.0
    moe: MoeTerms | None = None
    routing: ExpertRouting | None = None
    moe_fixed_s: float = 0.0  # layers x MoeTerms.layer_fixed_s, per forward
    # expert parallelism (sim/expert_parallel.py): the GPUs the experts are spread over whole (1 =
    # every expert sliced by TP), and the all-to-all's seconds per token of a forward
    expert_parallel_size: int = 1
    a2a_s_per_token: float = 0.0

    @classmethod
    def of(cls, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig,
           fp8_gemm_speedup: float | None = None, moe: MoeTerms | None = None) -> Roofline:
        """`fp8_gemm_speedup`: FP8 weights' GEMM compute rate over bf16's (None: the datasheet's);
        `moe`: a mixture of experts' routing skew and kernel factors (None: the defaults)."""
        tp = engine.tensor_parallel_size
        wdt = engine.weight_dtype or model.dtype
        gemm_rate = head_rate = gpu.tflops(model.dtype) * 1e12  # the LM head keeps the model's dtype
        if engine.weight_dtype is not None:
            gemm_rate = gpu.tflops(wdt) * 1e12
        if engine.weight_dtype == "fp8" and fp8_gemm_speedup is not None:
            gemm_rate = gpu.bf16_tflops * 1e12 * fp8_gemm_speedup
        bw = gpu.hbm_gb_per_s * GB
        L, h = model.num_layers, model.hidden_size
        expert_params = L * model.expert_params  # one expert, every layer (0 for a dense model)
        layer_params = L * model.params_per_layer - model.num_experts * expert_params
        head_params = model.vocab_size * h
        # element-wise traffic per token: norms/residual/RoPE (~8 h) and SwiGLU (3 x inter; MoE: of k experts)
        ew_bytes = L * (8 * h + 3 * model.ffn_width_per_token / tp) * dtype_bytes(model.dtype)
        moe = (moe or MoeTerms()) if model.is_moe else None
        # a quantised cache is priced by its kernels' measured time against the 16-bit cache's,
        # not by its bytes (sim/kv_dtype_costs.py): the kernels convert slower than HBM streams
        kvc = kv_dtype_cost(engine.kv_cache_dtype, gpu.name)
        attn_s_per_pair = 4 * L * model.num_heads * model.head_dim / tp / (gpu.bf16_tflops * 1e12)
        ep = engine.expert_parallel_size if moe else 1
        routing = moe.routing(model) if moe else None
        # EP: one whole expert per read on the busiest GPU, which serves its share of the pairs
        pairs, expert_tp = (max_pairs_per_token(routing, ep), 1) if ep > 1 else (model.experts_per_token, tp)
        return cls(gemm_s_per_token=2 * layer_params / tp / gemm_rate,
                   gemm_s_per_row=2 * head_params / tp / head_rate,
                   weights_s=(layer_params * dtype_bytes(wdt) + head_params * dtype_bytes(model.dtype)) / tp / bw,
                   attn_s_per_pair=attn_s_per_pair,
                   kv_s_per_token=model.kv_bytes_per_token(engine.kv_cache_dtype) / tp / bw * kvc.decode_per_byte,
                   prefill_s_per_pair=attn_s_per_pair * kvc.prefill_time_ratio,
                   ew_s_per_token=ew_bytes / bw,
                   moe_s_per_token=2 * pairs * expert_params / expert_tp / gemm_rate,
                   expert_s=expert_params * dtype_bytes(wdt) / expert_tp / bw, moe=moe, routing=routing,
                   moe_fixed_s=L * moe.layer_fixed_s if moe else 0.0, expert_parallel_size=ep,
                   a2a_s_per_token=all_to_all_s_per_token(model, gpu, ep))

    def experts_s(self, tokens: Any, compute_mult: float = 1.0, memory_mult: float = 1.0,
                  routed: Any = None) -> Any:
        """The experts' roofline seconds for `tokens` tokens per step (scalar or numpy array):
        max(their FLOPs, the bytes of the experts touched), each side times the measured factor
        (at `tokens`, the kernels' launch shape) and the caller's multiplier (1 / efficiency); 0
        for a dense model. `routed` (default `tokens`): the tokens whose routing decides the experts
        touched: a CUDA graph's padding tokens are copies of one dummy token (id 0 at position 0),
        so they route alike and read at most one token's experts more than the real tokens."""
        if self.routing is None:
            return 0.0 * tokens
        m = self.moe
        if routed is None:
            routed = tokens
        if np.ndim(tokens) == 0:
            t, r = float(tokens), float(routed)
            touched = _touched(self.routing, r) if self.expert_parallel_size == 1 \
                else max_touched_per_gpu(self.routing, r, self.expert_parallel_size)
            bf, ff = m.bytes_multiplier(t), m.flops_multiplier(t) * m.padding(self.routing, t)
            return max(self.moe_s_per_token * t * ff * compute_mult, self.expert_s * touched * bf * memory_mult)
        else:
            touched = self.routing.expected_touched(routed) if self.expert_parallel_size == 1 \
                else max_touched_per_gpu(self.routing, routed, self.expert_parallel_size)
            bf = np.array([m.bytes_multiplier(float(t)) for t in np.ravel(tokens)]).reshape(np.shape(tokens))
            ff = np.array([m.flops_multiplier(float(t)) * m.padding(self.routing, float(t))
                           for t in np.ravel(tokens)]).reshape(np.shape(tokens))
        return np.maximum(self.moe_s_per_token * tokens * ff * compute_mult, self.expert_s * touched * bf * memory_mult)

    def moe_step_s(self, tokens: float, compute_mult: float = 1.0, memory_mult: float = 1.0,
                   scale: float = 1.0, routed: float | None = None) -> float:
        """What a mixture of experts adds to a forward's GEMM time: its experts' roofline (times
        `scale`), the per-layer fixed cost and, under expert parallelism, the all-to-all's dispatch
        and combine; 0 for a dense model."""
        if self.routing is None:
            return 0.0
        return (scale * self.experts_s(tokens, compute_mult, memory_mult, routed) + self.moe_fixed_s
                + self.a2a_s_per_token * tokens)

    def features(self, tokens: Any, rows: Any, prefill_pairs: Any, prefill_kv_tokens: Any,
                 decode_q_per_seq: Any, decode_kv_tokens: Any, decode_max_kv_tokens: Any = 0,
                 routed: Any = None) -> dict[str, Any]:
        """The roofline terms of a forward (seconds at efficiency 1), scalars or numpy arrays alike:
        what a fitted profile's multipliers (`GpuTerms`) apply to. `routed`: see `experts_s`."""
        mx = np.maximum
        return {
            "gemm": mx(self.gemm_s_per_token * tokens + self.gemm_s_per_row * rows, self.weights_s)
            + self.experts_s(tokens, routed=routed),
            "prefill_attention": mx(self.prefill_s_per_pair * prefill_pairs, self.kv_s_per_token * prefill_kv_tokens),
            "decode_kv": mx(self.attn_s_per_pair * decode_q_per_seq, self.kv_s_per_token) * decode_kv_tokens,
            "decode_max_kv": mx(self.attn_s_per_pair * decode_q_per_seq, self.kv_s_per_token) * decode_max_kv_tokens,
            "elementwise": self.ew_s_per_token * tokens,
        }


@dataclass(frozen=True, slots=True)
class _Forward:
    """A forward pass's time, folded to multiply-adds: `max(gemm_tok x tokens + gemm_row x rows,
    weights) + max(pair x pairs, kv x prefill KV) + max(pair x q, kv) x decode KV + max(max_pair x q,
    max_kv) x the longest decode's KV + ew x tokens + per_token x tokens + fixed + per_seq x sequences`."""

    gemm_tok: float
    gemm_row: float
    weights: float
    pair: float
    kv: float
    dkv_pair: float  # decode attention: per (query, key) pair and per KV token, apart from prefill's
    dkv: float
    max_pair: float  # the longest decode's attention, per pair and per KV token
    max_kv: float
    ew: float
    fixed: float
    per_seq: float
    experts: Roofline | None = None  # a mixture of experts' roofline (its experts_s), x `gemm_mult`
    gemm_mult: float = 0.0  # the experts' multiplier (GpuTerms.experts, else .gemm)
    experts_mults: tuple[float, float] = (1.0, 1.0)  # experts_s's (compute, memory) multipliers

    @classmethod
    def fitted(cls, r: Roofline, t: GpuTerms, fixed_extra_s: float = 0.0,
               experts_mults: tuple[float, float] = (1.0, 1.0)) -> _Forward:
        """`experts_mults`: the (compute, memory) multipliers of the experts' time when the terms
        fit an `experts` multiplier of their own (1 / the profile's GEMM efficiencies)."""
        own = t.experts is not None
        return cls(gemm_tok=t.gemm * r.gemm_s_per_token, gemm_row=t.gemm * r.gemm_s_per_row,
                   weights=t.gemm * r.weights_s, pair=t.prefill_attention * r.prefill_s_per_pair,
                   kv=t.prefill_attention * r.kv_s_per_token, dkv_pair=t.decode_kv * r.attn_s_per_pair,
                   dkv=t.decode_kv * r.kv_s_per_token, ew=t.elementwise * r.ew_s_per_token,
                   max_pair=t.decode_max_kv * r.attn_s_per_pair, max_kv=t.decode_max_kv * r.kv_s_per_token,
                   fixed=t.step_s + fixed_extra_s, per_seq=t.per_seq_s,
                   experts=r if r.routing is not None else None, gemm_mult=t.experts if own else t.gemm,
                   experts_mults=experts_mults if own else (1.0, 1.0))

    def seconds(self, tokens: float, rows: float, prefill_pairs: float, prefill_kv: float, q_per_seq: float,
                decode_kv: float, seqs: float, max_decode_kv: float = 0.0, routed: float | None = None) -> float:
        """`routed`: the tokens whose routing picks the experts (Roofline.experts_s; None: `tokens`)."""
        gemm = self.gemm_tok * tokens + self.gemm_row * rows
        gemm = max(gemm, self.weights)
        if self.experts is not None:
            gemm += self.experts.moe_step_s(tokens, *self.experts_mults, scale=self.gemm_mult, routed=routed)
        pre = max(self.pair * prefill_pairs, self.kv * prefill_kv)
        dec = max(self.dkv_pair * q_per_seq, self.dkv) * decode_kv
        if max_decode_kv:
            dec += max(self.max_pair * q_per_seq, self.max_kv) * max_decode_kv
        return gemm + pre + dec + self.ew * tokens + self.fixed + self.per_seq * seqs


class CostModel:
    """Step time of one replica (a TP group) running `model` on `gpu` with `engine` flags.

    Coefficients are folded into plain floats once, so a step's time is a handful of
    multiply-adds (the simulator asks once per step). A fitted (v2) profile prices decode-only
    steps (CUDA graph: the batch padded to its captured size) and steps with prefill (eager)
    with separate terms, and with `mixed_graph` terms the steps with prefill that fit the
    engine's mixed CUDA graphs (tokens padded to their bucket); a v1 profile prices all with the
    same efficiencies.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig,
                 profile: CostProfile | None = None, draft: ModelSpec | None = None) -> None:
        self.model, self.gpu, self.engine = model, gpu, engine
        self.profile = p = profile or CostProfile.load("default")
        tp = engine.tensor_parallel_size
        self.async_scheduling = engine.async_scheduling
        act_b = dtype_bytes(model.dtype)
        self.roofline = r = Roofline.of(model, gpu, engine, p.fp8_gemm_speedup, p.moe)
        L, h = model.num_layers, model.hidden_size
        # GEMM: seconds per token / per sampled row (compute side), weights (memory side)
        self._gemm_s_per_token = r.gemm_s_per_token / p.gemm_compute_efficiency
        self._gemm_s_per_row = r.gemm_s_per_row / p.gemm_compute_efficiency
        self._weights_s = r.weights_s / p.gemm_memory_efficiency
        # attention: per (query, key) pair and per KV token read
        self._attn_s_per_pair = r.attn_s_per_pair / p.attn_compute_efficiency
        self._prefill_s_per_pair = r.prefill_s_per_pair / p.attn_compute_efficiency
        self._kv_s_per_token = r.kv_s_per_token / p.attn_memory_efficiency
        self._ew_s_per_token = r.ew_s_per_token / p.elementwise_memory_efficiency
        # two all-reduces per layer of tokens x hidden activations (ring: 2 (tp-1)/tp of the bytes):
        # measured terms where the profile has them, else the link's datasheet rate
        if tp > 1 and p.tp is not None:
            self._ar_fixed_s, self._ar_s_per_token = p.tp.comm_terms(model, tp)
        elif tp > 1:
            link = gpu.interconnect_gb_per_s * GB * p.allreduce_efficiency
            self._ar_fixed_s = 2 * L * p.allreduce_latency_s
            self._ar_s_per_token = 2 * L * 2 * (tp - 1) / tp * h * act_b / link
        else:
            self._ar_fixed_s = self._ar_s_per_token = 0.0
        # FP8 weights' per-forward cost (activation quantization), where measured
        self._fp8_step_s = (p.fp8_step_s or 0.0) if engine.weight_dtype == "fp8" else 0.0
        self._gpu_fixed_s = p.gpu_step_overhead_s + self._fp8_step_s
        self._decode_terms: dict[int, DecodeTerms] = {}  # num_seqs -> decode_linear()
        self._cpu_step_s, self._cpu_seq_s = p.cpu_step_s, p.cpu_per_seq_s
        self._cpu_blk_s, self._cpu_hash_s = p.cpu_per_block_allocated_s, p.cpu_per_block_hashed_s
        self._cpu_tok_s = self._cpu_ctx_s = 0.0
        # async: max(gpu + gap, cpu + host), eager steps' launches (launch_s, blocked_device_s); sync: gpu + cpu + host
        self._gap_s = self._host_s = self._eager_launch_s = self._eager_block = self._eager_block_s = 0.0
        self._max_num_seqs = engine.max_num_seqs or 256
        self._fit_decode = self._fit_mixed = self._fit_mixed_graph = None
        self._mixed_graph_max_tokens = 0  # largest step (tokens) a mixed graph takes; 0: none
        if p.is_fitted:
            self._use_fit(p)
        # proposer
        spec = engine.speculative_config
        self.k = spec.num_speculative_tokens if spec else 0
        self.spec_method = spec.method if spec else None
        self.is_head = self.spec_method in ("eagle", "eagle3")  # reads the target's hidden states
        self._ngram_s_per_seq = p.ngram_cpu_per_seq_s if self.spec_method == "ngram" else 0.0
        self.spec_terms = p.spec if self.k and p.is_fitted else None
        self.draft: CostModel | None = None
        if draft is not None and self.k:
            dengine = EngineConfig(tensor_parallel_size=spec.draft_tensor_parallel_size or tp,
                                   kv_cache_dtype=engine.kv_cache_dtype, quantization=engine.quantization)
            # the draft's math from first principles, its fixed cost per forward as measured
            per_pass = self.spec_terms.draft_pass_s if self.spec_terms else p.draft_pass_overhead_s
            if self.is_head and self.spec_terms is not None and self.spec_terms.eagle3_pass_s is not None:
                per_pass = self.spec_terms.eagle3_pass_s
            dprof = CostProfile(**p.model_dump(include=set(_V1_FIELDS)) | {
                "schema_version": 1, "gpu_step_overhead_s": per_pass})
            self.draft = CostModel(draft, gpu, dengine, dprof)

    def _use_fit(self, p: CostProfile) -> None:
        """Fold a v2 profile's fitted terms (the all-reduce terms stay first-principles: the fit is
        of one GPU)."""
        ar = self._ar_fixed_s + self._fp8_step_s
        em = (1 / p.gemm_compute_efficiency, 1 / p.gemm_memory_efficiency)
        self._fit_decode = _Forward.fitted(self.roofline, p.decode, ar, em)
        self._fit_mixed = _Forward.fitted(self.roofline, p.mixed, ar, em)
        self._mixed_excess = self._graph_excess = p.mixed.decode_max_excess
        if p.mixed_graph is not None:
            self._fit_mixed_graph = _Forward.fitted(self.roofline, p.mixed_graph, ar, em)
            self._graph_excess = p.mixed_graph.decode_max_excess
            # the engine captures mixed graphs up to the capture size or the token budget
            budget = self.engine.max_num_batched_tokens or p.max_cudagraph_capture_size
            self._mixed_graph_max_tokens = min(p.max_cudagraph_capture_size, budget)
        c = p.cpu if self.async_scheduling or p.cpu_sync is None else p.cpu_sync
        self._cpu_step_s, self._cpu_seq_s, self._cpu_tok_s = c.step_s, c.per_seq_s, c.per_token_s
        self._cpu_ctx_s = c.per_context_token_s
        self._cpu_blk_s, self._cpu_hash_s = c.per_block_allocated_s, c.per_block_hashed_s
        o = p.overlap
        self._gap_s, self._host_s = ((o.async_gpu_gap_s, o.async_host_s) if self.async_scheduling
                                     else (0.0, o.sync_extra_s))
        self._eager_launch_s = o.async_eager_launch_s if self.async_scheduling else 0.0
        self._eager_block = o.async_eager_block if self.async_scheduling else 0.0
        self._eager_block_s = o.async_eager_block_s if self.async_scheduling else 0.0

    # --- GPU ----------------------------------------------------------------------
    def forward_s(self, num_tokens: int, num_rows: int, prefill_pairs: float, prefill_kv_tokens: float,
                  decode_pairs: float, decode_kv_tokens: float) -> float:
        """GPU seconds of one forward pass (roofline per term, summed)."""
        if num_tokens <= 0:
            return 0.0
        gemm = max(self._gemm_s_per_token * num_tokens + self._gemm_s_per_row * num_rows, self._weights_s)
        if self.roofline.routing is not None:
            gemm += self.roofline.moe_step_s(num_tokens, 1 / self.profile.gemm_compute_efficiency,
                                             1 / self.profile.gemm_memory_efficiency)
        pre = max(self._prefill_s_per_pair * prefill_pairs, self._kv_s_per_token * prefill_kv_tokens)
        dec = max(self._attn_s_per_pair * decode_pairs, self._kv_s_per_token * decode_kv_tokens)
        return (gemm + pre + dec + self._ew_s_per_token * num_tokens
                + self._ar_fixed_s + self._ar_s_per_token * num_tokens + self._gpu_fixed_s)

    def gpu_time_s(self, b: BatchComposition) -> float:
        """Target forward plus the proposer's forwards."""
        tokens = b.num_prefill_tokens + b.num_decode_tokens
        q_per_seq = b.num_decode_tokens / b.num_decode_seqs if b.num_decode_seqs else 0.0
        if self._fit_mixed is not None:
            t = self._fitted_forward_s(b, tokens, q_per_seq) if tokens > 0 else 0.0
        else:
            t = self.forward_s(tokens, b.num_prefill_seqs + b.num_decode_tokens, b.prefill_attn_pairs,
                               b.sum_prefill_context, q_per_seq * b.sum_decode_context, b.sum_decode_context)
        if self.draft is not None:
            t += self.proposer_gpu_s(b)
        return t

    def _fitted_forward_s(self, b: BatchComposition, tokens: int, q_per_seq: float) -> float:
        """A v2 profile's forward: a one-token decode batch replays the CUDA graph of its bucket
        (padded rows and tokens), another batch within the mixed graphs' tokens (profiles with
        `mixed_graph` terms) the mixed graph of its token bucket; anything else runs eagerly."""
        n = b.num_decode_seqs
        ar = self._ar_s_per_token * tokens
        if self._verify_graph(b):
            return self._verify_graph_s(b) + ar
        if not b.num_prefill_tokens and tokens == n:
            terms = self._decode_terms.get(n)
            if terms is None:
                terms = self._decode_terms[n] = self.decode_linear(n)
            return terms.gpu_s + terms.per_context_s * b.sum_decode_context + terms.per_max_context_s * (
                b.max_decode_context)
        if tokens <= self._mixed_graph_max_tokens:
            return self._mixed_graph_s(b, tokens, q_per_seq)
        longest = longest_decode_context(b.max_decode_context, b.sum_decode_context, n, self._mixed_excess)
        return self._fit_mixed.seconds(tokens, b.num_prefill_seqs + b.num_decode_tokens, b.prefill_attn_pairs,
                                       b.sum_prefill_context, q_per_seq, b.sum_decode_context,
                                       b.num_prefill_seqs + n, longest) + ar

    def _mixed_graph_s(self, b: BatchComposition, tokens: int, q_per_seq: float) -> float:
        """A mixed graph: every token-wise term over the padded bucket (padding tokens run the
        GEMMs, norms and all-reduces), the LM head on the sampled rows only (it runs eagerly), and
        per sequence the scheduled ones (the graph's empty dummy sequences attend nothing)."""
        pad = mixed_graph_bucket(tokens, self._mixed_graph_max_tokens)
        n = b.num_decode_seqs
        longest = longest_decode_context(b.max_decode_context, b.sum_decode_context, n, self._graph_excess)
        return self._fit_mixed_graph.seconds(pad, b.num_prefill_seqs + b.num_decode_tokens, b.prefill_attn_pairs,
                                             b.sum_prefill_context, q_per_seq, b.sum_decode_context,
                                             b.num_prefill_seqs + n, longest,
                                             routed=graph_routed(tokens, pad)) + (
            self._ar_s_per_token * pad)

    def _verify_graph(self, b: BatchComposition) -> bool:
        """Whether the engine replays a verify CUDA graph for this step (measured terms only): every
        sequence a decode with k drafts, the padded batch within the graphs' token cap. n-gram
        lookups often find fewer than k tokens, so a batch of several n-gram decodes is almost
        never uniform (H200 run 1: 0.2-7% of them) and runs eagerly."""
        n, q = b.num_decode_seqs, self.k + 1
        if self.spec_terms is None or not n or b.num_prefill_tokens or b.num_decode_tokens != n * q:
            return False
        if self.spec_method == "ngram" and n > 1:
            return False
        return decode_graph_bucket(n, self._max_num_seqs) * q <= VERIFY_GRAPH_MAX_TOKENS

    def _verify_graph_s(self, b: BatchComposition) -> float:
        """A verify graph: the decode graph's terms over the padded batch's 1 + k tokens per
        sequence, logits at every position."""
        q = self.k + 1
        pad = decode_graph_bucket(b.num_decode_seqs, self._max_num_seqs)
        r, t = self.roofline, self.profile.decode
        per_token = max(r.attn_s_per_pair * q, r.kv_s_per_token)
        return (self._fit_decode.seconds(pad * q, pad * q, 0.0, 0.0, float(q), 0.0, pad) + t.decode_step_extra_s(pad)
                + per_token * t.decode_kv_multiplier(pad) * b.sum_decode_context
                + per_token * t.decode_max_kv_multiplier(pad) * b.max_decode_context)

    def proposer_gpu_s(self, b: BatchComposition) -> float:
        """Draft model / EAGLE head: one pass over the prefill chunks, k passes over the decodes
        (with measured `SpecTerms`: the engine's catch-up forward, then k - 1 single-token ones)."""
        d = self.draft
        if d is None:
            return 0.0
        if self.spec_terms is not None:
            return self._draft_passes_s(d, b)
        t = d.forward_s(b.num_prefill_tokens, b.num_prefill_seqs, b.prefill_attn_pairs,
                        b.sum_prefill_context, 0.0, 0.0) if b.num_prefill_tokens else 0.0
        if b.num_decode_seqs:
            n, c = b.num_decode_seqs, b.sum_decode_context
            t += self.k * d.forward_s(n, n, 0.0, 0.0, c, c)
        return t

    def _draft_passes_s(self, d: CostModel, b: BatchComposition) -> float:
        """The engine's draft proposer: one catch-up forward over every scheduled sequence's new
        tokens (prefill chunks, and each decode's last sampled token; an EAGLE head's catch-up
        covers every position the target computed: each decode's 1 + k), then k - 1
        single-token forwards over the decodes."""
        n, c = b.num_decode_seqs, b.sum_decode_context
        caught = b.num_decode_tokens if self.is_head else n
        t = d.forward_s(b.num_prefill_tokens + caught, b.num_prefill_seqs + n, b.prefill_attn_pairs,
                        b.sum_prefill_context, c, c)
        if self.is_head and self.spec_terms is not None and self.spec_terms.eagle3_pass_s is not None:
            t += self.k * self.spec_terms.eagle3_pass_per_seq_s * n
        if n:
            t += (self.k - 1) * d.forward_s(n, n, 0.0, 0.0, c, c)
        return t

    def verify_cpu_s(self, b: BatchComposition) -> float:
        """Host seconds verification adds to a step (measured `SpecTerms` only)."""
        st = self.spec_terms
        if st is None or b.num_decode_tokens <= b.num_decode_seqs:
            return 0.0
        return st.verify_cpu_step_s + st.verify_cpu_per_seq_s * b.num_decode_seqs

    # --- CPU ----------------------------------------------------------------------
    def cpu_time_s(self, b: BatchComposition, block_scale: int = 1) -> float:
        """Host seconds of the step. `block_scale`: engine blocks per scheduler block (the
        simulator's KV block coarsening), as the CPU cost is per engine block."""
        seqs = b.num_prefill_seqs + b.num_decode_seqs
        tokens = b.num_prefill_tokens + b.num_decode_tokens
        # (verify_cpu_s and block_cpu_s, inlined: the simulator asks every step)
        st = self.spec_terms
        verify = (0.0 if st is None or b.num_decode_tokens <= b.num_decode_seqs
                  else st.verify_cpu_step_s + st.verify_cpu_per_seq_s * b.num_decode_seqs)
        return (self._cpu_step_s + self._cpu_seq_s * seqs + self._cpu_tok_s * tokens
                + self._cpu_ctx_s * (b.sum_decode_context + b.sum_prefill_context)
                + self._ngram_s_per_seq * b.num_decode_seqs + verify
                + (self._cpu_blk_s * (b.num_blocks_allocated * block_scale)
                   + self._cpu_hash_s * (b.num_blocks_hashed * block_scale)))

    def block_cpu_s(self, num_blocks_allocated: int, num_blocks_hashed: int) -> float:
        """CPU seconds of block allocation and hashing (charged apart in skip-ahead)."""
        return self._cpu_blk_s * num_blocks_allocated + self._cpu_hash_s * num_blocks_hashed

    def combine(self, gpu_s: float, cpu_s: float) -> float:
        """A step's duration: CPU and GPU add, or overlap with async scheduling (a fitted profile
        adds the measured gap and host terms, see `OverlapTerms`)."""
        if self.async_scheduling:
            return max(gpu_s + self._gap_s, cpu_s + self._host_s)
        return gpu_s + cpu_s + self._host_s

    def launch_s(self, b: BatchComposition) -> float:
        """Async scheduling: host seconds spent launching the step's kernels one by one, when it
        runs eagerly (not as a CUDA graph); its device work starts meanwhile. 0 otherwise."""
        if not self._eager_launch_s or self._runs_as_graph(b):
            return 0.0
        return self._eager_launch_s

    def blocked_device_s(self, b: BatchComposition, device_s: float) -> float:
        """Async scheduling: how much of an eager step's `device_s` of device work has run when its
        launch returns (OverlapTerms.async_eager_block_s + async_eager_block x device_s, at most all
        of it); 0 for a graph step or when synchronous."""
        if not (self._eager_block or self._eager_block_s) or self._runs_as_graph(b):
            return 0.0  # the common case first: a profile without the terms, or a graph step
        return min(device_s, self._eager_block_s + self._eager_block * device_s)

    def _runs_as_graph(self, b: BatchComposition) -> bool:
        tokens = b.num_prefill_tokens + b.num_decode_tokens
        return (not b.num_prefill_tokens and tokens == b.num_decode_seqs) or self._verify_graph(b) \
            or tokens <= self._mixed_graph_max_tokens

    @property
    def async_gap_s(self) -> float:
        """Device seconds the fitted profile adds to each async step (0 when synchronous)."""
        return self._gap_s

    def device_and_host_s(self, gpu_s: float, cpu_s: float) -> tuple[float, float]:
        """(device seconds, host seconds) of one step as the engine's loop spends them: the host
        schedules and prepares (cpu + the fitted host term), then the device runs (gpu, plus the
        fitted gap under async scheduling). Synchronous: the two add up to `combine`. Async: the
        simulator's pipelined loop overlaps a step's host part with the previous step's device part."""
        if self.async_scheduling:
            return gpu_s + self._gap_s, cpu_s + self._host_s
        return gpu_s, cpu_s + self._host_s

    # --- closed forms ---------------------------------------------------------------
    def decode_linear(self, num_seqs: int) -> DecodeTerms:
        """A pure decode of `num_seqs` sequences without speculation, linear in its summed and
        longest context (block terms excluded)."""
        cpu = self._cpu_step_s + self._cpu_seq_s * num_seqs + self._cpu_tok_s * num_seqs
        if self._fit_decode is not None:
            pad = decode_graph_bucket(num_seqs, self._max_num_seqs)
            r, t = self.roofline, self.profile.decode
            a = (self._fit_decode.seconds(pad, pad, 0.0, 0.0, 1.0, 0.0, pad, routed=graph_routed(num_seqs, pad))
                 + t.decode_step_extra_s(pad)
                 + self._ar_s_per_token * num_seqs)
            per_token = max(r.attn_s_per_pair, r.kv_s_per_token)
            return DecodeTerms(a, per_token * t.decode_kv_multiplier(pad),
                               per_token * t.decode_max_kv_multiplier(pad), cpu)
        a = self.forward_s(num_seqs, num_seqs, 0.0, 0.0, 0.0, 0.0)
        return DecodeTerms(a, max(self._attn_s_per_pair, self._kv_s_per_token), 0.0, cpu)

    def decode_run(self, num_seqs: int, sum_context: int, num_steps: int, max_context: int = 0) -> DecodeRun:
        """`num_steps` pure-decode steps; the first sees `sum_context` tokens of context, its
        longest sequence `max_context` (both KV lengths after the step; each step adds one token
        to every sequence, so the GPU time stays linear in the step index)."""
        # a skip-ahead asks for a few batch sizes thousands of times: their terms are kept
        t = self._decode_terms.get(num_seqs)
        if t is None:
            t = self._decode_terms[num_seqs] = self.decode_linear(num_seqs)
        gpu = t.gpu_s + t.per_context_s * sum_context + t.per_max_context_s * max_context
        # the fitted overlap terms shift the GPU and CPU sides of combine(): folded in here so
        # that DecodeRun.dt(i) equals combine(gpu_i, cpu) step by step
        cpu = t.cpu_s + self._cpu_ctx_s * sum_context
        if self.async_scheduling:
            g0, cpu = gpu + self._gap_s, cpu + self._host_s
        else:
            g0 = gpu + self._host_s
        # (positional: a skip-ahead builds a few per stretch, and keywords are matched by name)
        return DecodeRun(g0, t.per_context_s * num_seqs + t.per_max_context_s, cpu, num_steps,
                         self.async_scheduling, self._cpu_ctx_s * num_seqs)


@dataclass(frozen=True, slots=True)
class DecodeTerms:
    """A pure decode batch's step: GPU seconds `gpu_s + per_context_s x sum_context +
    per_max_context_s x max_context`, CPU seconds `cpu_s` + the per-context-token term."""

    gpu_s: float
    per_context_s: float
    per_max_context_s: float
    cpu_s: float


@dataclass(slots=True)  # not frozen: a frozen init stores each field through object.__setattr__ (a skip builds a few per stretch)
class DecodeRun:
    """n decode steps whose GPU and CPU times grow linearly: gpu_i = g0 + slope * i and
    cpu_i = cpu + cpu_slope * i (i = 0..n-1; the context grows by one token per sequence a step).

    Step i takes `max(gpu_i, cpu_i)` with overlap (async scheduling), else `gpu_i + cpu_i`.
    """

    g0: float
    slope: float
    cpu: float
    n: int
    overlap: bool
    cpu_slope: float = 0.0

    def dt(self, i: int) -> float:
        g = self.g0 + self.slope * i
        c = self.cpu + self.cpu_slope * i
        return max(g, c) if self.overlap else g + c

    def cpu_elapsed_s(self, m: int) -> float:
        """CPU seconds of the first m steps."""
        # (_linear_sum(cpu, cpu_slope, 0, m), inlined: a skip-ahead asks per row)
        return m * self.cpu + self.cpu_slope * (m - 1) * m / 2 if m > 0 else 0.0

    def elapsed_s(self, m: int) -> float:
        """Seconds taken by the first m steps (closed form)."""
        if m <= 0:
            return 0.0
        if not self.overlap:  # (_linear_sum(g0 + cpu, slope + cpu_slope, 0, m), inlined: the hot case)
            return m * (self.g0 + self.cpu) + (self.slope + self.cpu_slope) * (m - 1) * m / 2
        # two lines cross at most once: the CPU-bound steps are a prefix or a suffix
        d0, dd = self.cpu - self.g0, self.cpu_slope - self.slope  # cpu_i - gpu_i = d0 + dd * i
        if dd == 0:
            cpu_first, split = True, (m if d0 > 0 else 0)
        elif dd < 0:  # CPU-bound while i < -d0 / dd
            cpu_first, split = True, (0 if d0 <= 0 else _index_below(d0 / -dd, m, math.ceil))
        else:  # GPU-bound while i <= -d0 / dd
            cpu_first, split = False, (0 if d0 > 0 else _index_below(-d0 / dd, m, lambda x: math.floor(x) + 1))
        first, second = ((self.cpu, self.cpu_slope), (self.g0, self.slope)) if cpu_first else \
            ((self.g0, self.slope), (self.cpu, self.cpu_slope))
        return _linear_sum(*first, 0, split) + _linear_sum(*second, split, m)

    def steps_estimate(self, elapsed: float) -> int:
        """About how many steps start before `elapsed` (a start point for an exact count):
        sync steps' elapsed time is a quadratic in the step count, solved; async ones' the
        GPU-or-CPU bound's line."""
        if self.overlap:
            return int(elapsed / max(self.g0, self.cpu, 1e-12))
        a, s = self.g0 + self.cpu, self.slope + self.cpu_slope  # elapsed(i) = a i + s i (i - 1) / 2
        if s <= 0.0:
            return int(elapsed / a) + 1 if a > 0.0 else self.n
        b = a - s / 2
        return int((math.sqrt(b * b + 2 * s * elapsed) - b) / s) + 1

    def steps_started_before(self, elapsed: float, extra_s: Callable[[int], float] | None = None) -> int:
        """How many of the n steps start strictly before `elapsed` seconds into the run.

        `extra_s(m)`, if given, adds time spent in the first m steps beyond the closed form
        (the CPU cost of the blocks they allocate and hash); it must be non-decreasing.
        """
        return _steps_started_before(self.elapsed_s, self.n, elapsed, extra_s)


def _index_below(x: float, m: int, to_index: Callable[[float], int]) -> int:
    """min(m, to_index(x)), safe for a huge x (a denormal slope)."""
    return m if x >= m else min(m, to_index(x))


def _linear_sum(a: float, slope: float, i0: int, i1: int) -> float:
    """sum of a + slope * i for i in [i0, i1)."""
    k = i1 - i0
    return k * a + slope * (i0 + i1 - 1) * k / 2 if k > 0 else 0.0


class DecodeRuns:
    """Consecutive `DecodeRun`s: a decode stretch whose batch shrinks where requests finish
    (one run per constant batch), timed as one sequence of steps."""

    def __init__(self, runs: Sequence[DecodeRun] = ()) -> None:
        self.runs: list[DecodeRun] = []
        self.first_steps = [0]  # step index where each run starts (and, last, the end)
        self._elapsed_before = [0.0]  # seconds before each run starts (and, last, the total)
        self.n = 0
        for r in runs:
            self.add(r)

    def add(self, run: DecodeRun) -> float:
        """Append a run; returns the seconds of the whole stretch so far."""
        self.runs.append(run)
        self.n += run.n
        elapsed = self._elapsed_before[-1] + run.elapsed_s(run.n)
        self.first_steps.append(self.n)
        self._elapsed_before.append(elapsed)
        return elapsed

    def run_of(self, i: int) -> int:
        """The run step i belongs to."""
        return bisect_right(self.first_steps, i) - 1

    def dt(self, i: int) -> float:
        k = self.run_of(i)
        return self.runs[k].dt(i - self.first_steps[k])

    def elapsed_s(self, m: int) -> float:
        """Seconds taken by the first m steps."""
        if m <= 0:
            return 0.0
        if m >= self.n:
            return self._elapsed_before[-1]
        k = bisect_right(self.first_steps, m) - 1  # (run_of, inlined)
        r, i = self.runs[k], m - self.first_steps[k]
        if r.overlap or i <= 0:
            return self._elapsed_before[k] + r.elapsed_s(i)
        # (DecodeRun.elapsed_s's sync closed form, inlined: the hot case)
        return self._elapsed_before[k] + (i * (r.g0 + r.cpu) + (r.slope + r.cpu_slope) * (i - 1) * i / 2)

    def steps_started_before(self, elapsed: float, extra_s: Callable[[int], float] | None = None,
                             without_extra: int | None = None) -> int:
        """As `DecodeRun.steps_started_before`, over the whole stretch. `without_extra`: the
        answer without `extra_s`, if the caller has it (no search then)."""
        if without_extra is None:
            without_extra = self._started_before(elapsed)
        if extra_s is None:  # (_steps_started_before's answer then, without the call)
            return without_extra
        return _steps_started_before(self.elapsed_s, self.n, elapsed, extra_s, without_extra)

    def _started_before(self, elapsed: float) -> int:
        """How many steps start strictly before `elapsed` (no extra time): the last run starting
        before it (a C-level bisection of the runs' start times), then inside that run the
        count its closed form estimates, corrected step by step against `elapsed_s` itself (the
        very comparisons a bisection over all steps makes; starts are non-decreasing)."""
        k = bisect_left(self._elapsed_before, elapsed, 0, len(self.runs)) - 1
        if k < 0:
            return 0
        lo, hi = self.first_steps[k] + 1, self.first_steps[k + 1]  # the answer is in [lo, hi]
        m = min(max(lo, self.first_steps[k] + self.runs[k].steps_estimate(elapsed - self._elapsed_before[k])), hi)
        if m > lo and self.elapsed_s(m - 1) >= elapsed:  # step m - 1 starts after: fewer
            hi = m - 1
        elif m < hi and self.elapsed_s(m) < elapsed:  # step m starts before: more
            lo = m + 1
        else:
            return m
        while lo < hi:  # (a far estimate: bisect what is left; step lo - 1 starts before)
            mid = (lo + hi + 1) // 2
            if self.elapsed_s(mid - 1) < elapsed:
                lo = mid
            else:
                hi = mid - 1
        return lo


def _steps_started_before(elapsed_s: Callable[[int], float], n: int, elapsed: float,
                          extra_s: Callable[[int], float] | None, without_extra: int | None = None) -> int:
    """How many of n steps start strictly before `elapsed`, step m starting at
    elapsed_s(m) (+ extra_s(m)); both non-decreasing in m."""
    lo, hi = 0, n  # invariant: step lo-1 starts before `elapsed` (or lo == 0)
    if without_extra is not None:
        lo = hi = without_extra
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


_V1_FIELDS = ("name", "hardware", "model", "engine", "source", "gemm_compute_efficiency",
               "gemm_memory_efficiency", "attn_compute_efficiency", "attn_memory_efficiency",
               "elementwise_memory_efficiency", "allreduce_efficiency", "allreduce_latency_s",
               "gpu_step_overhead_s", "draft_pass_overhead_s", "cpu_step_s", "cpu_per_seq_s",
               "cpu_per_block_allocated_s", "cpu_per_block_hashed_s", "ngram_cpu_per_seq_s")


# the step table's columns the cost model reads (the fields of `BatchComposition`)
STEP_TABLE_COLUMNS = ("max_decode_context", "num_blocks_allocated", "num_blocks_hashed", "num_decode_seqs",
                      "num_decode_tokens", "num_prefill_seqs", "num_prefill_tokens", "prefill_attn_pairs",
                      "sum_decode_context", "sum_prefill_context")


class _StepRow:
    """One step-table row as the cost model reads it (`BatchComposition`)."""

    __slots__ = STEP_TABLE_COLUMNS

    def __init__(self, values: dict[str, int]) -> None:
        for k, v in values.items():
            setattr(self, k, v)


def step_table_seconds(cost: CostModel, steps: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """`cost`'s (GPU, CPU) seconds for every row of an engine step table (one step per row), the
    schedule held fixed: the cost model's own error on the engine's steps."""
    cols = {k: steps[k].astype(np.int64).tolist() for k in _StepRow.__slots__}
    rows = (_StepRow(dict(zip(cols, vals))) for vals in zip(*cols.values()))
    times = np.array([(cost.gpu_time_s(b), cost.cpu_time_s(b)) for b in rows], dtype=np.float64).reshape(-1, 2)
    return times[:, 0], times[:, 1]

__all__ = [
    "CUDAGRAPH_MODES",
    "PROFILES_DIR",
    "PROFILE_SCHEMA_VERSION",
    "STATUS_FIRST_PRINCIPLES",
    "STATUS_FITTED",
    "STATUS_SCALED",
    "STATUS_VALIDATED",
    "STEP_KINDS",
    "STEP_TABLE_COLUMNS",
    "BatchComposition",
    "CostModel",
    "CostProfile",
    "CpuTerms",
    "DecodeRun",
    "DecodeTerms",
    "GpuTerms",
    "MemoryTerms",
    "OverlapTerms",
    "Roofline",
    "SpecTerms",
    "StepKind",
    "TPTerms",
    "graph_routed",
    "knot_weights",
    "longest_decode_context",
    "step_table_seconds",
]
