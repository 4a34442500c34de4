"""Digests of the simulator's outputs under the engine modes and deployments that
`output_digest.py` leaves out: the check that a speed change left them byte-identical too.

    PYTHONPATH=. python benchmarks/sim/mode_digest.py --out before.json     # on main
    PYTHONPATH=. python benchmarks/sim/mode_digest.py --compare before.json  # on the branch

Cases (llama-3.1-8b, max_model_len 20,000): async scheduling, n-gram speculative decoding,
chunked prefill off, prefix caching off, KV block coarsening 4 (each on the conversation
traffic, and async / caching off also under KV pressure on an L4); multi-turn sessions with
system prompts (later turns hit earlier turns' prompt *and generated* blocks) on one replica
under pressure and on 3 replicas under each router; a 1 prefill + 2 decode disaggregated
split. Per case: the summary, request-table and step-table digests, as in `output_digest.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from output_digest import digest_cli, result_digests, spec_of

from engine.core.model_spec import get_model
from sim.config import DeploymentConfig, DisaggConfig, EngineConfig
from sim.generate import generate
from sim.hardware import get_gpu
from sim.simulator import Simulation
from sim.workload_spec import WorkloadSpec

SESSIONS = {"turns": {"kind": "uniform", "low": 1, "high": 6}, "mean_think_time_s": 20.0,
            "user_message_tokens": {"kind": "lognormal", "median": 120, "sigma": 0.7, "min_tokens": 1,
                                    "max_tokens": 2000},
            "max_context_tokens": 16000}
SYSTEM = {"count": 6, "tokens": {"kind": "uniform", "low": 200, "high": 1500}, "zipf_exponent": 1.0,
          "share_of_requests": 0.8}


def _workload(kind: str, n: int, rate: float) -> list[Any]:
    """`output_digest.py`'s traffic (seed 1, 16-token hash blocks), with sessions for "sessions"."""
    spec = spec_of(kind, n, rate, 16)
    if kind == "sessions":
        spec |= {"sessions": SESSIONS, "system_prompts": SYSTEM,
                 "prompt_tokens": {"kind": "lognormal", "median": 300, "sigma": 0.8, "min_tokens": 16,
                                   "max_tokens": 8000}}
    return generate(WorkloadSpec.model_validate(spec)).requests


# name: (workload, requests, rate req/s, GPU, engine flags, deployment fields, Simulation keywords)
CASES: dict[str, tuple[str, int, float, str, dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "async": ("plain", 1500, 4.0, "a100-80gb", {"async_scheduling": True}, {}, {}),
    "hot_async": ("plain", 1000, 40.0, "l4", {"async_scheduling": True}, {}, {}),
    "spec": ("plain", 1500, 4.0, "a100-80gb",
             {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}, {}, {}),
    "nochunk": ("plain", 1500, 4.0, "a100-80gb", {"enable_chunked_prefill": False}, {}, {}),
    "nocache": ("plain", 1500, 4.0, "a100-80gb", {"enable_prefix_caching": False}, {}, {}),
    "hot_nocache": ("plain", 1000, 40.0, "l4", {"enable_prefix_caching": False}, {}, {}),
    "coarse4": ("plain", 1500, 4.0, "a100-80gb", {}, {}, {"kv_block_coarsening": 4}),
    "hot_sessions": ("sessions", 1200, 30.0, "l4", {}, {}, {}),
    "sessions_rr": ("sessions", 1500, 60.0, "l4", {}, {"num_replicas": 3, "router": "round_robin"}, {}),
    "sessions_ll": ("sessions", 1500, 60.0, "l4", {}, {"num_replicas": 3, "router": "least_loaded"}, {}),
    "sessions_pa": ("sessions", 1500, 60.0, "l4", {}, {"num_replicas": 3, "router": "prefix_aware"}, {}),
    "pd_1p2d": ("sessions", 1000, 20.0, "l4", {},
                {"disaggregation": DisaggConfig(num_prefill_replicas=1, num_decode_replicas=2)}, {}),
}


def digests(names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    out = {}
    for name, (kind, n, rate, gpu, flags, dep_kw, sim_kw) in CASES.items():
        if names and name not in names:
            continue
        dep = DeploymentConfig(model=get_model("llama-3.1-8b"), gpu=get_gpu(gpu),
                               engine=EngineConfig(max_model_len=20000, **flags), **dep_kw)
        res = Simulation(dep, _workload(kind, n, rate), **sim_kw).run()
        out[name] = result_digests(res, {"preemptions": "num_preemptions",
                                                "prefix_cache_hit_rate": "prefix_cache_hit_rate"})
    return out


def main() -> None:
    digest_cli(__doc__.splitlines()[0], lambda args: digests(args.only),
               [(("--only",), {"nargs": "*", "help": "run only these cases"})])


if __name__ == "__main__":
    main()
