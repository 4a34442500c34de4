"""GPU benchmark of the engine (issue 6), with the Hugging Face baselines and a roofline bound.

Part A: Llama-3.2-1B shape, random bf16 weights, 128 requests (prompts U[64,1024], outputs
U[32,256], seed 0, ignore_eos), all submitted at t=0. Our engine, then HF `generate()` in static
batches of 64, then HF `generate_batch()` (continuous batching). Bandwidth (device copy) and bf16
matmul rate are measured in the same run and give the roofline bound of this workload.
Part B: Llama-3.1-8B shape on the 1,000-request Mooncake sample (prompts capped, arrivals
time-scaled), timed replay: throughput, TTFT/TPOT percentiles, preemptions, prefix hit rate.

    python benchmarks/engine/bench_gpu.py --out DIR            # full (H200)
    python benchmarks/engine/bench_gpu.py --tiny --out DIR     # seconds, CPU or GPU: smoke test
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.llm import LLM
from engine.model_spec import ModelSpec, get_model
from engine.replay import replay
from engine.request import Request
from engine.sampling import SamplingParams

HERE = Path(__file__).resolve().parent


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------------- machine rates
def measure_copy_gbps(device: str, nbytes: int = 2 << 30, iters: int = 10) -> float:
    """Device-to-device copy bandwidth, counting bytes read + bytes written."""
    n = nbytes // 2
    a = torch.empty(n, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        b.copy_(a)
    sync()
    dt_s = (time.perf_counter() - t) / iters
    del a, b
    return 2 * n * 2 / dt_s / 1e9


def measure_matmul_tflops(device: str, n: int = 8192, iters: int = 20) -> float:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync()
    dt_s = (time.perf_counter() - t) / iters
    return 2 * n**3 / dt_s / 1e12


def roofline(spec: ModelSpec, prompts: list[int], outputs: list[int], max_num_seqs: int,
             copy_gbps: float, tflops: float) -> dict:
    """Lower bound on the time of this workload on this GPU.

    Memory: every decode step reads all weights once, and each generated token reads the KV of
    its context; the fewest decode steps is max(output) (all requests decode together when they
    fit in max_num_seqs) times ceil(#requests / max_num_seqs). Compute: 2 x matmul params per
    token (prompt and generated) plus causal attention over the prompts. Both at the rates
    measured in this run. `bound_sum_s` adds the two (prefill compute and decode streaming do
    not overlap); `bound_max_s` is the looser max of the two.
    """
    wbytes = spec.weight_bytes()
    kv_tok = spec.kv_bytes_per_token()
    waves = math.ceil(len(prompts) / max_num_seqs)
    steps = max(outputs) * waves
    kv_read = sum(kv_tok * (p * o + o * (o - 1) / 2) for p, o in zip(prompts, outputs))
    mem_s = (steps * wbytes + kv_read) / (copy_gbps * 1e9)
    params = spec.num_matmul_params_per_token
    attn_flops = sum(4 * spec.num_layers * spec.num_heads * spec.head_dim * p * p / 2 for p in prompts)
    flops = 2 * params * (sum(prompts) + sum(outputs)) + attn_flops
    comp_s = flops / (tflops * 1e12)
    out_tok = sum(outputs)
    return {
        "decode_steps_min": steps, "weight_bytes": wbytes, "kv_bytes_read": kv_read,
        "memory_s": mem_s, "flops": flops, "compute_s": comp_s,
        "bound_sum_s": mem_s + comp_s, "bound_max_s": max(mem_s, comp_s),
        "output_tokens_per_s_bound_sum": out_tok / (mem_s + comp_s),
        "output_tokens_per_s_bound_max": out_tok / max(mem_s, comp_s),
    }


# ---------------------------------------------------------------------- part A
def workload_a(n: int, seed: int, vocab: int, p_lo: int, p_hi: int, o_lo: int, o_hi: int):
    rng = np.random.default_rng(seed)
    plens = rng.integers(p_lo, p_hi + 1, n)
    olens = rng.integers(o_lo, o_hi + 1, n)
    prompts = [rng.integers(16, vocab, int(p)).tolist() for p in plens]
    return prompts, [int(o) for o in olens]


def run_ours(model: str, prompts, outputs, device: str, dtype: str, util: float,
             async_scheduling: bool) -> dict:
    t = time.perf_counter()
    llm = LLM(model, device=device, dtype=dtype, gpu_memory_utilization=util, max_model_len=2048,
              max_num_seqs=256, max_num_batched_tokens=8192, async_scheduling=async_scheduling)
    init_s = time.perf_counter() - t
    # Warm-up: compile the prefill/mixed-batch kernel shapes outside the timed region.
    llm.generate(prompts[:4], [SamplingParams(max_tokens=4, ignore_eos=True)] * 4)
    llm.step_traces.clear()
    sync()
    t = time.perf_counter()
    outs = llm.generate(prompts, [SamplingParams(max_tokens=o, ignore_eos=True) for o in outputs])
    sync()
    wall = time.perf_counter() - t
    gen = sum(len(o.token_ids) for o in outs)
    assert gen == sum(outputs), (gen, sum(outputs))
    tr = llm.step_traces
    dec = [s for s in tr if s["num_prefill_seqs"] == 0]

    def mean_ms(rows, k):
        return 1e3 * float(np.mean([r[k] for r in rows])) if rows else None

    res = {
        "async_scheduling": async_scheduling,
        "wall_s": wall, "output_tokens": gen, "output_tokens_per_s": gen / wall,
        "init_s": init_s, "graph_capture_s": llm.engine.graph_capture_s,
        "num_gpu_blocks": llm.engine.num_gpu_blocks, "num_steps": len(tr),
        "num_decode_only_steps": len(dec),
        "attention_backend": llm.engine.model.attn.name,
        "cuda_graphs": bool(llm.engine.runner.graphs),
        "decode_step_ms": {k: mean_ms(dec, k) for k in ("schedule_s", "prepare_s", "forward_s",
                                                        "sample_s", "total_s")},
        "mixed_step_ms": {k: mean_ms([s for s in tr if s["num_prefill_seqs"]], k)
                          for k in ("schedule_s", "prepare_s", "forward_s", "sample_s", "total_s")},
        "wall_in_decode_only_steps_s": float(sum(s["total_s"] for s in dec)),
        "wall_in_prefill_steps_s": float(sum(s["total_s"] for s in tr if s["num_prefill_seqs"])),
    }
    del llm, outs
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return res


def hf_model(spec: ModelSpec, device: str, dtype: torch.dtype, attn: str):
    import transformers

    from engine.loader import hf_config_from_spec

    cfg = transformers.LlamaConfig.from_dict(hf_config_from_spec(spec))
    cfg._attn_implementation = attn
    with torch.device(device):
        m = transformers.LlamaForCausalLM(cfg).to(dtype)
    return m.eval()


def run_hf_static(spec, prompts, outputs, device, dtype, batch: int = 64) -> dict:
    from transformers import GenerationConfig

    model = hf_model(spec, device, dtype, "sdpa")
    pad = 0

    def one_batch(ps, os_):
        width = max(map(len, ps))
        ids = torch.full((len(ps), width), pad, dtype=torch.long)
        mask = torch.zeros((len(ps), width), dtype=torch.long)
        for i, p in enumerate(ps):  # left padding, as decoder-only generation needs
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        m = max(os_)
        gc_ = GenerationConfig(max_new_tokens=m, min_new_tokens=m, do_sample=False,
                               eos_token_id=None, pad_token_id=pad)
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),  # noqa: F821
                                 generation_config=gc_)
        return out.shape[1] - width

    one_batch(prompts[:2], [2, 2])  # warm-up
    sync()
    t = time.perf_counter()
    generated = 0
    for i in range(0, len(prompts), batch):
        generated += one_batch(prompts[i:i + batch], outputs[i:i + batch]) * len(prompts[i:i + batch])
    sync()
    wall = time.perf_counter() - t
    del model
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return {"wall_s": wall, "useful_output_tokens_per_s": sum(outputs) / wall,
            "generated_tokens_incl_padding_per_s": generated / wall, "batch_size": batch}


def run_hf_cb(spec, prompts, outputs, device, dtype) -> dict:
    """generate_batch takes one max_new_tokens for all requests: max(outputs). Throughput is
    reported for the requested tokens (useful) and for everything it generated."""
    from transformers import GenerationConfig

    model = hf_model(spec, device, dtype, "paged|sdpa")
    m = max(outputs)
    gc_ = GenerationConfig(max_new_tokens=m, do_sample=False, eos_token_id=None, pad_token_id=0)
    # Not under torch.inference_mode: generate_batch's own loop updates its static tensors in
    # place, which inference tensors forbid (every request failed that way in one run).
    model.generate_batch(inputs=prompts[:2], generation_config=GenerationConfig(
        max_new_tokens=2, do_sample=False, eos_token_id=None, pad_token_id=0))
    sync()
    t = time.perf_counter()
    res = model.generate_batch(inputs=prompts, generation_config=gc_)
    sync()
    wall = time.perf_counter() - t
    generated = 0
    for r in res.values():
        toks = getattr(r, "generated_tokens", None)
        generated += len(toks) if toks is not None else 0
    del model
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if generated < sum(outputs):
        raise RuntimeError(f"generate_batch returned {generated} tokens for {len(res)} results; "
                           f"{sum(outputs)} were requested (failed requests)")
    return {"wall_s": wall, "useful_output_tokens_per_s": sum(outputs) / wall,
            "generated_tokens_per_s": generated / wall, "max_new_tokens": m,
            "num_results": len(res)}


# ---------------------------------------------------------------------- part B
def mooncake_requests(n: int, prompt_cap: int, time_scale: float) -> tuple[list[Request], dict]:
    data = json.loads((HERE / "mooncake_sample_1000.json").read_text())
    hb = data["hash_block_size"]
    reqs = []
    capped = 0
    for i, (ts, ilen, olen, hids) in enumerate(data["requests"][:n]):
        p = min(ilen, prompt_cap)
        capped += ilen > prompt_cap
        reqs.append(Request(request_id=i, arrival_s=ts / 1000.0 * time_scale, prompt_len=p,
                            output_len=olen, hash_ids=tuple(hids[: -(-p // hb)]), hash_block_size=hb))
    info = {"source": data["source"], "source_sha256": data["source_sha256"],
            "selection": data["selection"], "num_requests": len(reqs),
            "prompt_cap_tokens": prompt_cap, "num_prompts_capped": capped,
            "cap_rule": f"prompt truncated to its first {prompt_cap} tokens (hash ids truncated to "
                        f"match, so shared prefixes stay shared); outputs kept",
            "time_scale": time_scale,
            "arrival_span_s": reqs[-1].arrival_s if reqs else 0.0}
    return reqs, info


def run_mooncake(model: str, device: str, dtype: str, n: int, prompt_cap: int, time_scale: float,
                 max_model_len: int, max_wall_s: float, out_dir: Path) -> dict:
    reqs, info = mooncake_requests(n, prompt_cap, time_scale)
    t = time.perf_counter()
    core = EngineCore(EngineConfig(model=model, device=device, dtype=dtype, max_model_len=max_model_len,
                                   max_num_seqs=256, max_num_batched_tokens=8192,
                                   gpu_memory_utilization=0.9, async_scheduling=True))
    init_s = time.perf_counter() - t
    # Warm-up on throwaway requests (ids far above the workload's).
    warm = [Request(request_id=10**9 + i, arrival_s=0.0, prompt_len=600, output_len=4,
                    hash_ids=tuple(range(10**9 + 10 * i, 10**9 + 10 * i + 2)), hash_block_size=512)
            for i in range(2)]
    replay(core, warm, honor_arrivals=False)
    res = replay(core, reqs, time_scale=1.0, max_wall_s=max_wall_s)
    s = res.summary()
    s.update(info)
    s["init_s"] = init_s
    s["num_gpu_blocks"] = core.num_gpu_blocks
    s["max_model_len"] = max_model_len
    s["async_scheduling"] = True
    res.write(out_dir / "mooncake_run")
    return s


# ---------------------------------------------------------------------- main
class _Timeout(Exception):
    pass


def with_timeout(fn, seconds: int):
    """Run fn, raising _Timeout after `seconds` (a stuck baseline must not sink the whole run)."""
    import signal

    def handler(signum, frame):
        raise _Timeout(f"gave up after {seconds} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def versions() -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("triton", "transformers"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            v[mod] = f"unavailable: {type(e).__name__}"
    return v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="small shapes: a smoke test in seconds")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: ours,hf_static,hf_cb,mooncake")
    ap.add_argument("--mooncake-n", type=int, default=1000)
    ap.add_argument("--prompt-cap", type=int, default=2048)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--mooncake-max-wall-s", type=float, default=200.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result: dict = {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "versions": versions(), "tiny": args.tiny,
    }

    def save() -> None:
        (args.out / "engine_bench.json").write_text(json.dumps(result, indent=2, default=float))

    if args.tiny:
        model_a, model_b, dtype = "tiny", "tiny", "float32" if device == "cpu" else "bfloat16"
        n_a, (p_lo, p_hi, o_lo, o_hi) = 16, (8, 64, 4, 16)
    else:
        model_a, model_b, dtype = "llama-3.2-1b", "llama-3.1-8b", "bfloat16"
        n_a, (p_lo, p_hi, o_lo, o_hi) = 128, (64, 1024, 32, 256)
    spec_a = get_model(model_a)
    result["copy_gbps"] = measure_copy_gbps(device, nbytes=(2 << 30) if device == "cuda" else (64 << 20))
    result["matmul_tflops_bf16"] = measure_matmul_tflops(device, n=8192 if device == "cuda" else 512)
    log("rates", result["copy_gbps"], result["matmul_tflops_bf16"])
    prompts, outputs = workload_a(n_a, 0, spec_a.vocab_size, p_lo, p_hi, o_lo, o_hi)
    a = {"model": model_a, "num_requests": n_a, "prompt_len_range": [p_lo, p_hi],
         "output_len_range": [o_lo, o_hi], "seed": 0, "ignore_eos": True,
         "prompt_tokens": sum(map(len, prompts)), "output_tokens": sum(outputs)}
    a["roofline"] = roofline(spec_a, [len(p) for p in prompts], outputs, 256,
                             result["copy_gbps"], result["matmul_tflops_bf16"])
    result["part_a"] = a
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    for name, fn in (("ours_sync", lambda: run_ours(model_a, prompts, outputs, device, dtype, 0.5, False)),
                     ("ours", lambda: run_ours(model_a, prompts, outputs, device, dtype, 0.5, True)),
                     ("hf_static", lambda: run_hf_static(spec_a, prompts, outputs, device, torch_dtype)),
                     ("hf_generate_batch", lambda: run_hf_cb(spec_a, prompts, outputs, device, torch_dtype))):
        if name in skip or (name == "hf_generate_batch" and "hf_cb" in skip) or (
                name == "ours_sync" and "ours" in skip):
            continue
        log("part A:", name)
        try:
            a[name] = with_timeout(fn, 150)
        except Exception as e:  # noqa: BLE001 - a failed baseline is recorded, not fatal
            a[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        log(name, json.dumps(a[name], default=float)[:600])
        save()
    ours = a.get("ours", {}).get("output_tokens_per_s")
    if ours:
        a["ratio_vs_hf_static_measured"] = (ours / a["hf_static"]["useful_output_tokens_per_s"]
                                            if "useful_output_tokens_per_s" in a.get("hf_static", {}) else None)
        a["ratio_vs_hf_static_739"] = ours / 739.0
        cb = a.get("hf_generate_batch", {})
        a["ratio_vs_hf_generate_batch"] = (ours / cb["useful_output_tokens_per_s"]
                                           if "useful_output_tokens_per_s" in cb else None)
        a["fraction_of_roofline_sum"] = ours / a["roofline"]["output_tokens_per_s_bound_sum"]
        a["fraction_of_roofline_max"] = ours / a["roofline"]["output_tokens_per_s_bound_max"]
    save()
    if "mooncake" not in skip:
        log("part B: mooncake")
        n = 40 if args.tiny else args.mooncake_n
        cap = 256 if args.tiny else args.prompt_cap
        try:
            result["part_b"] = {"model": model_b, **run_mooncake(
                model_b, device, dtype, n, cap, args.time_scale if not args.tiny else 0.001,
                max_model_len=cap + 2048 if not args.tiny else 4096,
                max_wall_s=args.mooncake_max_wall_s, out_dir=args.out)}
        except Exception as e:  # noqa: BLE001
            result["part_b"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        log("part B", json.dumps({k: v for k, v in result["part_b"].items() if k != "scheduler_stats"},
                                 default=float)[:1500])
    save()
    log("done")


if __name__ == "__main__":
    main()
