"""The public simulation API: a workload and a `SimConfig` in, a `SimResult` out.

    from sim.run import SimConfig, run
    result = run("chat-production", SimConfig(gpu="h200", num_gpus=2, slo="ttft:500 tpot:50"))
    result.summary()            # a RunSummary: .ttft.p99_ms, .request_goodput, ...
    result.summary().to_json_dict()  # the same under `vllm bench serve` keys plus costline extras
    result.requests, result.steps, result.prometheus_text(), result.save("runs/a")

`costline simulate`, the advisor's search and the dashboard all call `run`; nobody else chains
configure -> simulate -> summarise. `SimConfig` is plain data (JSON and pickle round-trip), so a
search can ship configurations to other processes. A search that simulates one workload many
times loads it once with `load` and passes the `LoadedWorkload` to each `run`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.core.flags import FlagError
from engine.core.model_spec import get_model
from engine.core.request import Request
from sim.config import DeploymentConfig, DisaggConfig, EngineConfig, RouterPolicy
from sim.cost_model import CostProfile
from sim.hardware import GpuPreset, ModelPreset, get_gpu
from sim.metrics import SLO, SimResult
from sim.profile_files import load_profile
from sim.resolved import ResolvedDeployment, resolve_deployment
from sim.simulator import Simulation, kv_block_coarsening_for
from sim.workload import Workload
from sim.workload_source import SourceOptions, load_workload
from sim.workload_spec import MAX_ARRIVAL_S, MAX_REQUESTS, MAX_TOKENS

# A deployment of more GPUs than this is refused: every replica is simulated (its scheduler, its
# KV block pool), memory and time grow linearly with replicas, and 4096 GPUs is beyond any single
# vLLM deployment the cost profiles were measured on; simulate one pool and scale the result.
MAX_NUM_GPUS = 4096
# Simulated KV blocks over all replicas: ~110 bytes each in the simulator's block manager (measured:
# 5.5 MB for one H200 replica of llama-3.1-8b, 52,826 blocks), so 50M blocks keep a run near 5.5 GB.
MAX_SIMULATED_BLOCKS = 50_000_000
SIM_BYTES_PER_BLOCK = 110
# Engine KV blocks per simulated block: "auto" never goes past 64 (a 1,024-token block at 16);
# coarser, a request's last block wastes most of the pool and the run models another engine.
MAX_KV_BLOCK_COARSENING = 64


class SimConfig(BaseModel):
    """Everything a simulation run needs besides the workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelPreset = Field("llama-3.1-8b", description="model preset name")
    gpu: GpuPreset = Field("h200", description="GPU preset name")
    num_gpus: int | None = Field(None, ge=1, le=MAX_NUM_GPUS, description="GPUs in total; None = one replica, or what "
                                 "the P/D split needs")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="vllm serve flags")
    router: RouterPolicy = "least_loaded"
    disaggregation: DisaggConfig | None = None
    seed: int = Field(0, ge=0, description="seed of the simulation's draws and of a generated workload")
    profile: str = Field("auto", description="cost profile name (sim/profiles) or JSON path; 'auto' = the "
                         "profile fitted or scaled for this model and GPU if one ships, else 'default'")
    slo: SLO | None = Field(None, description="goodput targets; also accepts 'ttft:500 tpot:50'")
    skip_ahead: bool = Field(True, description="jump over decode-only stretches (results identical)")
    kv_block_coarsening: int | Literal["auto"] = Field(
        1, description="engine KV blocks per simulated block (speed option); 'auto' = as coarse as "
        "the workload's hash blocks allow")
    label: str | None = None
    fp8_gemm_speedup: float | None = Field(None, gt=0, le=4, description="price FP8 weights' GEMMs at this "
                                           "rate over bf16's instead of the profile's (the advisor's input range)")

    @field_validator("slo", mode="before")
    @classmethod
    def _parse_slo(cls, v: Any) -> Any:
        return SLO.parse(v) if isinstance(v, str) else v

    @field_validator("kv_block_coarsening")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= MAX_KV_BLOCK_COARSENING:
            raise FlagError("kv_block_coarsening", v, f"must be an integer from 1 to {MAX_KV_BLOCK_COARSENING}, "
                            "or 'auto' (coarser blocks model another engine: a request's last block would "
                            "waste most of the KV pool)")
        return v

    @property
    def num_replicas(self) -> int:
        """Replicas the config deploys (P/D: prefill + decode), before `deployment`'s checks."""
        d = self.disaggregation
        if d is not None:
            return d.num_prefill_replicas + d.num_decode_replicas
        tp = self.engine.tensor_parallel_size
        return (self.num_gpus or tp) // tp

    def deployment(self) -> DeploymentConfig:
        """The deployment this config describes; num_gpus must fit the TP size and the P/D split."""
        tp = self.engine.tensor_parallel_size
        common = {"model": get_model(self.model), "gpu": get_gpu(self.gpu), "engine": self.engine,
                  "router": self.router}
        d = self.disaggregation
        if d is not None:
            need = (d.num_prefill_replicas + d.num_decode_replicas) * tp
            if self.num_gpus is not None and self.num_gpus != need:
                raise FlagError("num_gpus", self.num_gpus,
                                f"does not match {{disaggregation}} {d.num_prefill_replicas}:"
                                f"{d.num_decode_replicas} at {{tensor_parallel_size}} {tp} ({need} GPUs); "
                                "drop {num_gpus} or make them agree")
            return DeploymentConfig(disaggregation=d, **common)
        n = self.num_gpus or tp
        if n % tp:
            raise FlagError("num_gpus", n, f"is not a multiple of {{tensor_parallel_size}} {tp}")
        return DeploymentConfig(num_replicas=self.num_replicas, **common)


def check_simulation_size(deployment: DeploymentConfig | ResolvedDeployment, kv_block_coarsening: int,
                          profile: CostProfile | None = None, *, limit: int = MAX_SIMULATED_BLOCKS,
                          limit_hint: str = "") -> int:
    """Refuse, before anything is allocated, a deployment whose simulated KV pools would not fit
    in memory (more than `limit` blocks), or whose model does not fit its GPUs (`plan_memory`
    says which figures). Returns the simulated blocks over all replicas. Give the run's
    `ResolvedDeployment` where there is one (its memory plans are read, not made again; it carries
    its own profile, so `profile` goes with a bare DeploymentConfig only)."""
    if isinstance(deployment, ResolvedDeployment) and profile is not None:
        raise ValueError("check_simulation_size: a ResolvedDeployment was resolved with its own profile; "
                         "pass `profile` with a DeploymentConfig only")
    res = deployment if isinstance(deployment, ResolvedDeployment) else resolve_deployment(deployment, profile)
    deployment, engine = res.deployment, res.engine
    plan = max((i.plan for i in res.instances), key=lambda p: p.num_gpu_blocks)
    d = deployment.disaggregation
    replicas = res.num_replicas
    blocks = res.simulated_blocks(kv_block_coarsening)
    if blocks > limit:
        gib = blocks * SIM_BYTES_PER_BLOCK / 2**30
        cap = f"cap {limit:,} blocks" + (f", {limit_hint}" if limit_hint else "")
        figures = (f"would simulate {replicas:,} replica(s) x {plan.num_gpu_blocks:,} KV blocks (~{gib:.1f} GiB "
                   f"of simulator memory, {cap}); ")
        if engine.num_gpu_blocks_override is not None:
            raise FlagError("num_gpu_blocks_override", engine.num_gpu_blocks_override,
                            figures + "lower {num_gpu_blocks_override} or raise {kv_block_coarsening}")
        if d is not None:  # the GPUs follow from the split
            raise FlagError("disaggregation", f"{d.num_prefill_replicas}:{d.num_decode_replicas}",
                            figures + "use fewer replicas in {disaggregation}, or raise {kv_block_coarsening}")
        coarser = ", or raise {kv_block_coarsening} (e.g. 32 or auto)" if limit == MAX_SIMULATED_BLOCKS else ""
        raise FlagError("num_gpus", deployment.num_gpus, figures + "lower {num_gpus}" + coarser)
    return blocks


@dataclass(slots=True)
class LoadedWorkload:
    """Requests ready to simulate, with the name and notes a run records about them."""

    requests: list[Request]
    name: str
    notes: list[str] = field(default_factory=list)


WorkloadInput = str | Path | Workload | Sequence[Request] | LoadedWorkload


def check_requests(requests: Sequence[Any]) -> list[Request]:
    """The requests a simulation may take: `Request`s, at most MAX_REQUESTS, each arriving at a
    finite time in [0, MAX_ARRIVAL_S] s with lengths up to MAX_TOKENS. A NaN or infinite arrival
    would never be reached (the run would not return) or poison every summary; a negative one
    would count the time before t = 0 as queueing. ValueError naming the request otherwise."""
    reqs = list(requests)
    if not reqs:
        raise ValueError("the workload has no requests; give at least one")
    if len(reqs) > MAX_REQUESTS:
        raise ValueError(f"{len(reqs):,} requests: at most {MAX_REQUESTS:,} are simulated at once; split the workload")
    for i, r in enumerate(reqs):
        if not isinstance(r, Request):
            raise ValueError(f"workload item {i}: a {type(r).__name__}, not an engine.core.request.Request; give "  # noqa: TRY004
                             "Requests, a Workload, or a preset, spec or trace name")
    t = np.fromiter((_time(r.arrival_s) for r in reqs), dtype=np.float64, count=len(reqs))
    longest = max(max(r.prompt_len, r.output_len) for r in reqs)
    ok = np.isfinite(t) & (t >= 0) & (t <= MAX_ARRIVAL_S)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"request {reqs[i].request_id} (item {i}): arrival_s {reqs[i].arrival_s!r} is not a "
                         f"finite time from 0 to {MAX_ARRIVAL_S:.0e} s; give every request a finite arrival "
                         "time in seconds >= 0")
    if longest > MAX_TOKENS:
        i = next(i for i, r in enumerate(reqs) if max(r.prompt_len, r.output_len) > MAX_TOKENS)
        raise ValueError(f"request {reqs[i].request_id} (item {i}): {longest:,} tokens, more than the "
                         f"{MAX_TOKENS:,} per request any served model takes")
    return reqs


def _time(x: Any) -> float:
    """A request's arrival as a float; NaN for anything that is not a real number."""
    if isinstance(x, bool) or not isinstance(x, int | float | np.integer | np.floating):
        return math.nan
    try:
        return float(x)
    except OverflowError:
        return math.inf


def load(workload: WorkloadInput, source: SourceOptions | None = None, *, seed: int = 0) -> LoadedWorkload:
    """`workload` as requests: a preset name, a spec or trace path (read with `source`), a
    `Workload` or a list of `Request`s. `seed` seeds a generated workload unless `source` does.
    Requests given directly are checked (`check_requests`)."""
    if isinstance(workload, LoadedWorkload):
        return LoadedWorkload(check_requests(workload.requests), workload.name, workload.notes)
    if isinstance(workload, (str, Path)):
        opts = source or SourceOptions()
        if opts.seed is None:
            opts = opts.model_copy(update={"seed": seed})
        wl = load_workload(str(workload), opts)
        return LoadedWorkload(list(wl.requests), Path(workload).stem, list(wl.notes))
    if isinstance(workload, Workload):
        return LoadedWorkload(check_requests(workload.requests), workload.name, list(workload.notes))
    if isinstance(workload, str | bytes | dict) or not isinstance(workload, Sequence | Iterable):
        raise ValueError(f"workload: a {type(workload).__name__}; give a preset, spec or trace name or path, a "  # noqa: TRY004
                         "Workload, or a list of Requests")
    return LoadedWorkload(check_requests(workload), "requests")


def run(workload: WorkloadInput, config: SimConfig, *, source: SourceOptions | None = None,
        progress: Callable[[float], None] | None = None, until_s: float | None = None,
        cost_profile: CostProfile | None = None) -> SimResult:
    """Simulate `workload` on the deployment `config` describes (same inputs, same result);
    `until_s` stops the clock there (what is in flight then is reported unfinished).
    `cost_profile`: a profile object used instead of `config.profile` (a fit that tries many
    variants of one profile builds them in memory, sim/request_fit.py)."""
    loaded = load(workload, source, seed=config.seed)
    coarsening = kv_block_coarsening_for(config.kv_block_coarsening, config.engine.block_size,
                                         loaded.requests)
    deployment = config.deployment()
    profile = cost_profile or load_profile(config.profile, config.model, config.gpu)
    if config.fp8_gemm_speedup is not None:
        profile = profile.model_copy(update={"fp8_gemm_speedup": config.fp8_gemm_speedup})
    resolved = resolve_deployment(deployment, profile)  # once: the size check and every replica read it
    check_simulation_size(resolved, coarsening)
    sim = Simulation(deployment, loaded.requests, seed=config.seed, resolved=resolved,
                     profile=profile, slo=config.slo, skip_ahead=config.skip_ahead,
                     progress=progress, label=config.label or loaded.name,
                     meta={"workload": loaded.name, "workload_notes": loaded.notes} | profile_meta(profile),
                     kv_block_coarsening=coarsening)
    return sim.run(until_s=until_s)


def profile_meta(profile: CostProfile) -> dict[str, Any]:
    """What a run records about its cost profile (the summary's `profile*` keys)."""
    return {"profile": profile.name, "profile_status": profile.status, "profile_validation": profile.validation}


__all__ = [
    "MAX_KV_BLOCK_COARSENING",
    "MAX_NUM_GPUS",
    "MAX_SIMULATED_BLOCKS",
    "LoadedWorkload",
    "SimConfig",
    "WorkloadInput",
    "check_requests",
    "check_simulation_size",
    "kv_block_coarsening_for",
    "load",
    "profile_meta",
    "run",
]
