"""Tensor parallelism on two H200s (issue 31): all-reduce by message size, step times at TP=1 and
TP=2, end-to-end serving runs, and the step traces `costline calibrate --tp` fits from.

ONE call, <= 9.5 minutes (--budget-s 570: a part that would start past it is skipped, and each part
runs in its own process under a timeout, so a hung collective costs that part only). Parts, in order:

  collectives  2 ranks, NCCL: the engine's all-reduce (in CUDA graphs) vs a plain NCCL bus-bandwidth
               loop, 4 KiB .. 256 MiB and the model's [tokens, hidden] sizes; the step message
               (gloo) and sampled-token broadcast costs                   -> collectives.json
  8b-tp1       llama-3.1-8b shape, one GPU: decode grid (batch x context), prefill ladder, mixed
               chat traffic (fit runs), two chat-production serving runs (held out)
                                                                           -> runs/llama-3.1-8b/tp1/...
  8b-tp2       the same at --tensor-parallel-size 2 (greedy tokens checked against 8b-tp1's)
  70b40-tp1    llama-3.1-70b shape cut to 40 layers (73 GB of bf16 weights: fits one GPU, so TP=1 and
               TP=2 compare on the same model; said so in every run.json): decode grid, prefills
  70b40-tp2    the same at TP=2
  70b-tp2      the whole 80-layer 70B shape (140 GB: needs both GPUs) at TP=2: a small decode grid

Every engine run is a run folder (requests.jsonl, steps.jsonl, summary.json, run.json with the
engine args incl. tensor_parallel_size, the model shape, GPU, commit); results.json holds every
part's summary; tp_fit.json the TP terms fitted from the decode/prefill runs (sim/tp_fit.py), the
serving runs held out.

    python benchmarks/tp/h200x2.py --out DIR                 # two H200s (nvidia-h200-x2)
    python benchmarks/tp/h200x2.py --dry-run --out DIR       # CPU, gloo, 2 processes, tiny models
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.tp.common import Results, elapsed_s, environment, log, start_clock

# (part, seconds it may take at most on the GPUs)
PARTS: tuple[tuple[str, float], ...] = (("collectives", 60), ("8b-tp1", 110), ("8b-tp2", 125),
                                        ("70b40-tp1", 100), ("70b40-tp2", 110), ("70b-tp2", 80))


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """One model part: which shape, TP size, and the runs it makes."""

    base: str  # preset the shape comes from
    layers: int | None  # cut to this many layers (None: the preset's)
    tp: int
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    decode_steps: int
    prefill_lens: tuple[int, ...]
    mixed_rps: float  # a fit run of chat-production traffic (another seed than the serving runs)
    mixed_s: float
    serving: tuple[float, ...]  # chat-production request rates (req/s); () = none
    serving_s: float
    engine: dict

    @property
    def name(self) -> str:
        return self.base if self.layers is None else f"{self.base}-{self.layers}l"


def model_plan(part: str, dry: bool) -> ModelPlan:
    shape, tp = part.rsplit("-tp", 1)
    if dry:
        layers = {"8b": None, "70b40": 4, "70b": 6}[shape]
        # arrivals 16/s, not 4: the replays honour arrival times, and at 4/s the two timed runs waited
        # ~4 s of wall time per part for 8 requests each
        return ModelPlan("tiny", layers, int(tp), (1, 4), (32, 96), 4, (40, 150), 16.0, 0.5,
                         (16.0,) if shape == "8b" else (), 0.5, {"max_num_seqs": 8, "max_num_batched_tokens": 128, "max_model_len": 512,
                               "num_gpu_blocks_override": 256, "block_size": 16, "dtype": "float32",
                               "device": "cpu"})
    gpu = {"max_num_seqs": 128, "max_num_batched_tokens": 8192, "max_model_len": 8192,
           "max_cudagraph_capture_size": 512, "gpu_memory_utilization": 0.85, "dtype": "bfloat16", "device": "cuda"}
    ladder = (128, 512, 1024, 2048, 4096, 8192) * 2
    if shape == "8b":
        return ModelPlan("llama-3.1-8b", None, int(tp), (1, 8, 32, 128), (512, 4096), 24, ladder, 8.0, 10.0,
                         (4.0, 12.0), 12.0, gpu)
    if shape == "70b40":
        return ModelPlan("llama-3.1-70b", 40, int(tp), (1, 8, 32, 128), (512, 4096), 16, ladder, 3.0, 8.0, (),
                         0.0, gpu)
    return ModelPlan("llama-3.1-70b", None, int(tp), (1, 32, 128), (1024,), 12, (2048,), 0.0, 0.0, (), 0.0, gpu)


# --------------------------------------------------------------------------- one part (own process)
def run_model_part(part: str, out: Path, dry: bool, deadline_s: float) -> dict:
    """Build the engine (TP ranks spawned by EngineCore), run the decode grid, prefills and serving."""
    import torch

    from benchmarks.calibration.gpu_sweep import Ids, reload, workload_requests, write_requests
    from engine.core.config import EngineArgs
    from engine.core.model_spec import MODEL_PRESETS, get_model
    from engine.engine_loop import EngineCore
    from engine.replay import replay

    plan = model_plan(part, dry)
    spec = get_model(plan.base)
    if plan.layers is not None:  # a shape of our own: rank 0 finds it by name, the workers get it sent
        spec = spec.model_copy(update={"name": plan.name, "num_layers": plan.layers})
        MODEL_PRESETS[plan.name] = spec
    cfg = EngineArgs(model=plan.name, seed=0, tensor_parallel_size=plan.tp, enable_prefix_caching=True,
                     **plan.engine)
    t = time.perf_counter()
    core = EngineCore(cfg, progress=lambda line: log(f"{part}: {line}"))
    warm = core.warm_up()
    start_s = time.perf_counter() - t
    gpu = torch.cuda.get_device_name() if core.runner.is_cuda else "cpu"
    meta = {"gpu": "h200" if "H200" in gpu else gpu, "model_shape": spec.model_dump(mode="json"),
            "model_note": (f"{plan.base} shape cut to {plan.layers} layers (random bf16 weights)"
                           if plan.layers is not None else f"{plan.base} shape (random weights)"),
            "tensor_parallel_size": plan.tp, "env": environment(), "warm_up_s": warm.seconds}
    folder_of = lambda purpose, name: out / "runs" / plan.name / f"tp{plan.tp}" / purpose / name
    index, ids = [], Ids()

    def one(purpose: str, name: str, reqs, honor: bool, max_wall_s: float) -> None:
        left = deadline_s - elapsed_s()
        if left < 10:
            index.append({"purpose": purpose, "name": name, "skipped": f"{left:.0f} s left"})
            return
        folder = folder_of(purpose, name)
        folder.mkdir(parents=True, exist_ok=True)
        write_requests(reqs, folder / "workload.jsonl")
        reqs = reload(folder / "workload.jsonl", reqs[0].hash_block_size)
        core.start_over()
        w = time.perf_counter()
        res = replay(core, reqs, honor_arrivals=honor, max_wall_s=min(max_wall_s, left - 5))
        summary = res.write_files(folder)
        run = {"schema": "costline-engine-run/1", "name": name, "purpose": purpose, "model": plan.name,
               "engine_args": core.config.model_dump(mode="json"), "hash_block_size": reqs[0].hash_block_size,
               "honor_arrivals": honor, "num_gpu_blocks": core.num_gpu_blocks, "memory": core.runner.memory_report,
               "unfinished_ids": len(res.unfinished_ids), "wall_s": time.perf_counter() - w, **meta}
        (folder / "run.json").write_text(json.dumps(run, indent=2) + "\n")
        index.append({"purpose": purpose, "name": name, "steps": len(res.steps["step_id"]),
                      "tpot_p50_ms": summary.get("median_tpot_ms"), "ttft_p50_ms": summary.get("median_ttft_ms"),
                      "out_tok_per_s": summary.get("output_throughput"), "unfinished": len(res.unfinished_ids)})
        log(f"{part}: {json.dumps(index[-1])}")

    for ctx in plan.contexts:  # decode grid: B requests sharing one prompt (prefilled once), all at t=0
        for b in plan.batches:
            prefix = ids.request(0.0, ctx, 1).hash_ids
            reqs = [ids.request(0.0, ctx, plan.decode_steps, prefix=prefix[: ctx // 16]) for _ in range(b)]
            one("fit", f"decode-b{b}-c{ctx}", reqs, False, 60.0)
    reqs = [ids.request(0.5 * i, n, 1) for i, n in enumerate(plan.prefill_lens)]  # prefills, one at a time
    one("fit", "prefill-ladder", reqs, True, 30.0)
    if plan.mixed_rps:  # prefill chunks beside decodes, for the fit (another seed than the serving runs)
        reqs = workload_requests("chat-production", max(8, int(plan.mixed_rps * plan.mixed_s)), plan.mixed_rps,
                                 plan.engine["max_model_len"] // 2, other_slice=True)
        one("fit", f"chat-other-seed-{plan.mixed_rps:g}rps", reqs, True, plan.mixed_s * 2)
    for rate in plan.serving:  # held out: the fit never sees them
        reqs = workload_requests("chat-production", max(8, int(rate * plan.serving_s)), rate,
                                 plan.engine["max_model_len"] // 2)
        one("validation", f"chat-{rate:g}rps", reqs, True, plan.serving_s * 3)
    tokens = greedy_check(core, spec.vocab_size)
    core.close()
    return {"part": part, "model": plan.name, "tp": plan.tp, "start_s": start_s, "blocks": core.num_gpu_blocks,
            "graph_capture_s": core.graph_capture_s, "runs": index, "greedy_tokens": tokens,
            "memory": core.runner.memory_report}


def greedy_check(core, vocab: int) -> list[list[int]]:
    """Greedy tokens of 4 fixed prompts (compared across TP sizes by the parent)."""
    from benchmarks.tp.common import generate, prompts

    return generate(core, prompts(4, vocab, seed=5), 16, first_id=10**6)


def run_part(part: str, out: Path, dry: bool, deadline_s: float) -> dict:
    if part == "collectives":
        from benchmarks.tp.collectives import run

        return run(2, "cpu" if dry else "cuda", dry, out / "collectives.json")
    return run_model_part(part, out, dry, deadline_s)


# --------------------------------------------------------------------------- the orchestrator
def spawn_part(part: str, limit_s: float, a: argparse.Namespace) -> dict:
    """The part in a child process under `limit_s`; its result (or why there is none)."""
    out_json = a.out / "parts" / f"{part}.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part, "--out", str(a.out),
           "--part-deadline-s", str(limit_s - 5)] + (["--dry-run"] if a.dry_run else [])
    # its own session: on a timeout the part AND the TP workers its engine spawned are killed together
    # (a SIGKILLed parent leaves daemon children running, holding their GPU)
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {"error": f"timed out after {limit_s:.0f} s (a hung collective or a slow start)"}
    if out_json.exists():
        return json.loads(out_json.read_text())
    return {"error": f"exit code {proc.returncode}, no result (see the log)"}


def compare(parts: dict) -> dict:
    """TP=2 over TP=1 per decode grid point, and greedy tokens equal across TP sizes."""
    out = {}
    for shape in ("8b", "70b40"):
        one, two = parts.get(f"{shape}-tp1", {}), parts.get(f"{shape}-tp2", {})
        if "runs" not in one or "runs" not in two:
            continue
        r1 = {r["name"]: r for r in one["runs"] if "tpot_p50_ms" in r}
        r2 = {r["name"]: r for r in two["runs"] if "tpot_p50_ms" in r}
        out[shape] = {"tokens_equal": one.get("greedy_tokens") == two.get("greedy_tokens"),
                      "tpot_tp2_over_tp1": {n: (r2[n]["tpot_p50_ms"] / r1[n]["tpot_p50_ms"])
                                            for n in r1 if n in r2 and r1[n]["tpot_p50_ms"] and r2[n]["tpot_p50_ms"]}}
    return out


def fit(out: Path) -> dict:
    """The TP terms from this call's runs (sim/tp_fit.py), written to tp_fit.json."""
    from sim.tp_fit import fit_from_folder

    result = fit_from_folder(out)
    (out / "tp_fit.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU, gloo, 2 processes, tiny models")
    ap.add_argument("--budget-s", type=float, default=570.0, help="a part that would start past this is skipped")
    ap.add_argument("--parts", default=",".join(p for p, _ in PARTS))
    ap.add_argument("--part", help=argparse.SUPPRESS)  # a child process: run this one part
    ap.add_argument("--part-deadline-s", type=float, default=1e9, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    start_clock()
    if a.part:
        value = run_part(a.part, a.out, a.dry_run, a.part_deadline_s)
        (a.out / "parts" / f"{a.part}.json").write_text(json.dumps(value, indent=2, default=str) + "\n")
        return 0
    res = Results(a.out, {"script": "benchmarks/tp/h200x2.py", "argv": sys.argv[1:], "env": environment()})
    wanted = set(a.parts.split(","))
    parts: dict[str, dict] = {}
    for part, max_s in PARTS:
        if part not in wanted:
            continue
        limit = min(max_s * (4 if a.dry_run else 1), a.budget_s - elapsed_s())
        if limit < 30:
            parts[part] = {"skipped": f"budget: {elapsed_s():.0f} s of {a.budget_s:.0f} s used"}
            continue
        log(f"part {part} (<= {limit:.0f} s)")
        parts[part] = spawn_part(part, limit, a)
        res.data["phases"][part] = parts[part]
        res.save()
    res.phase("compare", lambda: compare(parts), 1e9)
    res.phase("fit", lambda: fit(a.out), 1e9)
    res.data["elapsed_s"] = round(elapsed_s(), 1)
    res.save()
    log(f"done in {elapsed_s():.0f} s: {json.dumps(res.data['phases'].get('compare'))[:400]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
