"""Share of the conversation benchmark's CPU time spent in KV block bookkeeping, per method.

    PYTHONPATH=. python benchmarks/sim/block_share.py [--repeat 3]

cProfile misstates this code: its hook fires on every builtin call, so a method that calls
`list.append` per block (BlockPool.free_tail_first) shows ~2x its real share, and one that
does not (BlockPool.allocate) shows about its real share. Here each method is timed with two
`time.perf_counter` calls around it (no hook inside), on the same run as
`bench_conversation.py` (same workload and deployment); the timer's own cost per call is
printed next to each figure. The sum bounds what faster block bookkeeping alone can give:
a share s caps the speed-up at 1 / (1 - s).
"""

from __future__ import annotations

import argparse
import collections
import functools
import time
from collections.abc import Callable

from benchmarks.sim.bench_conversation import SPEC
from engine.core.block_keys import HashIdKeys
from engine.core.block_pool import BlockPool
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.model_spec import get_model
from sim.config import DeploymentConfig
from sim.generate import generate
from sim.hardware import get_gpu
from sim.simulator import Simulation
from sim.workload_spec import WorkloadSpec

TIMED = ((BlockPool, ("allocate", "allocate_one", "free_tail_first", "cache_blocks", "cache_block",
                      "cache_group", "touch")),
         (HashIdKeys, ("append_keys",)),
         (KVCacheManager, ("_key_generated", "_lookup_grouped")))


def _timed(f: Callable, name: str, spent: collections.Counter, calls: collections.Counter) -> Callable:
    clock = time.perf_counter

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        t = clock()
        out = f(*args, **kwargs)
        spent[name] += clock() - t
        calls[name] += 1
        return out
    return wrapper


def _timer_cost_s(n: int = 100_000) -> float:
    clock = time.perf_counter
    t = clock()
    for _ in range(n):
        clock()
        clock()
    return (clock() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    spent: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for cls, names in TIMED:
        for name in names:
            setattr(cls, name, _timed(getattr(cls, name), f"{cls.__name__}.{name}", spent, calls))
    reqs = generate(WorkloadSpec.model_validate(SPEC)).requests
    dep = DeploymentConfig(model=get_model("llama-3.1-8b"), gpu=get_gpu("a100-80gb"), num_replicas=1)
    per_call = _timer_cost_s()
    for _ in range(args.repeat):
        spent.clear()
        calls.clear()
        sim = Simulation(dep, reqs)
        c0 = time.process_time()
        sim.run()
        cpu = time.process_time() - c0
        print(f"run: {cpu:.3f} CPU s ({len(reqs) / cpu:,.0f} simulated requests per CPU s, timers included)")
        for name, s in spent.most_common():
            print(f"  {name:32s} {calls[name]:7d} calls {s:7.3f} s {s / cpu:6.1%}"
                  f"  (timers ~{calls[name] * per_call:.3f} s)")
        share = sum(spent.values()) / cpu
        print(f"  block bookkeeping {share:.1%}: at most {1 / (1 - share):.2f}x from it alone")


if __name__ == "__main__":
    main()
