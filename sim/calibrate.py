"""Fit a cost profile (schema v2, sim/cost_model.py) to the engine's step traces.

Every engine step row carries its batch composition (the simulator's `BatchComposition` fields)
and its timings: `gpu_s` (the forward, CUDA events), `sample_s`, `schedule_s`, `prepare_s` and
the wall `total_s`. The fit:

* GPU: `gpu_s + sample_s` (the sampler's time is device work in async mode, its wall time in sync
  mode) as a non-negative combination of roofline features (seconds at the datasheet rates,
  sim/cost_model.py `Roofline.features`) and counts, one coefficient set per step kind: decode-only
  steps (a CUDA graph padded to its captured batch; decode attention with one multiplier per
  padded-batch knot, on the summed context and on the longest sequence's), steps with prefill
  tokens that replay a mixed CUDA graph (runs with cudagraph_mode FULL, steps within the capture
  size: tokens padded to the graph's bucket), and the other steps with prefill tokens (eager).
  Non-negative least squares on
  RELATIVE error (rows weighted by 1 / time), iteratively reweighted (Huber, then Tukey's
  biweight: rows it gives weight 0 are the outliers, counted).
* CPU: `schedule_s + prepare_s` over counts (step, sequences, tokens, KV tokens, blocks
  allocated/hashed).
* Overlap: under async scheduling a step's period `total_s` is the host loop that waits for the
  PREVIOUS step's tokens, so step N's wall time is row N+1's `total_s`; it is fitted as
  `max(gpu + gap, cpu + host)` from the measured gpu and cpu times. Synchronous steps:
  `gpu + cpu + extra`.
* Memory: the engine's KV sizing terms from each run's run.json, so that the simulator's
  `plan_memory` reproduces `num_gpu_blocks`.

The first `warmup_steps` steps of each run (kernel compilation) are dropped and counted. A
deterministic 20% of the steps (by a hash of run name and step id) is held out of the fit; the
fit error reported is on those.
"""

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from scipy.optimize import least_squares, nnls

from engine.core.cuda_graphs import VERIFY_GRAPH_MAX_TOKENS, decode_graph_bucket, mixed_graph_bucket
from engine.core.model_spec import ModelSpec, dtype_bytes
from engine.core.outputs import check_output_file, staged_file
from sim.config import EngineConfig
from sim.cost_model import (
    CUDAGRAPH_MODES,
    STEP_KINDS,
    CostProfile,
    CpuTerms,
    GpuTerms,
    MemoryTerms,
    MoeTerms,
    OverlapTerms,
    Roofline,
    StepKind,
    graph_routed,
    knot_weights,
    longest_decode_context,
)
from sim.hardware import GPU_PRESETS, GPUSpec
from sim.memory import plan_memory

# columns a step trace must have (engine/core/records.py StepRecord names)
REQUIRED_COLUMNS: tuple[str, ...] = (
    "step_id", "t_start_s", "total_s", "gpu_s", "schedule_s", "prepare_s", "sample_s", "num_prefill_tokens",
    "num_prefill_seqs", "sum_prefill_context", "prefill_attn_pairs", "num_decode_tokens", "num_decode_seqs",
    "sum_decode_context", "num_blocks_allocated", "num_blocks_hashed")
# columns a trace recorded before they existed: 0 when absent (their feature then fits to 0)
OPTIONAL_COLUMNS: tuple[str, ...] = ("max_decode_context",)
# a run folder's reconstruction of a column its trace lacks (benchmarks/calibration/reschedule.py)
RECONSTRUCTED_STEPS_FILE = "steps_maxctx.jsonl"
GPU_FEATURES: dict[StepKind, tuple[str, ...]] = {
    # decode graphs, per padded-batch knot (see decode_knots): the replay's fixed seconds
    # (decode_step@B, in place of step_s + per_seq_s x B: not linear in B), the attention multiplier
    # (decode_kv@B) and the longest sequence's (decode_max_kv@B)
    "decode": ("gemm",),
    "mixed": ("gemm", "prefill_attention", "decode_kv", "decode_max_kv", "step_s", "per_seq_s"),
    # as eager mixed steps, over the token bucket; per_seq_s per scheduled sequence (the graph's
    # dummy sequences hold no tokens: their attention programs exit at once)
    "mixed_graph": ("gemm", "prefill_attention", "decode_kv", "decode_max_kv", "step_s", "per_seq_s"),
}
# cudagraph_mode of a run.json recorded before the engine had the flag: decode graphs only
LEGACY_CUDAGRAPH_MODE = "FULL_DECODE_ONLY"
# Element-wise bytes grow with tokens exactly as the GEMMs' FLOPs (eager batches) or as the
# per-sequence costs (decode batches) do, so no trace tells them apart: their multiplier is the
# first-principles one (1 / the default profile's element-wise efficiency), not fitted.
FIXED_MULTIPLIERS: dict[str, float] = {"elementwise": 1 / 0.7}
# First-principles multipliers the fit leans on only where the data cannot decide (see robust_nnls)
PRIOR_MULTIPLIERS: dict[str, float] = {"gemm": 1 / 0.85, "prefill_attention": 1 / 0.5, "decode_kv": 1 / 0.7,
                                       "experts": 1.0}
# A mixture of experts: its experts get a feature of their own, `experts` (the fused kernel's time as
# the profile's MoE terms price it: measured factors per tokens per step on the touched experts'
# roofline, at the GEMM efficiencies they were measured against), so the fit scales them apart from the
# dense GEMMs (`GpuTerms.experts`; prior 1: the kernel bench's time); `moe_fixed` (the MoE terms'
# per-layer fixed seconds x layers, per forward) is an offset taken as given, the step constants
# fit what is left.
MOE_OFFSET_FEATURE = "moe_fixed"
PRIOR_WEIGHT = 1e-4
CPU_FEATURES: tuple[str, ...] = ("step_s", "per_seq_s", "per_token_s", "per_context_token_s",
                                 "per_block_allocated_s", "per_block_hashed_s")
MIN_STEPS_PER_FEATURE = 10  # training steps a kind needs per coefficient it fits
HELD_OUT_SHARE = 0.2
WARMUP_STEPS = 3
SCALED_GPUS: tuple[str, ...] = ("a100-80gb", "h100-sxm", "b200", "l4")
_TUKEY_C = 4.685  # 95% efficiency under Gaussian noise
_HUBER_C = 1.345
# Host seconds: a step's host time adds to its period (sync) or binds it (async), so the simulator
# needs the mean host time of a step like it, skewed tail included, not its typical value; the
# Huber threshold is wide (in robust standard deviations of the absolute residual) and only caps
# the pull of a rare pause of many milliseconds.
_HOST_HUBER_C = 10.0
_CONTIGUOUS_S = 1e-6  # rows whose periods meet (both stamps come from one clock)


class CalibrationInputError(ValueError):
    """A run folder or step file that cannot be fitted from; the message names it and the fix."""


@dataclass(slots=True)
class EngineRun:
    """One engine run's step table and what the fit needs of its run.json."""

    name: str
    steps: dict[str, np.ndarray]
    async_scheduling: bool
    max_num_seqs: int | None  # None: vLLM's default for the GPU (resolved by fit_profile)
    enforce_eager: bool = False
    run_info: dict[str, Any] | None = None  # run.json (schema costline-engine-run/1), if any
    path: Path | None = None
    cudagraph_mode: str = LEGACY_CUDAGRAPH_MODE
    max_cudagraph_capture_size: int = VERIFY_GRAPH_MAX_TOKENS
    max_num_batched_tokens: int | None = None  # None: no cap below the capture size
    # a run recorded for its steps with prefill: its decode-only steps stay out of the fit (their
    # compositions, e.g. one decode far longer than the rest, lie outside what the decode terms carry)
    prefill_steps_only: bool = False

    @property
    def decode_graphs(self) -> bool:
        return not self.enforce_eager and self.cudagraph_mode != "NONE"

    @property
    def mixed_graph_max_tokens(self) -> int:
        """The largest step, in tokens, that replayed a mixed CUDA graph (0: none did)."""
        if not self.decode_graphs or self.cudagraph_mode != "FULL":
            return 0
        return min(self.max_cudagraph_capture_size, self.max_num_batched_tokens or self.max_cudagraph_capture_size)


@dataclass(slots=True)
class KindError:
    """Held-out error of one step kind: |predicted - measured| / measured."""

    n_fit: int
    n_held_out: int
    n_outliers: int  # training steps the robust fit gave weight 0
    gpu_median: float
    gpu_p90: float
    step_median: float  # the whole step's wall time (GPU, CPU and their overlap)
    step_p90: float

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class MemoryCheck:
    """The engine's KV block count of a run and the simulator's with the fitted terms."""

    run: str
    engine_blocks: int
    sim_blocks: int


@dataclass(slots=True)
class FitResult:
    """A fitted profile and how well it predicts the steps it did not see."""

    profile: CostProfile
    errors: dict[str, KindError]
    n_steps: int  # steps used (fitted + held out)
    n_warmup_dropped: int
    cpu_error_median: float
    memory_checks: list[MemoryCheck] = field(default_factory=list)


# --- reading ------------------------------------------------------------------------------------
def read_steps(path: str | Path) -> dict[str, np.ndarray]:
    """A steps.jsonl[.gz] file as columns (NaN where a row has null); refuses missing columns."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError, gzip.BadGzipFile, EOFError) as exc:
        raise CalibrationInputError(f"{p}: not a JSON-lines step trace ({exc})") from None
    if not rows:
        raise CalibrationInputError(f"{p}: no steps in the file")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    if missing:
        raise CalibrationInputError(f"{p}: step trace lacks column(s) {', '.join(missing)}; record it with "
                                    "this engine (`costline engine run --out DIR` writes steps.jsonl)")
    cols: dict[str, np.ndarray] = {}
    for c in REQUIRED_COLUMNS:
        vals = [r.get(c) for r in rows]
        cols[c] = np.array([np.nan if v is None else v for v in vals], dtype=np.float64)
    for c in OPTIONAL_COLUMNS:
        cols[c] = np.array([r.get(c) or 0 for r in rows], dtype=np.float64)
    return cols


def merge_reconstructed(steps: dict[str, np.ndarray], path: Path) -> None:
    """Fill the optional columns from a reconstruction file (rows of step_id and the columns),
    matched by step_id; refuses one that does not cover every step."""
    with open(path) as f:
        rows = {int(r["step_id"]): r for r in map(json.loads, filter(str.strip, f))}
    missing = [int(s) for s in steps["step_id"] if int(s) not in rows]
    if missing:
        raise CalibrationInputError(f"{path}: no row for step {missing[0]} ({len(missing)} steps missing); "
                                    "rerun benchmarks/calibration/reschedule.py on the run folder")
    for c in OPTIONAL_COLUMNS:
        if c in next(iter(rows.values())):
            steps[c] = np.array([rows[int(s)][c] for s in steps["step_id"]], dtype=np.float64)


def _steps_file(folder: Path) -> Path:
    for name in ("steps.jsonl", "steps.jsonl.gz"):
        if (folder / name).is_file():
            return folder / name
    raise CalibrationInputError(f"{folder}: no steps.jsonl or steps.jsonl.gz in the folder; pass an engine "
                                "run folder (`costline engine run --out DIR`) or a steps file")


def load_run(path: str | Path, default: EngineConfig | None = None) -> EngineRun:
    """An engine run folder (steps.jsonl + run.json) or a bare steps.jsonl[.gz] file; a bare file
    takes its flags (async scheduling, max_num_seqs) from `default`."""
    p = Path(path)
    if not p.exists():
        raise CalibrationInputError(f"{p}: no such file or folder")
    info = None
    if p.is_dir():
        steps_path = _steps_file(p)
        if (p / "run.json").is_file():
            info = json.loads((p / "run.json").read_text())
        name = info.get("name", p.name) if info else p.name
    else:
        steps_path, name = p, p.name.split(".")[0]
    steps = read_steps(steps_path)
    if p.is_dir() and (p / RECONSTRUCTED_STEPS_FILE).is_file():
        merge_reconstructed(steps, p / RECONSTRUCTED_STEPS_FILE)
    args = (info or {}).get("engine_args") or {}
    dflt = default or EngineConfig()
    mode = args.get("cudagraph_mode") or LEGACY_CUDAGRAPH_MODE
    if mode not in CUDAGRAPH_MODES:
        raise CalibrationInputError(f"{p}: run.json engine_args.cudagraph_mode {mode!r} is not one of "
                                    f"{', '.join(CUDAGRAPH_MODES)}; fix the run.json or rerun the engine")
    return EngineRun(name=str(name), steps=steps, path=p, run_info=info,
                     async_scheduling=bool(args.get("async_scheduling", dflt.async_scheduling)),
                     max_num_seqs=args.get("max_num_seqs") or dflt.max_num_seqs,
                     enforce_eager=bool(args.get("enforce_eager", False)), cudagraph_mode=mode,
                     max_cudagraph_capture_size=int(args.get("max_cudagraph_capture_size")
                                                    or VERIFY_GRAPH_MAX_TOKENS),
                     max_num_batched_tokens=args.get("max_num_batched_tokens") or dflt.max_num_batched_tokens)


# --- reconstruction of columns a trace lacks --------------------------------------------------
COMPOSITION_COLUMNS: tuple[str, ...] = (
    "num_batched_tokens", "num_prefill_tokens", "num_prefill_seqs", "sum_prefill_context", "prefill_attn_pairs",
    "num_decode_tokens", "num_decode_seqs", "sum_decode_context", "num_blocks_allocated", "num_preempted")


# how long before a step's recorded start the replay loop may have looked at the clock: an
# arrival in that gap is on either side, so both readings are tried
ARRIVAL_MARGINS_S = (0.0, 1e-4)


@dataclass(slots=True)
class Reschedule:
    """The shared scheduler re-run on a recorded engine run: each step's `max_decode_context`,
    and where its batch composition first differs from the recorded row (None: every step equal)."""

    run: str
    steps: list[dict[str, int]]  # step_id, max_decode_context (and the recomputed columns)
    num_recorded_steps: int
    first_mismatch: int | None  # index of the first recorded step whose composition differs
    mismatched_column: str | None

    @property
    def exact(self) -> bool:
        return self.first_mismatch is None and len(self.steps) == self.num_recorded_steps


def reschedule(folder: str | Path) -> Reschedule:
    """`reschedule_with` under each arrival margin: the first that reproduces every step, else the
    one that reproduces the most steps."""
    tries = []
    for margin_s in ARRIVAL_MARGINS_S:
        r = reschedule_with(folder, margin_s)
        if r.exact:
            return r
        tries.append(r)
    return max(tries, key=lambda r: r.first_mismatch if r.first_mismatch is not None else len(r.steps))


def reschedule_with(folder: str | Path, arrival_margin_s: float) -> Reschedule:
    """Re-run the scheduler on an engine run folder (run.json, workload.jsonl, steps.jsonl) on the
    CPU: the run's scheduling flags and KV pool, each request added before the first step that
    starts at or after its arrival (all before step 0 without `honor_arrivals`), token counts only
    (the runs ignore EOS). The scheduler is the engine's, so the steps reproduce exactly unless the
    arrivals fell otherwise between steps."""
    from engine.core.config import EngineArgs, scheduler_config
    from engine.core.scheduler import Scheduler
    from sim.workload_source import SourceOptions, load_workload

    p = Path(folder)
    info = json.loads((p / "run.json").read_text())
    steps = read_steps(_steps_file(p))
    args = EngineArgs(**info["engine_args"])
    sched = Scheduler(scheduler_config(args, num_gpu_blocks=int(info["num_gpu_blocks"])))
    opts = SourceOptions(trace_format="mooncake", hash_block_size=int(info["hash_block_size"]))
    reqs = sorted(load_workload(str(p / "workload.jsonl"), opts), key=lambda r: (r.arrival_s, r.request_id))
    arrivals = [r.arrival_s if info.get("honor_arrivals", True) else 0.0 for r in reqs]
    recorded = {c: steps[c] for c in COMPOSITION_COLUMNS if c in steps}
    # the replay loop adds what has arrived some microseconds before the step starts: an arrival
    # closer to the start than the margin waits for the next step
    out_rows, mismatch, column, i = [], None, None, 0
    for k, t_start in enumerate(steps["t_start_s"]):
        while i < len(reqs) and arrivals[i] <= t_start - arrival_margin_s * (k > 0):
            sched.add_request(reqs[i])
            i += 1
        while not sched.has_unfinished() and i < len(reqs) and arrivals[i] <= t_start:  # it slept until them
            sched.add_request(reqs[i])
            i += 1
        out = _next_scheduled_step(sched)
        if out is None:
            break
        # an async engine's empty schedules (a step in flight, nothing new) take step ids without
        # rows: the recorded ids label the rows
        row = {"step_id": int(steps["step_id"][k]), **_composition(out)}
        out_rows.append(row)
        if mismatch is None:
            column = next((c for c in recorded if row[c] != recorded[c][k]), None)
            mismatch = k if column else None
        sched.update_from_output(out, None)
    return Reschedule(info.get("name", p.name), out_rows, len(steps["step_id"]), mismatch, column)


def _next_scheduled_step(sched: Any) -> Any:
    """The next step that schedules tokens (the engine records no row for an empty one)."""
    while sched.has_unfinished():
        out = sched.schedule()
        if out.num_batched_tokens:
            return out
        sched.update_from_output(out, None)
    return None


def _composition(out: Any) -> dict[str, int]:
    row = {c: int(getattr(out, c)) for c in COMPOSITION_COLUMNS if c != "num_preempted"}
    return row | {"num_preempted": len(out.preempted_ids), "max_decode_context": int(out.max_decode_context)}


# --- features -----------------------------------------------------------------------------------
def decode_knots(max_num_seqs: int) -> list[int]:
    """The padded batches where decode attention gets its own multiplier: powers of two up to
    the largest CUDA graph (the split-KV heuristics change with the batch's power of two)."""
    top = decode_graph_bucket(max_num_seqs, max_num_seqs)
    knots = [1 << i for i in range(top.bit_length()) if 1 << i < top]
    return [*knots, top]


def step_kinds(steps: dict[str, np.ndarray], decode_graphs: bool = True,
               mixed_graph_max_tokens: int = 0) -> np.ndarray:
    """Each row's `StepKind` as the engine ran it: a one-token decode batch replays a decode
    graph (unless graphs are off); another step of at most `mixed_graph_max_tokens` tokens a mixed
    graph; the rest run eagerly ("mixed")."""
    g = steps
    n_dec = g["num_decode_seqs"]
    tokens = g["num_prefill_tokens"] + g["num_decode_tokens"]
    is_decode = (g["num_prefill_tokens"] == 0) & (tokens == n_dec) & (n_dec > 0) & decode_graphs
    in_graph = ~is_decode & (tokens > 0) & (tokens <= mixed_graph_max_tokens)
    return np.where(is_decode, "decode", np.where(in_graph, "mixed_graph", "mixed"))


def step_features(steps: dict[str, np.ndarray], rates: Roofline, max_num_seqs: int,
                  enforce_eager: bool = False, knots: Sequence[int] | None = None,
                  mixed_graph_max_tokens: int = 0, experts_mults: tuple[float, float] | None = None,
                  longest_excess: float = 1.0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(kind, features): each row's `StepKind` (see `step_kinds`) and every GPU feature per row as
    CostModel prices it (decode rows padded to their graph's batch, mixed-graph rows' tokens to
    their graph's bucket). `experts_mults` (a mixture of experts: the (compute, memory) multipliers
    its MoE factors were measured at): the experts as features of their own (MOE_OFFSET_FEATURE).
    `longest_excess`: the steps with prefill price the longest decode's context as
    `longest_decode_context` does with that weight (GpuTerms.decode_max_excess); decode-only steps
    the whole of it."""
    g = steps
    n_dec = g["num_decode_seqs"]
    tokens = g["num_prefill_tokens"] + g["num_decode_tokens"]
    kind = step_kinds(steps, not enforce_eager, mixed_graph_max_tokens)
    is_decode = kind == "decode"
    pad = np.array([decode_graph_bucket(int(b), max_num_seqs) for b in n_dec], dtype=np.float64)
    pad = np.where(is_decode, pad, n_dec)
    bucket = np.array([mixed_graph_bucket(int(t), mixed_graph_max_tokens) if k == "mixed_graph" else t
                       for t, k in zip(tokens, kind)], dtype=np.float64)
    tok = np.where(is_decode, pad, bucket)
    rows = np.where(is_decode, pad, g["num_prefill_seqs"] + g["num_decode_tokens"])
    q = np.where(n_dec > 0, g["num_decode_tokens"] / np.maximum(n_dec, 1), 0.0)
    # graphs' padding tokens route alike (Roofline.experts_s): the experts see the real tokens + 1
    # (an eager row pads nothing, tok == tokens, so the rule gives tok there)
    routed = graph_routed(tokens.astype(np.float64), tok)
    longest = g.get("max_decode_context", np.zeros_like(tok))
    longest = np.where(is_decode, longest, longest_decode_context(longest, g["sum_decode_context"], n_dec,
                                                                  longest_excess))
    f = rates.features(tok, rows, g["prefill_attn_pairs"], g["sum_prefill_context"], q, g["sum_decode_context"],
                       longest, routed=routed)
    f["step_s"] = np.ones_like(tok)
    f["per_seq_s"] = g["num_prefill_seqs"] + pad
    if rates.routing is not None and experts_mults is not None:
        f |= moe_features(rates, tok, experts_mults, f["gemm"], routed)
    knots = knots or decode_knots(max_num_seqs)
    hats = np.array([knot_weights(b, knots) for b in np.maximum(pad, 1)]).reshape(-1, len(knots))
    for j, k in enumerate(knots):
        f[f"decode_step@{k}"] = np.where(is_decode, hats[:, j], 0.0)
        f[f"decode_kv@{k}"] = np.where(is_decode, f["decode_kv"] * hats[:, j], 0.0)
    # the longest sequence's term from batch 2 (at 1 it is the summed term: no knot there)
    max_knots = [k for k in knots if k > 1]
    hats = np.array([knot_weights(b, max_knots) for b in np.maximum(pad, 1)]).reshape(-1, len(max_knots))
    for j, k in enumerate(max_knots):
        f[f"decode_max_kv@{k}"] = np.where(is_decode & (pad > 1), f["decode_max_kv"] * hats[:, j], 0.0)

    return kind, f


def moe_features(rates: Roofline, tokens: np.ndarray, experts_mults: tuple[float, float],
                 gemm: np.ndarray, routed: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """`gemm` without the experts (Roofline.features folds them in at multiplier 1), `experts` (the
    fused kernel's seconds as priced at `experts_mults`; `routed`: see Roofline.experts_s) and the
    per-forward MOE_OFFSET_FEATURE."""
    return {"gemm": gemm - rates.experts_s(tokens, routed=routed),
            "experts": rates.experts_s(tokens, *experts_mults, routed=routed),
            MOE_OFFSET_FEATURE: np.full(tokens.shape, rates.moe_fixed_s)}


def cpu_features(steps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    g = steps
    return {"step_s": np.ones_like(g["total_s"]), "per_seq_s": g["num_prefill_seqs"] + g["num_decode_seqs"],
            "per_token_s": g["num_prefill_tokens"] + g["num_decode_tokens"],
            "per_context_token_s": g["sum_decode_context"] + g["sum_prefill_context"],
            "per_block_allocated_s": g["num_blocks_allocated"], "per_block_hashed_s": g["num_blocks_hashed"]}


def held_out(run_name: str, step_ids: np.ndarray, share: float = HELD_OUT_SHARE) -> np.ndarray:
    """A deterministic `share` of the steps, by a hash of (run name, step id): the same steps are
    held out at every fit, whatever else the runs contain."""
    cut = int(share * 2**32)
    return np.array([zlib.crc32(f"{run_name}:{int(s)}".encode()) < cut for s in step_ids], dtype=bool)


# --- robust fitting -----------------------------------------------------------------------------
@dataclass(slots=True)
class RobustFit:
    coef: np.ndarray
    outliers: np.ndarray  # bool per row: weight 0 at the end


def robust_nnls(X: np.ndarray, y: np.ndarray, offset: np.ndarray | None = None,
                prior: np.ndarray | None = None, max_iter: int = 50) -> RobustFit:
    """Non-negative coefficients minimising the relative error |X c + offset - y| / y, robustly:
    iteratively reweighted (Huber first, for a stable start, then Tukey's biweight, which drops
    outliers).

    `prior` (NaN = none): values that coefficients are weakly pulled to, relative to themselves,
    with the weight of PRIOR_WEIGHT of the rows: it only decides between features the data cannot
    tell apart (a weights-bound GEMM and a fixed per-step cost are both constant in small decode
    batches), which matters when the profile is scaled to another GPU."""
    A = X / y[:, None]
    b = np.broadcast_to(1.0 - (offset / y if offset is not None else 0.0), y.shape)
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    A = A / scale
    P, pb = _prior_rows(prior, scale, y.size)
    w = np.ones(y.size)
    coef = np.zeros(X.shape[1])
    for it in range(max_iter):
        sw = np.sqrt(w)
        coef, _ = nnls(np.vstack([A * sw[:, None], P]), np.concatenate([b * sw, pb]), maxiter=50 * X.shape[1])
        r = A @ coef - b
        s = max(1.4826 * float(np.median(np.abs(r))), 1e-6)
        if it < 5:
            w_new = np.minimum(1.0, _HUBER_C * s / np.maximum(np.abs(r), 1e-300))
        else:
            u = r / (_TUKEY_C * s)
            w_new = np.where(np.abs(u) < 1, (1 - u**2) ** 2, 0.0)
            if it > 5 and np.allclose(w_new, w, atol=1e-6):
                w = w_new
                break
        w = w_new
    return RobustFit(coef=coef / scale, outliers=w == 0)


def _prior_rows(prior: np.ndarray | None, scale: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Pseudo-rows sqrt(weight) x (c / prior - 1) for the coefficients that have a prior, in the
    scaled coordinates (c = c_scaled / scale)."""
    k = scale.size
    if prior is None or not np.isfinite(prior).any():
        return np.zeros((0, k)), np.zeros(0)
    idx = np.flatnonzero(np.isfinite(prior))
    sw = np.sqrt(PRIOR_WEIGHT * n_rows)
    P = np.zeros((idx.size, k))
    P[np.arange(idx.size), idx] = sw / (prior[idx] * scale[idx])
    return P, np.full(idx.size, sw)


def _rel_err(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(pred - y) / y


def _median_p90(e: np.ndarray) -> tuple[float, float]:
    if not e.size:
        return float("nan"), float("nan")
    return float(np.median(e)), float(np.percentile(e, 90))


def pipelined_periods(device: np.ndarray, host: np.ndarray, launch: np.ndarray,
                      contiguous: np.ndarray, blocked: np.ndarray | None = None) -> np.ndarray:
    """Each step's period under async scheduling as the simulator's pipelined loop times it
    (sim/simulator.py `_pipelined_step`), from every step's device seconds, host seconds before
    its launch, launch seconds and blocked seconds (how much of its device work has run before
    its launch returns, `eager_blocked_s`; None: 0): period_i = max(host_i + launch_i, start_i +
    blocked_i, lead_i), where lead_i is what is left of step i-1's device work when iteration i
    begins (0 where a row does not follow the previous one back to back: the engine was idle or
    the run starts) and start_i = max(host_i, lead_i) when step i's device work begins."""
    # The fit calls this once per residual (thousands of times over ~10^4 rows). On Python floats with
    # inline comparisons it runs ~5x faster than on numpy scalars with max() (max() alone: 1.5x); the
    # recursion cannot vectorise.
    blocked_s = [0.0] * device.size if blocked is None else blocked.tolist()
    out = []
    lead = 0.0
    for d, h, launch_i, cont, b in zip(device.tolist(), host.tolist(), launch.tolist(), contiguous.tolist(),
                                       blocked_s, strict=True):
        if not cont:
            lead = 0.0
        start = h if h >= lead else lead  # noqa: FURB136 - max(host, lead), without the call
        period = h + launch_i  # max(host + launch, start + blocked, lead):
        if start + b > period:  # noqa: PLR1730
            period = start + b
        if lead > period:  # noqa: PLR1730
            period = lead
        out.append(period)
        lead = start + (d if d >= launch_i else launch_i) - period  # noqa: FURB136 - max(device, launch)
    return np.array(out, dtype=float)


def eager_blocked_s(device: np.ndarray, eager: np.ndarray, share: float, seconds: float) -> np.ndarray:
    """Per row, the device seconds an eager step's launch waits for (CostModel.blocked_device_s:
    `seconds` + `share` of its device work, at most all of it); 0 for the others."""
    return eager * np.minimum(device, seconds + share * device)


def fit_overlap(rows: _Rows, train: np.ndarray) -> OverlapTerms:
    """The wall-time terms from measured GPU, host and period times (soft-L1 relative loss). Async:
    the gap on the device side, the unrecorded host work, an eager step's kernel launches and the
    share of its device work its launch waits for, by the pipelined recursion
    (`pipelined_periods`) over each run's rows with their MEASURED device and host times. Sync:
    `period = gpu + cpu + extra`, the median extra."""
    out: dict[str, float] = {}
    a = rows.is_async
    fit_rows = a & train & rows.contiguous & (rows.total > 0)
    if fit_rows.sum() >= 10:
        g, c, eager, y = rows.gpu_y[a], rows.cpu_y[a], (rows.kind[a] == "mixed").astype(float), rows.total[a]
        contiguous, use = rows.contiguous[a], fit_rows[a]

        def resid(x: np.ndarray) -> np.ndarray:
            device = g + x[0]
            periods = pipelined_periods(device, c + x[1], eager * x[2], contiguous,
                                        eager_blocked_s(device, eager, x[3], x[4]))
            return (periods[use] - y[use]) / y[use]

        upper = np.array([np.inf, np.inf, np.inf, 1.0, np.inf])

        def fit(x0: list[float], free: tuple[int, ...]):
            """Fit the terms at indices `free`, the others held at x0's."""
            x0 = np.array(x0, dtype=float)

            def r(x: np.ndarray) -> np.ndarray:
                full = x0.copy()
                full[list(free)] = x
                return resid(full)

            sol = least_squares(r, x0[list(free)], bounds=(np.zeros(len(free)), upper[list(free)]),
                                loss="soft_l1", f_scale=0.02)
            full = x0.copy()
            full[list(free)] = sol.x
            sol.x = full
            return sol

        # several starts with the block's seconds held at 0 (the loss is piecewise in the launch
        # terms), then the best freed to take them: each term costs a recursion per Jacobian column
        best = min((fit([1e-5, host0, launch0, block0, 0.0], (0, 1, 2, 3)) for host0 in (0.0, 2e-4, 1e-3)
                    for launch0 in (0.0, 0.01) for block0 in (0.0, 0.8)), key=lambda sol: sol.cost)
        if eager[use].any():
            best = min((best, *(fit([*best.x[:4], s0], (0, 1, 2, 3, 4)) for s0 in (0.0, 0.01))),
                       key=lambda sol: sol.cost)
        # where the device side always binds (a large model's steps) the host term barely moves
        # the loss and drifts: keep the smallest one whose fit is within 1% of the best
        for host in (0.0, best.x[1] / 8, best.x[1] / 4, best.x[1] / 2):
            sol = fit([best.x[0], host, *best.x[2:]], (0, 2, 3, 4))
            if sol.cost <= best.cost * 1.01:
                best = sol
                break
        (out["async_gpu_gap_s"], out["async_host_s"], out["async_eager_launch_s"],
         out["async_eager_block"], out["async_eager_block_s"]) = map(float, best.x)
    sync = ~a & train & (rows.total > 0)
    if sync.sum() >= 10:
        extra = rows.total[sync] - rows.gpu_y[sync] - rows.cpu_y[sync]
        out["sync_extra_s"] = max(float(np.median(extra)), 0.0)
    return OverlapTerms(**out)


def predicted_periods(rows: _Rows, gpu_pred: np.ndarray, cpu_pred: np.ndarray, o: OverlapTerms) -> np.ndarray:
    """Every row's period as the simulator would time it from the MODEL's GPU and host times."""
    out = gpu_pred + cpu_pred + o.sync_extra_s
    a = rows.is_async
    if a.any():
        eager = (rows.kind[a] == "mixed").astype(float)
        device = gpu_pred[a] + o.async_gpu_gap_s
        out[a] = pipelined_periods(device, cpu_pred[a] + o.async_host_s, eager * o.async_eager_launch_s,
                                   rows.contiguous[a],
                                   eager_blocked_s(device, eager, o.async_eager_block, o.async_eager_block_s))
    return out


# --- memory -------------------------------------------------------------------------------------
def _activation_slope(model: ModelSpec) -> float:
    """Bytes of profiling-run activations per batched token, from first principles (the MLP's
    gate/up outputs and a few hidden-size buffers): used when the runs have one token budget."""
    return (2 * model.intermediate_size + 4 * model.hidden_size) * dtype_bytes(model.dtype)


def profiled_tokens(memory: dict[str, Any], engine_args: dict[str, Any]) -> int:
    """The tokens the engine's profiling forward ran (what its KV sizing used): read from the
    temporary KV it allocated for them, since a harness may reuse one engine, sized once, for
    runs with other budgets; else the run's max_num_batched_tokens."""
    block_size = engine_args.get("block_size") or 16
    if memory.get("profile_tmp_kv_bytes") and memory.get("block_bytes"):
        return round(memory["profile_tmp_kv_bytes"] / memory["block_bytes"]) * block_size
    return engine_args.get("max_num_batched_tokens") or 8192


def fit_memory(runs: Sequence[EngineRun | dict[str, Any]], model: ModelSpec) -> MemoryTerms | None:
    """The engine's KV sizing terms from the runs' run.json `memory` (runs, or run.json dicts;
    None if none has one): activations = profiling peak - its temporary KV - weights, linear in
    max_num_batched_tokens (fitted when the runs used several budgets, else the first-principles
    slope)."""
    infos = [r if isinstance(r, dict) else r.run_info for r in runs]
    recs = [(i["memory"], i.get("engine_args") or {}) for i in infos if i and i.get("memory")]
    if not recs:
        return None
    act = np.array([m["profile_peak_bytes"] - m["profile_tmp_kv_bytes"] - m["weights_bytes"] for m, _ in recs],
                   dtype=np.float64)
    tok = np.array([profiled_tokens(m, a) for m, a in recs], dtype=np.float64)
    if np.unique(tok).size >= 2:
        slope, icpt = np.polyfit(tok, act, 1)
        slope = max(float(slope), 0.0)
    else:
        slope = _activation_slope(model)
    icpt = max(float(np.median(act - slope * tok)), 0.0)
    m0 = recs[0][0]
    return MemoryTerms(total_bytes=float(np.median([m["total_bytes"] for m, _ in recs])),
                       weights_bytes=float(m0["weights_bytes"]), activation_bytes=icpt,
                       activation_bytes_per_batched_token=slope,
                       non_torch_bytes=float(np.median([max(m["other_bytes"], 0) for m, _ in recs])))


def memory_checks(runs: Sequence[EngineRun], profile: CostProfile, model: ModelSpec,
                  gpu: GPUSpec) -> list[MemoryCheck]:
    """For each run with a run.json: its num_gpu_blocks and the simulator's for the same flags."""
    out = []
    for r in runs:
        info = r.run_info
        if not info or info.get("num_gpu_blocks") is None:
            continue
        args = dict(info.get("engine_args") or {})
        if info.get("memory"):  # the budget the engine's KV sizing profiled with
            args["max_num_batched_tokens"] = profiled_tokens(info["memory"], args)
        eng = EngineConfig(**{k: args[k] for k in ("max_num_batched_tokens", "max_num_seqs", "block_size",
                                                   "gpu_memory_utilization", "kv_cache_dtype")
                              if args.get(k) is not None})
        plan = plan_memory(model, gpu, eng.resolved_for(gpu, model), profile)
        out.append(MemoryCheck(r.name, int(info["num_gpu_blocks"]), plan.num_gpu_blocks))
    return out


# --- the fit ------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Rows:
    """All usable steps of all runs, stacked."""

    kind: np.ndarray  # StepKind per row
    gpu_x: dict[str, np.ndarray]
    cpu_x: dict[str, np.ndarray]
    gpu_y: np.ndarray
    cpu_y: np.ndarray
    total: np.ndarray  # the row's own period (engine `total_s`)
    # the row follows the previous row of its run back to back (the same clock, no idle gap, no
    # row dropped between): the pipelined recursion runs on through it
    contiguous: np.ndarray
    is_async: np.ndarray
    held: np.ndarray
    n_warmup: int


def _stack(runs: Sequence[EngineRun], rates: Roofline, warmup_steps: int, share: float,
           default_max_num_seqs: int, experts_mults: tuple[float, float] | None = None,
           longest_excess: float = 1.0) -> _Rows:
    parts = []
    n_warmup = 0
    # one set of knots for all runs: the largest CUDA graph any of them captured
    knots = decode_knots(max(r.max_num_seqs or default_max_num_seqs for r in runs))
    sampler = sampler_gpu_terms(runs)
    for r in runs:
        s = r.steps
        order = np.argsort(s["step_id"], kind="stable")
        s = {k: v[order] for k, v in s.items()}
        kind, gx = step_features(s, rates, r.max_num_seqs or default_max_num_seqs, not r.decode_graphs, knots,
                                 r.mixed_graph_max_tokens, experts_mults, longest_excess)
        keep = np.arange(order.size) >= warmup_steps
        if r.prefill_steps_only:
            keep &= kind != "decode"
        n_warmup += int(min(warmup_steps, order.size))
        gy = s["gpu_s"] + np.nan_to_num(s["sample_s"])
        cy = s["schedule_s"] + s["prepare_s"]
        if not r.async_scheduling and sampler is not None:
            gy, cy = _split_sync_sampling(s, sampler, cy)
        keep &= np.isfinite(gy) & (gy > 0) & np.isfinite(cy) & (cy > 0)
        start, total = s["t_start_s"], s["total_s"]
        back_to_back = np.abs(start[1:] - (start[:-1] + total[:-1])) < _CONTIGUOUS_S
        contiguous = np.concatenate([[False], back_to_back & keep[:-1]])
        parts.append({"kind": kind[keep], "gpu_x": {k: v[keep] for k, v in gx.items()},
                          "cpu_x": {k: v[keep] for k, v in cpu_features(s).items()}, "gpu_y": gy[keep], "cpu_y": cy[keep],
                          "total": total[keep], "contiguous": contiguous[keep],
                          "is_async": np.full(int(keep.sum()), r.async_scheduling),
                          "held": held_out(r.name, s["step_id"][keep], share)})

    def cat(key: str) -> Any:
        if isinstance(parts[0][key], dict):
            return {k: np.concatenate([p[key][k] for p in parts]) for k in parts[0][key]}
        return np.concatenate([p[key] for p in parts])

    return _Rows(**{k: cat(k) for k in parts[0]}, n_warmup=n_warmup)


def _sampled_rows(steps: dict[str, np.ndarray]) -> np.ndarray:
    """Rows a step's sampler runs on, at most (a partial prefill chunk samples nothing)."""
    return steps["num_decode_seqs"] + steps["num_prefill_seqs"]


def sampler_gpu_terms(runs: Sequence[EngineRun]) -> tuple[float, float] | None:
    """(seconds per step, per sampled row) of the sampler on the GPU, from the async runs, whose
    `sample_s` is CUDA-event time; None without async runs. A synchronous step's `sample_s` is
    host wall time instead (the forward's end to the sampled tokens on the host: the sampler, the
    copy, the wait and the host's bookkeeping), 2-3x the sampler's GPU time on the H200."""
    parts = [(_sampled_rows(r.steps), r.steps["sample_s"]) for r in runs if r.async_scheduling]
    if not parts:
        return None
    n, y = (np.concatenate(v) for v in zip(*parts))
    ok = np.isfinite(y) & (y > 0) & (n > 0)
    if ok.sum() < MIN_STEPS_PER_FEATURE * 2:
        return None
    fit = robust_nnls(np.column_stack([np.ones(int(ok.sum())), n[ok]]), y[ok])
    return float(fit.coef[0]), float(fit.coef[1])


def _split_sync_sampling(steps: dict[str, np.ndarray], sampler: tuple[float, float],
                         cpu_y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(GPU, CPU) seconds of synchronous steps: the sampler's GPU time (as the async runs measured
    it) on the GPU side, the rest of the host's sampling wall time on the CPU side, so that one GPU
    model serves both loops and the sync CPU terms carry what only the sync loop waits for."""
    sample = np.nan_to_num(steps["sample_s"])
    on_gpu = np.minimum(sampler[0] + sampler[1] * _sampled_rows(steps), sample)
    return steps["gpu_s"] + on_gpu, cpu_y + (sample - on_gpu)


def _matrix(x: dict[str, np.ndarray], names: Sequence[str], mask: np.ndarray) -> np.ndarray:
    return np.column_stack([x[n][mask] for n in names])


@dataclass(slots=True)
class _KindFit:
    terms: GpuTerms
    pred: np.ndarray  # predicted gpu seconds of every row
    train: np.ndarray  # bool per row: fitted on
    outliers: np.ndarray  # bool per row: weight 0 at the end of the robust fit
    graph_terms: GpuTerms | None = None  # shared fit: the mixed-graph steps' terms


def _fit_kind(rows: _Rows, kind: StepKind, source: str, fixed: dict[str, float], in_kind: np.ndarray,
              graph_rows: np.ndarray | None = None) -> _KindFit:
    """One step kind's terms from the rows `in_kind`; `fixed`: multipliers taken as given (not
    fitted). `graph_rows` (a shared fit, see `graph_fit_mode`): mixed-graph rows among them,
    which share the multipliers and get a step constant of their own."""
    names = GPU_FEATURES[kind] + (("experts",) if "experts" in rows.gpu_x else ())
    x = rows.gpu_x
    if graph_rows is not None:
        x = x | {"step_s": (~graph_rows).astype(np.float64), "graph_step_s": graph_rows.astype(np.float64)}
        names, in_kind = (*names, "graph_step_s"), in_kind & ~graph_rows
    # attention knots without steps near them stay at their prior: they do not count in the steps
    # needed; a fixed-cost knot has no prior: one without steps near it is left out (its batches
    # interpolate between, or take the value of, the nearest knots that have steps)
    need = MIN_STEPS_PER_FEATURE * (len(names) + 3 * (kind == "decode"))
    train = in_kind & ~rows.held
    if kind == "decode":
        names = (*names, *_supported_knots(x, "decode_step", train),
                 *sorted((k for k in rows.gpu_x if k.startswith("decode_kv@")), key=_knot),
                 *sorted((k for k in rows.gpu_x if k.startswith("decode_max_kv@")), key=_knot))
    if train.sum() < need:
        what = {"decode": "decode-only", "mixed": "eager prefill or mixed"}.get(kind, kind)
        raise CalibrationInputError(f"{source}: {int(train.sum())} {what} steps to fit from (after warm-up and "
                                    f"the held-out {HELD_OUT_SHARE:.0%}); the fit needs at least {need}: "
                                    "add runs with such steps")
    if graph_rows is not None:
        train |= graph_rows & ~rows.held
    offset = sum((v * x[k] for k, v in fixed.items()), np.zeros(rows.gpu_y.size))
    prior = np.array([PRIOR_MULTIPLIERS.get(n.split("@")[0], np.nan) for n in names])
    fit = robust_nnls(_matrix(x, names, train), rows.gpu_y[train], offset[train], prior)
    coef = dict(zip(names, map(float, fit.coef)))
    pred = offset + sum(c * x[n] for n, c in coef.items())
    graph_step_s = coef.pop("graph_step_s", None)
    knots = {p: tuple((_knot(n), coef.pop(n)) for n in list(coef) if n.startswith(f"{p}@"))
             for p in ("decode_step", "decode_kv", "decode_max_kv")}
    given = {k: v for k, v in fixed.items() if k != MOE_OFFSET_FEATURE}  # an offset, not a GpuTerms field
    terms = GpuTerms(**coef | given, decode_kv_by_batch=knots["decode_kv"],
                     decode_max_kv_by_batch=knots["decode_max_kv"], decode_step_by_batch=knots["decode_step"])
    outliers = np.zeros(rows.gpu_y.size, dtype=bool)
    outliers[train] = fit.outliers
    graph = None if graph_step_s is None else terms.model_copy(update={"step_s": graph_step_s})
    return _KindFit(terms, pred, train, outliers, graph)


def _knot(feature: str) -> int:
    return int(feature.split("@")[1])


def _supported_knots(x: dict[str, np.ndarray], family: str, train: np.ndarray) -> list[str]:
    """The `family@B` features whose hat weights over the training rows add up to at least
    MIN_STEPS_PER_FEATURE steps, in knot order."""
    names = sorted((k for k in x if k.startswith(f"{family}@")), key=_knot)
    return [n for n in names if float(x[n][train].sum()) >= MIN_STEPS_PER_FEATURE]


def fit_profile(step_tables: Sequence[EngineRun | dict[str, np.ndarray]], model: ModelSpec, gpu: GPUSpec,
                engine_config: EngineConfig | None = None, *, name: str | None = None,
                warmup_steps: int = WARMUP_STEPS, held_out_share: float = HELD_OUT_SHARE,
                provenance: dict[str, Any] | None = None,
                memory_runs: Sequence[dict[str, Any]] | None = None, moe_base: CostProfile | None = None,
                longest_excess: float = 1.0) -> FitResult:
    """Fit a v2 profile for `model` on `gpu` from engine step tables (`EngineRun`s, or bare
    column tables that take their flags from `engine_config`). `memory_runs` (run.json dicts):
    where the KV sizing terms come from when the timed runs' engines were sized by an override
    (several engines sharing a GPU) and record none. A mixture of experts: `moe_base` is the
    profile whose MoE terms (the fused kernel's measured factors, per-layer fixed cost) and
    first-principles fields the fitted profile keeps (None: the MoeTerms prior); see `moe_features`.
    `longest_excess`: the steps with prefill's longest-decode weight (GpuTerms.decode_max_excess, in
    [0, 1]; `choose_longest_excess` picks it on the held-out steps)."""
    _check_longest_excess(longest_excess)
    dflt = (engine_config or EngineConfig()).resolved_for(gpu, model)
    runs = [t if isinstance(t, EngineRun) else
            EngineRun(name=f"table{i}", steps=t, async_scheduling=dflt.async_scheduling,
                      max_num_seqs=dflt.max_num_seqs) for i, t in enumerate(step_tables)]
    if not runs:
        raise CalibrationInputError("no step tables to fit from")
    source = ", ".join(str(r.path or r.name) for r in runs)
    moe_kept = moe_kept_fields(model, moe_base)
    rates = Roofline.of(model, gpu, dflt, moe=moe_kept.get("moe"))
    mults = (1 / moe_kept["gemm_compute_efficiency"], 1 / moe_kept["gemm_memory_efficiency"]) if moe_kept else None
    rows = _stack(runs, rates, warmup_steps, held_out_share, dflt.max_num_seqs or 256, mults, longest_excess)
    graph_mode = graph_fit_mode(rows.kind, rows.held)
    masks = kind_masks(rows.kind, graph_mode)
    terms, gpu_pred, fit_counts = _fit_gpu(rows, source, masks, graph_mode == "shared")
    terms = _with_longest_excess(terms, longest_excess)
    errors = {}
    train = ~rows.held
    cpu, cpu_sync = _fit_cpu_by_scheduling(rows, train)
    cpu_pred = np.where(rows.is_async, _cpu_seconds(cpu, rows), _cpu_seconds(cpu_sync or cpu, rows))
    overlap = fit_overlap(rows, train)
    step_pred = predicted_periods(rows, gpu_pred, cpu_pred, overlap)
    measured = (rows.contiguous | ~rows.is_async) & (rows.total > 0)  # periods the recursion reaches
    for kind, in_kind in masks.items():
        h = in_kind & rows.held
        hw = h & measured
        gm, gp = _median_p90(_rel_err(gpu_pred[h], rows.gpu_y[h]))
        sm, sp = _median_p90(_rel_err(step_pred[hw], rows.total[hw]))
        errors[kind] = KindError(n_fit=fit_counts[kind][0], n_held_out=int(h.sum()), n_outliers=fit_counts[kind][1],
                                 gpu_median=gm, gpu_p90=gp, step_median=sm, step_p90=sp)
    mem = fit_memory(runs, model) or (fit_memory(memory_runs, model) if memory_runs else None)
    n_steps = int(rows.gpu_y.size)
    prov = {"runs": [r.name for r in runs], "n_steps": n_steps, "n_warmup_dropped": rows.n_warmup,
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "gpu": gpu.name, "model": model.name}
    prov |= _run_provenance(runs) | (provenance or {})
    profile = CostProfile(
        schema_version=2, name=name or f"{gpu.name}-{model.name}", hardware=gpu.name, model=model.name,
        engine=_engine_label(prov.get("engine_commit")),
        source=f"fitted from {n_steps} engine steps of {len(runs)} run(s) by sim/calibrate.py",
        decode=terms["decode"], mixed=terms["mixed"], mixed_graph=terms.get("mixed_graph"), cpu=cpu,
        cpu_sync=cpu_sync, overlap=overlap, memory=mem, provenance=prov,
        fit_error={k: e.as_dict() for k, e in errors.items()}, **graph_settings(runs) | moe_kept)
    cpu_med = float(np.median(_rel_err(cpu_pred[rows.held], rows.cpu_y[rows.held]))) if rows.held.any() else np.nan
    return FitResult(profile=profile, errors=errors, n_steps=n_steps, n_warmup_dropped=rows.n_warmup,
                     cpu_error_median=cpu_med, memory_checks=memory_checks(runs, profile, model, gpu))


def _check_longest_excess(w: float) -> None:
    if not 0.0 <= w <= 1.0:
        raise CalibrationInputError(f"longest_excess {w}: must lie in [0, 1] (1: the longest decode's whole context)")


def _with_longest_excess(terms: dict[StepKind, GpuTerms], w: float) -> dict[StepKind, GpuTerms]:
    """The kinds with prefill record the weight their features were built with; decode-only steps
    always price the whole longest context."""
    return {k: t if k == "decode" else t.model_copy(update={"decode_max_excess": w}) for k, t in terms.items()}


# The longest-decode weights `choose_longest_excess` tries (GpuTerms.decode_max_excess): 1 is the
# form profiles had before the weight; each try is a whole fit
LONGEST_EXCESS_GRID: tuple[float, ...] = (1.0, 0.7, 0.5, 0.35)


def prefill_step_error(res: FitResult) -> float:
    """The held-out GPU error of a fit's steps with prefill (eager and graph): median + p90 of
    |error|, each kind weighted by its held-out steps."""
    kinds = [e for k, e in res.errors.items() if k != "decode" and e.n_held_out]
    if not kinds:
        return float("nan")
    n = sum(e.n_held_out for e in kinds)
    return sum(e.n_held_out * (e.gpu_median + e.gpu_p90) for e in kinds) / n


def choose_longest_excess(step_tables: Sequence[EngineRun | dict[str, np.ndarray]], model: ModelSpec, gpu: GPUSpec,
                          grid: Sequence[float] = LONGEST_EXCESS_GRID, **fit_kw: Any,
                          ) -> tuple[FitResult, dict[float, float]]:
    """`fit_profile` at each longest-decode weight of `grid`; the fit whose held-out steps with
    prefill it prices best (`prefill_step_error`; a tie keeps the earlier weight) and every
    weight's score (the fit's provenance records them)."""
    if not grid:
        raise CalibrationInputError("choose_longest_excess: an empty grid of weights")
    scores, best = {}, None
    for w in grid:
        res = fit_profile(step_tables, model, gpu, longest_excess=w, **fit_kw)
        scores[float(w)] = round(prefill_step_error(res), 5)
        if best is None or scores[float(w)] < scores[best[0]]:
            best = (float(w), res)
    assert best is not None
    prov = best[1].profile.provenance | {"longest_excess_scores": {str(k): v for k, v in scores.items()}}
    best[1].profile = best[1].profile.model_copy(update={"provenance": prov})
    return best[1], scores


def moe_kept_fields(model: ModelSpec, base: CostProfile | None) -> dict[str, Any]:
    """What a mixture of experts' fitted profile takes from `base` unchanged: its MoE terms and its
    first-principles fields (the GEMM efficiencies the MoE factors are relative to; the rest prices
    what no step fit covers: a proposer's forwards, the advisor's MoE notes). {} for a dense model."""
    if not model.is_moe:
        return {}
    base = base or CostProfile.load("default")
    return base.model_dump(include=set(_FIRST_PRINCIPLES_FIELDS)) | {"moe": base.moe or MoeTerms()}


_FIRST_PRINCIPLES_FIELDS = ("gemm_compute_efficiency", "gemm_memory_efficiency", "attn_compute_efficiency",
                            "attn_memory_efficiency", "elementwise_memory_efficiency", "allreduce_efficiency",
                            "allreduce_latency_s", "gpu_step_overhead_s", "draft_pass_overhead_s", "cpu_step_s",
                            "cpu_per_seq_s", "cpu_per_block_allocated_s", "cpu_per_block_hashed_s",
                            "ngram_cpu_per_seq_s")


GraphFitMode = Literal["own", "shared", "eager"]


def graph_fit_mode(kind: np.ndarray, held: np.ndarray) -> GraphFitMode:
    """How the mixed-graph steps are fitted, by their training steps: "own" terms with enough for
    every coefficient; "shared" with the eager mixed steps' multipliers and a step constant of
    their own (a graph replay saves launches; the kernels are the same) with enough for one;
    else "eager": they join the eager steps, which then price them (as before mixed graphs)."""
    n = int(((kind == "mixed_graph") & ~held).sum())
    if n >= MIN_STEPS_PER_FEATURE * len(GPU_FEATURES["mixed_graph"]):
        return "own"
    return "shared" if n >= MIN_STEPS_PER_FEATURE else "eager"


def kind_masks(kind: np.ndarray, mode: GraphFitMode) -> dict[StepKind, np.ndarray]:
    """The rows of each step kind whose terms the profile gets (and whose error is reported)."""
    masks = {k: kind == k for k in STEP_KINDS}
    if mode == "eager":
        masks["mixed"] |= masks.pop("mixed_graph")
    return masks


def _fit_gpu(rows: _Rows, source: str, masks: dict[StepKind, np.ndarray], shared: bool,
             ) -> tuple[dict[StepKind, GpuTerms], np.ndarray, dict[StepKind, tuple[int, int]]]:
    """(terms, predicted gpu seconds of every row, (training steps, outliers)) per step kind."""
    terms, counts, gpu_pred = {}, {}, np.zeros(rows.gpu_y.size)
    for kind, in_kind in masks.items():
        if kind == "mixed_graph" and shared:  # fitted with the eager ones
            continue
        graph = masks["mixed_graph"] if kind == "mixed" and shared else None
        fixed = FIXED_MULTIPLIERS | ({MOE_OFFSET_FEATURE: 1.0} if MOE_OFFSET_FEATURE in rows.gpu_x else {})
        f = _fit_kind(rows, kind, source, fixed, in_kind if graph is None else in_kind | graph, graph)
        fitted = {kind: (f.terms, in_kind)}
        if graph is not None:
            fitted["mixed_graph"] = (f.graph_terms, graph)
        for k, (t, m) in fitted.items():
            terms[k] = t
            gpu_pred = np.where(m, f.pred, gpu_pred)
            counts[k] = (int((f.train & m).sum()), int((f.outliers & m).sum()))
    return terms, gpu_pred, counts


def graph_settings(runs: Sequence[EngineRun]) -> dict[str, Any]:
    """The profile's `cudagraph_mode` and `max_cudagraph_capture_size`: FULL if any run replayed
    mixed graphs (their largest capture size), else the runs' mode (the most common one)."""
    full = [r for r in runs if r.mixed_graph_max_tokens]
    if full:
        return {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": max(r.max_cudagraph_capture_size
                                                                            for r in full)}
    modes = [r.cudagraph_mode for r in runs]
    return {"cudagraph_mode": max(CUDAGRAPH_MODES, key=modes.count), "max_cudagraph_capture_size": None}


def _fit_cpu_by_scheduling(rows: _Rows, train: np.ndarray) -> tuple[CpuTerms, CpuTerms | None]:
    """(cpu, cpu_sync): the host terms of async and of synchronous runs, each fitted on its own
    runs when both have enough steps (their fixed and per-context costs differ), else one set
    from every run and no `cpu_sync`."""
    need = MIN_STEPS_PER_FEATURE * len(CPU_FEATURES)
    sync, asyn = train & ~rows.is_async, train & rows.is_async
    if sync.sum() < need or asyn.sum() < need:
        return _fit_cpu(rows, train), None
    return _fit_cpu(rows, asyn), _fit_cpu(rows, sync)


def _fit_cpu(rows: _Rows, train: np.ndarray) -> CpuTerms:
    coef = mean_nnls(_matrix(rows.cpu_x, CPU_FEATURES, train), rows.cpu_y[train])
    return CpuTerms(**dict(zip(CPU_FEATURES, map(float, coef))))


def mean_nnls(X: np.ndarray, y: np.ndarray, c: float = _HOST_HUBER_C, max_iter: int = 30) -> np.ndarray:
    """Non-negative coefficients for the conditional MEAN of y: least squares on absolute
    residuals, Huber-weighted beyond `c` robust standard deviations (iteratively reweighted)."""
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    A = X / scale
    w = np.ones(y.size)
    coef = np.zeros(X.shape[1])
    for _ in range(max_iter):
        sw = np.sqrt(w)
        coef, _ = nnls(A * sw[:, None], y * sw, maxiter=50 * X.shape[1])
        r = A @ coef - y
        s = max(1.4826 * float(np.median(np.abs(r - np.median(r)))), 1e-12)
        w_new = np.minimum(1.0, c * s / np.maximum(np.abs(r), 1e-300))
        if np.allclose(w_new, w, atol=1e-6):
            break
        w = w_new
    return coef / scale


def _cpu_seconds(cpu: CpuTerms, rows: _Rows) -> np.ndarray:
    return sum(getattr(cpu, n) * rows.cpu_x[n] for n in CPU_FEATURES)


def _engine_label(commits: str | list[str] | None) -> str:
    """The profile's `engine`: the commit the runs were recorded at, or each of them when calls on
    several commits were pooled ("costline-engine@79e0853,8950eff"; a suffix such as -dirty kept),
    not a list's repr cut short."""
    if not commits:
        return "costline-engine@unknown"
    if isinstance(commits, str):
        return f"costline-engine@{commits[:12]}"
    return "costline-engine@" + ",".join(dict.fromkeys(_short_commit(c) for c in commits))


def _short_commit(commit: str) -> str:
    """A commit as git shortens it (7 hex digits), anything after the hash kept."""
    digits = len(commit) - len(commit.lstrip("0123456789abcdef"))
    return commit[:min(7, digits)] + commit[digits:]


def _run_provenance(runs: Sequence[EngineRun]) -> dict[str, Any]:
    infos = [r.run_info for r in runs if r.run_info]
    if not infos:
        return {}
    commits = sorted({str(i.get("engine_commit")) for i in infos if i.get("engine_commit")})
    return {"engine_commit": commits[0] if len(commits) == 1 else commits,
            "run_dates": sorted({str(i.get("date")) for i in infos if i.get("date")}),
            "versions": infos[0].get("versions")}


# --- scaling to other GPUs ----------------------------------------------------------------------
def scale_profile(fitted: CostProfile, gpu: str) -> CostProfile:
    """A fitted profile carried to another GPU by datasheet ratios: its roofline multipliers apply
    to that GPU's own rates (so the features scale themselves), the fixed CPU, launch and overlap
    terms carry over unchanged, and so do the model's measured weights, activations and non-torch
    memory (the device size becomes the datasheet's). Status "scaled, not validated"."""
    if not fitted.is_fitted or fitted.scaled_from:
        raise ValueError(f"profile {fitted.name!r} is not a fitted one: scale the fit itself")
    target = GPU_PRESETS[gpu]
    mem = fitted.memory.model_copy(update={"total_bytes": None}) if fitted.memory else None
    return fitted.model_copy(update={
        "name": f"{target.name}-{fitted.model}", "hardware": target.name, "memory": mem,
        "scaled_from": fitted.name, "fit_error": None, "validation": None,
        "tp": None,  # measured over one GPU pair's link: another GPU's falls back to its datasheet link
        "source": (f"scaled from {fitted.name} by datasheet ratios: roofline multipliers applied to "
                   f"{target.name}'s rates; CPU, launch and overlap terms carried over as measured on "
                   f"{fitted.hardware}; not validated")})


def write_scaled_profiles(fitted: CostProfile, out_dir: str | Path, gpus: Sequence[str] = SCALED_GPUS,
                          *, force: bool = False) -> list[Path]:
    """`scale_profile` to each GPU, written as `<gpu>-<model>.json` in out_dir."""
    paths = []
    for g in gpus:
        prof = scale_profile(fitted, g)
        p = check_output_file(Path(out_dir) / f"{prof.name}.json", flag="--scaled", force=force)
        with staged_file(p) as tmp:
            tmp.write_text(prof.to_json())
        paths.append(p)
    return paths


__all__ = [
    "CPU_FEATURES",
    "FIXED_MULTIPLIERS",
    "GPU_FEATURES",
    "LONGEST_EXCESS_GRID",
    "PRIOR_MULTIPLIERS",
    "REQUIRED_COLUMNS",
    "SCALED_GPUS",
    "CalibrationInputError",
    "EngineRun",
    "FitResult",
    "KindError",
    "MemoryCheck",
    "choose_longest_excess",
    "eager_blocked_s",
    "fit_memory",
    "fit_overlap",
    "fit_profile",
    "graph_fit_mode",
    "graph_settings",
    "held_out",
    "kind_masks",
    "load_run",
    "pipelined_periods",
    "predicted_periods",
    "prefill_step_error",
    "profiled_tokens",
    "read_steps",
    "robust_nnls",
    "scale_profile",
    "step_features",
    "step_kinds",
    "write_scaled_profiles",
]
