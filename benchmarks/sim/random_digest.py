"""Digests of the simulator's outputs on random deployments and workloads, one line per case:
run it on main and on a branch and diff the two outputs (a speed change must leave them equal).

    PYTHONPATH=. python benchmarks/sim/random_digest.py 0 150 > branch.txt   # cases 0..149

Each case (seeded by its number) draws a workload (200-700 requests; rates from 2 to 60 req/s;
short to long prompts and outputs; hash blocks of 16, 32 or 64 tokens; sometimes system prompts,
multi-turn sessions or dynamic prefixes) and a deployment of llama-3.1-8b on an L4, A100 or H100
(sometimes prefix caching or chunked prefill off, async scheduling, n-gram speculation, 32-token
blocks, a small KV pool, 2-3 replicas under a random router, a 1P+1-2D split, KV block
coarsening). A line: case, summary / request-table / step-table digest prefixes, preemptions,
prefix-cache hit rate (or the error a configuration gets, identical on both sides).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from output_digest import WALL_CLOCK_KEYS, table_digest

from engine.core.model_spec import get_model
from sim.config import DeploymentConfig, DisaggConfig, EngineConfig
from sim.generate import generate
from sim.hardware import get_gpu
from sim.simulator import Simulation
from sim.workload_spec import WorkloadSpec


def _workload(rng: random.Random, seed: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "random", "num_requests": rng.choice([200, 400, 700]), "seed": seed,
        "hash_block_size": rng.choice([16, 16, 32, 64]),
        "arrival": {"kind": "poisson", "rate_rps": rng.choice([2.0, 8.0, 25.0, 60.0])},
        "prompt_tokens": {"kind": "lognormal", "median": rng.choice([200, 800, 2000]), "sigma": 0.9,
                          "min_tokens": 8, "max_tokens": 12000},
        "output_tokens": {"kind": "lognormal", "median": rng.choice([30, 150, 400]), "sigma": 0.8,
                          "min_tokens": 1, "max_tokens": 1500},
        "task_mix": {"chat": 1.0}}
    if rng.random() < 0.4:
        spec["system_prompts"] = {"count": rng.randint(1, 8), "tokens": {"kind": "uniform", "low": 100, "high": 2000},
                                  "zipf_exponent": 1.0, "share_of_requests": rng.choice([0.5, 1.0])}
    if rng.random() < 0.3:
        spec["sessions"] = {"turns": {"kind": "uniform", "low": 1, "high": 5}, "mean_think_time_s": 10.0,
                            "user_message_tokens": {"kind": "lognormal", "median": 100, "sigma": 0.6,
                                                    "min_tokens": 1, "max_tokens": 1000},
                            "max_context_tokens": 12000}
    if rng.random() < 0.2:
        spec["dynamic_prefix"] = {"share_of_requests": 0.5, "position_tokens": rng.choice([0, 100, 500])}
    return spec


def _deployment(rng: random.Random) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
    flags: dict[str, Any] = {"max_model_len": 20000}
    for name, value, p in (("enable_prefix_caching", False, 0.2), ("enable_chunked_prefill", False, 0.2),
                           ("async_scheduling", True, 0.2)):
        if rng.random() < p:
            flags[name] = value
    if rng.random() < 0.15:
        flags["speculative_config"] = {"method": "ngram", "num_speculative_tokens": rng.choice([2, 4])}
    if rng.random() < 0.2:
        flags["block_size"] = 32
    if rng.random() < 0.3:
        flags["num_gpu_blocks_override"] = rng.choice([300, 800, 2000])
    dep: dict[str, Any] = {}
    r = rng.random()
    if r < 0.2:
        dep = {"num_replicas": rng.choice([2, 3]), "router": rng.choice(["round_robin", "least_loaded", "prefix_aware"])}
    elif r < 0.3:
        dep = {"disaggregation": DisaggConfig(num_prefill_replicas=1, num_decode_replicas=rng.choice([1, 2]))}
    sim = {"kv_block_coarsening": rng.choice([2, 4])} if rng.random() < 0.15 else {}
    return flags, dep, sim, rng.choice(["l4", "a100-80gb", "h100"])


def case_line(seed: int) -> str:
    rng = random.Random(seed)
    spec = _workload(rng, seed)
    flags, dep_kw, sim_kw, gpu = _deployment(rng)
    try:
        reqs = generate(WorkloadSpec.model_validate(spec)).requests
        dep = DeploymentConfig(model=get_model("llama-3.1-8b"), gpu=get_gpu(gpu), engine=EngineConfig(**flags), **dep_kw)
        res = Simulation(dep, reqs, **sim_kw).run()
    except ValueError as e:  # a configuration the checks refuse (the same on both sides)
        return f"{seed} ERROR {type(e).__name__} {str(e)[:80]}"
    s = res.summary().to_json_dict()
    for k in WALL_CLOCK_KEYS:
        s.pop(k, None)
    h = hashlib.sha256(json.dumps(s, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return (f"{seed} {h} {table_digest(res.requests)[:12]} {table_digest(res.steps)[:12]} "
            f"{s.get('num_preemptions')} {round(s.get('prefix_cache_hit_rate') or 0, 3)}")


def main() -> None:
    first, end = (int(x) for x in sys.argv[1:3]) if len(sys.argv) >= 3 else (0, 50)
    for seed in range(first, end):
        print(case_line(seed), flush=True)


if __name__ == "__main__":
    main()
