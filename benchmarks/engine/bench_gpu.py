"""GPU benchmark of the engine (issue 6), with the Hugging Face baselines and a roofline bound.

Part A: Llama-3.2-1B shape, random bf16 weights, 128 requests (prompts U[64,1024], outputs
U[32,256], seed 0, ignore_eos), all submitted at t=0. Our engine, then HF `generate()` in static
batches of 64, then HF `generate_batch()` (continuous batching). Bandwidth (device copy) and bf16
matmul rate are measured in the same run and give the roofline bound of this workload.
Part B: Llama-3.1-8B shape on the 1,000-request Mooncake sample (prompts capped, arrivals
time-scaled), timed replay: throughput, TTFT/TPOT percentiles, preemptions, prefix hit rate.

    python benchmarks/engine/bench_gpu.py --out DIR            # full (H200)
    python benchmarks/engine/bench_gpu.py --tiny --out DIR     # seconds, CPU or GPU: smoke test
    python benchmarks/engine/bench_gpu.py --out DIR --skip hf_static,hf_cb,mooncake,profile --budget-s 170

Part A's JSON also has, per mode, the mean schedule / prepare / sample time of decode-only steps at
batch >= 120 (`host_ms_decode_only`) and `sync_vs_async` (throughput ratio; target: sync loses <= 10%).
"""

from __future__ import annotations

import argparse
import dataclasses
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

from engine.core.config import EngineArgs
from engine.core.model_spec import ModelSpec, get_model
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.llm import LLM
from engine.replay import GcWatch, frozen_heap, replay
from engine.sampling import SamplingParams
from kernels import Backend
from kernels.reference import add_rms_norm_ref, rotate_qkv_ref, silu_mul_ref

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


def engine_args(device: str, dtype: str, util: float, **kw) -> dict:
    return {"device": device, "dtype": dtype, "gpu_memory_utilization": util, "max_model_len": 2048,
            "max_num_seqs": 256, "max_num_batched_tokens": 8192, **kw}


def unfused_backend(backend: Backend) -> Backend:
    """`backend` with the element-wise steps as separate PyTorch kernels (rotary, then the
    backend's own K/V-cache write; SiLU * up; residual add + RMSNorm), attention unchanged:
    the decode path before the fused kernels, for a before/after in one run."""

    def rope_then_write_kv(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping,
                           num_q_heads, num_kv_heads, head_dim, k_scale=None, v_scale=None):
        q, k, v = rotate_qkv_ref(qkv, positions, cos, sin, num_q_heads, num_kv_heads, head_dim)
        backend.write_kv_cache(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return q

    return dataclasses.replace(backend, rope_store_kv=rope_then_write_kv,
                               add_rms_norm=add_rms_norm_ref, silu_mul=silu_mul_ref)


def fused_element_wise(backend: Backend) -> bool:
    """Whether the element-wise steps run the fused Triton kernels."""
    return backend.name == "triton" and backend.silu_mul is not silu_mul_ref


def make_llm(model: str, args: dict, legacy: bool = False) -> LLM:
    """`legacy`: the element-wise steps unfused (`unfused_backend`), for a before/after in one
    run. (Runs before the fused kernels also upcast the logits to fp32; that is gone.)"""
    if not legacy:
        return LLM(model, **args)
    from engine.engine_loop import build_model, resolve_device

    cfg = EngineArgs(model=model, **args)
    m = build_model(cfg, resolve_device(cfg.device), cfg.max_model_len)
    m.backend = unfused_backend(m.backend)
    return LLM(model, llm_model=m, **args)


def host_decode_ms(steps, min_batch: int) -> dict:
    """Mean host time per decode-only step of at least `min_batch` sequences (ms): what the issue's
    target (schedule + prepare <= 0.3 ms at batch 128) reads; sampling is the sampler's host side."""
    rows = [s for s in steps if s.num_prefill_tokens == 0 and s.num_decode_seqs >= min_batch]
    out: dict = {"min_batch": min_batch, "num_steps": len(rows)}
    for k in ("schedule_s", "prepare_s", "sample_s"):
        out[k] = 1e3 * float(np.mean([getattr(r, k) for r in rows])) if rows else None
    out["schedule_plus_prepare"] = (out["schedule_s"] + out["prepare_s"]) if rows else None
    return out


def run_ours(model: str, prompts, outputs, device: str, dtype: str, util: float,
             async_scheduling: bool, legacy: bool = False, host_min_batch: int = 120) -> dict:
    t = time.perf_counter()
    llm = make_llm(model, engine_args(device, dtype, util, async_scheduling=async_scheduling), legacy)
    init_s = time.perf_counter() - t
    # Warm-up: compile the prefill/mixed-batch kernel shapes outside the timed region.
    llm.generate(prompts[:4], [SamplingParams(max_tokens=4, ignore_eos=True)] * 4)
    llm.step_traces.clear()
    llm.engine.runner.num_graph_replays = llm.engine.runner.num_eager_forwards = 0
    sync()
    params = [SamplingParams(max_tokens=o, ignore_eos=True) for o in outputs]
    # as vLLM after its warm-up: full GC passes skip the start-up heap; the run's collections counted
    with frozen_heap() as frozen, GcWatch() as watch:
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        sync()
        wall = time.perf_counter() - t
        gc_stats = watch.stats(frozen).as_dict()
    gen = sum(len(o.token_ids) for o in outs)
    assert gen == sum(outputs), (gen, sum(outputs))
    tr = llm.step_traces
    dec = [s for s in tr if s.num_prefill_seqs == 0]

    def mean_ms(rows, k):
        return 1e3 * float(np.mean([getattr(r, k) for r in rows])) if rows else None

    runner = llm.engine.runner
    res = {
        "async_scheduling": async_scheduling, "legacy_decode_path": legacy,
        "fused_ops": fused_element_wise(llm.engine.model.backend),
        "graph_replays": runner.num_graph_replays, "graph_captures": runner.num_graph_captures,
        "eager_forwards": runner.num_eager_forwards,
        "wall_s": wall, "output_tokens": gen, "output_tokens_per_s": gen / wall,
        "init_s": init_s, "graph_capture_s": llm.engine.graph_capture_s,
        "num_gpu_blocks": llm.engine.num_gpu_blocks, "num_steps": len(tr),
        "num_decode_only_steps": len(dec),
        "attention_backend": llm.engine.model.backend.name,
        "cuda_graphs": bool(llm.engine.runner.graphs),
        "decode_step_ms": {k: mean_ms(dec, k) for k in ("schedule_s", "prepare_s", "gpu_s",
                                                        "sample_s", "total_s")},
        "mixed_step_ms": {k: mean_ms([s for s in tr if s.num_prefill_seqs], k)
                          for k in ("schedule_s", "prepare_s", "gpu_s", "sample_s", "total_s")},
        "host_ms_decode_only": host_decode_ms(tr, host_min_batch), "gc": gc_stats,
        "wall_in_decode_only_steps_s": float(sum(s.total_s for s in dec)),
        "wall_in_prefill_steps_s": float(sum(s.total_s for s in tr if s.num_prefill_seqs)),
    }
    # `runner` too: a live reference kept the old engine's KV cache (and graph pools) reserved
    # until a later collection, and the next engine's KV allocation ran out of memory (run 5).
    del llm, outs, runner
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


def run_hf_cb(spec, prompts, outputs, device, dtype, max_wall_s: float = 90.0) -> dict:
    """HF continuous batching (transformers 5.x `ContinuousBatchingManager`, what `generate_batch`
    runs), each request with its own max_new_tokens, greedy, no EOS.

    The manager is built and warmed up (its CUDA graphs captured) outside the timed region, as
    our engine's init and graph capture are; the timed region is start, add the requests, wait
    for all results. Not under torch.inference_mode: the manager's thread updates tensors that
    the main thread allocated, which inference tensors forbid (every request failed that way in
    an earlier run of this script); transformers runs it under no_grad itself.
    """
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    model = hf_model(spec, device, dtype, "paged|sdpa")
    gc_ = GenerationConfig(max_new_tokens=max(outputs), do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    hints = WorkloadHints(max_prompt_length=max(map(len, prompts)),
                          max_generated_length=max(outputs), num_requests=len(prompts))
    t = time.perf_counter()
    manager = model.init_continuous_batching(generation_config=gc_, workload_hints=hints)
    manager.warmup()
    setup_s = time.perf_counter() - t
    sync()
    t = time.perf_counter()
    manager.start()
    try:
        for i, (p, o) in enumerate(zip(prompts, outputs)):
            manager.add_request(list(p), request_id=f"r{i}", max_new_tokens=o)
        done: dict[str, int] = {}
        failed: list[str] = []
        while len(done) < len(prompts) and time.perf_counter() - t < max_wall_s:
            r = manager.get_result(timeout=1)
            if r is None:
                if not manager.is_running():
                    break
                continue
            if r.is_finished():
                done[r.request_id] = len(r.generated_tokens)
                if getattr(r, "error", None):
                    failed.append(f"{r.request_id}: {r.error}")
        sync()
        wall = time.perf_counter() - t
    finally:
        manager.stop(block=True, timeout=10)
        manager.destroy()
    del model, manager
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    generated = sum(done.values())
    exact = sum(done.get(f"r{i}") == o for i, o in enumerate(outputs))
    if generated < sum(outputs) or failed:
        raise RuntimeError(f"HF continuous batching returned {generated} of {sum(outputs)} tokens "
                           f"({len(done)} of {len(prompts)} requests finished; failures: {failed[:3]})")
    return {"wall_s": wall, "useful_output_tokens_per_s": sum(outputs) / wall,
            "generated_tokens_per_s": generated / wall, "generated_tokens": generated,
            "requests_with_exact_length": exact, "setup_and_warmup_s": setup_s,
            "attn_implementation": "paged|sdpa", "api": "ContinuousBatchingManager (generate_batch's)"}


# ---------------------------------------------------------------------- decode profile
class _Eager:
    """Stands in for a CUDA graph on the CPU (smoke test): replay() just calls fn."""

    def __init__(self, fn) -> None:
        self.replay = fn


def _capture(fn):
    """A CUDA graph of fn() (warmed up on a side stream first, as the runner does)."""
    if not torch.cuda.is_available():
        return _Eager(fn)
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _time_ms(fn, iters: int = 40, warm: int = 5) -> float:
    for _ in range(warm):
        fn()
    if not torch.cuda.is_available():
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) / iters * 1e3
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def decode_state(runner, batch: int, seed: int = 1):
    """A pure-decode step of `batch` sequences with Part-A-like contexts (prompt U[64,1024] plus
    ~75 generated tokens), prepared through the runner as the engine would."""
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    ctx = rng.integers(64, 1025, batch) + 75
    sched, toks, nxt = [], {}, 0
    for i, c in enumerate(ctx.tolist()):
        nb = -(-(c + 1) // runner.block_size)
        sched.append(SimpleNamespace(request_id=i, num_new_tokens=1, num_computed_tokens=c,
                                     block_ids=list(range(nxt, nxt + nb)), samples=True,
                                     num_spec_tokens=0))
        toks[i] = [17] * (c + 1)
        nxt += nb
    inp = runner.prepare(sched, toks)
    return inp, ctx


@torch.inference_mode()
def profile_decode(model: str, dtype: str, batch: int, copy_gbps: float, out_dir: Path,
                   device: str = "cuda") -> dict:
    """Where a decode step's GPU time goes: torch.profiler over CUDA-graph replays of the
    engine's own decode graph (top kernels), then variants captured the same way, each timed
    over graph replays: old path (unfused element-wise, fp32 logits), attention removed, the
    layers without the LM head, the LM head alone, attention alone, the GEMMs alone, and the
    sampler (eager, as the engine runs it)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    llm = LLM(model, **engine_args(device, dtype, 0.3))
    core, runner, m = llm.engine, llm.engine.runner, llm.engine.model
    spec = m.spec
    inp, ctx = decode_state(runner, batch)
    if cuda and inp.graph_size is None:
        raise RuntimeError("the decode batch did not map to a CUDA graph")
    res: dict = {"batch": batch, "graph_size": inp.graph_size, "mean_context": float(ctx.mean()),
                 "fused_ops": fused_element_wise(m.backend)}
    g = runner.graphs[inp.graph_size] if cuda else _Eager(lambda: runner.forward(inp))
    res["full_step_ms"] = _time_ms(g.replay)
    kv_bytes = float((ctx + 1).sum()) * spec.kv_bytes_per_token()
    w_bytes = spec.weight_bytes()
    res["bytes_weights"], res["bytes_kv"] = w_bytes, kv_bytes
    res["bound_ms_at_copy_bw"] = (w_bytes + kv_bytes) / (copy_gbps * 1e9) * 1e3
    res["achieved_gbps"] = (w_bytes + kv_bytes) / (res["full_step_ms"] / 1e3) / 1e9
    n_prof = 5
    prof = None
    try:  # a profiler failure must not lose the timed variants below
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(n_prof):
                g.replay()
            sync()

        def dev_us(k):
            if not cuda:
                return k.self_cpu_time_total
            return getattr(k, "device_time_total", None) or getattr(k, "cuda_time_total", 0.0)

        rows = sorted(prof.key_averages(), key=dev_us, reverse=True)
        total_us = sum(dev_us(k) for k in rows) / n_prof
        res["profile_total_kernel_us_per_step"] = total_us
        res["top_kernels"] = [{"name": k.key[:110], "us_per_step": dev_us(k) / n_prof,
                               "calls_per_step": k.count / n_prof} for k in rows[:25] if dev_us(k) > 0]
        log(f"decode profile, batch {batch}: full step {res['full_step_ms']:.3f} ms (graph), kernels "
            f"{total_us / 1e3:.3f} ms; top kernels (us/step, calls/step):")
        for r in res["top_kernels"]:
            log(f"  {r['us_per_step']:9.1f}  {r['calls_per_step']:6.1f}  {r['name']}")
        try:
            table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=40)
        except Exception:  # noqa: BLE001 - older torch spells it self_cuda_time_total
            table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40)
        with open(out_dir / "decode_profile.txt", "a") as f:  # one file for every batch size
            f.write(f"==== decode step, batch {batch}, {n_prof} CUDA-graph replays ====\n{table}\n")
    except Exception as e:  # noqa: BLE001
        res["profile_error"] = f"{type(e).__name__}: {e}"
        log("profiler failed:", res["profile_error"])

    b = inp.graph_size or inp.num_tokens
    ids, pos = runner.d_input_ids[:b], runner.d_positions[:b]
    meta = runner._meta(b, b, 1, runner.max_model_len, runner.max_blocks_per_seq)
    kv = runner.kv_caches
    variants: dict[str, float] = {}

    def full():
        m.compute_logits(m(ids, pos, kv, meta))

    def layers():
        m(ids, pos, kv, meta)

    hidden = torch.randn(b, spec.hidden_size, dtype=m.dtype, device=device)
    qbuf = torch.randn(b, spec.num_heads, spec.head_dim, dtype=m.dtype, device=device)

    def lm_head():
        m.compute_logits(hidden)

    def attn_only():
        for i in range(spec.num_layers):
            m.backend.paged_attention(qbuf, kv[i, 0], kv[i, 1], meta.block_tables, meta.seq_lens,
                                      meta.query_start_loc, 0.125, meta.max_query_len,
                                      meta.max_seq_len)

    lay = m.layers[0]
    inter = torch.randn(b, spec.intermediate_size, dtype=m.dtype, device=device)
    attn_out = torch.randn(b, spec.num_heads * spec.head_dim, dtype=m.dtype, device=device)

    def gemms():
        for _ in range(spec.num_layers):
            lay.qkv_proj(hidden)
            torch.addmm(hidden, attn_out, lay.o_proj.weight.t())
            lay.gate_up_proj(hidden)
            torch.addmm(hidden, inter, lay.down_proj.weight.t())
        m.compute_logits(hidden)

    def timed(name, fn):
        try:
            gr = _capture(fn)
            variants[name] = _time_ms(gr.replay)
            del gr
        except Exception as e:  # noqa: BLE001 - one failed variant must not lose the others
            variants[name] = float("nan")
            log(f"variant {name} failed: {type(e).__name__}: {e}")

    backend0 = m.backend
    timed(f"full ({'fused' if fused_element_wise(backend0) else 'unfused'}, bf16 logits)", full)
    m.backend = unfused_backend(backend0)
    timed("full, old path (unfused, fp32 logits)",
          lambda: m.compute_logits(m(ids, pos, kv, meta)).float())
    timed("full, unfused element-wise, bf16 logits", full)
    m.backend = backend0
    timed("layers only (no LM head)", layers)
    timed("LM head only", lm_head)
    timed("attention kernels only (all layers)", attn_only)
    timed("GEMMs only (4 per layer + LM head)", gemms)
    if cuda:  # decode tile shapes for this model's head_dim (the kernels were tuned at D=128)
        from kernels.paged_attention import AttentionConfig, paged_attention

        for tn, nw, ns in ((128, 4, 3), (64, 4, 3), (256, 4, 3), (128, 8, 3), (128, 2, 3), (64, 2, 2)):
            cfg = AttentionConfig(16, tn, nw, ns)

            def attn_cfg(cfg=cfg):
                for i in range(spec.num_layers):
                    paged_attention(qbuf, kv[i, 0], kv[i, 1], meta.block_tables, meta.seq_lens,
                                    meta.query_start_loc, 0.125, 1, meta.max_seq_len, config=cfg)

            timed(f"attention only, tile_n {tn}, warps {nw}, stages {ns}", attn_cfg)
    m.backend = dataclasses.replace(backend0, paged_attention=lambda q, *a, **k: q)
    timed("full without attention kernels", full)
    m.backend = backend0
    sample_ids = list(range(inp.num_seqs))
    params = [SamplingParams(max_tokens=8)] * inp.num_seqs
    logits_bf16 = torch.randn(inp.num_seqs, spec.vocab_size, dtype=m.dtype, device=device)
    logits_fp32 = logits_bf16.float()
    variants["sampling, greedy, bf16 logits (eager)"] = _time_ms(
        lambda: core.sampler.sample(logits_bf16, sample_ids, params))
    variants["sampling, greedy, fp32 logits (eager)"] = _time_ms(
        lambda: core.sampler.sample(logits_fp32, sample_ids, params))
    t = time.perf_counter()
    for _ in range(20):
        decode_state(runner, batch)
    sync()
    variants["host: runner.prepare (batch decode, CPU ms)"] = (time.perf_counter() - t) / 20 * 1e3
    res["variants_ms"] = variants
    for k, v in variants.items():
        log(f"  variant {k:48s} {v:8.3f} ms")
    return res


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
    gc.collect()  # whatever earlier parts left must be gone before this engine sizes its cache
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    t = time.perf_counter()
    core = EngineCore(EngineArgs(model=model, device=device, dtype=dtype, max_model_len=max_model_len,
                                   max_num_seqs=256, max_num_batched_tokens=8192,
                                   gpu_memory_utilization=0.9, async_scheduling=True))
    init_s = time.perf_counter() - t
    # Warm-up on throwaway requests (ids far above the workload's).
    warm = [Request(request_id=10**9 + i, arrival_s=0.0, prompt_len=600, output_len=4,
                    hash_ids=tuple(range(10**9 + 10 * i, 10**9 + 10 * i + 2)), hash_block_size=512)
            for i in range(2)]
    replay(core, warm, honor_arrivals=False)
    res = replay(core, reqs, time_scale=1.0, max_wall_s=max_wall_s)
    s = res.summary().to_json_dict()
    s.update(info)
    s["init_s"] = init_s
    s["num_gpu_blocks"] = core.num_gpu_blocks
    s["max_model_len"] = max_model_len
    s["async_scheduling"] = True
    res.write(out_dir / "mooncake_run", force=True)  # a rerun replaces its own earlier output
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
    ap.add_argument("--skip", default="", help="comma list of parts to skip: profile,ours,hf_static,hf_cb,mooncake")
    ap.add_argument("--mooncake-n", type=int, default=1000)
    ap.add_argument("--prompt-cap", type=int, default=2048)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--mooncake-max-wall-s", type=float, default=200.0)
    ap.add_argument("--dry-run", action="store_true", help="same as --tiny")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no further part once this many seconds have passed (a part runs to its own timeout)")
    args = ap.parse_args()
    args.tiny = args.tiny or args.dry_run
    t_start = time.perf_counter()

    def over_budget(part: str) -> bool:
        if args.budget_s is None or time.perf_counter() - t_start < args.budget_s:
            return False
        result.setdefault("skipped_for_budget", []).append(part)
        log(f"{part}: skipped, --budget-s {args.budget_s} reached")
        return True
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
        host_min_batch = 8
    else:
        model_a, model_b, dtype = "llama-3.2-1b", "llama-3.1-8b", "bfloat16"
        n_a, (p_lo, p_hi, o_lo, o_hi) = 128, (64, 1024, 32, 256)
        host_min_batch = 120  # the host-time target is at batch 128
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
    if "profile" not in skip:
        for batch in ((128, 32) if not args.tiny else (8,)):
            if over_budget(f"profile {batch}"):
                break
            try:
                result.setdefault("decode_profile", {})[str(batch)] = with_timeout(
                    lambda b=batch: profile_decode(model_a, dtype, b, result["copy_gbps"], args.out,
                                                   device), 120)
                gc.collect()  # the profiled engine's KV cache goes before Part A allocates its own
                torch.cuda.empty_cache() if device == "cuda" else None
            except Exception as e:  # noqa: BLE001
                result.setdefault("decode_profile", {})[str(batch)] = {
                    "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
                log("profile failed", e)
            save()
    for name, fn in (("ours", lambda: run_ours(model_a, prompts, outputs, device, dtype, 0.5, True,
                                               host_min_batch=host_min_batch)),
                     ("ours_sync", lambda: run_ours(model_a, prompts, outputs, device, dtype, 0.5, False,
                                                    host_min_batch=host_min_batch)),
                     ("ours_old_decode_path", lambda: run_ours(model_a, prompts, outputs, device, dtype,
                                                               0.5, True, legacy=True, host_min_batch=host_min_batch)),
                     ("hf_static", lambda: run_hf_static(spec_a, prompts, outputs, device, torch_dtype)),
                     ("hf_generate_batch", lambda: run_hf_cb(spec_a, prompts, outputs, device, torch_dtype))):
        if name in skip or (name == "hf_generate_batch" and "hf_cb" in skip) or (
                name in ("ours_sync", "ours_old_decode_path") and "ours" in skip):
            continue
        if over_budget(f"part A {name}"):
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
        old = a.get("ours_old_decode_path", {}).get("output_tokens_per_s")
        a["speedup_vs_old_decode_path"] = ours / old if old else None
        a["fraction_of_roofline_max"] = ours / a["roofline"]["output_tokens_per_s_bound_max"]
    a["sync_vs_async"] = sync_vs_async(a)
    save()
    if "mooncake" not in skip and not over_budget("part B mooncake"):
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
    summary_table(result)
    log("done")


SYNC_LOSS_TARGET = 0.10  # issue 16: synchronous scheduling loses at most 10% to async


def sync_vs_async(a: dict) -> dict | None:
    """Synchronous / async output throughput of Part A, and each mode's host time per decode step."""
    tps = {k: (a.get(k) or {}).get("output_tokens_per_s") for k in ("ours", "ours_sync")}
    if not all(tps.values()):
        return None
    ratio = tps["ours_sync"] / tps["ours"]
    return {"throughput_ratio_sync_over_async": ratio, "sync_loss": 1 - ratio,
            "sync_loss_target": SYNC_LOSS_TARGET, "meets_target": 1 - ratio <= SYNC_LOSS_TARGET,
            "host_ms_decode_only": {"async": a["ours"].get("host_ms_decode_only"),
                                    "sync": a["ours_sync"].get("host_ms_decode_only")}}


def summary_table(result: dict) -> None:
    """The figures that matter, last in the log."""
    a = result.get("part_a", {})
    rows = []
    for k in ("ours", "ours_sync", "ours_old_decode_path", "hf_static", "hf_generate_batch"):
        v = a.get(k, {})
        tps = v.get("output_tokens_per_s") or v.get("useful_output_tokens_per_s")
        dec = (v.get("decode_step_ms") or {}).get("gpu_s")
        rows.append(f"{k:22s} {'n/a' if tps is None else round(tps):>8} tok/s"
                    + (f"  decode fwd {dec:.3f} ms" if dec else "") + (f"  ERROR {v['error'][:80]}"
                                                                     if "error" in v else ""))
    for k in ("ratio_vs_hf_static_measured", "ratio_vs_hf_generate_batch", "fraction_of_roofline_sum",
              "speedup_vs_old_decode_path"):
        if a.get(k) is not None:
            rows.append(f"{k:30s} {a[k]:.3f}")
    sva = a.get("sync_vs_async")
    if sva:
        rows.append(f"sync / async throughput {sva['throughput_ratio_sync_over_async']:.3f} "
                    f"(sync loses {sva['sync_loss']:.1%}, target <= {SYNC_LOSS_TARGET:.0%})")
        for mode, h in sva["host_ms_decode_only"].items():
            if h and h["num_steps"]:
                rows.append(f"   {mode}: host per decode step at batch >= {h['min_batch']} ({h['num_steps']} steps): "
                            f"schedule {h['schedule_s']:.3f} + prepare {h['prepare_s']:.3f} ms, sample "
                            f"{h['sample_s']:.3f} ms")
    for b, p in (result.get("decode_profile") or {}).items():
        if "variants_ms" in p:
            rows.append(f"profile batch {b}: step {p['full_step_ms']:.3f} ms, bound "
                        f"{p['bound_ms_at_copy_bw']:.3f} ms, {p['achieved_gbps']:.0f} GB/s")
            rows += [f"   {k:48s} {v:8.3f}" for k, v in p["variants_ms"].items()]
    pb = result.get("part_b", {})
    if "output_tokens_per_s" in pb:
        rows.append(f"mooncake 8B: {pb['output_tokens_per_s']:.0f} out tok/s, TTFT p50/p99 "
                    f"{pb['ttft_p50_s']:.3f}/{pb['ttft_p99_s']:.3f} s, TPOT p50/p99 "
                    f"{pb['tpot_p50_s'] * 1e3:.1f}/{pb['tpot_p99_s'] * 1e3:.1f} ms, preempt "
                    f"{pb['num_preemptions']}, hit {pb['prefix_cache_hit_rate']:.3f}")
    print("\n".join(["==== summary ===="] + rows), flush=True)


if __name__ == "__main__":
    main()
