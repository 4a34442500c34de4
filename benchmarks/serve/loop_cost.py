"""How much the HTTP side slows the engine's step loop, without a GPU: a stub engine core whose
step sleeps `--step-ms` (a GPU step releases the GIL the same way) and then does the per-step
Python bookkeeping of N running requests, served by the real server (`AsyncEngine` + FastAPI +
uvicorn); the streaming load client runs in another process, as against a real deployment.

    python benchmarks/serve/loop_cost.py --streams 256 --step-ms 7 --tokens 200

Prints the engine's step period with and without clients reading the streams: the stretch is
what the event loop's work (SSE chunks, one per token per stream) costs the engine through the GIL.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.engine_loop import StepResult
from engine.serve.api import ServedModel
from engine.serve.async_engine import AsyncEngine
from engine.serve.server import GIL_SWITCH_INTERVAL_S, ServerThread
from engine.serve.tokenizers import WordTokenizer


class StubCore:
    """What AsyncEngine needs of EngineCore; a step = sleep (the GPU) + a token per running request."""

    def __init__(self, step_s: float) -> None:
        self.config = SimpleNamespace(block_size=16)
        self.epoch = time.perf_counter()
        self.requests: dict[int, SimpleNamespace] = {}
        self.live: dict[int, list[int]] = {}
        self.step_s = step_s
        self.steps: list[float] = []
        self.thread_cpu_s = 0.0

    def add_request(self, req, params, ids, arrival_s=None) -> None:
        self.live[req.request_id] = [params.max_tokens, 0]
        self.requests[req.request_id] = SimpleNamespace(finished_s=None, request=req, finish_reason=None,
                                                        status="running")

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def abort_requests(self, ids) -> list:
        for rid in ids:
            self.live.pop(rid, None)
        return []

    def step(self) -> StepResult:
        t = time.perf_counter()
        time.sleep(self.step_s)
        c = time.thread_time()
        new, done = {}, []
        for rid, st in list(self.live.items()):
            st[1] += 1
            new[rid] = [16 + (rid * 31 + st[1]) % 400]
            if st[1] >= st[0]:
                del self.live[rid]
                s = self.requests[rid]
                s.finish_reason, s.status, s.finished_s = "length", "finished", 0.0
                done.append(s)
        self.thread_cpu_s += time.thread_time() - c
        self.steps.append(time.perf_counter() - t)
        return StepResult(new, done, None)


CLIENT = """
import asyncio, json, sys
sys.path.insert(0, {root!r})
from engine.serve.load_client import ClientRequest, run_load
reqs = [ClientRequest(prompt="a b c d", prompt_len=4, max_tokens={tokens}) for _ in range({streams})]
res, dur = asyncio.run(run_load({url!r}, "stub", reqs, [0.0] * {streams}))
print(json.dumps({{"ok": sum(r.success for r in res), "duration": dur,
                  "chunks": sum(len(r.itls_s) + 1 for r in res if r.success)}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--step-ms", type=float, default=7.0)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--switch-interval-s", type=float, default=GIL_SWITCH_INTERVAL_S)
    a = ap.parse_args()
    sys.setswitchinterval(a.switch_interval_s)
    core = StubCore(a.step_ms / 1e3)
    model = ServedModel(engine=AsyncEngine(core), tokenizer=WordTokenizer(512), names=("stub",),
                        max_model_len=1 << 20, vocab_size=512)
    with ServerThread(model) as url:
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        code = CLIENT.format(root=str(ROOT), tokens=a.tokens, streams=a.streams, url=url)
        out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                        check=True).stdout.splitlines()[-1])
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    # CPU seconds of this process beside the engine thread's own: the event loop (HTTP, SSE)
    loop_cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) - core.thread_cpu_s
    steps = sorted(core.steps[5:-5]) or [0.0]
    period = sum(steps) / len(steps)
    print(json.dumps({"streams": a.streams, "step_ms": a.step_ms, "switch_interval_s": a.switch_interval_s,
                      "requests_ok": out["ok"], "tokens": a.streams * a.tokens, "chunks": out["chunks"],
                      "tokens_per_chunk": a.streams * a.tokens / max(1, out["chunks"]),
                      "mean_step_ms": 1e3 * period, "median_step_ms": 1e3 * steps[len(steps) // 2],
                      "stretch": period / (a.step_ms / 1e3) - 1, "duration_s": out["duration"],
                      "loop_cpu_s": loop_cpu, "loop_cpu_us_per_chunk": 1e6 * loop_cpu / max(1, out["chunks"]),
                      "engine_thread_cpu_s": core.thread_cpu_s}))


if __name__ == "__main__":
    main()
