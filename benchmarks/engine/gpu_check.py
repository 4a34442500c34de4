"""GPU correctness smoke check: the engine on CUDA (Triton kernels, CUDA graphs) gives the same
greedy tokens as on the CPU (torch reference attention), tiny model, fp32; plus one bf16 1B step."""

from __future__ import annotations

import json
import sys
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
    # Per-request stops under async scheduling: EOS honoured by even requests, ignored by odd ones.
    eos = cpu[0].token_ids[min(3, len(cpu[0].token_ids) - 1)]
    sp_eos = [SamplingParams(max_tokens=s.max_tokens, ignore_eos=i % 2 == 1) for i, s in enumerate(sp)]
    cpu_e = LLM("tiny", device="cpu", eos_token_id=eos, **kw).generate(prompts, sp_eos)
    gpu_e = LLM("tiny", device="cuda", gpu_memory_utilization=0.2, llm_model=gpu_model,
                async_scheduling=True, eos_token_id=eos, **kw).generate(prompts, sp_eos)
    same = [(a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason) for a, b in zip(cpu_e, gpu_e)]
    print(json.dumps({"mode": "async+eos", "cuda_async_equals_cpu_sync": all(same), "num_equal": sum(same),
                      "n": len(same), "num_stopped": sum(o.finish_reason == "stop" for o in gpu_e)}))


if __name__ == "__main__":
    main()
