"""TP=1 through the tensor-parallel code path on one H200 (issue 31): does the path cost nothing?

Three engines of the same model (same seed, so the same weights) side by side in one process:

  plain    EngineCore as before (no process group)
  tp1      rank 0 of a one-rank NCCL group (--tensor-parallel-size 1 through the TP code: the
           model and runner take the group; a one-rank group issues no collective)
  tp1-nccl the same group with its collectives forced on: one NCCL all-reduce per attention and
           MLP block, the embedding's all-reduce and the logits all-gather, all of them inside the
           CUDA graphs (so this also checks that the graphs capture NCCL collectives)

Checks and measures:
  tokens  greedy tokens of 16 prompts (32 tokens each) equal across the three (dry run: 4 x 8)
  steps   decode step time (CUDA events, median) on a batch x context grid, in rounds that
          alternate the engines (plain twice per round: its spread is the noise floor);
          verdict: tp1 within max(2 %, 2 x noise) of plain; tp1-nccl's extra time per collective

    python benchmarks/tp/one_gpu.py --out DIR                # one H200, <= 2 min (--budget-s 110)
    python benchmarks/tp/one_gpu.py --dry-run --out DIR      # CPU, gloo, tiny model
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.tp.common import (
    Results,
    decode_steps,
    elapsed_s,
    environment,
    generate,
    log,
    prompts,
    start_clock,
)
from engine.core.config import EngineArgs
from engine.engine_loop import EngineCore
from engine.tp_worker import free_port, init_group, leave_group


@dataclasses.dataclass(frozen=True)
class Plan:
    model: str
    device: str
    dtype: str
    grid: tuple[tuple[int, int], ...]  # (batch, context)
    steps: int
    rounds: int
    engine: dict
    num_prompts: int = 16  # the greedy-token check: prompts x tokens each
    num_tokens: int = 32

    @classmethod
    def of(cls, dry: bool, model: str) -> Plan:
        if dry:
            return cls("tiny", "cpu", "float32", ((1, 32), (4, 64)), 4, 2,
                       {"max_num_seqs": 8, "max_num_batched_tokens": 128, "num_gpu_blocks_override": 256,
                        "max_model_len": 256, "block_size": 16}, num_prompts=4, num_tokens=8)
        return cls(model, "cuda", "bfloat16", ((1, 512), (16, 2048), (64, 2048), (64, 512)), 24, 2,
                   {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "max_cudagraph_capture_size": 512,
                    "num_gpu_blocks_override": 2048, "max_model_len": 4096, "block_size": 16})


def build(plan: Plan, tp=None) -> EngineCore:
    cfg = EngineArgs(model=plan.model, device=plan.device, dtype=plan.dtype, seed=0, usage_context="offline",
                     enable_prefix_caching=True, async_scheduling=False, **plan.engine)
    core = EngineCore(cfg, tp=tp, progress=lambda line: None)
    core.warm_up()
    return core


def tokens_phase(engines: dict[str, EngineCore], vocab: int, plan: Plan) -> dict:
    ps = prompts(plan.num_prompts, vocab, seed=1)
    out = {name: generate(core, ps, plan.num_tokens) for name, core in engines.items()}
    ref = out["plain"]
    return {"prompts": len(ps), "tokens_each": plan.num_tokens,
            "equal": {name: toks == ref for name, toks in out.items()},
            "first_tokens": {name: toks[0][:8] for name, toks in out.items()}}


def steps_phase(engines: dict[str, EngineCore], plan: Plan, vocab: int, budget_s: float) -> dict:
    """Rounds of the grid, each engine in turn (plain first and last: its spread is the noise)."""
    order = ["plain", *[n for n in engines if n != "plain"], "plain"]
    rows: list[dict] = []
    for r in range(plan.rounds):
        for batch, ctx in plan.grid:
            if elapsed_s() > budget_s - 8:
                log(f"steps: budget reached at round {r}")
                return summarize(rows, plan, engines)
            for k, name in enumerate(order):
                row = decode_steps(engines[name], batch, ctx, plan.steps, vocab)
                rows.append({"engine": name, "round": r, "slot": k, **row})
        log(f"steps: round {r} done")
    return summarize(rows, plan, engines)


def summarize(rows: list[dict], plan: Plan, engines: dict[str, EngineCore]) -> dict:
    """Per grid point: each engine's median step time over the rounds, tp1 / plain, the noise
    (plain's own spread between its two slots), and tp1-nccl's extra time per collective."""
    layers = engines["plain"].spec.num_layers
    collectives = 2 * layers + 2  # attention + MLP per layer, the embedding, the logits gather
    table = []
    for batch, ctx in plan.grid:
        pick = [x for x in rows if x["batch"] == batch and x["context"] == ctx and x["gpu_ms_p50"] is not None]
        if not pick:
            continue
        med = {n: statistics.median(x["gpu_ms_p50"] for x in pick if x["engine"] == n)
               for n in engines if any(x["engine"] == n for x in pick)}
        plain = [x["gpu_ms_p50"] for x in pick if x["engine"] == "plain"]
        noise = (max(plain) - min(plain)) / statistics.median(plain) if len(plain) > 1 else None
        ratio = med.get("tp1", float("nan")) / med["plain"]
        row = {"batch": batch, "context": ctx, "gpu_ms": med, "tp1_over_plain": ratio, "noise": noise,
               "tp1_equal_within_noise": abs(ratio - 1) <= max(0.02, 2 * (noise or 0))}
        if "tp1-nccl" in med:
            row["nccl_extra_us_per_collective"] = 1e3 * (med["tp1-nccl"] - med["plain"]) / collectives
        table.append(row)
    return {"collectives_per_step": collectives, "grid": table, "rows": rows,
            "verdict_tp1_costs_nothing": all(r["tp1_equal_within_noise"] for r in table) if table else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny model")
    ap.add_argument("--budget-s", type=float, default=110.0, help="phases past this are skipped")
    ap.add_argument("--model", default="llama-3.1-8b")
    a = ap.parse_args(argv)
    start_clock()
    plan = Plan.of(a.dry_run, a.model)
    res = Results(a.out, {"script": "benchmarks/tp/one_gpu.py", "argv": sys.argv[1:], "plan": dataclasses.asdict(plan),
                          "env": environment()})
    device = torch.device(plan.device if plan.device == "cpu" else "cuda:0")
    group = init_group(0, 1, f"tcp://127.0.0.1:{free_port()}", device)  # NCCL on the GPU, gloo on the CPU
    forced = dataclasses.replace(group, force_collectives=True, counts=dict.fromkeys(group.counts, 0))
    forced.all_reduce(torch.zeros(1, device=device))  # NCCL's communicator, before any capture
    forced.counts["all_reduce"] = 0
    engines: dict[str, EngineCore] = {}

    def build_all() -> dict:
        for name, tp in (("plain", None), ("tp1", group), ("tp1-nccl", forced)):
            engines[name] = build(plan, tp)
            log(f"built {name}: {engines[name].num_gpu_blocks} blocks, graph capture "
                f"{engines[name].graph_capture_s:.1f} s")
        return {"backend": str(torch.distributed.get_backend()), "collectives_captured": dict(forced.counts),
                "graphs": {n: e.runner.num_graph_captures for n, e in engines.items()}}

    res.phase("build", build_all, a.budget_s)
    vocab = engines["plain"].spec.vocab_size if "plain" in engines else 0
    if len(engines) == 3:
        res.phase("tokens", lambda: tokens_phase(engines, vocab, plan), a.budget_s)
        res.phase("steps", lambda: steps_phase(engines, plan, vocab, a.budget_s), a.budget_s)
    res.data["elapsed_s"] = round(elapsed_s(), 1)
    res.save()
    if device.type == "cuda":
        torch.cuda.synchronize()
    leave_group()  # bounded: after NCCL captures destroy_process_group can hang (pytorch#115388)
    tok = res.data["phases"].get("tokens", {}).get("value") or {}
    st = res.data["phases"].get("steps", {}).get("value") or {}
    log(f"tokens equal: {tok.get('equal')}; tp1 costs nothing: {st.get('verdict_tp1_costs_nothing')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
