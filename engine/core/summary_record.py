"""A run's summary as a typed record: what `RunTables.summary()` returns (engine/core/run_summary.py)
and what the advisor and the dashboard read, by field.

The record's field names are costline's; vLLM's `vllm bench serve --save-result` key names
(`duration`, `model_id`, `mean_ttft_ms`, `p99_tpot_ms`, ...) appear only when the record is
written as JSON (`to_json_dict`) or read back from such a file (`from_json_dict`), so a simulated
run, an engine replay and a measured vLLM run still compare key by key on disk.

Torch-free: the simulator imports it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from engine.core.slo import SLO

# the order of the statistics in `vllm bench serve`'s result file, each `{stat}_{metric}_ms`
STAT_NAMES = ("mean", "median", "std", "p50", "p90", "p95", "p99")
NAN = math.nan


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """One latency distribution in milliseconds (mean, median, standard deviation, percentiles);
    NaN throughout when the run had no sample."""

    mean_ms: float = NAN
    median_ms: float = NAN
    std_ms: float = NAN
    p50_ms: float = NAN
    p90_ms: float = NAN
    p95_ms: float = NAN
    p99_ms: float = NAN

    def json_items(self, metric: str) -> dict[str, float]:
        """This distribution under vLLM's key names (`mean_ttft_ms`, `p99_ttft_ms`, ...)."""
        return {f"{s}_{metric}_ms": getattr(self, f"{s}_ms") for s in STAT_NAMES}

    @classmethod
    def from_json(cls, d: dict[str, Any], metric: str) -> LatencyStats:
        return cls(*(_nan_if_none(d.get(f"{s}_{metric}_ms")) for s in STAT_NAMES))


def _nan_if_none(x: Any) -> float:
    return NAN if x is None else float(x)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What one run (simulated or replayed) measured, in the order its JSON keys are written.

    Rates are per second of the run's duration (first arrival to last finish); `slo` is the
    goodput target the run was judged by (`request_goodput` None without one). Engine-only or
    run-specific figures a run does not have are None."""

    date: str
    endpoint_type: str | None
    backend: str | None
    label: str | None
    model: str | None  # JSON: model_id and tokenizer_id
    num_prompts: int
    request_rate: float | str
    burstiness: float | None
    max_concurrency: int | None
    duration_s: float  # JSON: duration
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    queue_time: LatencyStats
    num_gpus: int
    num_replicas: int
    deployment: str | None
    slo: SLO | None  # JSON: goodput_slo, as {"ttft": ms, ...}
    request_goodput_per_gpu: float | None
    output_throughput_per_gpu: float
    rejected: int
    unfinished: int
    rejected_reasons: dict[str, int]
    unfinished_reasons: dict[str, int]
    num_preemptions: int
    prefix_cache_queries_tokens: float
    prefix_cache_hits_tokens: float
    prefix_cache_hit_rate: float
    prefill_tokens_computed: int
    gpu_busy_share: float
    cpu_share_of_step_time: float
    num_engine_steps: int
    async_scheduling: bool | None
    speculative_config: str | None
    ready_s: float | None  # engines only
    spec_decode_num_drafts: float
    spec_decode_draft_tokens: float
    spec_decode_accepted_tokens: float
    spec_decode_acceptance_rate: float | None
    spec_decode_acceptance_length: float | None
    spec_decode_per_position_acceptance_rates: list[float] | None
    mean_kv_transfer_ms: float | None
    kv_cache_usage_max: float
    num_gpu_blocks: int | None
    kv_block_coarsening: int
    profile: str | None  # the simulator's cost profile: name, how far to trust it, its validation
    profile_status: str | None
    profile_validation: dict[str, Any] | None
    wall_s: float
    simulated_requests_per_wall_s: float | None
    vllm_args: str | None = None  # the `vllm serve` flags the run modelled (simulated runs)
    serve_command: str | None = None

    @property
    def slo_attainment(self) -> float:
        """Share of the requests that finished within the SLO (all finished ones without an SLO)."""
        good = self.request_throughput if self.request_goodput is None else self.request_goodput
        return good * (self.duration_s or 1.0) / max(self.num_prompts, 1)

    def to_json_dict(self) -> dict[str, Any]:
        """The record under `vllm bench serve`'s key names plus costline's extras, in the order
        they are written (values as computed: NaN stays NaN; `jsonable` makes strict JSON); the
        same keys for every run, simulated or replayed (None where a run does not say)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, LatencyStats):
                out |= value.json_items(f.name)
            elif f.name == "model":
                out["model_id"] = out["tokenizer_id"] = value
            elif f.name == "slo":
                out["goodput_slo"] = value.as_dict() if value is not None else None
            else:
                out[_JSON_NAMES.get(f.name, f.name)] = value
        return out

    @classmethod
    def from_json_dict(cls, d: dict[str, Any]) -> RunSummary:
        """A record from a summary written by `to_json_dict` (a saved run's summary.json)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in _LATENCIES:
                values[f.name] = LatencyStats.from_json(d, f.name)
            elif f.name == "model":
                values[f.name] = d.get("model_id")
            elif f.name == "slo":
                slo = d.get("goodput_slo")
                values[f.name] = SLO(**{f"{k}_ms": v for k, v in slo.items()}) if slo else None
            else:
                values[f.name] = d.get(_JSON_NAMES.get(f.name, f.name))
        return cls(**values)


_JSON_NAMES = {"duration_s": "duration"}
_LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue_time")

__all__ = ["STAT_NAMES", "LatencyStats", "RunSummary"]
