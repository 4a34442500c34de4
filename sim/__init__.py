"""Workloads, GPU specs, the step cost model, the SimPy simulator and its metrics.

The run boundary is `sim.run.run(workload, SimConfig) -> SimResult` (the function stays in its
module: exporting it here would shadow the `sim.run` module); `SimResult.summary()` is a typed
`RunSummary` (vLLM's `vllm bench serve` key names only in `to_json_dict()`); SLOs travel as `SLO`.
"""

from engine.core.slo import SLO
from engine.core.summary_record import LatencyStats, RunSummary
from sim.metrics import SimResult, load_summary
from sim.run import LoadedWorkload, SimConfig

__all__ = ["SLO", "LatencyStats", "LoadedWorkload", "RunSummary", "SimConfig", "SimResult", "load_summary"]
