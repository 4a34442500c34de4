"""Request-level measurements as inputs: `vllm bench serve` result files and Prometheus scrapes.

`read_bench(path)` reads what `vllm bench serve --save-result --save-detailed` writes (vLLM's
vllm/benchmarks/serve.py): the run's setup (`date`, `backend`, `model_id`, `tokenizer_id`,
`num_prompts`, `request_rate` — a number or "inf" —, `burstiness`, `max_concurrency`), its totals
(`duration`, `completed`, `failed`, `total_input_tokens`, `total_output_tokens`,
`request_throughput`, `output_throughput`), the summary keys (`mean_/median_/std_/pNN_` of `ttft`,
`tpot`, `itl`, `e2el`, in ms) and, with `--save-detailed`, one entry per request in send order:
`input_lens`, `output_lens`, `ttfts` (s), `itls` (a list of s per request), `generated_texts`,
`errors` ("" when it succeeded). Newer versions add `start_times` (the client's perf_counter when
the request was sent) and `latencies` (e2e, s); older ones have neither, so e2e is `ttft +
sum(itls)` and the send times must be rebuilt (`arrival_times`). A file written with
`--append-result` holds one JSON object per line: each is a run.

`read_scrape(path)` reads a Prometheus text exposition of vLLM's `/metrics` and `scrape_delta`
turns two of them (before and after a benchmark) into what happened in between: histogram
counts and sums, counters, and the gauges after.

Bad input is refused in one line naming the file, the key (and row) and the fix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.bench_format import RequestResult, RunInfo, bench_result, results_from_aiperf
from engine.core.input_files import InputFileError, decode_utf8, json_type, read_bytes

MAX_BENCH_BYTES = 512 << 20  # a 100k-request detailed result with generated texts
MAX_SCRAPE_BYTES = 64 << 20
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls")
BENCH_FIX = ("rerun `vllm bench serve ... --save-result --save-detailed` (the per-request lists "
             "come with --save-detailed)")


class BenchFileError(InputFileError):
    """A benchmark result or scrape that cannot be used; names the file, the key or row, the fix."""


@dataclass(frozen=True)
class BenchRun:
    """One `vllm bench serve` run: its setup, the client's per-request measurements, its summary."""

    path: Path
    index: int  # which run of the file (an --append-result file holds several)
    model_id: str | None
    backend: str | None
    date: str | None
    request_rate: float  # math.inf: all sent at once (vLLM's "inf")
    burstiness: float
    max_concurrency: int | None
    duration_s: float
    input_lens: np.ndarray  # int64 [n], send order
    output_lens: np.ndarray  # int64 [n], 0 for a failed request
    ttft_s: np.ndarray  # float64 [n]
    itls_s: list[np.ndarray]  # per request, the gaps between its tokens after the first
    latency_s: np.ndarray  # e2e per request (`latencies`, else ttft + sum(itls))
    start_s: np.ndarray | None  # send time since the first send (`start_times`); None in older files
    ok: np.ndarray  # bool [n]: succeeded (no error, at least one token)
    summary: dict[str, Any] = field(default_factory=dict)  # the file's scalar keys as written

    @property
    def name(self) -> str:
        return self.path.stem if self.index == 0 else f"{self.path.stem}#{self.index}"

    def __len__(self) -> int:
        return int(self.input_lens.size)


def _bad(path: Path, where: str, what: str, fix: str = BENCH_FIX) -> BenchFileError:
    return BenchFileError(f"{path}: {where} {what}; {fix}")


def _number(path: Path, obj: dict[str, Any], key: str, *, default: Any = None, allow_inf: bool = False,
            minimum: float = 0.0) -> Any:
    v = obj.get(key, default)
    if v is None:
        return default
    if allow_inf and v in ("inf", "Infinity"):
        return math.inf
    if (isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or not (math.isfinite(v) or allow_inf)
            or v < minimum):
        raise _bad(path, f"key '{key}'", f"must be a number >= {minimum:g}, not {json_type(v)} ({str(v)[:40]})")
    return v


def _list(path: Path, obj: dict[str, Any], key: str, n: int | None) -> list[Any]:
    v = obj.get(key)
    if not isinstance(v, list):
        what = "is missing" if v is None else f"must be a list, not {json_type(v)}"
        raise _bad(path, f"key '{key}'", what)
    if n is not None and len(v) != n:
        raise _bad(path, f"key '{key}'", f"has {len(v)} entries but 'input_lens' has {n} (one per request)",
                   "the file is damaged or edited: rerun the benchmark")
    return v


def _floats(path: Path, key: str, values: list[Any], *, lo: float = 0.0) -> np.ndarray:
    for i, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < lo:
            raise _bad(path, f"key '{key}' row {i}", f"must be a finite number >= {lo:g}, not {json_type(x)} "
                       f"({str(x)[:40]})", "the file is damaged or edited: rerun the benchmark")
    return np.asarray(values, dtype=np.float64)


def _ints(path: Path, key: str, values: list[Any]) -> np.ndarray:
    for i, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise _bad(path, f"key '{key}' row {i}", f"must be a token count (an integer >= 0), not "
                       f"{json_type(x)} ({str(x)[:40]})", "the file is damaged or edited: rerun the benchmark")
    return np.asarray(values, dtype=np.int64)


def _itls(path: Path, values: list[Any]) -> list[np.ndarray]:
    out = []
    for i, row in enumerate(values):
        if not isinstance(row, list):
            raise _bad(path, f"key 'itls' row {i}", f"must be a list of seconds, not {json_type(row)}")
        out.append(_floats(path, f"itls[{i}]", row))
    return out


def _errors(path: Path, obj: dict[str, Any], n: int) -> np.ndarray:
    if obj.get("errors") is None:
        return np.zeros(n, dtype=bool)
    errs = _list(path, obj, "errors", n)
    return np.array([bool(e) for e in errs], dtype=bool)


def parse_bench(obj: Any, path: Path, index: int = 0) -> BenchRun:
    """One result object (see the module's docstring) as a `BenchRun`, every key checked."""
    if not isinstance(obj, dict):
        raise _bad(path, "the top level", f"must be a JSON object, not {json_type(obj)}")
    missing = [k for k in DETAILED_KEYS if k not in obj]
    if missing:
        raise _bad(path, f"key '{missing[0]}'", "is missing: the per-request lists are what a fit needs")
    n = len(_list(path, obj, "input_lens", None))
    if n == 0:
        raise _bad(path, "key 'input_lens'", "is empty: the run sent no requests")
    input_lens = _ints(path, "input_lens", obj["input_lens"])
    output_lens = _ints(path, "output_lens", _list(path, obj, "output_lens", n))
    ttft = _floats(path, "ttfts", _list(path, obj, "ttfts", n))
    itls = _itls(path, _list(path, obj, "itls", n))
    failed = _errors(path, obj, n)
    latency = (_floats(path, "latencies", _list(path, obj, "latencies", n)) if obj.get("latencies") is not None
               else ttft + np.array([float(x.sum()) for x in itls]))
    start = None
    if obj.get("start_times") is not None:
        raw = _floats(path, "start_times", _list(path, obj, "start_times", n), lo=-math.inf)
        start = raw - raw.min()
    ok = ~failed & (output_lens > 0)
    rate = _number(path, obj, "request_rate", default=math.inf, allow_inf=True)
    burst = _number(path, obj, "burstiness", default=1.0, allow_inf=True)
    if rate == 0 or burst == 0:
        raise _bad(path, f"key '{'request_rate' if rate == 0 else 'burstiness'}'", "must be > 0")
    conc = obj.get("max_concurrency")
    if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
        raise _bad(path, "key 'max_concurrency'", f"must be null or an integer >= 1, not {str(conc)[:40]}")
    duration = _number(path, obj, "duration", default=None)
    if duration is None:
        ends = (start if start is not None else 0.0) + latency
        duration = float(np.max(ends[ok])) if ok.any() else 0.0
    summary = {k: v for k, v in obj.items() if not isinstance(v, list | dict)}
    return BenchRun(path=path, index=index, model_id=_str(obj, "model_id"), backend=_str(obj, "backend"),
                    date=_str(obj, "date"), request_rate=float(rate), burstiness=float(burst), max_concurrency=conc,
                    duration_s=float(duration), input_lens=input_lens, output_lens=output_lens, ttft_s=ttft,
                    itls_s=itls, latency_s=latency, start_s=start, ok=ok, summary=summary)


def _str(obj: dict[str, Any], key: str) -> str | None:
    v = obj.get(key)
    return v if isinstance(v, str) else None


def _is_aiperf(obj: Any) -> bool:
    """An AIPerf per-request record (`profile_export.jsonl`): metadata with the request's start."""
    return isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) and "request_start_ns" in obj["metadata"]


def _from_aiperf(path: Path, records: list[Any]) -> BenchRun:
    """An AIPerf export written as a bench result (engine/core/bench_format.py's converter), then read."""
    try:
        results, duration = results_from_aiperf(records)
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(path, "an AIPerf record", f"cannot be read ({exc!s:.80})",
                   "give AIPerf's profile_export.jsonl as it wrote it (AIPerf 0.13)") from None
    info = RunInfo(model_id="", num_prompts=len(results), request_rate=math.inf, backend="aiperf")
    return parse_bench(bench_result(results, duration, info), path)


def read_bench(path: str | Path) -> list[BenchRun]:
    """The runs of a result file: one JSON object, or one per line (`--append-result`); an AIPerf
    per-request export (`profile_export.jsonl`, one record per line) is one run."""
    path = Path(path)
    text = decode_utf8(path, read_bytes(path, max_bytes=MAX_BENCH_BYTES, what="benchmark result"))
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) < 2:
            raise _bad(path, f"line {exc.lineno}", f"is not valid JSON ({exc.msg})",
                       "give the file `vllm bench serve --save-result` wrote") from None
    else:
        return [_from_aiperf(path, [obj]) if _is_aiperf(obj) else parse_bench(obj, path)]
    objs = []
    for i, line in enumerate(lines):
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise _bad(path, f"line {i + 1}", f"is not valid JSON ({exc.msg})",
                       "an --append-result file holds one result object per line") from None
    if _is_aiperf(objs[0]):
        return [_from_aiperf(path, objs)]
    return [parse_bench(obj, path, index=i) for i, obj in enumerate(objs)]


# --------------------------------------------------------------------------- arrivals
def arrival_times(run: BenchRun, seed: int = 0) -> tuple[np.ndarray, str]:
    """When each request was sent (s since the first), and how that was found:

    - `start_times` in the file (newer vLLM): as measured;
    - a concurrency cap without them: the client replayed (each request starts when one of the
      `max_concurrency` slots frees, at the rate's send times), from the measured latencies;
    - a finite rate: vLLM's process redrawn (Gamma gaps of shape `burstiness`, scaled so that
      the n sends span n / rate as vLLM scales them); the same process, not the same draws
      (vLLM's draws depend on what its dataset sampling drew before);
    - rate "inf": all at t = 0."""
    n = len(run)
    if run.start_s is not None:
        return run.start_s, "measured (start_times)"
    if math.isinf(run.request_rate):
        sends, how = np.zeros(n), "all at t=0 (request_rate inf)"
    else:
        rng = np.random.default_rng(seed)
        gaps = (np.full(n, 1.0 / run.request_rate) if math.isinf(run.burstiness)
                else rng.gamma(run.burstiness, 1.0 / (run.request_rate * run.burstiness), n))
        sends = np.cumsum(gaps)
        sends *= (n / run.request_rate) / sends[-1]
        sends -= sends[0]
        how = f"redrawn (Gamma, rate {run.request_rate:g}/s, burstiness {run.burstiness:g}, seed {seed})"
    if run.max_concurrency is not None and run.max_concurrency < n:
        sends = closed_loop_sends(sends, run.latency_s, run.max_concurrency)
        how += f", gated by max_concurrency {run.max_concurrency} with the measured latencies"
    return sends, how


def closed_loop_sends(sends: np.ndarray, latency_s: np.ndarray, slots: int) -> np.ndarray:
    """Send times of a client that holds at most `slots` requests in flight: request i goes at
    max(its own time, the first slot free), and holds that slot for its measured latency."""
    free = np.zeros(slots)
    out = np.empty_like(sends)
    for i, t in enumerate(sends):
        j = int(np.argmin(free))
        out[i] = max(float(t), float(free[j]))
        free[j] = out[i] + float(latency_s[i])
    return out


# --------------------------------------------------------------------------- writing the format
def step_end_times(steps: dict[str, np.ndarray]) -> np.ndarray:
    """When each step ended (a row of n steps expanded: durations first_dt .. last_dt), sorted."""
    k = steps["n_steps"].astype(np.int64)
    first, last = steps["first_dt_s"].astype(np.float64), steps["last_dt_s"].astype(np.float64)
    single = k <= 1
    ends = [steps["t_start_s"][single] + steps["total_s"][single]]
    for t0, a, b, n in zip(steps["t_start_s"][~single], first[~single], last[~single], k[~single], strict=True):
        ends.append(t0 + np.cumsum(a + (b - a) * np.arange(n) / max(n - 1, 1)))
    return np.sort(np.concatenate(ends))


def request_itls(first_s: float, finish_s: float, n_tokens: int, ends: np.ndarray) -> tuple[list[float], bool]:
    """A request's gaps between tokens, as its client saw them: the step ends in (first token,
    last token] when there are exactly n - 1 of them (a token per step); else n - 1 equal gaps
    (a preemption or speculative steps: the count does not match). (gaps, exact)."""
    if n_tokens <= 1:
        return [], True
    eps = 1e-7
    lo, hi = np.searchsorted(ends, first_s + eps), np.searchsorted(ends, finish_s + eps)
    times = ends[lo:hi]
    if times.size == n_tokens - 1:
        return np.diff(np.concatenate([[first_s], times[:-1], [finish_s]])).tolist(), True
    return [(finish_s - first_s) / (n_tokens - 1)] * (n_tokens - 1), False


def _rate(arrival_s: np.ndarray) -> float:
    """The mean send rate (requests / span) as a result file states it; inf when all at once."""
    span = float(arrival_s.max() - arrival_s.min()) if arrival_s.size else 0.0
    return arrival_s.size / span if span > 0 else math.inf


def bench_from_tables(requests: dict[str, np.ndarray], steps: dict[str, np.ndarray], *, duration_s: float,
                      model_id: str, backend: str, date: str) -> tuple[dict[str, Any], int]:
    """A run's request and step tables (engine/core/records.py columns: the engine's or the
    simulator's) written as `vllm bench serve --save-result --save-detailed` would have measured
    them from a client, by the one writer of that format (engine/core/bench_format.py): send time
    = arrival, TTFT, token gaps (`request_itls`), e2e; a request that did not finish is a failed
    one (empty output, its status in `errors`). Returns (the result object, requests whose gaps
    were spread evenly)."""
    ends = step_end_times(steps)
    order = np.argsort(requests["arrival_s"], kind="stable")
    results, spread = [], 0
    for i in order:
        done = requests["status"][i] == "finished"
        n = int(requests["num_output_tokens"][i]) if done else 0
        gaps, exact = (request_itls(float(requests["first_token_s"][i]), float(requests["finish_s"][i]), n, ends)
                       if done else ([], True))
        spread += not exact
        results.append(RequestResult(
            prompt_len=int(requests["prompt_len"][i]), success=bool(done), output_len=n,
            ttft_s=float(requests["ttft_s"][i]) if done else 0.0, itls_s=gaps,
            latency_s=float(requests["e2e_s"][i]) if done else 0.0, start_s=float(requests["arrival_s"][i]),
            error="" if done else f"{requests['status'][i]}: {requests['finish_reason'][i]}"))
    info = RunInfo(model_id=model_id, num_prompts=len(results), request_rate=_rate(requests["arrival_s"]),
                   backend=backend)
    return bench_result(results, duration_s, info) | {"date": date}, spread


# --------------------------------------------------------------------------- Prometheus scrapes
ITL_NAMES = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
HISTOGRAMS = {"ttft": ("vllm:time_to_first_token_seconds",), "itl": ITL_NAMES,
              "e2e": ("vllm:e2e_request_latency_seconds",), "prefill": ("vllm:request_prefill_time_seconds",),
              "decode": ("vllm:request_decode_time_seconds",), "queue": ("vllm:request_queue_time_seconds",),
              "iteration_tokens": ("vllm:iteration_tokens_total",)}
COUNTERS = {"preemptions": "vllm:num_preemptions", "prefix_cache_queries": "vllm:prefix_cache_queries",
            "prefix_cache_hits": "vllm:prefix_cache_hits", "prompt_tokens": "vllm:prompt_tokens",
            "generation_tokens": "vllm:generation_tokens"}
GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")}
SCRAPE_FIX = "save the server's /metrics text (curl http://HOST:PORT/metrics > FILE) just before and just after the run"


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound (+Inf last), their sum and count (summed over labels)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    count: float

    def minus(self, other: Histogram) -> Histogram:
        if other.bounds != self.bounds:
            raise ValueError("bucket bounds differ between the two scrapes")
        return Histogram(self.bounds, tuple(a - b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
                         self.sum - other.sum, self.count - other.count)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus's histogram_quantile: linear within the bucket (the +Inf bucket: its lower bound)."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lo_bound, lo_count = 0.0, 0.0
        for b, c in zip(self.bounds, self.cumulative, strict=True):
            if c >= rank:
                if math.isinf(b):
                    return lo_bound
                return lo_bound + (b - lo_bound) * ((rank - lo_count) / (c - lo_count) if c > lo_count else 1.0)
            lo_bound, lo_count = b, c
        return lo_bound


@dataclass(frozen=True)
class Scrape:
    """One /metrics exposition: histograms, counters and gauges (summed over label sets), and
    `vllm:cache_config_info`'s labels (num_gpu_blocks, block_size) when the server exports it."""

    path: Path
    histograms: dict[str, Histogram]
    counters: dict[str, float]
    gauges: dict[str, float]
    cache_config: dict[str, str]


def _families(path: Path, text: str) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise BenchFileError(f"{path}: not a Prometheus text exposition ({str(exc)[:80]}); {SCRAPE_FIX}") from None


def _histogram(samples: list[Any]) -> Histogram:
    buckets: dict[float, float] = {}
    total = count = 0.0
    for s in samples:
        if s.name.endswith("_bucket"):
            b = float(s.labels["le"])
            buckets[b] = buckets.get(b, 0.0) + s.value
        elif s.name.endswith("_sum"):
            total += s.value
        elif s.name.endswith("_count"):
            count += s.value
    bounds = tuple(sorted(buckets))
    return Histogram(bounds, tuple(buckets[b] for b in bounds), total, count)


def read_scrape(path: str | Path) -> Scrape:
    """A vLLM /metrics scrape (see the module's docstring)."""
    path = Path(path)
    return parse_scrape_text(decode_utf8(path, read_bytes(path, max_bytes=MAX_SCRAPE_BYTES, what="metrics scrape")),
                             path)


def parse_scrape_text(text: str, path: str | Path) -> Scrape:
    """A Prometheus exposition's vLLM histograms, counters, gauges and cache config (the server's,
    or a simulation's own `prometheus_text()`, read alike)."""
    path = Path(path)
    by_name = {fam.name: fam for fam in _families(path, text)}
    if not any(n.startswith("vllm:") for n in by_name):
        raise BenchFileError(f"{path}: no vllm:* metric in the file (is it a vLLM server's /metrics?); {SCRAPE_FIX}")
    hist = {}
    for key, names in HISTOGRAMS.items():
        fam = next((by_name[n] for n in names if n in by_name and by_name[n].type == "histogram"), None)
        if fam is not None:
            hist[key] = _histogram(fam.samples)
    counters = {key: sum(s.value for s in by_name[n].samples if s.name.endswith("_total"))
                for key, n in COUNTERS.items() if n in by_name}
    gauges = {}
    for key, names in GAUGES.items():
        for n in (names,) if isinstance(names, str) else names:
            if n in by_name:
                gauges[key] = sum(s.value for s in by_name[n].samples)
                break
    info = by_name.get("vllm:cache_config_info")
    cache = dict(info.samples[0].labels) if info is not None and info.samples else {}
    return Scrape(path=path, histograms=hist, counters=counters, gauges=gauges, cache_config=cache)


@dataclass(frozen=True)
class ScrapeDelta:
    """What the server counted between two scrapes."""

    before: Path
    after: Path
    histograms: dict[str, Histogram]
    counters: dict[str, float]
    gauges_after: dict[str, float]
    num_gpu_blocks: int | None  # from vllm:cache_config_info, when exported

    @property
    def prefix_hit_rate(self) -> float | None:
        q = self.counters.get("prefix_cache_queries")
        return self.counters.get("prefix_cache_hits", 0.0) / q if q else None


def scrape_delta(before: Scrape, after: Scrape, *, keep_new: bool = False) -> ScrapeDelta:
    """after - before; refused when a counter went down (a server restart between the scrapes).
    `keep_new`: a histogram only `after` has is kept whole (else left out)."""
    hist = {}
    for key, h in after.histograms.items():
        if key not in before.histograms:
            if keep_new:
                hist[key] = h
            continue
        try:
            d = h.minus(before.histograms[key])
        except ValueError as exc:
            raise BenchFileError(f"{after.path}: histogram {HISTOGRAMS[key][0]}: {exc}; {SCRAPE_FIX}") from None
        if d.count < 0:
            raise BenchFileError(f"{after.path}: histogram {HISTOGRAMS[key][0]} counts fewer observations than "
                                 f"{before.path} (a server restart in between?); {SCRAPE_FIX}")
        hist[key] = d
    counters = {k: after.counters[k] - before.counters[k] for k in after.counters if k in before.counters}
    down = [k for k, v in counters.items() if v < 0]
    if down:
        raise BenchFileError(f"{after.path}: counter {COUNTERS[down[0]]} is lower than in {before.path} (a server "
                             f"restart in between, or the files swapped?); give the scrape from before the run first")
    blocks = after.cache_config.get("num_gpu_blocks")
    return ScrapeDelta(before=before.path, after=after.path, histograms=hist, counters=counters,
                       gauges_after=dict(after.gauges),
                       num_gpu_blocks=int(blocks) if blocks and str(blocks).isdigit() else None)


def read_scrape_pair(paths: list[Path]) -> ScrapeDelta:
    """Scrapes of one run: BEFORE AFTER (the earlier first), or one scrape of a server started for
    the run (everything it counted is the run's)."""
    if len(paths) not in (1, 2):
        raise BenchFileError(f"one run takes two scrapes (before and after it), or one of a server started for "
                             f"it; got {len(paths)}; {SCRAPE_FIX}")
    after = read_scrape(paths[-1])
    if len(paths) == 1:
        return scrape_delta(Scrape(paths[0], {}, {k: 0.0 for k in after.counters}, {}, {}), after, keep_new=True)
    return scrape_delta(read_scrape(paths[0]), after)


__all__ = [
    "DETAILED_KEYS",
    "BenchFileError",
    "BenchRun",
    "Histogram",
    "Scrape",
    "ScrapeDelta",
    "arrival_times",
    "bench_from_tables",
    "closed_loop_sends",
    "parse_bench",
    "parse_scrape_text",
    "read_bench",
    "read_scrape",
    "read_scrape_pair",
    "request_itls",
    "scrape_delta",
    "step_end_times",
]
