"""What the tensor-parallel benchmarks share: greedy tokens of a fixed prompt set, decode step
times on a batch x context grid (through the real engine step path), the environment, and a
results file rewritten after every phase (so a killed run still leaves what it measured)."""

from __future__ import annotations

import json
import math
import platform
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.core.request import Request
from engine.engine_loop import EngineCore, content_hash_ids
from engine.sampling import SamplingParams

T0 = time.perf_counter()


def log(*a: Any) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def elapsed_s() -> float:
    return time.perf_counter() - T0


def start_clock() -> None:
    """Budgets count from here (a script's main; its tests call main in a longer process)."""
    global T0
    T0 = time.perf_counter()


def environment() -> dict:
    """Versions, GPUs and the commit the numbers come from."""
    env = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit()}
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            pass
    return env


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Results:
    """results.json under `out`, rewritten after each phase; a phase's exception is recorded."""

    def __init__(self, out: Path, header: dict) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "results.json"
        self.data: dict[str, Any] = {**header, "phases": {}}
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=2, default=_jsonable) + "\n")

    def phase(self, name: str, fn: Callable[[], Any], budget_s: float, min_left_s: float = 10.0) -> Any:
        """Run one phase unless the budget is spent; its value (or its error) into the file."""
        if elapsed_s() > budget_s - min_left_s:
            self.data["phases"][name] = {"skipped": f"budget: {elapsed_s():.0f} s of {budget_s:.0f} s used"}
            log(f"SKIP {name}")
            self.save()
            return None
        t = time.perf_counter()
        try:
            value = fn()
            self.data["phases"][name] = {"seconds": round(time.perf_counter() - t, 2), "value": value}
        except Exception as e:  # noqa: BLE001 - a phase's failure is a result; the next phase still runs
            value = None
            self.data["phases"][name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            log(f"FAILED {name}: {e}")
        self.save()
        return value


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def prompts(n: int, vocab: int, seed: int = 0, min_len: int = 5, max_len: int = 60) -> list[list[int]]:
    """`n` random prompts of random lengths (token ids from 16 up: the byte-token range)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(16, vocab, (k,), generator=g).tolist() for k in lens]


def generate(core: EngineCore, prompt_ids: list[list[int]], max_tokens: int, first_id: int = 0) -> list[list[int]]:
    """Greedy tokens of every prompt, through the engine's step loop."""
    core.start_over()
    for i, p in enumerate(prompt_ids):
        req = Request(request_id=first_id + i, arrival_s=0.0, prompt_len=len(p), output_len=max_tokens,
                      hash_ids=content_hash_ids(p, 16), prompt_token_ids=tuple(p))
        core.add_request(req, SamplingParams(max_tokens=max_tokens, ignore_eos=True), p)
    done: dict[int, list[int]] = {}
    while core.has_unfinished():
        for st in core.step().finished:
            done[st.request.request_id] = st.output_token_ids
    return [done[first_id + i] for i in range(len(prompt_ids))]


def decode_steps(core: EngineCore, batch: int, context: int, steps: int, vocab: int) -> dict:
    """`batch` requests of one `context`-token prompt (shared, so prefix caching prefills it once),
    then `steps` decode steps of all of them: median device (CUDA events) and wall seconds of the
    decode-only steps, and every such step's record."""
    core.start_over()
    g = torch.Generator().manual_seed(context)
    prompt = torch.randint(16, vocab, (context,), generator=g).tolist()
    hashes = content_hash_ids(prompt, 16)
    for i in range(batch):
        req = Request(request_id=i, arrival_s=0.0, prompt_len=context, output_len=steps + 2,
                      hash_ids=hashes, prompt_token_ids=tuple(prompt))
        core.add_request(req, SamplingParams(max_tokens=steps + 2, ignore_eos=True), prompt)
    rows = []
    while core.has_unfinished():
        tr = core.step().trace
        if tr is not None and tr.num_prefill_tokens == 0 and tr.num_decode_seqs == batch:
            rows.append(tr)
    gpu = [r.gpu_s for r in rows]
    wall = [r.total_s for r in rows]
    return {"batch": batch, "context": context, "steps": len(rows),
            "gpu_ms_p50": 1e3 * statistics.median(gpu) if gpu else None,
            "wall_ms_p50": 1e3 * statistics.median(wall) if wall else None,
            "gpu_ms_min": 1e3 * min(gpu) if gpu else None}


__all__ = ["Results", "decode_steps", "elapsed_s", "environment", "generate", "log", "prompts", "start_clock"]
