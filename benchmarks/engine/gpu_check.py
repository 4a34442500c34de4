"""GPU correctness smoke check: the engine on CUDA (Triton kernels, CUDA graphs) gives the same
greedy tokens as on the CPU (torch reference attention), tiny model, fp32; plus one bf16 1B step.

`--graph-modes`: the same greedy tokens under cudagraph_mode FULL (decode + mixed graphs), FULL
with a small capture limit (larger steps eager), FULL_DECODE_ONLY and NONE (--enforce-eager),
sync and async, with each engine's graph replay counts; JSON lines into `--out`. `--dry-run`
runs it on the CPU (Triton interpreter: TRITON_INTERPRET=1, no graphs) to catch Python errors.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from engine.llm import LLM
from engine.model import LlamaModel
from engine.sampling import SamplingParams


def main() -> None:
    rng = np.random.default_rng(1)
    prompts = [rng.integers(16, 512, int(n)).tolist() for n in rng.integers(3, 200, 24)]
    sp = [SamplingParams(max_tokens=int(m), ignore_eos=True) for m in rng.integers(1, 40, 24)]
    kw = {"dtype": "float32", "max_num_seqs": 16, "max_num_batched_tokens": 128, "seed": 0}
    cpu_llm = LLM("tiny", device="cpu", **kw)
    cpu = cpu_llm.generate(prompts, sp)
    # Same weights on the GPU (a CUDA generator draws other numbers than the CPU one).
    spec = cpu_llm.engine.spec
    gpu_model = LlamaModel(spec, max_positions=cpu_llm.engine.max_model_len, device="cuda",
                           attention_backend="triton", seed=None)
    gpu_model.load_state_dict(cpu_llm.engine.model.state_dict())
    for mode in ("sync", "async"):
        gpu_llm = LLM("tiny", device="cuda", gpu_memory_utilization=0.2, llm_model=gpu_model,
                      async_scheduling=mode == "async", **kw)
        gpu = gpu_llm.generate(prompts, sp)
        same = [a.token_ids == b.token_ids for a, b in zip(cpu, gpu)]
        graphs = sorted(gpu_llm.engine.runner.graphs)
        decode_steps = sum(1 for t in gpu_llm.step_traces if t.num_prefill_seqs == 0)
        print(json.dumps({"mode": mode, "tiny_fp32_cuda_equals_cpu": all(same), "num_equal": sum(same),
                          "n": len(same), "backend": gpu_llm.engine.model.backend.name,
                          "num_graphs": len(graphs), "decode_only_steps": decode_steps}))
        first_diff = next((i for i, s in enumerate(same) if not s), None)
        if first_diff is not None:
            print("first diff", first_diff, cpu[first_diff].token_ids, gpu[first_diff].token_ids)
        del gpu_llm
    # Seeded sampling: the sampler's uniform number is a hash of (seed, tokens drawn), the same on
    # every device, so sampled tokens match the CPU's as greedy ones do (sync and async)
    sp_rand = [SamplingParams(max_tokens=s.max_tokens, ignore_eos=True, temperature=0.8, top_k=50 if i % 3 == 0
                              else -1, seed=1000 + i) for i, s in enumerate(sp)]
    cpu_r = LLM("tiny", device="cpu", **kw).generate(prompts, sp_rand)
    for mode in ("sync", "async"):
        gpu_r = LLM("tiny", device="cuda", gpu_memory_utilization=0.2, llm_model=gpu_model,
                    async_scheduling=mode == "async", **kw).generate(prompts, sp_rand)
        same = [a.token_ids == b.token_ids for a, b in zip(cpu_r, gpu_r)]
        print(json.dumps({"mode": f"{mode}+sampled", "cuda_sampled_equals_cpu": all(same), "num_equal": sum(same),
                          "n": len(same)}))
    print(json.dumps(sampler_leaves_the_host_free()))
    # Per-request stops under async scheduling: EOS honoured by even requests, ignored by odd ones.
    eos = cpu[0].token_ids[min(3, len(cpu[0].token_ids) - 1)]
    sp_eos = [SamplingParams(max_tokens=s.max_tokens, ignore_eos=i % 2 == 1) for i, s in enumerate(sp)]
    cpu_e = LLM("tiny", device="cpu", eos_token_id=eos, **kw).generate(prompts, sp_eos)
    gpu_e = LLM("tiny", device="cuda", gpu_memory_utilization=0.2, llm_model=gpu_model,
                async_scheduling=True, eos_token_id=eos, **kw).generate(prompts, sp_eos)
    same = [(a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason) for a, b in zip(cpu_e, gpu_e)]
    print(json.dumps({"mode": "async+eos", "cuda_async_equals_cpu_sync": all(same), "num_equal": sum(same),
                      "n": len(same), "num_stopped": sum(o.finish_reason == "stop" for o in gpu_e)}))


def sampler_leaves_the_host_free() -> dict:
    """Sampled rows drawn behind ~0.5 s of queued fp32 matmuls: `Sampler.sample` must return while
    that work still runs (a blocking host-to-device copy would wait for it, and under async
    scheduling the next step's launch with it). Also the draw equals the same draw made idle."""
    import torch

    from engine.sampling import Sampler

    dev = torch.device("cuda")
    logits = torch.randn(64, 151_936, device=dev)
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(64)]
    a, b = torch.randn(8192, 8192, device=dev), torch.randn(8192, 8192, device=dev)

    def draw(busy: bool) -> tuple[torch.Tensor, bool]:
        sampler = Sampler(dev)
        for i, p in enumerate(params):
            sampler.add_request(i, p)
        torch.cuda.synchronize()
        for _ in range(20 if busy else 0):  # 22 TFLOP of fp32 matmuls queued ahead of the sampler
            a @ b
        tokens = sampler.sample(logits, list(range(64)), params)
        still_busy = not torch.cuda.current_stream().query()
        return tokens.cpu(), still_busy

    busy_tokens, returned_early = draw(True)
    idle_tokens, _ = draw(False)
    return {"mode": "sampler-upload", "returned_while_device_busy": returned_early,
            "tokens_equal_idle": bool(torch.equal(busy_tokens, idle_tokens))}


# (label, engine arguments) of the graph-mode check; the first is the reference
GRAPH_MODES = (
    ("NONE", {"enforce_eager": True}),
    ("FULL_DECODE_ONLY", {"cudagraph_mode": "FULL_DECODE_ONLY"}),
    ("FULL", {"cudagraph_mode": "FULL"}),
    ("FULL-async", {"cudagraph_mode": "FULL", "async_scheduling": True}),
    # async decode graphs gather their in-flight tokens; the eager mixed steps gather in prepare
    ("FULL_DECODE_ONLY-async", {"cudagraph_mode": "FULL_DECODE_ONLY", "async_scheduling": True}),
    ("FULL-capture-40", {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 40}),
)


def graph_modes(out_dir: Path, budget_s: float, dry_run: bool) -> None:
    """Greedy tokens per cudagraph mode (tiny model, fp32): every mode equals NONE; counts of
    graph replays (mixed ones apart) and eager forwards show which path each step took.
    Prompts of 3..300 tokens at a budget of 96 tokens: chunked prefills beside decodes."""
    import gc

    import torch

    from kernels import _interpreter_compat

    _interpreter_compat.apply()  # a no-op unless TRITON_INTERPRET=1 (the CPU dry run)
    t0 = time.perf_counter()
    rng = np.random.default_rng(2)
    n = 6 if dry_run else 32
    prompts = [rng.integers(16, 512, int(k)).tolist() for k in rng.integers(3, 60 if dry_run else 300, n)]
    sp = [SamplingParams(max_tokens=int(m), ignore_eos=True) for m in rng.integers(1, 6 if dry_run else 40, n)]
    device = "cpu" if dry_run else "cuda"
    kw = {"dtype": "float32", "max_num_seqs": 16, "max_num_batched_tokens": 96, "seed": 0,
          "attention_backend": "triton", "device": device}
    if not dry_run:
        kw["gpu_memory_utilization"] = 0.2
    from engine.core.model_spec import get_model

    model = LlamaModel(get_model("tiny"), max_positions=2048, dtype=torch.float32,
                       device=device, attention_backend="triton", seed=0)
    out_dir.mkdir(parents=True, exist_ok=True)
    reference = None
    with open(out_dir / "graph_modes.jsonl", "w") as f:
        for label, args in GRAPH_MODES:
            if time.perf_counter() - t0 > budget_s:
                print(json.dumps({"mode": label, "skipped": "budget"}), file=f, flush=True)
                continue
            llm = LLM("tiny", llm_model=model, **(kw | args))
            tokens = [o.token_ids for o in llm.generate(prompts, sp)]
            reference = tokens if reference is None else reference
            r = llm.engine.runner
            row = {"mode": label, "tokens_equal_none": tokens == reference,
                   "num_equal": sum(a == b for a, b in zip(tokens, reference)), "n": len(prompts),
                   "graph_replays": r.num_graph_replays, "mixed_graph_replays": r.num_mixed_graph_replays,
                   "eager_forwards": r.num_eager_forwards, "graph_captures": r.num_graph_captures,
                   "capture_s": round(llm.engine.graph_capture_s, 2),
                   "mixed_steps": sum(1 for t in llm.step_traces if t.num_prefill_seqs > 0),
                   "device": device, "elapsed_s": round(time.perf_counter() - t0, 1)}
            print(json.dumps(row), file=f, flush=True)
            print(json.dumps(row), flush=True)
            del llm, r
            gc.collect()
            if not dry_run:
                torch.cuda.empty_cache()


def soak(seconds: float) -> None:
    """Prompts longer than the token budget (steps that only chunk a prefill sample nothing) under
    load, synchronous then async, with the llama-3.2-1b shape: every step's timing events must be
    readable, every request must finish, and nothing may compile after the warm-up."""
    import dataclasses

    from engine.core.config import EngineArgs
    from engine.engine_loop import EngineCore
    from engine.replay import replay
    from kernels import compiled_kernel_count
    from sim.workload_source import SourceOptions, load_workload

    reqs = list(load_workload("rag-long-prompt", SourceOptions(num_requests=4000, rate_rps=6.0)))
    reqs = [dataclasses.replace(r, prompt_len=min(r.prompt_len, 16384), prompt_token_ids=None,
                                hash_ids=r.hash_ids[: -(-min(r.prompt_len, 16384) // r.hash_block_size)])
            for r in reqs]
    import gc

    import torch

    gc.collect()  # the correctness engines above hold CUDA graph pools until their cycles are collected
    torch.cuda.empty_cache()
    core = EngineCore(EngineArgs(model="llama-3.2-1b", device="cuda", max_num_batched_tokens=8192,
                                 max_num_seqs=256, seed=0))
    warm = core.warm_up()
    for mode in ("sync", "async"):
        core.start_over(async_scheduling=mode == "async")
        before = compiled_kernel_count()
        res = replay(core, reqs, max_wall_s=seconds)
        steps = res.steps
        silent = int((steps["num_output_tokens"] == 0).sum())
        rows = res.request_rows()
        print(json.dumps({"mode": f"soak-{mode}", "seconds": seconds, "steps": int(steps["step_id"].size),
                          "steps_sampling_nothing": silent, "requests_finished": sum(r["status"] == "finished" for r in rows),
                          "requests_cut_at_time_limit": len(res.unfinished_ids), "max_prompt": max(r.prompt_len for r in reqs),
                          "kernels_compiled_after_warm_up": compiled_kernel_count() - before,
                          "warm_up_s": round(warm.seconds, 1), "warm_up_compiled": warm.kernels_compiled,
                          "gpu_s_all_finite": bool(np.isfinite(steps["gpu_s"]).all())}), flush=True)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--soak-s", type=float, default=0.0, help="also run the long-prompt soak this long per mode")
    ap.add_argument("--graph-modes", action="store_true", help="tokens equal across cudagraph modes")
    ap.add_argument("--dry-run", action="store_true", help="--graph-modes on the CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="--graph-modes: start no mode after this")
    ap.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="--graph-modes: JSON lines here")
    a = ap.parse_args()
    if a.graph_modes:
        graph_modes(a.out, a.budget_s, a.dry_run)
    elif a.soak_s <= 0:
        main()
    else:
        soak(a.soak_s)
