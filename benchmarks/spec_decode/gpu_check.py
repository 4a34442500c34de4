"""Speculative decoding on the GPU: are greedy tokens the same with drafts as without?

`check(target, draft, out_json)` runs one workload (prompts longer than the token budget,
shared prefixes that hit the prefix cache when later requests arrive, repeats that n-gram
lookup finds) through the engine without drafts, then with the draft model and with n-gram
lookup, each with a roomy and a tight KV pool (preemptions), CUDA graphs on (decode and verify
graphs of the target, single-token graphs of the draft). It writes a JSON verdict: per run,
whether every request's tokens equal the reference, the acceptance figures, preemptions,
prefix-cache hits and how many steps replayed a graph. Exit status 1 when a run differs.

On a machine without CUDA it runs the same on the CPU, eagerly (no graphs), so the script can
be dry-run: `python benchmarks/spec_decode/gpu_check.py --target tiny --draft tiny --out v.json`.
`target`/`draft`: checkpoint directories (engine.loader) or model presets (engine.core.model_spec).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from engine.core.config import EngineArgs
from engine.core.request import Request
from engine.engine_loop import EngineCore, build_model, resolve_device
from engine.model import LlamaModel
from engine.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class Setup:
    """Engine sizes of the check, per device: small on the CPU, GPU-sized otherwise."""

    dtype: str
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    tight_blocks: int  # a pool that forces preemptions
    output_len: int
    k: int


GPU = Setup("bfloat16", 2048, 512, 32, 16, 80, 64, 4)
CPU = Setup("float32", 256, 32, 6, 4, 24, 10, 3)


@dataclass(slots=True)
class RunVerdict:
    name: str
    identical: bool
    num_different_requests: int
    num_preemptions: int
    prefix_cache_hits_tokens: int
    num_spec_drafts: int
    num_spec_draft_tokens: int
    num_spec_accepted_tokens: int
    acceptance_length: float | None
    target_graph_replays: int
    draft_graph_replays: int
    eager_forwards: int
    wall_s: float
    divergences: list = field(default_factory=list)  # Divergence of each differing request


@dataclass(slots=True)
class Divergence:
    """Where a run's greedy tokens first leave the reference's, and how close the two candidates
    are in an fp64 dense forward of the target (engine/dense_reference.py): a gap of a few
    hundredths of a logit is a numerical near-tie (bf16 kernels reduce in another order when a
    step verifies k+1 positions than when it decodes one), not a wrong acceptance."""

    request_id: int
    index: int  # output token position
    reference_token: int
    run_token: int
    fp64_argmax: int | None = None
    fp64_gap: float | None = None  # logit(reference_token) - logit(run_token), fp64
    fp64_top2_gap: float | None = None


def workload(vocab: int, s: Setup, seed: int = 0) -> list[tuple[int, list[int]]]:
    """(step to add it at, prompt)."""
    g = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(16, vocab, (n,), generator=g).tolist()

    shared = rand(2 * s.block_size)
    long = rand(2 * s.max_num_batched_tokens + 5)  # longer than the token budget: chunked
    loop = rand(7) * 5  # n-gram lookup finds its continuation
    a, b, c = rand(9), rand(3 * s.block_size + 1), rand(5)
    return [(0, shared + a), (0, long), (0, loop), (0, b), (3, shared + c), (5, shared + b), (6, a * 4),
            (8, long[: s.max_num_batched_tokens + 3])]


def run(core: EngineCore, work: list[tuple[int, list[int]]], output_len: int) -> dict[int, list[int]]:
    step, pending = 0, sorted(enumerate(work), key=lambda x: x[1][0])
    while pending or core.has_unfinished():
        while pending and pending[0][1][0] <= step:
            rid, (_, p) = pending.pop(0)
            req = Request(request_id=rid, arrival_s=0.0, prompt_len=len(p), output_len=output_len,
                          hash_ids=tuple(range(-(-len(p) // 16))))
            core.add_request(req, SamplingParams(max_tokens=output_len, ignore_eos=True), p)
        core.step()
        step += 1
    return {rid: st.output_token_ids for rid, st in core.requests.items()}


def _engine(target: str, model: LlamaModel, draft: LlamaModel | None, spec: dict | None, s: Setup,
            blocks: int | None, eager: bool) -> EngineCore:
    args = EngineArgs(model=target, dtype=s.dtype, max_model_len=s.max_model_len,
                      max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
                      block_size=s.block_size, num_gpu_blocks_override=blocks, enforce_eager=eager,
                      speculative_config=spec, gpu_memory_utilization=0.5)
    return EngineCore(args, model=model, draft_model=draft)


def _divergences(out: dict, ref: dict) -> list[Divergence]:
    found = []
    for rid, want in ref.items():
        got = out[rid]
        if got != want:
            i = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            found.append(Divergence(rid, i, want[i] if i < len(want) else -1, got[i] if i < len(got) else -1))
    return found


def _explain(divs: list[Divergence], target: str, prompts: dict[int, list[int]], ref: dict) -> None:
    """Fill in the fp64 dense reference's view of each divergence (on the CPU: exact, seconds).
    Only for checkpoint folders (a preset has no weights to read back); best effort: the verdict
    stands without it."""
    path = Path(target)
    if not divs or not path.is_dir():
        return
    try:
        from engine.dense_reference import dense_logits
        from engine.loader import _read_tensors, spec_from_hf_config
        spec = spec_from_hf_config(json.loads((path / "config.json").read_text()))
        w = {k: v.float().cpu() for k, v in _read_tensors(path).items()}
    except Exception as exc:  # noqa: BLE001
        print(f"divergence diagnosis skipped: {exc!r}", file=sys.stderr)
        return
    for d in divs:
        logits = dense_logits(spec, w, prompts[d.request_id] + ref[d.request_id][: d.index])[-1]
        top2 = torch.topk(logits, 2)
        d.fp64_argmax = int(top2.indices[0])
        d.fp64_top2_gap = float(top2.values[0] - top2.values[1])
        if d.reference_token >= 0 and d.run_token >= 0:
            d.fp64_gap = float(logits[d.reference_token] - logits[d.run_token])


def _verdict(name: str, core: EngineCore, out: dict, ref: dict, wall_s: float) -> RunVerdict:
    st = core.scheduler.stats
    diff = sum(out[r] != ref[r] for r in ref)
    drafter = core.drafter
    return RunVerdict(
        name=name, identical=diff == 0, num_different_requests=diff, num_preemptions=st.num_preemptions,
        prefix_cache_hits_tokens=st.prefix_cache_hits_tokens, num_spec_drafts=st.num_spec_drafts,
        num_spec_draft_tokens=st.num_spec_draft_tokens, num_spec_accepted_tokens=st.num_spec_accepted_tokens,
        acceptance_length=1 + st.num_spec_accepted_tokens / st.num_spec_drafts if st.num_spec_drafts else None,
        target_graph_replays=core.runner.num_graph_replays,
        draft_graph_replays=drafter.runner.num_graph_replays if drafter else 0,
        eager_forwards=core.runner.num_eager_forwards, wall_s=wall_s, divergences=_divergences(out, ref))


def check(target: str, draft: str, out_json: str | Path, dtype: str | None = None) -> dict:
    """Greedy tokens with drafts (draft model, n-gram) vs without, roomy and tight pools; the
    verdict is written to `out_json` and returned. `dtype` overrides the device's default."""
    target, draft = str(target), str(draft)  # checkpoint folders may come as Paths
    device = resolve_device("auto")
    s = GPU if device.type == "cuda" else CPU
    if dtype:
        s = replace(s, dtype=dtype)
    eager = device.type != "cuda"
    probe = EngineArgs(model=target, dtype=s.dtype, max_model_len=s.max_model_len)
    model = build_model(probe, device, s.max_model_len)
    draft_model = build_model(probe.model_copy(update={"model": draft}), device, s.max_model_len)
    work = workload(model.spec.vocab_size, s)
    specs = {"off": None, "draft": {"model": draft, "num_speculative_tokens": s.k},
             "ngram": {"method": "ngram", "num_speculative_tokens": s.k, "prompt_lookup_min": 2,
                       "prompt_lookup_max": 5}}
    runs, ref = [], None
    for pool, blocks in (("roomy", None), ("tight", s.tight_blocks)):
        for name, spec in specs.items():
            core = _engine(target, model, draft_model if name == "draft" else None, spec, s, blocks, eager)
            t = time.perf_counter()
            out = run(core, work, s.output_len)
            if ref is None:
                ref = out  # spec off, roomy pool: the reference of every run
            runs.append(_verdict(f"{name}-{pool}", core, out, ref, time.perf_counter() - t))
            _explain(runs[-1].divergences, target, dict(enumerate(p for _, p in work)), ref)
            del core  # its KV cache, before the next engine sizes its own
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    verdict = {"device": str(device), "target": target, "draft": draft, "setup": asdict(s),
               "ok": all(r.identical for r in runs), "runs": [asdict(r) for r in runs]}
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(verdict, indent=2) + "\n")
    return verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="tiny", help="target checkpoint directory or model preset")
    ap.add_argument("--draft", default="tiny", help="draft checkpoint directory or model preset")
    ap.add_argument("--out", default="spec_gpu_check.json", help="verdict JSON file")
    ap.add_argument("--dtype", default=None, help="model dtype (default: bfloat16 on CUDA, float32 on CPU)")
    a = ap.parse_args(argv)
    v = check(a.target, a.draft, a.out, a.dtype)
    for r in v["runs"]:
        print(f"{r['name']:>12}: identical={r['identical']} accepted/drafted={r['num_spec_accepted_tokens']}/"
              f"{r['num_spec_draft_tokens']} preemptions={r['num_preemptions']} "
              f"graphs={r['target_graph_replays']}+{r['draft_graph_replays']} eager={r['eager_forwards']}")
    return 0 if v["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
