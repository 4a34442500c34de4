"""How many distinct experts a decode step of a random-weight MoE preset touches, greedy vs sampled
(issue 29: why qwen3-30b-a3b's decode steps at batch 5-8 over long contexts cost less than the
uniform-routing model says).

The calibration runs decode greedily with random weights. If the sequences of a batch converge on the
same output tokens, their routing is correlated and a step touches fewer experts than uniform routing
at that many tokens predicts (E[distinct] = E (1 - (1 - k/E)^T)). This probe runs the same workload
slices eagerly (every layer's router visible) greedy and at temperature 1, and records per layer call
of a decode-only forward: tokens, distinct experts; and per step the share of sampled tokens equal to
another row's.

    python3 benchmarks/calibration/routing_probe.py --model qwen3-30b-a3b --out $OUT/routing.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import gpu_sweep as gs

import engine.model as engine_model
from engine.core.config import EngineArgs
from engine.core.model_spec import get_model
from engine.engine_loop import EngineCore
from engine.replay import replay
from engine.sampling import SamplingParams

SOURCES = ("mooncake-conversation", "chat-production", "code-bursty")


class RouterTap:
    """Wraps engine.model's router: (tokens, distinct experts) of every layer call while `on`."""

    def __init__(self) -> None:
        self.orig = engine_model.route_ref
        self.on = False
        self.calls: list[tuple[int, int]] = []
        engine_model.route_ref = self

    def __call__(self, logits, top_k, renormalize):
        w, ids = self.orig(logits, top_k, renormalize)
        if self.on:
            self.calls.append((int(ids.shape[0]), int(torch.unique(ids).numel())))
        return w, ids


class SampleTap:
    """Wraps the sampler: per step, the share of rows whose token another row also drew."""

    def __init__(self, core: EngineCore) -> None:
        self.orig = core.sampler.sample
        self.dup_share: list[tuple[int, float]] = []
        core.sampler.sample = self

    def __call__(self, logits, request_ids, params, out=None):
        t = self.orig(logits, request_ids, params, out=out) if out is not None else self.orig(logits, request_ids,
                                                                                             params)
        v = t.tolist()
        if len(v) > 1:
            counts = defaultdict(int)
            for x in v:
                counts[x] += 1
            self.dup_share.append((len(v), sum(c for c in counts.values() if c > 1) / len(v)))
        return t


def uniform_expected(num_experts: int, k: int, tokens: int) -> float:
    return num_experts * (1.0 - (1.0 - k / num_experts) ** tokens)


def probe(core: EngineCore, tap: RouterTap, stap: SampleTap, source: str, n: int, out_len: int,
          temperature: float) -> dict:
    reqs = gs.workload_requests(source, n, None, min(16384, core.config.max_model_len - out_len - 1))
    reqs = [dataclasses.replace(r, output_len=out_len) for r in reqs]

    def params(r):
        return SamplingParams(max_tokens=r.output_len, ignore_eos=True, temperature=temperature)

    core.start_over()
    tap.calls.clear()
    stap.dup_share.clear()
    tap.on = True
    t = time.perf_counter()
    replay(core, reqs, params_for=params, honor_arrivals=False, max_wall_s=60.0)
    tap.on = False
    spec = core.spec
    by_t: dict[int, list[int]] = defaultdict(list)
    for tokens, distinct in tap.calls:
        if tokens <= 64:
            by_t[tokens].append(distinct)
    rows = [{"tokens": T, "layer_calls": len(v), "distinct_mean": float(np.mean(v)),
             "uniform_expected": uniform_expected(spec.num_experts, spec.experts_per_token, T)}
            for T, v in sorted(by_t.items())]
    dup = [s for b, s in stap.dup_share if b >= 4]
    return {"source": source, "requests": n, "output_len": out_len, "temperature": temperature,
            "prompt_mean": float(np.mean([r.prompt_len for r in reqs])), "wall_s": round(time.perf_counter() - t, 1),
            "by_tokens": rows, "by_layer": by_layer(tap.calls, spec.num_layers),
            "dup_token_share_mean": float(np.mean(dup)) if dup else None}


def by_layer(calls: list[tuple[int, int]], num_layers: int) -> dict | None:
    """Distinct experts per layer (mean over the forwards) at the most frequent decode size up to 64
    tokens: where through depth the routing collapses. The calls come a forward at a time, one per
    layer in order."""
    forwards = [calls[i: i + num_layers] for i in range(0, len(calls) - num_layers + 1, num_layers)]
    sizes = [f[0][0] for f in forwards if f[0][0] <= 64 and all(c[0] == f[0][0] for c in f)]
    if not sizes:
        return None
    size = max(set(sizes), key=sizes.count)
    picked = [[d for _, d in f] for f in forwards if f[0][0] == size and all(c[0] == size for c in f)]
    return {"tokens": size, "forwards": len(picked), "distinct_mean": np.mean(picked, axis=0).round(1).tolist()}


@torch.no_grad()
def scale_residual_outputs(core: EngineCore, factor: float) -> None:
    """Each residual branch's output weights (attention's o_proj, the experts' w2) x `factor` on the built
    model (GPT-2's initialisation: 1/sqrt(2 x layers)). Smaller branches keep a token's own embedding
    dominant through depth: an untrained network's attention over a shared context adds nearly the same
    vector to every sequence, layer after layer, and the routers then see nearly one input."""
    for name, p in core.model.named_parameters():
        if name.endswith(("o_proj.weight", ".w2")):
            p.mul_(factor)


@torch.no_grad()
def scale_standin(core: EngineCore, embed_scale: float = 1.0, residual_scale: float = 1.0) -> None:
    """The random-weight stand-in's routing made to follow the token (benchmarks/calibration/data/routing):
    token embeddings x `embed_scale`, residual branch outputs x `residual_scale`. Neither changes a
    step's kernels or bytes, only which experts the tokens route to."""
    if embed_scale != 1.0:
        core.model.embed_tokens.mul_(embed_scale)
    if residual_scale != 1.0:
        scale_residual_outputs(core, residual_scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run (tiny-moe, float32)")
    ap.add_argument("--embed-scales", type=float, nargs="+", default=[1.0],
                    help="probe with the token embeddings at each multiple of the engine's init, in turn")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0],
                    help="decode at each temperature in turn (0: greedy)")
    ap.add_argument("--residual-scale", type=float, default=1.0,
                    help="first scale the residual branches' output weights (o_proj, w2) by this")
    ap.add_argument("--scaled-init", action="store_true",
                    help="also probe with the residual branches' output weights (o_proj, w2) scaled by "
                         "1/sqrt(2 x layers), GPT-2's initialisation, which keeps each token's own embedding "
                         "dominant through depth")
    a = ap.parse_args()
    if any(s <= 0 for s in a.embed_scales):
        ap.error(f"--embed-scales {a.embed_scales}: every multiple must be > 0")
    if a.residual_scale <= 0:
        ap.error(f"--residual-scale {a.residual_scale}: must be > 0")
    if any(t < 0 for t in a.temperatures):
        ap.error(f"--temperatures {a.temperatures}: each must be >= 0 (0: greedy)")
    extra = {"dtype": "float32", "max_model_len": 1024} if a.device == "cpu" else {}
    t0 = time.perf_counter()
    core = EngineCore(EngineArgs(model=a.model, device=a.device, max_num_seqs=256, max_num_batched_tokens=8192,
                                 seed=0, enforce_eager=True, gpu_memory_utilization=0.92, **extra))
    tap, stap = RouterTap(), SampleTap(core)
    scale_standin(core, residual_scale=a.residual_scale)
    results = []
    inits = [f"embed x{s:g}" for s in a.embed_scales] + (["scaled"] if a.scaled_init else [])
    current = 1.0
    for init in inits:
        if init == "scaled":
            scale_residual_outputs(core, (2 * get_model(a.model).num_layers) ** -0.5)
        else:  # the embeddings to this multiple of the engine's init
            target = float(init.split("x")[1])
            with torch.no_grad():
                core.model.embed_tokens.mul_(target / current)
            current = target
        for source in SOURCES:
            for temp in a.temperatures:
                res = probe(core, tap, stap, source, a.requests, a.output_len, temp) | {"init": init}
                results.append(res)
                print(json.dumps({k: v for k, v in res.items() if k not in ("by_tokens", "by_layer")}), flush=True)
                if res["by_layer"]:
                    print("    per layer at", res["by_layer"]["tokens"], "tokens:", res["by_layer"]["distinct_mean"])
                for row in res["by_tokens"]:
                    if row["tokens"] in (1, 2, 4, 6, 8, 12, 16):
                        print("   ", row, flush=True)
    spec = get_model(a.model)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"model": a.model, "residual_scale": a.residual_scale, "experts": spec.num_experts, "top_k": spec.experts_per_token,
                                 "gpu": torch.cuda.get_device_name() if a.device == "cuda" else a.device, "torch": torch.__version__,
                                 "command": " ".join(sys.argv), "seconds": round(time.perf_counter() - t0, 1),
                                 "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
