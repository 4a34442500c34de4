"""Fit a cost profile to request-level measurements (no step traces), by simulation.

What a client measures (`vllm bench serve --save-detailed`: per-request prompt and output
lengths, TTFT, inter-token gaps, e2e, send times) does not say how long each engine step took,
so the step-level least squares of sim/calibrate.py cannot run. Instead the simulator replays
the same requests (`bench_requests`: the measured lengths, the send times of
`sim.bench_results.arrival_times`, unique prompts) with the server's flags, and a few
multipliers of a starting profile are searched until the simulated TTFT / TPOT / ITL / e2e
quantiles and the throughput match the measured ones.

The multipliers (`Multipliers`), four that request-level data can tell apart:
- `prefill`: the GPU time of steps that carry prompt tokens (the profile's `mixed` and
  `mixed_graph` terms): TTFT and the e2e of long prompts move with it;
- `decode`: the per-step GPU time of decode-only steps (the `decode` terms that do not grow with
  context: weights, element-wise, graph replay): TPOT and ITL at any batch;
- `kv`: the decode-only steps' attention, per KV token read (`decode_kv`, `decode_max_kv` and
  their knots): what grows with batch x context, so TPOT rises with load and prompt length;
- `host`: the host time of every step (the `cpu`, `cpu_sync` and `overlap` terms): a fixed cost
  per step, which binds only where the host is slower than the device (synchronous scheduling,
  small batches), which is how it separates from `decode` when the runs span loads and modes.
A first-principles (schema 1) starting profile is first written as schema-2 terms with the same
meaning (`first_principles_v2`), so that the multipliers act on it the same way.

Search (`fit_multipliers`): the loss is the mean absolute log-ratio sim / measured over the fit
keys (`FIT_KEYS`, plus the server's histogram means with `--from-metrics`). It is piecewise
constant in places (a step more or fewer changes a schedule), so no gradient: a 1-D grid over
one common scale (the profile is usually off overall, by GPU or model), then a coordinate grid
per multiplier, then Nelder-Mead (derivative-free, robust to small plateaus) on the logs. Each
evaluation simulates every fit run (the simulator's skip-ahead makes a run of a few hundred
requests a fraction of a second); runs longer than `max_requests` are cut to their first
requests in send order (the load pattern kept, the tail dropped).

Errors are those of `costline validate` (sim/validate.py): signed relative error per metric,
median |error| over the throughput and latency metrics (`ERROR_METRICS`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel

from engine.core.request import Request
from engine.core.run_summary import latency_stats
from sim.bench_results import BenchRun, ScrapeDelta, arrival_times, parse_scrape_text
from sim.config import EngineConfig
from sim.cost_model import CostProfile, CpuTerms, GpuTerms, OverlapTerms
from sim.metrics import SimResult
from sim.run import LoadedWorkload, SimConfig, run
from sim.validate import ERROR_METRICS, MetricComparison, compare_summaries

FACTORS = ("prefill", "decode", "kv", "host")
# the decode terms that grow with the KV read (the `kv` multiplier's); the others are `decode`'s
KV_TERMS = frozenset({"decode_kv", "decode_max_kv", "decode_kv_by_batch", "decode_max_kv_by_batch"})
# fields of a term set that are not seconds or multipliers: a request-level fit leaves them as they are
NOT_SCALED = frozenset({"decode_max_excess"})
BOUNDS = (0.1, 10.0)  # each multiplier's range: a profile off by more than 10x is the wrong profile
LATENCIES = ("ttft", "tpot", "itl", "e2el")
FIT_KEYS = (*(f"{s}_{m}_ms" for m in LATENCIES for s in ("mean", "median", "p90")),
            "p99_ttft_ms", "p99_e2el_ms", "output_throughput")
# --from-metrics: the server's histograms whose means join the loss (sum / count, exact; their
# quantiles would be interpolated within buckets 10 ms wide where ITLs are ~10 ms)
METRIC_KEYS = ("ttft", "itl", "e2e", "prefill", "decode", "iteration_tokens")
MAX_REQUESTS = 2000
GRID = tuple(float(x) for x in np.exp(np.linspace(math.log(0.33), math.log(3.0), 9)))
COORD_STEPS = (-0.4, -0.2, 0.2, 0.4)  # log steps of the coordinate pass
METHOD = ("simulation-based: a common-scale grid (9 points), a coordinate grid per multiplier (4 points "
          "each), then Nelder-Mead on the log multipliers (prefill, decode, kv, host); loss = mean |log(sim / measured)| over "
          "TTFT / TPOT / ITL / e2e mean, p50, p90, TTFT and e2e p99, output throughput")


@dataclass(frozen=True)
class Multipliers:
    prefill: float = 1.0
    decode: float = 1.0
    kv: float = 1.0
    host: float = 1.0

    @classmethod
    def from_log(cls, x: Sequence[float]) -> Multipliers:
        lo, hi = math.log(BOUNDS[0]), math.log(BOUNDS[1])
        return cls(*(math.exp(min(max(float(v), lo), hi)) for v in x))

    def log(self) -> np.ndarray:
        return np.log([getattr(self, f) for f in FACTORS])

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


# --------------------------------------------------------------------------- the profile's knobs
def first_principles_v2(p: CostProfile) -> CostProfile:
    """A schema-1 profile's efficiencies as schema-2 terms (multiplier = 1 / efficiency; decode
    GEMMs read weights, prefill GEMMs compute), its CPU costs as host terms, no overlap terms."""
    if p.is_fitted:
        return p
    decode = GpuTerms(gemm=1 / p.gemm_memory_efficiency, decode_kv=1 / p.attn_memory_efficiency,
                      elementwise=1 / p.elementwise_memory_efficiency, step_s=p.gpu_step_overhead_s)
    mixed = GpuTerms(gemm=1 / p.gemm_compute_efficiency, prefill_attention=1 / p.attn_compute_efficiency,
                     decode_kv=1 / p.attn_memory_efficiency, elementwise=1 / p.elementwise_memory_efficiency,
                     step_s=p.gpu_step_overhead_s)
    cpu = CpuTerms(step_s=p.cpu_step_s, per_seq_s=p.cpu_per_seq_s, per_block_allocated_s=p.cpu_per_block_allocated_s,
                   per_block_hashed_s=p.cpu_per_block_hashed_s)
    return p.model_copy(update={"schema_version": 2, "decode": decode, "mixed": mixed, "cpu": cpu,
                                "overlap": OverlapTerms()})


def _scaled(terms: BaseModel | None, k: float, k_kv: float | None = None) -> Any:
    """Every coefficient of a term set times k (knot lists: their values, not their batches);
    with `k_kv`, the KV_TERMS times k_kv instead; NOT_SCALED fields as they are."""
    if terms is None:
        return None
    upd: dict[str, Any] = {}
    for name, v in terms:
        if name in NOT_SCALED:
            continue
        if k_kv is not None and name in KV_TERMS:
            upd[name] = v * k_kv if isinstance(v, float) else tuple((b, c * k_kv) for b, c in v)
        elif isinstance(v, float):
            upd[name] = v * k
        elif isinstance(v, tuple):
            upd[name] = tuple((b, c * k) for b, c in v)
    return terms.model_copy(update=upd)


def apply_multipliers(p: CostProfile, m: Multipliers) -> CostProfile:
    """`p` with its prefill-step GPU terms x m.prefill, decode-step GPU terms x m.decode (their
    KV terms x m.kv), host terms x m.host (see the module's docstring)."""
    p = first_principles_v2(p)
    return p.model_copy(update={
        "decode": _scaled(p.decode, m.decode, m.kv), "mixed": _scaled(p.mixed, m.prefill),
        "mixed_graph": _scaled(p.mixed_graph, m.prefill), "cpu": _scaled(p.cpu, m.host),
        "cpu_sync": _scaled(p.cpu_sync, m.host), "overlap": _scaled(p.overlap, m.host)})


# --------------------------------------------------------------------------- the workload
@dataclass(eq=False)  # identity: a case is one run (its arrays do not compare as a bool)
class BenchCase:
    """One benchmark run ready to simulate: its requests (the succeeded ones, ids = file rows),
    the server's flags, and the scrape delta of that run when given."""

    run: BenchRun
    engine: EngineConfig
    requests: list[Request]
    rows: np.ndarray  # file rows simulated, in request order
    arrivals: str  # how the send times were found
    metrics: ScrapeDelta | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.run.name


def bench_requests(run: BenchRun, *, seed: int = 0, block_size: int = 16, shared_prefix_tokens: int = 0,
                   max_requests: int = MAX_REQUESTS) -> tuple[list[Request], np.ndarray, str]:
    """The succeeded requests of `run` as simulator requests: measured prompt and output lengths
    (output = what the server produced), send times, and prompts that share only their first
    `shared_prefix_tokens` (a result file holds lengths, not token ids: the prefix structure comes
    from the server's prefix-cache counters, `shared_prefix_for`). At most `max_requests`, the
    first in send order."""
    sends, how = arrival_times(run, seed)
    rows = np.flatnonzero(run.ok)
    rows = rows[np.argsort(sends[rows], kind="stable")][:max_requests]
    if rows.size == 0:
        raise ValueError(f"{run.path}: no request succeeded (every 'errors' entry is set or every output is "
                         "empty); benchmark a working server")
    t0 = float(sends[rows].min())
    shared = shared_prefix_tokens // block_size
    reqs, next_id = [], shared
    for i in rows:
        p = int(max(run.input_lens[i], 1))
        nb = -(-p // block_size)
        common = min(shared, p // block_size)
        ids = (*range(common), *range(next_id, next_id + nb - common))
        reqs.append(Request(request_id=int(i), arrival_s=float(sends[i]) - t0, prompt_len=p,
                            output_len=int(run.output_lens[i]), hash_ids=ids, hash_block_size=block_size))
        next_id += nb - common
    return reqs, rows, how


def shared_prefix_for(run: BenchRun, metrics: ScrapeDelta | None, block_size: int = 16) -> int:
    """The shared prompt prefix (tokens) whose cache hits give the server's prefix-hit rate over
    the run's prompts (0 without metrics or below half a percent of hits): one system prompt for
    all, the structure of sim/fit.py's `fit_spec`. It keeps the hit rate, not how the hits were
    spread (conversations re-sending their history hit more in their later turns)."""
    rate = metrics.prefix_hit_rate if metrics is not None else None
    if not rate or rate < 0.005:
        return 0
    from sim.fit import shared_prefix_tokens

    return shared_prefix_tokens(run.input_lens[run.ok], min(rate, 1.0), block_size)


def make_case(run: BenchRun, engine: EngineConfig, metrics: ScrapeDelta | None = None, *, seed: int = 0,
              max_requests: int = MAX_REQUESTS) -> BenchCase:
    bs = engine.block_size or 16
    prefix = shared_prefix_for(run, metrics, bs)
    reqs, rows, how = bench_requests(run, seed=seed, block_size=bs, shared_prefix_tokens=prefix,
                                     max_requests=max_requests)
    notes = []
    if prefix:
        notes.append(f"a {prefix}-token shared prefix reproduces the server's prefix-hit rate "
                     f"{metrics.prefix_hit_rate:.1%}")  # type: ignore[union-attr]
    if rows.size < int(run.ok.sum()):
        notes.append(f"simulated the first {rows.size} of {int(run.ok.sum())} requests")
    failed = int((~run.ok).sum())
    if failed:
        notes.append(f"{failed} failed request(s) left out")
    return BenchCase(run=run, engine=engine, requests=reqs, rows=rows, arrivals=how, metrics=metrics, notes=notes)


# --------------------------------------------------------------------------- the statistics
def _latencies(ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray, itl: tuple[np.ndarray, np.ndarray | None]
               ) -> dict[str, float]:
    return (latency_stats(ttft).json_items("ttft") | latency_stats(tpot[np.isfinite(tpot)]).json_items("tpot")
            | latency_stats(*itl).json_items("itl") | latency_stats(e2e).json_items("e2el"))


def measured_stats(case: BenchCase, rows: np.ndarray | None = None) -> dict[str, float]:
    """The bench run's figures over `rows` (all simulated rows when None), `vllm bench serve`
    keys; throughputs only over all of them."""
    r = case.run
    sel = case.rows if rows is None else rows
    n = r.output_lens[sel]
    ttft, e2e = r.ttft_s[sel], r.latency_s[sel]
    tpot = np.where(n > 1, (e2e - ttft) / np.maximum(n - 1, 1), np.nan)
    itl = np.concatenate([r.itls_s[i] for i in sel]) if sel.size else np.zeros(0)
    out = _latencies(ttft, tpot, e2e, (itl, None))
    if rows is None:
        span = _span_s(case)
        out |= {"output_throughput": float(n.sum()) / span, "request_throughput": sel.size / span}
    return out


def _span_s(case: BenchCase) -> float:
    """First send to last completion of the simulated rows (the whole run: its duration)."""
    r = case.run
    if case.rows.size == int(r.ok.sum()) and r.duration_s > 0:
        return r.duration_s
    sends = np.array([q.arrival_s for q in case.requests])
    return float(np.max(sends + r.latency_s[case.rows]))


def simulated_stats(case: BenchCase, result: SimResult, rows: np.ndarray | None = None) -> dict[str, float]:
    """The simulator's figures over the same rows (ITL over the whole run: the simulator keeps
    token gaps per step, not per request)."""
    req = result.requests
    pos = {int(i): k for k, i in enumerate(req["request_id"])}
    sel = case.rows if rows is None else rows
    idx = np.array([pos[int(i)] for i in sel], dtype=np.int64)
    done = req["status"][idx] == "finished"
    ttft, tpot, e2e = (np.where(done, req[c][idx], np.inf) for c in ("ttft_s", "tpot_s", "e2e_s"))
    gaps, weights = result.itl_samples()
    out = _latencies(ttft, tpot, e2e, (gaps, weights))
    if rows is None:
        s = result.summary()
        out |= {"output_throughput": s.output_throughput, "request_throughput": s.request_throughput}
    return out


def server_means(delta: ScrapeDelta | dict[str, Any]) -> dict[str, float]:
    """Each METRIC_KEYS histogram's mean (sum / count) over the run: `server_mean_<key>`."""
    hist = delta.histograms if isinstance(delta, ScrapeDelta) else delta
    return {f"server_mean_{k}": hist[k].mean for k in METRIC_KEYS if k in hist and hist[k].count > 0}


def log_loss(measured: dict[str, float], sim: dict[str, float], keys: Sequence[str]) -> float:
    """Mean |log(sim / measured)| over the keys both sides have (a request the simulator never
    finished makes its side infinite: a large, finite penalty). Absolute, not squared: the error
    reported is a median |relative error|, and one wild tail figure (a p99 set by two requests)
    must not buy its fit with every median."""
    terms = []
    for k in keys:
        m, s = measured.get(k), sim.get(k)
        if m is None or s is None or not math.isfinite(m) or m <= 0 or math.isnan(s):
            continue
        terms.append(5.0 if not math.isfinite(s) or s <= 0 else abs(math.log(s / m)))
    return float(np.mean(terms)) if terms else 0.0


# --------------------------------------------------------------------------- simulate and score
def simulate(case: BenchCase, profile: CostProfile, model: str, gpu: str, seed: int = 0) -> SimResult:
    cfg = SimConfig(model=model, gpu=gpu, engine=case.engine, seed=seed, label=case.name)
    return run(LoadedWorkload(case.requests, case.name), cfg, cost_profile=profile)


@dataclass(frozen=True)
class CaseScore:
    """One run (or one half of one) under one profile: its loss and its validate-style errors."""

    name: str
    role: str  # fit / held-out
    loss: float
    median_abs_error: float | None
    metrics: list[MetricComparison]


def score_case(case: BenchCase, result: SimResult, role: str, rows: np.ndarray | None = None) -> CaseScore:
    measured, sim = measured_stats(case, rows), simulated_stats(case, result, rows)
    keys = list(FIT_KEYS)
    if case.metrics is not None and rows is None:
        measured |= server_means(case.metrics)
        sim |= server_means(parse_scrape_text(result.prometheus_text(), "simulation").histograms)
        keys += [f"server_mean_{k}" for k in METRIC_KEYS]
    metrics = compare_summaries(measured, sim, tuple(k for k in ERROR_METRICS if k in measured))
    errs = [abs(m.error) for m in metrics if m.error is not None]
    return CaseScore(name=case.name if rows is None else f"{case.name} ({role} rows)", role=role,
                     loss=log_loss(measured, sim, keys), median_abs_error=float(np.median(errs)) if errs else None,
                     metrics=metrics)


Split = list[tuple[BenchCase, np.ndarray | None]]  # (case, rows scored; None = all)


def split_cases(cases: Sequence[BenchCase], held_out: Sequence[BenchCase]) -> tuple[Split, Split]:
    """Fit and held-out parts: by run when held-out runs are given; one run alone is split by
    request (even rows fit, odd rows held out; the simulation runs every request)."""
    if held_out:
        return [(c, None) for c in cases], [(c, None) for c in held_out]
    fit: Split = []
    held: Split = []
    for c in cases:
        fit.append((c, c.rows[0::2]))
        held.append((c, c.rows[1::2]))
    return fit, held


def score(parts: Split, profile: CostProfile, model: str, gpu: str, role: str,
          cache: dict[int, SimResult] | None = None) -> list[CaseScore]:
    out = []
    for case, rows in parts:
        key = id(case)  # one simulation per case and profile (two files may share a name)
        if cache is None or key not in cache:
            res = simulate(case, profile, model, gpu)
            if cache is not None:
                cache[key] = res
        res = cache[key] if cache is not None else res
        out.append(score_case(case, res, role, rows))
    return out


# --------------------------------------------------------------------------- the search
@dataclass
class Search:
    """The objective over log multipliers, with a cache and an evaluation / CPU-time budget (this
    process's CPU seconds: on a busy machine the wall clock would cut the search short)."""

    parts: Split
    base: CostProfile
    model: str
    gpu: str
    max_evals: int = 150
    max_seconds: float = 240.0
    seen: dict[tuple[float, ...], float] = field(default_factory=dict)
    started: float = field(default_factory=time.process_time)

    def out_of_budget(self) -> bool:
        return len(self.seen) >= self.max_evals or time.process_time() - self.started > self.max_seconds

    def __call__(self, x: Sequence[float]) -> float:
        m = Multipliers.from_log(x)
        key = tuple(round(v, 4) for v in m.log())
        if key in self.seen:
            return self.seen[key]
        if self.out_of_budget():
            return math.inf if not self.seen else max(self.seen.values())
        prof = apply_multipliers(self.base, m)
        scores = score(self.parts, prof, self.model, self.gpu, "fit")
        self.seen[key] = float(np.mean([s.loss for s in scores]))
        return self.seen[key]

    def best(self) -> tuple[np.ndarray, float]:
        key = min(self.seen, key=self.seen.__getitem__)
        return np.array(key), self.seen[key]


def fit_multipliers(search: Search, progress: Callable[[str], None] | None = None) -> Multipliers:
    """Grid over a common scale, a coordinate grid per multiplier, then Nelder-Mead (see the
    module's docstring); returns the best multipliers seen."""
    from scipy.optimize import minimize

    for s in GRID:
        search(np.full(len(FACTORS), math.log(s)))
    x, f = search.best()
    if progress:
        progress(f"common scale {math.exp(x[0]):.3g}: loss {f:.4f}")
    for i in range(len(FACTORS)):
        for step in COORD_STEPS:
            y = x.copy()
            y[i] += step
            search(y)
        x, f = search.best()
    if progress:
        progress(f"coordinate pass {Multipliers.from_log(x)}: loss {f:.4f}")
    simplex = np.vstack([x, *(x + 0.15 * np.eye(len(FACTORS))[i] for i in range(len(FACTORS)))])
    left = max(search.max_evals - len(search.seen), 0)
    if left > 4 and not search.out_of_budget():
        minimize(search, x, method="Nelder-Mead",
                 options={"initial_simplex": simplex, "maxfev": left, "xatol": 0.01, "fatol": 1e-5})
    x, f = search.best()
    if progress:
        progress(f"Nelder-Mead {Multipliers.from_log(x)}: loss {f:.4f} after {len(search.seen)} simulations")
    return Multipliers.from_log(x)


@dataclass
class RequestFit:
    """A fitted profile and how well it reproduces the runs it was fitted on and the held-out ones."""

    profile: CostProfile
    base: str
    multipliers: Multipliers
    fit: list[CaseScore]
    held_out: list[CaseScore]
    evaluations: int
    seconds: float  # wall clock
    cpu_seconds: float = 0.0  # this process's CPU time (the fit is single-threaded)

    @staticmethod
    def _median(scores: list[CaseScore]) -> float | None:
        errs = [abs(m.error) for s in scores for m in s.metrics if m.error is not None]
        return float(np.median(errs)) if errs else None

    @property
    def fit_error(self) -> float | None:
        return self._median(self.fit)

    @property
    def held_out_error(self) -> float | None:
        return self._median(self.held_out)


def fit_request_level(cases: Sequence[BenchCase], base: CostProfile, model: str, gpu: str, *,
                      held_out: Sequence[BenchCase] = (), max_evals: int = 150, max_seconds: float = 240.0,
                      progress: Callable[[str], None] | None = None) -> RequestFit:
    """Fit `base`'s multipliers to `cases` and score fit and held-out parts (`split_cases`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fit_parts, held_parts = split_cases(cases, held_out)
    search = Search(fit_parts, base, model, gpu, max_evals=max_evals, max_seconds=max_seconds)
    m = fit_multipliers(search, progress)
    prof = apply_multipliers(base, m)
    cache: dict[int, SimResult] = {}
    fit_scores = score(fit_parts, prof, model, gpu, "fit", cache)
    held_scores = score(held_parts, prof, model, gpu, "held-out", cache)
    return RequestFit(profile=prof, base=base.name, multipliers=m, fit=fit_scores, held_out=held_scores,
                      evaluations=len(search.seen), seconds=time.perf_counter() - t0,
                      cpu_seconds=time.process_time() - c0)


def fitted_profile(fit: RequestFit, *, name: str, model: str, gpu: str, sources: list[str],
                   metrics_files: list[str], arrivals: dict[str, str], date: str) -> CostProfile:
    """The profile to write: the fitted terms, provenance `measured (request-level fit)`, the
    source files, the method and the fit and held-out errors."""
    err = {"method": METHOD, "multipliers": fit.multipliers.as_dict(), "base_profile": fit.base,
           "fit_median_abs_error": fit.fit_error, "held_out_median_abs_error": fit.held_out_error,
           "runs": {s.name: {"role": s.role, "median_abs_error": s.median_abs_error}
                    for s in [*fit.fit, *fit.held_out]},
           "simulations": fit.evaluations, "seconds": round(fit.seconds, 1),
           "cpu_seconds": round(fit.cpu_seconds, 1)}
    return fit.profile.model_copy(update={
        "name": name, "hardware": gpu, "model": model, "scaled_from": None, "validation": None,
        "source": (f"measured (request-level fit): {fit.base} with multipliers "
                   + ", ".join(f"{k} {v:.3g}" for k, v in fit.multipliers.as_dict().items())
                   + f", fitted by simulation to {len(sources)} benchmark file(s)"),
        "provenance": {"kind": "measured (request-level fit)", "bench_files": sources,
                       "metrics_files": metrics_files, "arrivals": arrivals, "date": date, "gpu": gpu,
                       "model": model, "base_profile": fit.base},
        "fit_error": {"request_level": err}})


__all__ = [
    "BOUNDS",
    "FACTORS",
    "FIT_KEYS",
    "METHOD",
    "BenchCase",
    "CaseScore",
    "Multipliers",
    "RequestFit",
    "Search",
    "apply_multipliers",
    "bench_requests",
    "first_principles_v2",
    "fit_multipliers",
    "fit_request_level",
    "fitted_profile",
    "log_loss",
    "make_case",
    "measured_stats",
    "score",
    "score_case",
    "shared_prefix_for",
    "simulate",
    "simulated_stats",
    "split_cases",
]
