"""Engine versus simulator, per metric: replay a recorded engine run in the simulator and compare.

An engine run folder (what `benchmarks/calibration`'s GPU script writes) holds the engine's tables
and summary, `workload.jsonl` (the exact requests it replayed, Mooncake JSONL) and `run.json` (its
flags, KV block count and memory figures). `validate_run` rebuilds the same requests and the same
flags, gives the simulator the engine's KV block count (so a KV sizing error cannot hide inside a
latency error; what the simulator would have sized by itself is reported beside it), simulates,
and compares throughput, TTFT / TPOT / ITL / e2e (mean, p50, p90, p99), preemptions, prefix-cache
hits and unserved requests: engine value, simulator value, signed relative error
(sim - engine) / engine. The targets are issue 10's: median |error| <= 5% over the throughput and
latency metrics, every p99 within 10%, preemptions within 5% (or 2), prefix-hit rate within one
point. Per step kind (decode-only, and steps with prefill chunks under / from 512 tokens) it also
compares the mean step time, which is where a residual latency error comes from.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from engine.core.flags import SCHEDULING_FLAGS
from engine.core.input_files import InputFileError, read_json
from engine.core.model_spec import ModelSpec, get_model
from engine.core.records import STEP_COLUMNS
from engine.core.request import Request
from engine.core.run_summary import SLO, good_mask, latency_stats
from sim.calibrate import OPTIONAL_COLUMNS, RECONSTRUCTED_STEPS_FILE, merge_reconstructed
from sim.config import EngineConfig
from sim.cost_model import PROFILES_DIR, CostModel, CostProfile, step_table_seconds
from sim.engine_runs import EngineRunError, check_engine_summary, check_steps_file, read_run_json
from sim.hardware import GPUSpec, get_gpu
from sim.memory import plan_memory
from sim.profile_files import load_profile, target_mismatch
from sim.run import LoadedWorkload, SimConfig, run
from sim.traces import load_mooncake
from sim.workload_source import all_at_time_zero

RUN_SCHEMA = "costline-engine-run/1"
REPORT_SCHEMA = "costline-validation/1"
# Files validate_run reads; steps.jsonl is optional (the step-kind breakdown needs it).
RUN_INPUT_FILES = ("run.json", "summary.json", "workload.jsonl")

# Issue 10's targets.
MEDIAN_ABS_ERROR_TARGET = 0.05
P99_ABS_ERROR_TARGET = 0.10
PREEMPTION_REL_TOLERANCE = 0.05
PREEMPTION_ABS_TOLERANCE = 2
PREFIX_HIT_RATE_TOLERANCE_POINTS = 1.0
# A run the engine cut at its wall-clock cap: a request a step or two from the cut finishes on one side and not
# the other, so the unfinished counts may differ by this many (or this share of the engine's); TTFT, TPOT and e2e
# are then compared over the requests both sides finished (`both_finished_latencies`).
UNFINISHED_ABS_TOLERANCE = 1
UNFINISHED_REL_TOLERANCE = 0.05
REQUEST_LATENCIES = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2el", "e2e_s"))  # summary name, request column

THROUGHPUT_METRICS = ("output_throughput", "request_throughput")
LATENCY_METRICS = tuple(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                        for stat in ("mean", "median", "p90", "p99"))
# The median |error| runs over these; the rest are reported and checked by their own targets.
ERROR_METRICS = THROUGHPUT_METRICS + LATENCY_METRICS
COUNT_METRICS = ("completed", "rejected", "unfinished", "total_output_tokens", "num_preemptions",
                 "prefix_cache_queries_tokens", "prefix_cache_hits_tokens", "prefix_cache_hit_rate",
                 "num_engine_steps", "num_gpu_blocks")
CONTEXT_METRICS = ("mean_queue_time_ms", "p99_queue_time_ms", "gpu_busy_share", "duration")
ALL_METRICS = ERROR_METRICS + COUNT_METRICS + CONTEXT_METRICS
# Prefill chunks below this many tokens run markedly less efficiently on the engine (issue 10).
SMALL_CHUNK_TOKENS = 512
DECODE_BATCH_EDGES = (16, 128)


class RunFolderError(ValueError):
    """An engine run folder that cannot be validated; the message names the file, the field, the fix."""


# --------------------------------------------------------------------------- records
class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EngineRunInfo(BaseModel):
    """run.json: what the GPU script records beside an engine run's tables."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    schema_name: str
    name: str
    purpose: str = "validation"
    model: str
    gpu: str
    engine_args: dict[str, Any]
    hash_block_size: int
    honor_arrivals: bool
    num_gpu_blocks: int
    memory: dict[str, Any] | None = None
    engine_commit: str | None = None
    date: str | None = None
    description: str | None = None


class MetricComparison(_Record):
    """One metric: the engine's value, the simulator's, and (sim - engine) / engine."""

    metric: str
    engine: float | None
    sim: float | None
    error: float | None  # signed relative; None when the engine's value is 0 (and the sim's is not) or missing


class KVBlocks(_Record):
    """The KV pool: the engine's, the one simulated (the engine's, by design), and what the
    simulator sizes from memory by itself with the same flags (None when it cannot)."""

    engine: int
    simulated: int
    sim_own: int | None
    sim_own_error: float | None
    note: str = ""


class StepKindComparison(_Record):
    """One kind of step, both sides: steps, mean GPU time and mean period (ms). GPU time, not the
    period, is what a kind costs: under async scheduling the engine's period of a step is
    start-to-next-start, so a long prefill's GPU time lands in the next step's period. Also the
    cost model's GPU and CPU time for the engine's own steps of that kind (`model_*`): its error
    with the schedule held fixed, which separates a mis-timed step from a different schedule."""

    kind: str
    engine_steps: int
    sim_steps: int
    engine_gpu_ms: float | None
    sim_gpu_ms: float | None
    gpu_error: float | None
    model_gpu_ms: float | None = None
    model_gpu_error: float | None = None
    engine_cpu_ms: float | None = None
    model_cpu_ms: float | None = None
    engine_period_ms: float | None = None
    sim_period_ms: float | None = None
    engine_max_gpu_ms: float | None = None  # the slowest step (a compilation stall shows here)


class Verdict(_Record):
    """Issue 10's targets on one run: pass, or which ones failed and by how much."""

    median_abs_error: float | None
    max_p99_abs_error: float | None
    preemptions_ok: bool
    prefix_hit_rate_ok: bool
    passed: bool
    failures: list[str]


class RunComparison(_Record):
    """One engine run replayed in the simulator, compared per metric."""

    name: str
    run_dir: str
    purpose: str
    model: str
    gpu: str
    description: str | None
    profile: str
    honor_arrivals: bool
    num_requests: int
    flags: dict[str, Any]
    metrics: list[MetricComparison]
    kv_blocks: KVBlocks
    step_kinds: list[StepKindComparison]
    verdict: Verdict
    # set when the two sides left different requests unfinished: what TTFT, TPOT and e2e were compared over
    latency_basis: str | None = None

    def metric(self, name: str) -> MetricComparison:
        for m in self.metrics:
            if m.metric == name:
                return m
        raise KeyError(f"no metric {name!r}; have {', '.join(m.metric for m in self.metrics)}")


class ValidationReport(_Record):
    """What `costline validate --out` writes as validation.json (and renders as validation.md)."""

    schema_name: Literal["costline-validation/1"] = REPORT_SCHEMA
    command: str
    date: str
    profiles: list[str]
    fitted_runs: dict[str, list[str]]  # profile -> the runs its provenance says it was fitted on
    runs: list[RunComparison]
    ranking: RankingReport | None = None  # --rank: the runs' goodput order, engine vs simulator

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ValidationReport:
        return cls.model_validate_json(text)


# --------------------------------------------------------------------------- the error arithmetic
def relative_error(engine: float | None, sim: float | None) -> float | None:
    """(sim - engine) / engine; 0 when both are 0; None when either is missing or only the engine's is 0."""
    if engine is None or sim is None or not (math.isfinite(engine) and math.isfinite(sim)):
        return None
    if engine == 0:
        return 0.0 if sim == 0 else None
    return (sim - engine) / abs(engine)


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def compare_summaries(engine: dict[str, Any], sim: dict[str, Any],
                      metrics: tuple[str, ...] = ALL_METRICS) -> list[MetricComparison]:
    """Per metric (summary keys of engine/core/run_summary.py): both values and the relative error."""
    out = []
    for key in metrics:
        e, s = _number(engine.get(key)), _number(sim.get(key))
        out.append(MetricComparison(metric=key, engine=e, sim=s, error=relative_error(e, s)))
    return out


def _unfinished_failures(unfinished: MetricComparison | None, same_requests: bool) -> list[str]:
    """A run the engine cut at its wall-clock cap: its unfinished count against the simulator's."""
    if unfinished is None or not unfinished.engine or unfinished.sim == unfinished.engine:
        return []
    if not same_requests:
        return [(f"unfinished at the engine's wall-clock cap {_count(unfinished)} and no requests.jsonl in the run "
                "folder, so each side's TTFT / TPOT / e2e cover other requests; add the engine's requests.jsonl")]
    if abs((unfinished.sim or 0) - unfinished.engine) <= max(UNFINISHED_ABS_TOLERANCE,
                                                              UNFINISHED_REL_TOLERANCE * unfinished.engine):
        return []
    return [(f"unfinished at the engine's wall-clock cap {_count(unfinished)}, beyond +-{UNFINISHED_REL_TOLERANCE:.0%} "
            f"(or +-{UNFINISHED_ABS_TOLERANCE}): the two sides' backlogs differ")]


def verdict(metrics: list[MetricComparison], same_requests: bool = True) -> Verdict:
    """Issue 10's targets applied to one run's comparisons. `same_requests`: the per-request latencies cover
    the same requests on both sides (`both_finished_latencies`, or nothing was left unfinished); only then may
    the unfinished counts differ within their tolerance."""
    by = {m.metric: m for m in metrics}
    errors = [abs(by[k].error) for k in ERROR_METRICS if k in by and by[k].error is not None]
    median = float(np.median(errors)) if errors else None
    p99 = [(k, abs(by[k].error)) for k in ERROR_METRICS if k.startswith("p99_") and k in by and by[k].error is not None]
    worst = max((e for _, e in p99), default=None)
    failures = []
    if median is None or median > MEDIAN_ABS_ERROR_TARGET:
        failures.append(f"median |error| {_pct(median)} > {MEDIAN_ABS_ERROR_TARGET:.0%}")
    failures += [f"{k} |error| {_pct(e)} > {P99_ABS_ERROR_TARGET:.0%}" for k, e in p99 if e > P99_ABS_ERROR_TARGET]
    failures += _unfinished_failures(by.get("unfinished"), same_requests)
    pre = by.get("num_preemptions")
    pre_ok = pre is not None and pre.engine is not None and pre.sim is not None and abs(pre.sim - pre.engine) <= max(
        PREEMPTION_ABS_TOLERANCE, PREEMPTION_REL_TOLERANCE * pre.engine)
    if not pre_ok:
        failures.append(f"preemptions {_count(pre)} beyond +-{PREEMPTION_REL_TOLERANCE:.0%} "
                        f"(or +-{PREEMPTION_ABS_TOLERANCE})")
    hit = by.get("prefix_cache_hit_rate")
    hit_ok = hit is not None and hit.engine is not None and hit.sim is not None and abs(
        hit.sim - hit.engine) * 100 <= PREFIX_HIT_RATE_TOLERANCE_POINTS + 1e-12
    if not hit_ok:
        failures.append(f"prefix-hit rate {_count(hit)} differs by more than "
                        f"{PREFIX_HIT_RATE_TOLERANCE_POINTS:g} point")
    return Verdict(median_abs_error=median, max_p99_abs_error=worst, preemptions_ok=pre_ok,
                   prefix_hit_rate_ok=hit_ok, passed=not failures, failures=failures)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _count(m: MetricComparison | None) -> str:
    if m is None or m.engine is None or m.sim is None:
        return "missing"
    return f"engine {m.engine:g} vs sim {m.sim:g}"


# --------------------------------------------------------------------------- reading a run folder
def read_run_info(run_dir: Path) -> EngineRunInfo:
    """run.json, checked: a missing file or field names the file and the field."""
    path = run_dir / "run.json"
    if not path.exists():
        raise RunFolderError(f"{run_dir}: no run.json; give a folder the engine GPU script wrote "
                             f"(run.json, summary.json, workload.jsonl)")
    try:
        data = read_run_json(run_dir)
    except EngineRunError as exc:
        raise RunFolderError(str(exc)) from None
    assert data is not None
    if data.get("schema") != RUN_SCHEMA:
        raise RunFolderError(f"{path}: field 'schema' is {data.get('schema')!r}, expected {RUN_SCHEMA!r}")
    data = {("schema_name" if k == "schema" else k): v for k, v in data.items()}
    try:
        return EngineRunInfo.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        what = "is missing" if err["type"] == "missing" else f"is invalid ({err['msg']})"
        raise RunFolderError(f"{path}: field '{field}' {what}; the engine GPU script records it "
                             f"(schema {RUN_SCHEMA})") from None


def read_json_file(path: Path) -> Any:
    """A run folder's JSON object (summary.json), bounded; NaN reads as a missing value."""
    if not path.exists():
        raise RunFolderError(f"{path.parent}: no {path.name}; give a complete engine run folder "
                             f"({', '.join(RUN_INPUT_FILES)})")
    try:
        return read_json(path, what=path.name, allow_nan=True, fix="the file is damaged: rerun the engine run")
    except InputFileError as exc:
        raise RunFolderError(str(exc)) from None


def read_steps(path: Path) -> dict[str, np.ndarray] | None:
    """An engine step trace (JSONL of engine/core/records.py StepRecord rows) as columns; None if absent."""
    if not path.is_file():
        return None
    try:
        check_steps_file(path)
    except (EngineRunError, InputFileError) as exc:
        raise RunFolderError(f"{exc} (or remove steps.jsonl to validate without it)") from None
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RunFolderError(f"{path}, line {lineno}: not valid JSON ({exc.msg}); the trace is damaged: "
                                 "rerun the engine run, or remove steps.jsonl to validate without it") from None
        missing = [c for c in STEP_COLUMNS if c not in row and c not in OPTIONAL_COLUMNS]
        if missing:
            raise RunFolderError(f"{path}, line {lineno}: field '{missing[0]}' is missing (a step trace has "
                                 "engine/core/records.py's StepRecord columns); rerun the engine run with this version")
        rows.append(row)
    cols = {c: np.array([math.nan if r.get(c) is None else r[c] for r in rows], dtype=np.float64)
            for c in STEP_COLUMNS}
    for c in OPTIONAL_COLUMNS:  # a trace from before the column: 0, or its reconstruction
        cols[c] = np.nan_to_num(cols[c])
    if (path.parent / RECONSTRUCTED_STEPS_FILE).is_file():
        merge_reconstructed(cols, path.parent / RECONSTRUCTED_STEPS_FILE)
    return cols


def replayed_requests(run_dir: Path, info: EngineRunInfo) -> list[Request]:
    """The requests the engine replayed, reloaded as it reloaded them (at t = 0 without arrivals)."""
    path = run_dir / "workload.jsonl"
    if not path.is_file():
        raise RunFolderError(f"{run_dir}: no workload.jsonl (the exact requests the engine replayed); "
                             "rerun the engine run with the GPU script, which writes it")
    requests = load_mooncake(path, hash_block_size=info.hash_block_size).requests
    return requests if info.honor_arrivals else all_at_time_zero(requests)


# --------------------------------------------------------------------------- the simulated twin
SCHEDULING_NAMES = frozenset(f.name for f in SCHEDULING_FLAGS)
PRECISION_NAMES = ("quantization", "kv_cache_dtype")


def sim_engine_config(info: EngineRunInfo) -> EngineConfig:
    """The engine's scheduling and KV flags as the simulator's `EngineConfig`: costline's attention
    backend (any block size), the engine's KV block count, and the limits the engine resolved
    (same rules, same GPU, same entry point: its usage context)."""
    flags = {k: v for k, v in info.engine_args.items() if k in SCHEDULING_NAMES}
    # the precision flags price the forward (FP8 weights, an FP8 cache): carried when set
    flags |= {k: info.engine_args[k] for k in PRECISION_NAMES if info.engine_args.get(k) not in (None, "auto")}
    # a run over several GPUs is simulated over as many (the TP terms price its all-reduces)
    if (info.engine_args.get("tensor_parallel_size") or 1) > 1:
        flags["tensor_parallel_size"] = info.engine_args["tensor_parallel_size"]
    flags |= {"attention_backend": "costline", "num_gpu_blocks_override": info.num_gpu_blocks}
    try:
        cfg = EngineConfig(**flags)
    except ValidationError as exc:
        raise RunFolderError(f"run.json of {info.name}: engine_args do not make a valid engine "
                             f"configuration: {exc.errors()[0]['msg']}") from None
    model, gpu = model_and_gpu(info)
    usage = info.engine_args.get("usage_context", "api_server")
    return cfg.resolve_limits(device_name=gpu.name, device_memory_bytes=gpu.hbm_bytes,
                              max_position_embeddings=model.max_position_embeddings, usage=usage)


def model_and_gpu(info: EngineRunInfo) -> tuple[ModelSpec, GPUSpec]:
    """run.json's model and GPU as simulator presets; an unknown one names the field."""
    for field, value, get in (("model", info.model, get_model), ("gpu", info.gpu, get_gpu)):
        try:
            get(value)
        except (KeyError, ValueError) as exc:
            msg = exc.args[0] if exc.args else str(exc)
            raise RunFolderError(f"run.json of {info.name}: field '{field}' is {value!r}: {msg}") from None
    return get_model(info.model), get_gpu(info.gpu)


def sim_own_blocks(info: EngineRunInfo, cfg: EngineConfig, profile: CostProfile) -> tuple[int | None, str]:
    """The KV blocks the simulator sizes from memory for these flags with this profile (its
    measured memory terms when it has them; the engine's own override, when it ran with one),
    and a note when it cannot size them."""
    own = cfg.model_copy(update={"num_gpu_blocks_override": info.engine_args.get("num_gpu_blocks_override")})
    try:
        return plan_memory(*model_and_gpu(info), own, profile).num_gpu_blocks, ""
    except ValueError as exc:
        return None, f"the simulator cannot size the pool by itself: {exc}"


def resolve_profile(profile: str | None, model: str, gpu: str) -> str:
    """The profile's name or path: `auto` (or None) names the one `CostProfile.for_target` picks
    (sim/profiles/<gpu>-<model>.json when it ships, else the first-principles `default`)."""
    if profile not in (None, "", "auto"):
        return str(profile)
    fitted = PROFILES_DIR / f"{gpu.lower()}-{model.lower()}.json"
    return fitted.stem if fitted.is_file() else "default"


def check_profile_target(run_dir: Path, info: EngineRunInfo, profile: str) -> None:
    """A profile measured on another model or GPU than the run's would "validate" a pairing nobody
    runs: refused, naming both."""
    why = target_mismatch(load_profile(profile, info.model, info.gpu), info.model, info.gpu)
    if why is not None:
        raise RunFolderError(f"{run_dir}: {why}; this run is {info.model} on {info.gpu}: validate it with a "
                             "profile of that model and GPU (--profile auto picks the shipped one, default is "
                             "first principles)")


def profile_path(profile: str) -> Path:
    """A profile's JSON file, as `CostProfile.load` finds it: a path, or a name under sim/profiles."""
    p = Path(profile)
    return p if p.suffix == ".json" or p.is_file() else PROFILES_DIR / f"{profile}.json"


def fitted_runs(profile: str) -> list[str]:
    """The runs a profile's provenance says it was fitted on ([] when it lists none)."""
    path = profile_path(profile)
    if not path.is_file():
        return []
    prov = load_profile(profile).provenance or {}
    runs = prov.get("runs") if isinstance(prov, dict) else None
    return [str(r.get("path") or r.get("name")) if isinstance(r, dict) else str(r) for r in runs or []]


def was_fitted_on(run_dir: Path, fitted: list[str], run_name: str | None = None) -> str | None:
    """The provenance entry naming `run_dir`, or None: a path is compared on its last components
    (model, purpose, name), a bare run name with the folder's name and run.json's `name`."""
    mine = run_dir.resolve().parts
    for entry in fitted:
        parts = Path(entry).parts
        k = min(3, len(parts), len(mine))
        if (k and mine[-k:] == parts[-k:]) or (len(parts) == 1 and entry == run_name):
            return entry
    return None


# --------------------------------------------------------------------------- step kinds
def step_kind_masks(steps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Decode-only steps by batch size (the engine replays them as CUDA graphs, the small ones
    near a fixed floor), and steps carrying prefill tokens by chunk size (eager)."""
    prefill, batch = steps["num_prefill_tokens"], steps["num_decode_seqs"]
    decode_only = (prefill == 0) & (batch > 0)
    lo, hi = DECODE_BATCH_EDGES
    return {f"decode-only, batch <= {lo}": decode_only & (batch <= lo),
            f"decode-only, batch {lo + 1}-{hi}": decode_only & (batch > lo) & (batch <= hi),
            f"decode-only, batch > {hi}": decode_only & (batch > hi),
            f"prefill < {SMALL_CHUNK_TOKENS} tok": (prefill > 0) & (prefill < SMALL_CHUNK_TOKENS),
            f"prefill >= {SMALL_CHUNK_TOKENS} tok": prefill >= SMALL_CHUNK_TOKENS}


def compare_step_kinds(engine: dict[str, np.ndarray] | None, sim: dict[str, np.ndarray],
                       modelled: tuple[np.ndarray, np.ndarray] | None = None) -> list[StepKindComparison]:
    """Per step kind: steps, mean GPU time and period on each side (a simulator row of n decode
    steps counts n steps; its times are their sums). `modelled`: the cost model's (GPU, CPU)
    seconds of each engine step (`cost_model_step_s`)."""
    if engine is None:
        return []
    out = []
    e_masks, s_masks = step_kind_masks(engine), step_kind_masks(sim)
    for kind, em in e_masks.items():
        sm = s_masks[kind]
        e_n, s_n = int(engine["n_steps"][em].sum()), int(sim["n_steps"][sm].sum())
        e_k, s_k = engine["n_steps"][em], sim["n_steps"][sm]
        e_gpu, s_gpu = _mean_ms(engine["gpu_s"][em], e_k), _mean_ms(sim["gpu_s"][sm], s_k)
        m_gpu = _mean_ms(modelled[0][em], e_k) if modelled is not None else None
        out.append(StepKindComparison(
            kind=kind, engine_steps=e_n, sim_steps=s_n, engine_gpu_ms=e_gpu, sim_gpu_ms=s_gpu,
            gpu_error=relative_error(e_gpu, s_gpu), model_gpu_ms=m_gpu, model_gpu_error=relative_error(e_gpu, m_gpu),
            engine_cpu_ms=_mean_ms(engine["cpu_s"][em], e_k),
            model_cpu_ms=_mean_ms(modelled[1][em], e_k) if modelled is not None else None,
            engine_period_ms=_mean_ms(engine["total_s"][em], e_k), sim_period_ms=_mean_ms(sim["total_s"][sm], s_k),
            engine_max_gpu_ms=float(np.nanmax(engine["gpu_s"][em])) * 1e3 if e_n else None))
    return out


def _mean_ms(seconds: np.ndarray, n_steps: np.ndarray) -> float | None:
    """Mean per step, in ms, of per-row seconds (a row of n steps holds their sum); rows without a
    figure (NaN) are left out."""
    ok = np.isfinite(seconds)
    n = int(n_steps[ok].sum())
    return float(seconds[ok].sum()) / n * 1e3 if n else None


def cost_model_step_s(steps: dict[str, np.ndarray], config: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    """The simulator's cost model applied to each step of an engine trace: (GPU, CPU) seconds,
    its step-time error with the schedule held fixed."""
    dep = config.deployment()
    engine = dep.engine.resolved_for(dep.gpu, dep.model)
    cost = CostModel(dep.model, dep.gpu, engine, load_profile(config.profile, config.model, config.gpu))
    return step_table_seconds(cost, steps)


# --------------------------------------------------------------------------- one run
def validate_run(run_dir: str | Path, profile: str | None = None) -> RunComparison:
    """Replay the engine run in `run_dir` in the simulator (`profile`: a name, a path, or None /
    "auto" for the shipped fit of its model and GPU) and compare them per metric."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: not a folder; give an engine run folder "
                             f"({', '.join(RUN_INPUT_FILES)})")
    info = read_run_info(run_dir)
    engine_summary = read_json_file(run_dir / "summary.json")
    requests = replayed_requests(run_dir, info)
    cfg = sim_engine_config(info)
    check_engine_summary(run_dir / "summary.json", engine_summary, len(requests))
    used = resolve_profile(profile, info.model, info.gpu)
    check_profile_target(run_dir, info, used)
    cut = engine_cut_s(run_dir, info, engine_summary)
    # a skip-ahead stretch in flight at the cut would keep its finishes: step a cut run one by one
    config = SimConfig(model=info.model, gpu=info.gpu, engine=cfg, profile=used, label=info.name,
                       skip_ahead=cut is None)
    result = run(LoadedWorkload(requests, info.name), config, until_s=cut)
    sim_summary = result.summary()
    # compared key by key under the JSON names the engine's summary.json was written with
    sim_json = sim_summary.to_json_dict()
    metrics = compare_summaries(engine_summary, sim_json)
    basis = None
    differ = cut is not None and engine_summary.get("unfinished") != sim_json.get("unfinished")
    if differ and (run_dir / "requests.jsonl").is_file():
        eng_fig, sim_fig, basis = both_finished_latencies(read_requests(run_dir / "requests.jsonl"), result.requests)
        metrics = compare_summaries(engine_summary | eng_fig, sim_json | sim_fig)
    own, note = sim_own_blocks(info, cfg, load_profile(used))
    kv = KVBlocks(engine=info.num_gpu_blocks, simulated=int(sim_summary.num_gpu_blocks or 0), sim_own=own,
                  sim_own_error=relative_error(info.num_gpu_blocks, own), note=note)
    return RunComparison(
        name=info.name, run_dir=str(run_dir), purpose=info.purpose, model=info.model, gpu=info.gpu,
        description=info.description, profile=used, honor_arrivals=info.honor_arrivals,
        num_requests=len(requests), flags=_flags_used(cfg), metrics=metrics, kv_blocks=kv,
        step_kinds=_step_kinds(run_dir, result.steps, config),
        verdict=verdict(metrics, same_requests=not differ or basis is not None), latency_basis=basis)


def engine_cut_s(run_dir: Path, info: EngineRunInfo, engine_summary: dict[str, Any]) -> float | None:
    """When the engine stopped a run it cut short (requests left unfinished at its wall-time cap),
    on its clock: the end of its last step (else run.json's wall time); None when it served every
    request. The simulator stops there too, so both sides are compared over the same span."""
    if not engine_summary.get("unfinished"):
        return None
    steps = read_steps(run_dir / "steps.jsonl")
    if steps is not None and steps["t_start_s"].size:
        last = int(np.argmax(steps["t_start_s"]))
        end = float(steps["t_start_s"][last] + steps["total_s"][last])
        if info.engine_args.get("async_scheduling") and not info.engine_args.get("speculative_config"):
            # async: a step's row is written when the NEXT step collects its tokens, a period later:
            # stop half-way through the period after that (not on the boundary, where rounding decides)
            end += 1.5 * float(steps["total_s"][last])
        return end + 1e-9  # what ends at that very time counts (a ns of rounding)
    wall = (info.model_extra or {}).get("wall_s")
    return float(wall) if isinstance(wall, int | float) and wall > 0 else None


def _step_kinds(run_dir: Path, sim_steps: dict[str, np.ndarray], config: SimConfig) -> list[StepKindComparison]:
    engine_steps = read_steps(run_dir / "steps.jsonl")
    if engine_steps is None:
        return []
    if config.engine.async_scheduling:
        # the simulator's and the cost model's GPU time hold the sampler's kernels; an async engine
        # times them on the device apart from the forward (a sync one's `sample_s` is host wall time)
        engine_steps = engine_steps | {"gpu_s": engine_steps["gpu_s"] + np.nan_to_num(engine_steps["sample_s"])}
    return compare_step_kinds(engine_steps, sim_steps, cost_model_step_s(engine_steps, config))


def _flags_used(cfg: EngineConfig) -> dict[str, Any]:
    keys = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "enable_prefix_caching",
            "enable_chunked_prefill", "async_scheduling", "gpu_memory_utilization")
    return {k: getattr(cfg, k) for k in keys}


# --------------------------------------------------------------------------- ranking
RANK_SEPARATION = 0.03  # engine goodputs further apart than this must be ordered alike


class RankedRun(_Record):
    """One configuration of a ranking set: goodput (requests/s meeting the SLO) on both sides."""

    name: str
    engine_goodput: float
    sim_goodput: float
    error: float | None


class RankingReport(_Record):
    """Whether the simulator orders engine configurations of one workload as the engine does:
    every pair the engine separates by more than `separation` (relative) must come out in the
    same order; `pick_loss` is the goodput lost by running the simulator's best configuration
    instead of the engine's (0 when both pick the same)."""

    slo: dict[str, float]
    separation: float
    runs: list[RankedRun]
    engine_order: list[str]
    sim_order: list[str]
    pairs_separated: int
    pairs_agreeing: int
    disagreements: list[str]
    spread: float  # (best - worst) / best engine goodput
    pick_loss: float
    passed: bool


def read_requests(path: Path) -> dict[str, np.ndarray]:
    """An engine run's requests.jsonl as columns (the columns goodput and `both_finished_latencies` need)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    cols = ("request_id", "status", "ttft_s", "tpot_s", "e2e_s")
    return {c: np.array([r.get(c) if r.get(c) is not None else (math.nan if c != "status" else "")
                         for r in rows], dtype=object if c == "status" else np.float64) for c in cols}


def both_finished_latencies(engine: dict[str, np.ndarray], sim: dict[str, np.ndarray]
                            ) -> tuple[dict[str, float], dict[str, float], str]:
    """TTFT, TPOT and e2e statistics (the summary's keys) of the requests both sides finished, the engine's and
    the simulator's (request tables: `request_id`, `status` and the latency columns), and a line saying so. A
    run's own figures cover the requests it finished; where the two sides left different ones unfinished,
    those figures would compare different requests, the slowest left out on one side only."""
    def finished(t: dict[str, np.ndarray]) -> dict[int, int]:
        return {int(r): i for i, (r, st) in enumerate(zip(t["request_id"], t["status"])) if st == "finished"}

    eng, sim_rows = finished(engine), finished(sim)
    both = sorted(set(eng) & set(sim_rows))

    def figures(t: dict[str, np.ndarray], rows: dict[int, int]) -> dict[str, float]:
        out: dict[str, float] = {}
        idx = np.array([rows[r] for r in both], dtype=np.int64)
        for name, col in REQUEST_LATENCIES:
            v = np.asarray(t[col], dtype=np.float64)[idx] if idx.size else np.zeros(0)
            out |= latency_stats(v[~np.isnan(v)]).json_items(name)
        return out

    basis = (f"TTFT, TPOT and e2e over the {len(both)} requests both finished (the engine finished {len(eng)}, "
             f"the simulator {len(sim_rows)})")
    return figures(engine, eng), figures(sim, sim_rows), basis


def engine_goodput(run_dir: Path, slo: SLO) -> float:
    """Requests per second meeting `slo` in an engine run (its own duration, as the summary's)."""
    reqs = read_requests(run_dir / "requests.jsonl")
    duration = read_json_file(run_dir / "summary.json")["duration"]
    return float(good_mask(reqs, slo).sum() / duration) if duration else 0.0


def rank_runs(run_dirs: list[str | Path], slo: SLO, profile: str | None = None,
              separation: float = RANK_SEPARATION) -> RankingReport:
    """Simulate each engine run (as `validate_run`) and compare the two goodput orders."""
    runs = []
    for d in map(Path, run_dirs):
        info = read_run_info(d)
        cfg = sim_engine_config(info)
        cut = engine_cut_s(d, info, read_json_file(d / "summary.json"))
        config = SimConfig(model=info.model, gpu=info.gpu, engine=cfg, skip_ahead=cut is None,
                           profile=resolve_profile(profile, info.model, info.gpu), label=info.name)
        result = run(LoadedWorkload(replayed_requests(d, info), info.name), config, until_s=cut)
        sim = result.summary(slo).request_goodput
        eng = engine_goodput(d, slo)
        runs.append(RankedRun(name=info.name, engine_goodput=eng, sim_goodput=float(sim),
                              error=relative_error(eng, float(sim))))
    return ranking(runs, slo, separation)


def ranking(runs: list[RankedRun], slo: SLO, separation: float = RANK_SEPARATION) -> RankingReport:
    """The pairwise comparison of `rank_runs` on goodputs already known."""
    separated = agreeing = 0
    disagreements = []
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            hi, lo = (a, b) if a.engine_goodput >= b.engine_goodput else (b, a)
            if hi.engine_goodput <= 0 or (hi.engine_goodput - lo.engine_goodput) / hi.engine_goodput <= separation:
                continue
            separated += 1
            if hi.sim_goodput > lo.sim_goodput:
                agreeing += 1
            else:
                disagreements.append(f"{hi.name} > {lo.name} on the engine ({hi.engine_goodput:.3g} vs "
                                     f"{lo.engine_goodput:.3g} req/s), not in the simulator ({hi.sim_goodput:.3g} "
                                     f"vs {lo.sim_goodput:.3g})")
    eng_best = max(runs, key=lambda r: r.engine_goodput)
    sim_best = max(runs, key=lambda r: r.sim_goodput)
    best = eng_best.engine_goodput
    return RankingReport(
        slo=slo.as_dict(), separation=separation, runs=runs,
        engine_order=[r.name for r in sorted(runs, key=lambda r: -r.engine_goodput)],
        sim_order=[r.name for r in sorted(runs, key=lambda r: -r.sim_goodput)],
        pairs_separated=separated, pairs_agreeing=agreeing, disagreements=disagreements,
        spread=(best - min(r.engine_goodput for r in runs)) / best if best > 0 else 0.0,
        pick_loss=(best - sim_best.engine_goodput) / best if best > 0 else 0.0,
        passed=agreeing == separated)


ValidationReport.model_rebuild()

__all__ = [
    "ALL_METRICS",
    "ERROR_METRICS",
    "MEDIAN_ABS_ERROR_TARGET",
    "P99_ABS_ERROR_TARGET",
    "REPORT_SCHEMA",
    "RUN_SCHEMA",
    "EngineRunInfo",
    "KVBlocks",
    "MetricComparison",
    "RankedRun",
    "RankingReport",
    "RunComparison",
    "RunFolderError",
    "StepKindComparison",
    "ValidationReport",
    "Verdict",
    "compare_step_kinds",
    "compare_summaries",
    "cost_model_step_s",
    "engine_goodput",
    "fitted_runs",
    "profile_path",
    "rank_runs",
    "ranking",
    "read_run_info",
    "relative_error",
    "resolve_profile",
    "sim_engine_config",
    "validate_run",
    "verdict",
    "was_fitted_on",
]
