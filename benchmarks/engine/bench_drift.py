"""Does a step cost the same all run? One engine replays one workload several times.

On the H200 an eager forward of the same target took 4.8 -> 5.8 -> 7.9 ms over three successive
replays in one engine process while CUDA-graph replays stayed flat (benchmarks/spec_decode run 4).
This replays one workload `--replays` times in one `EngineCore` (synchronous scheduling, all
requests at t=0, so every replay schedules exactly the same steps), first with the GC heap left as
it is (`unfrozen`), then frozen for each replay (`frozen`, vLLM's `freeze_gc_heap` after warm-up;
engine/replay.py), and reports per replay: the eager and the graph steps' GPU time and launch time,
schedule / prepare / sample time per step, the GC's collections per generation and their pauses,
the pauses that fell inside eager steps, and the objects the GC tracks; plus each replay's eager GPU
time against the same mode's first replay, step for step (the same composition: a paired ratio).

    python3 benchmarks/engine/bench_drift.py --out DIR              # GPU: llama-3.2-1b shape, <= --budget-s
    python3 benchmarks/engine/bench_drift.py --tiny --out DIR       # CPU smoke test (TRITON_INTERPRET=1)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.core.run_summary import jsonable
from engine.engine_loop import EngineCore
from engine.replay import ReplayResult, replay

MODES = ("unfrozen", "frozen")


@dataclass(frozen=True, slots=True)
class Setup:
    """Model, engine limits and workload of one drift run."""

    model: str
    dtype: str
    num_requests: int
    prompt_lens: tuple[int, int]  # uniform [lo, hi)
    output_lens: tuple[int, int]
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


GPU_SETUP = Setup("llama-3.2-1b", "bfloat16", 384, (64, 1024), (32, 256), 64, 512, 2048)
TINY_SETUP = Setup("tiny", "float32", 24, (8, 64), (4, 16), 8, 64, 256)


def workload(s: Setup, seed: int = 0, block: int = 16) -> list[Request]:
    """`num_requests` prompts at t=0, no shared prefix (distinct hash ids)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(s.num_requests):
        p = int(rng.integers(*s.prompt_lens))
        n = -(-p // block)
        out.append(Request(request_id=i, arrival_s=0.0, prompt_len=p, output_len=int(rng.integers(*s.output_lens)),
                           hash_ids=tuple(range(i << 20, (i << 20) + n))))
    return out


def build_core(s: Setup, device: str) -> EngineCore:
    return EngineCore(EngineArgs(model=s.model, device=device, dtype=s.dtype, max_model_len=s.max_model_len,
                                 max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                                 gpu_memory_utilization=0.5, async_scheduling=False, seed=0))


def graph_mask(steps: dict[str, np.ndarray], core: EngineCore) -> np.ndarray:
    """Steps that replayed a decode CUDA graph: decode-only (one token each) within the largest graph."""
    if not core.runner.graphs:
        return np.zeros(steps["gpu_s"].shape, dtype=bool)
    n = steps["num_decode_seqs"]
    return ((steps["num_prefill_tokens"] == 0) & (steps["num_decode_tokens"] == n)
            & (n > 0) & (n <= max(core.runner.graphs)))


def _ms(x: np.ndarray, how: str = "mean") -> float | None:
    return float(1e3 * (np.median(x) if how == "median" else np.mean(x))) if x.size else None


def replay_stats(res: ReplayResult, core: EngineCore, wall_s: float) -> dict:
    """One replay's figures (milliseconds per step unless named otherwise)."""
    s = res.steps
    graph = graph_mask(s, core)
    eager = ~graph
    pause = res.step_gc_pause_s
    return {
        "wall_s": wall_s, "num_steps": int(s["gpu_s"].size), "num_eager": int(eager.sum()),
        "num_graph": int(graph.sum()),
        "eager_gpu_ms": {"mean": _ms(s["gpu_s"][eager]), "median": _ms(s["gpu_s"][eager], "median")},
        "eager_launch_ms": {"mean": _ms(res.step_launch_s[eager]), "median": _ms(res.step_launch_s[eager], "median")},
        "graph_gpu_ms": {"mean": _ms(s["gpu_s"][graph]), "median": _ms(s["gpu_s"][graph], "median")},
        "graph_launch_ms": {"mean": _ms(res.step_launch_s[graph]), "median": _ms(res.step_launch_s[graph], "median")},
        "host_ms": {k: _ms(s[k]) for k in ("schedule_s", "prepare_s", "sample_s")},
        "gc": res.gc_stats.as_dict() if res.gc_stats else None,
        "gc_pause_in_eager_steps_ms": float(1e3 * pause[eager].sum()),
        "gc_pause_in_graph_steps_ms": float(1e3 * pause[graph].sum()),
        "eager_steps_with_gc_pause": int((pause[eager] > 0).sum()),
    }


def paired_ratio(first: ReplayResult, later: ReplayResult, mask: np.ndarray) -> float | None:
    """Median over steps of later / first GPU time, when both replays scheduled the same steps."""
    a, b = first.steps, later.steps
    same = a["gpu_s"].size == b["gpu_s"].size and all(
        np.array_equal(a[c], b[c]) for c in ("num_prefill_tokens", "num_decode_seqs", "sum_decode_context"))
    if not same or not mask.any():
        return None
    return float(np.median(b["gpu_s"][mask] / a["gpu_s"][mask]))


def run_replays(core: EngineCore, reqs: list[Request], modes: list[str], replays: int, deadline: float,
                doc: dict, save) -> None:
    """`replays` rounds of one replay per mode, the modes interleaved (so a drift with the replay's
    index is not read as the mode's effect); starts no replay that would end past the deadline."""
    first: dict[str, ReplayResult] = {}
    for k in range(replays):
        for mode in modes:
            rows = doc["modes"].setdefault(mode, [])
            if time.perf_counter() + 1.5 * doc.get("last_replay_wall_s", 0.0) > deadline:
                doc["stopped_early"] = f"round {k}, {mode}: --budget-s reached"
                return
            core.start_over()
            t = time.perf_counter()
            res = replay(core, reqs, honor_arrivals=False, freeze_gc=(mode == "frozen"))
            row = replay_stats(res, core, time.perf_counter() - t)
            row["index_in_engine"] = doc["num_replays"] = doc.get("num_replays", 0) + 1
            eager = ~graph_mask(res.steps, core)
            if mode in first:
                row["eager_gpu_vs_first_paired"] = paired_ratio(first[mode], res, eager)
                row["graph_gpu_vs_first_paired"] = paired_ratio(first[mode], res, ~eager)
            first.setdefault(mode, res)
            rows.append(row)
            doc["last_replay_wall_s"] = row["wall_s"]
            print(f"{mode} replay {k}: {json.dumps(jsonable(row), default=float)[:400]}", flush=True)
            save()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for drift.json")
    ap.add_argument("--tiny", action="store_true", help="the tiny model and workload: a CPU smoke test")
    ap.add_argument("--dry-run", action="store_true", help="same as --tiny")
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of: unfrozen, frozen")
    ap.add_argument("--num-requests", type=int, help="override the workload's request count")
    ap.add_argument("--budget-s", type=float, default=80.0, help="start no replay that would end past this")
    ap.add_argument("--force", action="store_true", help="overwrite an existing drift.json")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    modes = [m for m in a.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        print(f"error: --modes: unknown {bad}; choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    out_file = a.out / "drift.json"
    if out_file.exists() and not a.force:
        print(f"error: {out_file} exists; pass --force to overwrite or choose another --out", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    setup = TINY_SETUP if (a.tiny or a.dry_run) else GPU_SETUP
    if a.num_requests:
        setup = Setup(**(asdict(setup) | {"num_requests": a.num_requests}))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    doc: dict = {"date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
                 "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "setup": asdict(setup),
                 "python": sys.version.split()[0], "torch": torch.__version__, "modes": {}}

    def save() -> None:
        out_file.write_text(json.dumps(jsonable(doc), indent=1, default=float) + "\n")

    core = build_core(setup, device)
    warm = core.warm_up()
    doc["warm_up_s"], doc["graphs"] = warm.seconds, sorted(core.runner.graphs)
    doc["build_and_warm_up_s"] = time.perf_counter() - t_start
    reqs = workload(setup)
    run_replays(core, reqs, modes, a.replays, t_start + a.budget_s, doc, save)
    doc["total_s"] = time.perf_counter() - t_start
    save()
    print(f"wrote {out_file} ({doc['total_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
