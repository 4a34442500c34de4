"""Cost lines: for each optimization, the variable that decides whether it pays on this traffic,
swept around the user's operating point, with the break-even value where the gain crosses zero.

Gain is the mean end-to-end latency ratio (without / with the optimization, as a % change):
defined at any load, negative where the optimization costs more than it saves."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from advisor.advise.evaluate import Evaluator, Outcome, SimTask
from advisor.advise.records import CPU_LABEL, CostLine, CostPoint
from advisor.advise.robustness import lower_acceptance
from advisor.advise.search import Context
from advisor.advise.space import Candidate, Layout
from advisor.advise.variants import rate_of, scaled_prompts, with_dynamic, with_rate, with_reuse
from engine.core.model_spec import get_model
from sim.config import DisaggConfig, SpeculativeConfig
from sim.workload_spec import WorkloadSpec

RATE_FACTORS = (0.5, 1.0, 2.0, 4.0)
ACCEPTANCE_DROPS = (0.6, 0.3, 0.0)
PROMPT_FACTORS = (0.25, 1.0, 4.0)
REUSE_SHARES = (0.0, 0.5, 1.0)
DYNAMIC_SHARES = (0.3, 1.0)  # share 0 is the reuse line's last point
BLOCK_SIZES = (16, 64, 256, 2048)  # 2048: the auto block size of hybrid models (vllm#53749)
BUDGETS_TOKENS = (512, 2048, 8192)
CPU_RATE_FACTORS = (1.0, 4.0, 16.0)
CPU_BOTTLENECK_SHARE = 0.5  # block manager + scheduler CPU at half the step time: the GPU waits
FALLBACK_SPEC = {"method": "eagle3", "num_speculative_tokens": 2}


def latency_cut_pct(off: Outcome, on: Outcome) -> float:
    """How much shorter the mean end-to-end latency is with the optimization: (1 - on / off) x 100;
    negative where it lengthens it. The charts plot this and the text quotes it (one number)."""
    a, b = off.extras.get("mean_e2e_ms", math.nan), on.extras.get("mean_e2e_ms", math.nan)
    return (1 - b / a) * 100 if a and math.isfinite(a) and math.isfinite(b) else math.nan


def speed_words(pct: float) -> str:
    """`latency_cut_pct` as words: positive means requests finish sooner on average."""
    if not math.isfinite(pct):
        return "has no measurable effect on mean end-to-end latency"
    if abs(pct) < 0.5:
        return "leaves mean end-to-end latency unchanged"
    ratio = 1 - pct / 100  # mean latency with / without
    if pct > 0:
        return f"cuts mean end-to-end latency by {pct:.0f}% (x{ratio:.2f})"
    return f"raises mean end-to-end latency by {-pct:.0f}% (x{ratio:.2f})"


def goodput_pct(off: Outcome, on: Outcome) -> float:
    a, b = off.metrics.goodput_rps, on.metrics.goodput_rps
    return (b / a - 1) * 100 if a > 0 else 0.0


def _at(pts: Sequence[CostPoint], x: float) -> float | None:
    """The gain of the point swept at `x` (None: the sweep does not include it)."""
    return next((p.gain_pct for p in pts if p.x == x), None)


def crossing(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The first x where y changes sign, linearly interpolated (None if it never does)."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)]
    pts.sort()
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if y0 == 0:
            return x0
        if (y0 > 0) != (y1 > 0):
            return x0 + (x1 - x0) * y0 / (y0 - y1)
    return None


class _Sweeps:
    """Builds the sweep tasks around the recommendation on `n` requests of the spec's traffic."""

    def __init__(self, ev: Evaluator, ctx: Context, spec: WorkloadSpec, best: Candidate, n: int) -> None:
        self.ev, self.ctx, self.spec, self.best, self.n = ev, ctx, spec, best, n
        self.engine = ctx.task(best).config.engine

    def task(self, variant: WorkloadSpec, engine: dict[str, Any] | None = None,
             layout: Layout | None = None) -> SimTask:
        t = self.ctx.task(self.best, self.n, variant=variant, engine=engine)
        if layout is None:
            return t
        update = {"num_gpus": layout.num_gpus, "disaggregation": layout.disaggregation(),
                  "engine": t.config.engine.model_copy(update={"tensor_parallel_size": layout.tensor_parallel_size})}
        return SimTask(t.config.model_copy(update=update), t.num_requests, variant)

    def run(self, tasks: list[SimTask]) -> list[Outcome]:
        outs = self.ev.map(tasks)
        refused = next((o.error for o in outs if o.error), None)
        if refused is not None:  # a point of the line cannot start (e.g. the model does not fit)
            raise PointDoesNotStart(refused)
        return outs


class PointDoesNotStart(Exception):
    """A cost line's sweep reached a configuration vLLM would refuse to start: the line is left out
    (its other points would be measured against nothing)."""


def _drawable(line: Callable[[_Sweeps], Any]) -> Callable[[_Sweeps], Any]:
    def draw(sw: _Sweeps) -> Any:
        try:
            return line(sw)
        except PointDoesNotStart:
            return []
    return draw


def spec_lines(sw: _Sweeps) -> list[CostLine]:
    spec = sw.engine.speculative_config or SpeculativeConfig(**FALLBACK_SPEC)
    on = {"speculative_config": spec.model_dump()}
    off = {"speculative_config": None}
    variants = [with_rate(sw.spec, f) for f in RATE_FACTORS]
    outs = sw.run([sw.task(v, e) for v in variants for e in (off, on)]
                  + [sw.task(sw.spec, {"speculative_config": lower_acceptance(spec, d)}) for d in ACCEPTANCE_DROPS])
    pairs = [(outs[2 * i], outs[2 * i + 1]) for i in range(len(variants))]
    pts = [CostPoint(x=o.extras["concurrency"], gain_pct=latency_cut_pct(o, s), goodput_delta_pct=goodput_pct(o, s),
                     detail={"rate_rps": o.extras["rate_rps"], "acceptance_rate": s.extras["acceptance_rate"]})
           for o, s in pairs]
    op = pairs[RATE_FACTORS.index(1.0)][0].extras["concurrency"]
    be = crossing([p.x for p in pts], [p.gain_pct for p in pts])
    name = f"speculative decoding ({spec.method} k={spec.num_speculative_tokens})"
    here = pts[RATE_FACTORS.index(1.0)].gain_pct
    conc = CostLine(optimization=name, variable="mean concurrency", unit="requests", points=pts, break_even=be,
                    operating_point=op, operating_gain_pct=here, answer=(
                        f"{name} {speed_words(here)} at your concurrency of {op:.0f}; "
                        + (f"it stops paying above a mean concurrency of {be:.0f}." if be is not None else
                           f"no break-even between concurrency {pts[0].x:.0f} and {pts[-1].x:.0f}.")))
    off_here = pairs[RATE_FACTORS.index(1.0)][0]
    acc = [CostPoint(x=o.extras["acceptance_rate"], gain_pct=latency_cut_pct(off_here, o),
                     goodput_delta_pct=goodput_pct(off_here, o)) for o in outs[2 * len(variants):]]
    be_a = crossing([p.x for p in acc], [p.gain_pct for p in acc])
    accept = CostLine(optimization=name, variable="acceptance rate", unit="share of drafted tokens", points=acc,
                      break_even=be_a, operating_point=acc[-1].x, operating_gain_pct=acc[-1].gain_pct, answer=(
                          f"at your traffic's acceptance of {acc[-1].x:.2f} {name} "
                          f"{speed_words(acc[-1].gain_pct)}; " + (f"below an acceptance of {be_a:.2f} it costs more than it saves."
                                                           if be_a is not None else
                                                           f"it still pays at an acceptance of {acc[0].x:.2f}.")))
    return [conc, accept]


def disagg_line(sw: _Sweeps) -> CostLine | None:
    tp = sw.engine.tensor_parallel_size
    n_gpus = max(sw.ctx.num_gpus, 2 * tp)
    if n_gpus // tp < 2:
        return None
    agg, pd = Layout(tp, n_gpus), Layout(tp, n_gpus, 1, n_gpus // tp - 1)
    variants = [scaled_prompts(sw.spec, f) for f in PROMPT_FACTORS]
    outs = sw.run([sw.task(v, layout=lay) for v in variants for lay in (agg, pd)])
    model, gpu_link = get_model(sw.ctx.model), DisaggConfig(num_prefill_replicas=1, num_decode_replicas=1, link="nvlink")
    per_token = model.kv_bytes_per_token(sw.engine.kv_cache_dtype)
    pts = []
    for i, v in enumerate(variants):
        a, p = outs[2 * i], outs[2 * i + 1]
        tokens = a.extras["mean_prompt_tokens"]
        pts.append(CostPoint(x=tokens, gain_pct=latency_cut_pct(a, p), goodput_delta_pct=goodput_pct(a, p),
                             detail={"kv_bytes": tokens * per_token, "kv_transfer_ms": p.extras["kv_transfer_ms"],
                                     "ttft_p50_delta_ms": p.metrics.ttft_p50_ms - a.metrics.ttft_p50_ms}))
    op = pts[PROMPT_FACTORS.index(1.0)]
    be = crossing([p.x for p in pts], [p.gain_pct for p in pts])
    where = (f"P/D 1P:{n_gpus // tp - 1}D on {n_gpus} GPUs over {gpu_link.link}"
             + (" (evaluated on 2 GPUs: you gave 1)" if sw.ctx.num_gpus < n_gpus else ""))
    return CostLine(optimization="disaggregated prefill", variable="mean prompt length", unit="tokens", points=pts,
                    break_even=be, operating_point=op.x, operating_gain_pct=op.gain_pct, answer=(
                        f"{where} {speed_words(op.gain_pct)} at your mean prompt of {op.x:,.0f} tokens, "
                        f"moving {op.detail['kv_bytes'] / 1e6:,.0f} MB of KV per request in "
                        f"{op.detail['kv_transfer_ms']:.1f} ms; "
                        + (f"it wins above ~{be:,.0f} prompt tokens." if be is not None and op.gain_pct < 0 else
                           f"it loses below ~{be:,.0f} prompt tokens." if be is not None else
                           "no break-even in the prompt lengths swept.")))


def prefix_lines(sw: _Sweeps) -> list[CostLine]:
    on, off = {"enable_prefix_caching": True}, {"enable_prefix_caching": False}
    reuse = [with_reuse(sw.spec, s) for s in REUSE_SHARES]
    dyn = [with_dynamic(with_reuse(sw.spec, 1.0), s, 0) for s in DYNAMIC_SHARES]
    outs = sw.run([sw.task(sw.spec, off)] + [sw.task(v, on) for v in reuse + dyn])
    base, ons = outs[0], outs[1:]
    pts = [CostPoint(x=o.extras["prefix_hit_rate"], gain_pct=latency_cut_pct(base, o), goodput_delta_pct=goodput_pct(base, o),
                     detail={"share_with_prefix": s}) for s, o in zip(REUSE_SHARES, ons, strict=False)]
    here = sw.run([sw.task(sw.spec, on)])[0]
    be = crossing([p.x for p in pts], [p.gain_pct for p in pts])
    hit = here.extras["prefix_hit_rate"]
    here_gain = latency_cut_pct(base, here)
    line = CostLine(optimization="prefix caching", variable="prefix-cache hit rate", unit="share of prompt tokens",
                    points=pts, break_even=be, operating_point=hit, operating_gain_pct=here_gain, answer=(
                        f"prefix caching hits {hit:.0%} of your prompt tokens and "
                        f"{speed_words(here_gain)}; "
                        + (f"below a hit rate of {be:.0%} its hashing costs more than it saves." if be is not None
                           else "it costs nothing measurable even at 0% hits (vLLM V1's claim holds here).")))
    dyn_outs = [ons[len(REUSE_SHARES) - 1], *ons[len(REUSE_SHARES):]]
    dpts = [CostPoint(x=sh, gain_pct=latency_cut_pct(base, o), goodput_delta_pct=goodput_pct(base, o),
                      detail={"hit_rate": o.extras["prefix_hit_rate"]})
            for sh, o in zip((0.0, *DYNAMIC_SHARES), dyn_outs, strict=True)]
    dline = CostLine(optimization="prefix caching", variable="share of requests with a dynamic prefix at token 0",
                     unit="share of requests", points=dpts, break_even=crossing([p.x for p in dpts], [p.gain_pct for p in dpts]),
                     operating_point=0.0, operating_gain_pct=dpts[0].gain_pct, answer=(
                         f"a timestamp or user id at the start of {DYNAMIC_SHARES[0]:.0%} of prompts drops the hit rate from "
                         f"{dpts[0].detail['hit_rate']:.0%} to {dpts[1].detail['hit_rate']:.0%} (all prompts: "
                         f"{dpts[-1].detail['hit_rate']:.0%}) and the mean E2E latency cut from {dpts[0].gain_pct:+.0f}% to "
                         f"{dpts[1].gain_pct:+.0f}%; put per-request content after the shared prefix."))
    return [line, dline]


def block_line(sw: _Sweeps) -> CostLine:
    outs = sw.run([sw.task(sw.spec, {"block_size": b}) for b in BLOCK_SIZES])
    ref = outs[0]
    pts = [CostPoint(x=b, gain_pct=latency_cut_pct(ref, o), goodput_delta_pct=goodput_pct(ref, o),
                     detail={"hit_rate": o.extras["prefix_hit_rate"], "kv_usage_max": o.extras["kv_usage_max"],
                             "cpu_share": o.extras["cpu_share"]}) for b, o in zip(BLOCK_SIZES, outs, strict=True)]
    big = pts[-1]
    return CostLine(optimization="block size", variable="--block-size", unit="tokens per block", points=pts,
                    break_even=None, operating_point=float(sw.engine.block_size),
                    operating_gain_pct=_at(pts, sw.engine.block_size), answer=(
                        f"block size 16 -> 64 {speed_words(pts[1].gain_pct)} (hit rate "
                        f"{pts[0].detail['hit_rate']:.0%} -> {pts[1].detail['hit_rate']:.0%}, CPU "
                        f"{pts[0].detail['cpu_share']:.1%} -> {pts[1].detail['cpu_share']:.1%} of step time); at "
                        f"{int(big.x)} tokens per block (a hybrid model's auto size) the hit rate is {big.detail['hit_rate']:.0%}."))


def budget_line(sw: _Sweeps) -> CostLine:
    outs = sw.run([sw.task(sw.spec, {"max_num_batched_tokens": b, "max_num_seqs": min(b, 1024)}) for b in BUDGETS_TOKENS])
    ref = outs[-1]
    pts = [CostPoint(x=b, gain_pct=latency_cut_pct(ref, o), goodput_delta_pct=goodput_pct(ref, o),
                     detail={"preemptions": o.metrics.preemptions, "recompute_share": o.extras["recompute_share"],
                             "ttft_p99_ms": o.metrics.ttft_p99_ms}) for b, o in zip(BUDGETS_TOKENS, outs, strict=True)]
    low = pts[0]
    return CostLine(optimization="chunked prefill token budget", variable="--max-num-batched-tokens", unit="tokens",
                    points=pts, break_even=crossing([p.x for p in pts], [p.gain_pct for p in pts]),
                    operating_point=float(sw.engine.max_num_batched_tokens or 8192),
                    operating_gain_pct=_at(pts, sw.engine.max_num_batched_tokens or 8192), answer=(
                        f"a budget of {int(low.x)} tokens (below most of your prompts) gives {int(low.detail['preemptions'])} "
                        f"preemptions, {low.detail['recompute_share']:.1%} recomputed prefill and TTFT p99 "
                        f"{low.detail['ttft_p99_ms']:,.0f} ms against {pts[-1].detail['ttft_p99_ms']:,.0f} ms at 8192."))


def cpu_line(sw: _Sweeps) -> CostLine:
    outs = sw.run([sw.task(with_rate(sw.spec, f)) for f in CPU_RATE_FACTORS])
    pts = [CostPoint(x=rate_of(sw.spec) * f, gain_pct=o.extras["cpu_share"] * 100,
                     detail={"gpu_busy_share": o.extras["gpu_busy_share"], "goodput_rps": o.metrics.goodput_rps})
           for f, o in zip(CPU_RATE_FACTORS, outs, strict=True)]
    be = crossing([p.x for p in pts], [p.gain_pct - CPU_BOTTLENECK_SHARE * 100 for p in pts])
    return CostLine(optimization="block manager and scheduler CPU", variable="request rate", unit="req/s",
                    points=pts, gain_label=CPU_LABEL, break_even=be, operating_point=rate_of(sw.spec),
                    operating_gain_pct=pts[CPU_RATE_FACTORS.index(1.0)].gain_pct, answer=(
                        f"CPU (scheduler + block manager) takes {pts[0].gain_pct:.1f}% of step time at your "
                        f"{rate_of(sw.spec):.1f} req/s and {pts[-1].gain_pct:.1f}% at {pts[-1].x:.1f} req/s; "
                        + (f"it becomes the bottleneck (half the step) at ~{be:.1f} req/s." if be is not None else
                           f"it stays below half the step time up to {pts[-1].x:.1f} req/s: the GPU is the bottleneck.")))


def expected_simulations() -> int:
    """What `cost_lines` runs when every point starts (for progress): speculative decoding's rate
    pairs and acceptance drops, prefix caching's reuse and dynamic-prefix runs plus the operating
    point, block sizes, token budgets, CPU rates and the P/D prompt pairs."""
    spec = 2 * len(RATE_FACTORS) + len(ACCEPTANCE_DROPS)
    prefix = 1 + len(REUSE_SHARES) + len(DYNAMIC_SHARES) + 1
    return spec + prefix + len(BLOCK_SIZES) + len(BUDGETS_TOKENS) + len(CPU_RATE_FACTORS) + 2 * len(PROMPT_FACTORS)


def cost_lines(ev: Evaluator, ctx: Context, spec: WorkloadSpec, best: Candidate, n: int,
               pool: ThreadPoolExecutor | None = None) -> list[CostLine]:
    """Every cost line around `best` on `n` requests of the spec's traffic. With `pool`, the lines
    submit their simulations at once (the evaluator's workers stay busy); the order of the
    result does not depend on it."""
    sw = _Sweeps(ev, ctx, spec, best, n)
    parts: list[Callable[[_Sweeps], Any]] = [spec_lines, prefix_lines, block_line, budget_line, cpu_line, disagg_line]
    parts = [_drawable(f) for f in parts]
    done = list(pool.map(lambda f: f(sw), parts)) if pool else [f(sw) for f in parts]
    lines: list[CostLine] = []
    for part in done:
        lines += part if isinstance(part, list) else [part] if part else []
    return lines
