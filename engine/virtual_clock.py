"""The engine's own loop on a virtual clock, with step times given by the caller.

`EngineCore` (schedule, prepare, launch, collect, update; synchronous or async) and
engine/replay.py's arrival loop run unchanged, and the model computes for real (a small model
on the CPU), but no wall clock is read: each step's host part advances a virtual clock by
`step_times(out).host_s`, and its device part occupies a virtual stream for `device_s`, on
which stand-ins for CUDA events (`record` at the stream's end, `synchronize`, `elapsed_time`)
and the sampler's read-back wait.

With the simulator's cost model as `step_times`, a replay is what the engine would measure if
every step took exactly what the simulator charges for it: its schedule (which arrivals each
step admits, which decodes a step leaves out), its token times and its inter-token gaps then
come from the engine's code, an independent reference for the simulator's loop
(tests/sim/test_engine_clock.py). Deterministic: the same inputs give the same run.

    with virtual_clock(core, step_times) as clock:
        res = replay(core, requests)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import engine.engine_loop as engine_loop_module
import engine.replay as replay_module
from engine.core.scheduler_output import SchedulerOutput
from engine.engine_loop import EngineCore


@dataclass(frozen=True, slots=True)
class StepTimes:
    """One step: host seconds before its launch, device seconds on the stream, and host seconds
    of the launch itself (an eager step's kernels one by one), during which the device work runs."""

    host_s: float
    device_s: float
    launch_s: float = 0.0
    # the launch returns no earlier than this much of the step's device work has run (a host that
    # blocks on a full launch queue; at most device_s)
    blocked_s: float = 0.0


class VirtualClock:
    """A clock that moves only when told to, and one device stream."""

    def __init__(self) -> None:
        self.now = 0.0
        self.stream_end_s = 0.0  # when the work launched so far ends

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)

    def wait_until(self, t: float) -> None:
        self.now = max(self.now, t)

    def launch(self, device_s: float) -> None:
        """Queue `device_s` of work: it starts when the stream is free, or now."""
        self.stream_end_s = max(self.now, self.stream_end_s) + device_s


class _Event:
    """torch.cuda.Event's contract on the virtual stream."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.t = 0.0

    def record(self) -> None:
        self.t = max(self.clock.now, self.clock.stream_end_s)

    def synchronize(self) -> None:
        self.clock.wait_until(self.t)

    def elapsed_time(self, end: _Event) -> float:
        return (end.t - self.t) * 1e3  # milliseconds, as CUDA's


@contextmanager
def virtual_clock(core: EngineCore, step_times: Callable[[SchedulerOutput], StepTimes]) -> Iterator[VirtualClock]:
    """Run `core` on a virtual clock for the block (see the module's note). Enter it after any
    `start_over()` (which replaces the scheduler it watches)."""
    clock = VirtualClock()
    fake_time = SimpleNamespace(perf_counter=clock.perf_counter, sleep=clock.sleep)
    last: list[StepTimes] = []  # the times of the step scheduled last
    sched, runner = core.scheduler, core.runner
    saved: list[tuple[Any, str, Any]] = [(engine_loop_module, "time", engine_loop_module.time),
                                         (replay_module, "time", replay_module.time)]
    schedule, prepare, forward, sample = sched.schedule, runner.prepare, runner.forward, core.sample_step

    def timed_schedule() -> SchedulerOutput:
        out = schedule()
        last[:] = [step_times(out)] if out.num_batched_tokens else []
        return out

    def timed_prepare(*args: Any, **kwargs: Any) -> Any:
        clock.sleep(last[0].host_s)
        return prepare(*args, **kwargs)

    def timed_forward(*args: Any, **kwargs: Any) -> Any:
        logits = forward(*args, **kwargs)
        times = last[0]
        start = max(clock.now, clock.stream_end_s)
        clock.launch(max(times.device_s, times.launch_s))  # the device starts on the first kernel
        clock.sleep(times.launch_s)
        clock.wait_until(start + times.blocked_s)
        return logits

    def synced_sample(*args: Any, **kwargs: Any) -> Any:
        clock.wait_until(clock.stream_end_s)  # the read-back of the sampled tokens waits for the step
        return sample(*args, **kwargs)

    patches = [(engine_loop_module, "time", fake_time), (replay_module, "time", fake_time),
               (sched, "schedule", timed_schedule), (runner, "prepare", timed_prepare),
               (runner, "forward", timed_forward), (core, "sample_step", synced_sample),
               (core, "_use_events", True), (core, "_new_event", lambda: _Event(clock))]
    saved += [(obj, name, obj.__dict__.get(name)) for obj, name, _ in patches[2:]]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        yield clock
    finally:
        for obj, name, value in saved:
            if value is None and obj is not engine_loop_module and obj is not replay_module:
                delattr(obj, name)  # an instance attribute over its class's
            else:
                setattr(obj, name, value)


__all__ = ["StepTimes", "VirtualClock", "virtual_clock"]
