"""Counting the torch ops a piece of host code runs (a `TorchDispatchMode`): how the runner's
step preparation is kept to few launches (tests/engine/test_runner_staging.py) and measured
(benchmarks/engine/bench_host_prep.py, bench_host_step.py, diagnose.py)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

# ops that only make a new view: no launch, no copy on a GPU
VIEW_OPS = frozenset({"slice", "view", "as_strided", "alias", "detach", "select", "reshape", "unsqueeze",
                      "squeeze", "t", "transpose", "expand", "_unsafe_view"})


class OpCounter(TorchDispatchMode):
    """Counts the torch ops (by name) run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def views(self) -> int:
        return sum(n for name, n in self.counts.items() if name in VIEW_OPS)


__all__ = ["VIEW_OPS", "OpCounter"]
