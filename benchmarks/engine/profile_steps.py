"""Where an engine step's GPU time goes, by the step's shape: crafted batches through the runner.

    python3 benchmarks/engine/profile_steps.py --out DIR [--models llama-3.2-1b llama-3.1-8b]
        [--variants nosplit split ...] [--no-profile] [--dry-run]

For each model one engine is built (random bf16 weights, Triton kernels, CUDA graphs, FULL
mode), and for each step shape of SHAPES (prefill chunks over cached contexts, decodes beside
them) the runner prepares the batch as the engine would, then times, under each variant of the
prefill split-KV heuristic (VARIANTS):

- `eager_ms`: the eager forward as a replay runs it (host launches included; CUDA events around
  it, median of repeats);
- `graph_ms`: the same eager forward captured as one CUDA graph (no launch gaps): eager - graph
  is the host's share;
- `mixed_graph_ms`: for steps of at most max_cudagraph_capture_size tokens, the engine's own
  mixed graph (a padded grid of sequences and tokens), the LM head on the sampled rows included;
- `roofline_ms`: the naive roofline of the step (benchmarks/engine/step_roofline.py's terms);
- with --profile, torch.profiler's top kernels of the eager forward (first variant and `split`).

Writes DIR/profile_steps.json and DIR/profile_steps.md, and prints the table.
`--dry-run` runs the tiny model on the CPU (Triton interpreter) to check the script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "engine"))

import kernels.paged_attention as pa
from engine.llm import LLM

# (label, [(new tokens, cached tokens) per sequence]); decodes are (1, context)
SHAPES = {
    "llama-3.2-1b": [
        ("prefill 512", [(512, 0)]),
        ("prefill 768", [(768, 0)]),
        ("prefill 1024", [(1024, 0)]),
        ("prefill 1536", [(1536, 0)]),
        ("prefill 2048", [(2048, 0)]),
        ("prefill 1024 + 16 decodes @1K", [(1024, 0)] + [(1, 1024)] * 16),
        ("chunk 64 over 8K", [(64, 8192)]),
        ("chunk 512 over 1.5K + 20 decodes @2K", [(512, 1536)] + [(1, 2048)] * 20),
        ("chunk 128 over 2.5K + 20 decodes @2K", [(128, 2560)] + [(1, 2048)] * 20),
    ],
    "llama-3.1-8b": [
        ("chunk 64 over 8K", [(64, 8192)]),
        ("chunk 512 over 1.5K", [(512, 1536)]),
        ("chunk 512 over 8.7K", [(512, 8704)]),
        ("chunk 512 over 1.5K + 20 decodes @2K", [(512, 1536)] + [(1, 2048)] * 20),
        ("chunk 128 over 2.5K + 20 decodes @2K", [(128, 2560)] + [(1, 2048)] * 20),
        ("chunk 2048 over 8K", [(2048, 8192)]),
        ("prefill 1024", [(1024, 0)]),
    ],
    "tiny": [("chunk 40 over 200 + 3 decodes", [(40, 200)] + [(1, 90)] * 3), ("prefill 64", [(64, 0)])],
}
# prefill split-KV settings: (PREFILL_SPLIT_MAX, PREFILL_SPLIT_MIN_TOKENS, target programs per SM,
# split only below this many programs per SM), and the work lists on (True) or off
VARIANTS = {
    "nosplit": (1, 512, 2, 0.5, True),
    "split": (16, 512, 2, 0.5, True),  # the shipped heuristic
    "split-any": (16, 1024, 2, 1e9, True),  # the first run's rule: split wherever under 2 per SM
    "split-nowork": (16, 512, 2, 0.5, False),  # static grids (binary search), as before work lists
}


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def set_variant(name: str, runner=None) -> None:
    (pa.PREFILL_SPLIT_MAX, pa.PREFILL_SPLIT_MIN_TOKENS, pa.PREFILL_SPLIT_TARGET_PROGRAMS_PER_SM,
     pa.PREFILL_SPLIT_BELOW_PROGRAMS_PER_SM, work) = VARIANTS[name]
    if runner is not None:  # eager steps without work lists: the runner stages none
        runner._work_block_qs = runner.model.backend.work_block_qs(
            runner.spec.num_heads, runner.spec.num_kv_heads, runner.kv_dtype == torch.float8_e4m3fn) if work else None


def prepare(runner, seqs: list[tuple[int, int]], mixed_graphs: bool):
    """The runner's inputs for one step of `seqs`, each with its own blocks (prefix tokens 17)."""
    saved = runner.mixed_graphs
    if not mixed_graphs:
        runner.use_mixed_graphs({}) if saved else None
    sched, toks, nxt = [], {}, 0
    for i, (q, c) in enumerate(seqs):
        nb = -(-(c + q) // runner.block_size)
        sched.append(SimpleNamespace(request_id=i, num_new_tokens=q, num_computed_tokens=c,
                                     block_ids=list(range(nxt, nxt + nb)), samples=True,
                                     num_spec_tokens=0))
        toks[i] = [17 + (j % 200) for j in range(c + q)]
        nxt += nb
    inp = runner.prepare(sched, toks)
    if not mixed_graphs and saved:
        runner.use_mixed_graphs(saved)
    return inp


def time_ms(fn, cuda: bool, reps: int = 10, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def graph_ms(fn, cuda: bool) -> float | None:
    """fn captured as one CUDA graph, replays timed (None on the CPU)."""
    if not cuda:
        return None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ms = time_ms(g.replay, cuda)
    del g
    return ms


def top_kernels(fn, cuda: bool, n: int = 14) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            fn()
        if cuda:
            torch.cuda.synchronize()

    def dev_us(k):
        if not cuda:
            return k.self_cpu_time_total
        return getattr(k, "self_device_time_total", None) or getattr(k, "self_cuda_time_total", 0.0)

    rows = sorted(prof.key_averages(), key=dev_us, reverse=True)
    return [{"name": k.key[:100], "us_per_step": dev_us(k) / 3, "calls": k.count / 3} for k in rows[:n] if dev_us(k) > 0]


def roofline_ms(model: str, seqs: list[tuple[int, int]]) -> float:
    import numpy as np
    from step_roofline import rates, roofline_s

    pre = [(q, c) for q, c in seqs if q > 1]
    dec = [(q, c) for q, c in seqs if q == 1]
    g = {"num_prefill_tokens": sum(q for q, _ in pre), "num_decode_tokens": len(dec),
         "num_prefill_seqs": len(pre), "num_decode_seqs": len(dec),
         "prefill_attn_pairs": sum(q * c + q * (q + 1) // 2 for q, c in pre),
         "sum_prefill_context": sum(q + c for q, c in pre), "sum_decode_context": sum(1 + c for _, c in dec)}
    return float(roofline_s({k: np.array([v], dtype=float) for k, v in g.items()}, rates(model, 4.2, 790))[0]) * 1e3


def check_split_prefill(device: str) -> list[dict]:
    """Prefill split-KV on the device: bf16 outputs of the attention kernel, unsplit and split
    (heuristic and forced), against the float32 reference on random caches; every output row
    written (poisoned first). Llama-3.1-8B layer shapes (32 q heads, 8 KV heads, D 128)."""
    from kernels.paged_batches import make_batch, rel_norm_error
    from kernels.reference import paged_attention_ref

    small = device == "cpu"
    cases = [([64], [900 if small else 8192]), ([300 if small else 512, 1, 1], [200 if small else 1536, 700, 90]),
             ([1, 40, 1, 7], [5, 1100 if small else 9000, 300, 2100 if small else 4000])]
    out = []
    for q_lens, ctx in cases:
        b = make_batch(q_lens, ctx, 8, 4, 128, 16, torch.bfloat16, seed=len(q_lens))
        args = [t.to(device) if isinstance(t, torch.Tensor) else t for t in b.args()]
        ref = paged_attention_ref(args[0].float(), args[1].float(), args[2].float(), *args[3:])
        for label, kw in (("unsplit", {"num_splits": 1, "prefill_splits": 1}), ("heuristic", {}),
                          ("forced 5", {"num_splits": 5, "prefill_splits": 5})):
            o = torch.full_like(args[0], float("nan"))
            pa.paged_attention(*args, out=o, **kw)
            err = rel_norm_error(o.float(), ref)
            out.append({"case": f"{q_lens} over {ctx}", "launch": label, "rel_err": err,
                        "all_written": bool(not o.isnan().any())})
            log("split check", out[-1])
    return out


def run_model(model: str, variants: list[str], profile: bool, device: str) -> list[dict]:
    cuda = device == "cuda"
    t0 = time.perf_counter()
    sizes = {"max_num_batched_tokens": 8192} if cuda else {"max_num_batched_tokens": 512, "num_gpu_blocks_override": 64}
    llm = LLM(model, device=device, dtype="bfloat16" if cuda else "float32", gpu_memory_utilization=0.85,
              max_model_len=16384, max_num_seqs=256, attention_backend="triton", **sizes)
    runner = llm.engine.runner
    log(f"{model}: engine in {time.perf_counter() - t0:.1f} s, mixed graphs {len(runner.mixed_graphs)}")
    rows = []
    for label, seqs in SHAPES[model]:
        need = sum(-(-(q + c) // runner.block_size) for q, c in seqs)
        if need > runner.num_blocks:
            log(f"{model} {label}: needs {need} KV blocks, the pool has {runner.num_blocks}; skipped")
            continue
        row = {"model": model, "shape": label, "tokens": sum(q for q, _ in seqs), "seqs": len(seqs),
               "roofline_ms": roofline_ms(model, seqs) if model != "tiny" else None, "variants": {}}
        for v in variants:
            set_variant(v, runner)
            inp = prepare(runner, seqs, mixed_graphs=False)
            assert inp.graph_kind is None
            fwd = lambda inp=inp: runner.forward(inp)
            res = {"eager_ms": time_ms(fwd, cuda), "graph_ms": graph_ms(fwd, cuda)}
            # the mixed graphs were captured with work lists: a variant without them stages none
            ginp = prepare(runner, seqs, mixed_graphs=True) if VARIANTS[v][4] else inp
            if ginp.graph_kind == "mixed":
                res["mixed_graph_ms"] = time_ms(lambda ginp=ginp: runner.forward(ginp), cuda)
            if profile and v in (variants[0], "split"):
                res["top_kernels"] = top_kernels(fwd, cuda)
            row["variants"][v] = res
            log(model, label, v, {k: (round(x, 3) if isinstance(x, float) else x)
                                  for k, x in res.items() if k != "top_kernels"})
        rows.append(row)
    set_variant("split", runner)
    return rows  # the engine goes with this frame; main() empties the allocator's cache


def host_costs(model: str, device: str) -> dict:
    """Host microseconds per call, enqueued back to back on tiny inputs (the GPU is idle, so
    the wall is the host's): the attention entry over a mixed batch's work lists, one fused
    Triton kernel, one cuBLAS GEMM, one whole eager forward of that batch."""
    cuda = device == "cuda"
    llm = LLM(model, device=device, dtype="bfloat16" if cuda else "float32", gpu_memory_utilization=0.3,
              max_model_len=4096, max_num_seqs=64, attention_backend="triton",
              **({"max_num_batched_tokens": 2048} if cuda else {"max_num_batched_tokens": 512, "num_gpu_blocks_override": 64}))
    runner, m = llm.engine.runner, llm.engine.model
    inp = prepare(runner, [(40, 100)] + [(1, 50)] * 3, mixed_graphs=False)
    meta = runner._meta(inp.num_tokens, inp.num_seqs, inp.max_query_len, inp.max_seq_len,
                        runner._max_cols(inp), inp.num_decode_seqs, runner._work(inp.work_items))
    lay, kv = m.layers[0], runner.kv_caches
    q = torch.randn(inp.num_tokens, lay.hq, lay.d, dtype=m.dtype, device=device)
    x = torch.randn(inp.num_tokens, m.spec.hidden_size, dtype=m.dtype, device=device)

    def attn():
        m.backend.paged_attention(q, kv[0, 0], kv[0, 1], meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                  lay.scale, meta.max_query_len, meta.max_seq_len, k_scale=lay.k_scale,
                                  v_scale=lay.v_scale, num_decode_seqs=meta.num_decode_seqs, work=meta.work)

    calls = {"paged_attention (2 launches, work lists)": attn,
             "add_rms_norm (1 Triton launch)": lambda: m.backend.add_rms_norm(x, x, lay.post_attention_layernorm.weight, 1e-5),
             "linear (1 cuBLAS GEMM)": lambda: m.backend.linear(x, lay.o_proj.weight),
             "eager forward (whole model)": lambda: runner.forward(inp)}
    out = {}
    for name, fn in calls.items():
        n = 5 if name.startswith("eager") else 200
        fn()
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t) / n * 1e6
        if cuda:
            torch.cuda.synchronize()
        log(f"host cost, {model}: {name}: {out[name]:.1f} us per call")
    return out


def capture_experiment(model: str, size: int, device: str) -> list[dict]:
    """An engine with mixed graphs up to `size` tokens: capture time, and eager vs mixed-graph
    step time for prefill steps past vLLM's default capture size of 512."""
    cuda = device == "cuda"
    t0 = time.perf_counter()
    llm = LLM(model, device=device, dtype="bfloat16" if cuda else "float32", gpu_memory_utilization=0.85,
              max_model_len=16384, max_num_seqs=256, attention_backend="triton", max_cudagraph_capture_size=size,
              **({"max_num_batched_tokens": 8192} if cuda else {"max_num_batched_tokens": 512, "num_gpu_blocks_override": 64}))
    runner = llm.engine.runner
    log(f"{model}: capture size {size}: engine in {time.perf_counter() - t0:.1f} s, {len(runner.mixed_graphs)} mixed graphs")
    rows = []
    for label, seqs in [("prefill 768", [(768, 0)]), ("prefill 1024 + 16 decodes @1K", [(1024, 0)] + [(1, 1024)] * 16),
                        ("chunk 1536 over 2K + 20 decodes @2K", [(1536, 2048)] + [(1, 2048)] * 20),
                        ("prefill 2000", [(2000, 0)])] if cuda else [("prefill 40", [(40, 0)])]:
        inp = prepare(runner, seqs, mixed_graphs=False)
        ginp = prepare(runner, seqs, mixed_graphs=True)
        row = {"model": model, "capture_size": size, "shape": label, "eager_ms": time_ms(lambda inp=inp: runner.forward(inp), cuda),
               "graph_kind": ginp.graph_kind, "graph_size": ginp.graph_size}
        if ginp.graph_kind == "mixed":
            row["mixed_graph_ms"] = time_ms(lambda ginp=ginp: runner.forward(ginp), cuda)
        rows.append(row)
        log(row)
    return rows


def markdown(rows: list[dict], variants: list[str]) -> str:
    head = "| model | shape | tokens | roofline ms | " + " | ".join(
        f"{v} eager / graph / mixed graph ms" for v in variants) + " |"
    lines = [head, "|" + "---|" * (4 + len(variants))]
    for r in rows:
        cells = []
        for v in variants:
            x = r["variants"].get(v, {})

            def f(key, x=x):
                val = x.get(key)
                return "-" if val is None else f"{val:.2f}"
            cells.append(f"{f('eager_ms')} / {f('graph_ms')} / {f('mixed_graph_ms')}")
        roof = "-" if r["roofline_ms"] is None else f"{r['roofline_ms']:.2f}"
        lines.append(f"| {r['model']} | {r['shape']} | {r['tokens']} | {roof} | " + " | ".join(cells) + " |")
    out = ["\n".join(lines), ""]
    for r in rows:
        for v, x in r["variants"].items():
            if "top_kernels" in x:
                out.append(f"### {r['model']}, {r['shape']}, {v}: top kernels (us per step, calls)\n")
                out += [f"- {k['us_per_step']:.1f} us, {k['calls']:.0f}x {k['name']}" for k in x["top_kernels"]]
                out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=["llama-3.2-1b", "llama-3.1-8b"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--capture-size", type=int, default=2048,
                    help="also time the first model's steps past 512 tokens with mixed graphs up to this size (0: skip)")
    ap.add_argument("--dry-run", action="store_true", help="tiny model on the CPU interpreter")
    a = ap.parse_args()
    device = "cpu" if a.dry_run else "cuda"
    from kernels import _interpreter_compat

    _interpreter_compat.apply()  # a no-op unless TRITON_INTERPRET=1 (the dry run)
    models = ["tiny"] if a.dry_run else a.models
    a.out.mkdir(parents=True, exist_ok=True)
    checks = check_split_prefill(device)
    bad = [c for c in checks if not (c["all_written"] and c["rel_err"] <= 1e-2)]
    rows: list[dict] = []
    extra: dict = {"host_costs": {}, "capture": []}

    def save() -> None:
        (a.out / "profile_steps.json").write_text(json.dumps(
            {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "torch": torch.__version__, "variants": {v: VARIANTS[v] for v in a.variants},
             "split_checks": checks, "rows": rows, **extra}, indent=1))

    for model in models:
        extra["host_costs"][model] = host_costs(model, device)
        if device == "cuda":
            import gc

            gc.collect()
            torch.cuda.empty_cache()
        rows += run_model(model, a.variants, not a.no_profile, device)
        if device == "cuda":
            import gc

            gc.collect()
            torch.cuda.empty_cache()  # the engine of the last model, before the next one sizes its KV
        save()
    if a.capture_size:
        extra["capture"] = capture_experiment(models[0], a.capture_size if device == "cuda" else 40, device)
        save()
    md = markdown(rows, a.variants)
    (a.out / "profile_steps.md").write_text(md + "\n")
    print(md)
    print(f"split checks: {len(checks) - len(bad)}/{len(checks)} passed" + (f"; FAILED {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
