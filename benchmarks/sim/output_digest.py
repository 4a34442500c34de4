"""Digests of the simulator's outputs on fixed workloads: the check that a speed change
left every result byte-identical (run it on main and on the branch, then `--compare`).

    PYTHONPATH=. python benchmarks/sim/output_digest.py --out before.json   # on main
    PYTHONPATH=. python benchmarks/sim/output_digest.py --compare before.json  # on the branch

Three workloads, one replica of llama-3.1-8b each (max_model_len 20,000): `conv`, the
conversation benchmark's traffic (4,000 requests at 4 req/s on an A100-80GB, no pressure);
`hot`, 1,500 requests at 40 req/s on an L4 (KV pressure: ~470 preemptions, evictions);
`grp`, the same with 64-token hash blocks (4 KV blocks each: the prompt is cached in
hash-block groups). Per workload: SHA-256 of the summary JSON (less its wall-clock fields
`wall_s`, `simulated_requests_per_wall_s` and `date`), of the request table and of the
step table (every column's bytes, by column name).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

import numpy as np

from engine.core.model_spec import get_model
from sim.config import DeploymentConfig, EngineConfig
from sim.generate import generate
from sim.hardware import get_gpu
from sim.simulator import Simulation
from sim.workload_spec import WorkloadSpec

# (name, requests, rate req/s, hash block size, GPU preset)
WORKLOADS = (("conv", 4000, 4.0, 16, "a100-80gb"), ("hot", 1500, 40.0, 16, "l4"),
             ("grp", 1500, 30.0, 64, "l4"))
WALL_CLOCK_KEYS = ("wall_s", "simulated_requests_per_wall_s", "date")


def spec_of(name: str, n: int, rate: float, hash_block_size: int) -> dict[str, Any]:
    """The digests' traffic: chat, Poisson arrivals, lognormal prompts and outputs, seed 1."""
    return {"name": name, "num_requests": n, "seed": 1, "hash_block_size": hash_block_size,
            "arrival": {"kind": "poisson", "rate_rps": rate},
            "prompt_tokens": {"kind": "lognormal", "median": 800, "sigma": 0.85, "min_tokens": 16,
                              "max_tokens": 16000},
            "output_tokens": {"kind": "lognormal", "median": 150, "sigma": 0.8, "min_tokens": 1,
                              "max_tokens": 2000},
            "task_mix": {"chat": 1.0}}


def table_digest(table: Any) -> str:
    """SHA-256 over a column table (dict of arrays, or anything with `.columns`)."""
    items = table.items() if isinstance(table, dict) else [(c, table[c]) for c in table.columns]
    h = hashlib.sha256()
    for name, col in sorted(items, key=lambda kv: kv[0]):
        arr = np.asarray(col)
        h.update(name.encode())
        h.update(repr(list(arr)).encode() if arr.dtype == object else arr.tobytes())
    return h.hexdigest()


def digests() -> dict[str, dict[str, Any]]:
    out = {}
    for name, n, rate, hbs, gpu in WORKLOADS:
        reqs = generate(WorkloadSpec.model_validate(spec_of(name, n, rate, hbs))).requests
        dep = DeploymentConfig(model=get_model("llama-3.1-8b"), gpu=get_gpu(gpu), num_replicas=1,
                               engine=EngineConfig(max_model_len=20000))
        out[name] = result_digests(Simulation(dep, reqs).run())
    return out


def result_digests(res: Any, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """A run's summary (less its wall-clock fields), request-table and step-table digests, its engine
    steps, and per `extra` {name: summary key} that summary value as it is."""
    s = res.summary().to_json_dict()
    for k in WALL_CLOCK_KEYS:
        s.pop(k, None)
    text = json.dumps(s, sort_keys=True, default=str)
    return {"summary": hashlib.sha256(text.encode()).hexdigest(), "requests": table_digest(res.requests),
            "steps": table_digest(res.steps), "num_engine_steps": s["num_engine_steps"]} | {
        name: s.get(key) for name, key in (extra or {}).items()}


def digest_cli(description: str, compute, extra_args=()) -> None:
    """Print the digests `compute(args)` returns; --out writes them, --compare exits 1 unless every
    digest of the compared file's workloads is equal (those it lacks are new, not different)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", help="write the digests to this JSON file")
    ap.add_argument("--compare", help="exit 1 unless the digests equal those in this JSON file")
    for flags, kw in extra_args:
        ap.add_argument(*flags, **kw)
    args = ap.parse_args()
    got = compute(args)
    print(json.dumps(got, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(got, f, indent=1)
    if args.compare:
        with open(args.compare) as f:
            want = json.load(f)
        bad = [f"{w}.{k}" for w in want if w in got for k in want[w] if got[w].get(k) != want[w][k]]
        bad += [w for w in want if w not in got and not getattr(args, "only", None)]
        print("identical" if not bad else f"DIFFERENT: {', '.join(bad)}")
        sys.exit(1 if bad else 0)


def main() -> None:
    digest_cli(__doc__.splitlines()[0], lambda args: digests())


if __name__ == "__main__":
    main()
