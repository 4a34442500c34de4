"""`costline engine serve` on the H200 (issue 27): HTTP overhead, 1,000 streaming clients, and
bench-format client results for request-level calibration.

    python3 benchmarks/serve/h200.py --out "$OUT/serve" [--budget-s 230]
    TRITON_INTERPRET=1 python benchmarks/serve/h200.py --out /tmp/serve-dry --dry-run   # CPU, tiny model

1. In-process replay (a child process: `engine run`'s path, `engine.replay.replay`): a chat-like
   request set all at once (saturation: requests/s), then Poisson at 80% (twice: the run-to-run
   noise) and 100% of it; each load has its own prompts (no prefix-cache hits across loads).
2. `costline engine serve` (a child process), driven over HTTP by the streaming load client
   (engine/serve/load_client.py, measured as `vllm bench serve`): the same requests (same token
   ids, same arrival times) at the same three loads -> throughput ratio HTTP / in-process (the
   all-at-once load is the throughput test; below saturation throughput follows the arrivals),
   TTFT and TPOT deltas, engine step periods; then 1,000 concurrent streaming clients (short outputs, all at once); then six
   bench-format runs (three length mixes x two loads, one over /v1/chat/completions) with a
   /metrics scrape before and after each.
Writes under --out: summary.json, summary.md, runs.tar.gz (every HTTP run's `--save-detailed`
JSON + its scrapes), server.log. Each child is a separate process so the GPU is whole for each.

Both sides run with async scheduling (the mode of the calibration's mixed-load validation runs,
benchmarks/calibration/README.md): the engine's host work for step N+1 overlaps step N on the GPU,
so the event loop's share of the GIL (one SSE chunk per token per stream) delays launches only
when it exceeds a step's GPU time; benchmarks/serve/loop_cost.py measures that share on a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.core.bench_format import RunInfo, bench_result
from engine.core.request import Request, materialize_prompt


@dataclass(frozen=True)
class Mix:
    """A length mix: lognormal prompt and output lengths (median, sigma, clipped to [lo, hi])."""

    name: str
    prompt: tuple[float, float, int, int]
    output: tuple[float, float, int, int]


# conversation-like (ShareGPT-ish medians), prefill-heavy (RAG), decode-heavy (long answers)
MIXES = {"chat": Mix("chat", (600, 0.8, 16, 3000), (150, 0.7, 8, 400)),
         "long-prompt": Mix("long-prompt", (2000, 0.5, 256, 6000), (60, 0.5, 8, 200)),
         "long-output": Mix("long-output", (150, 0.6, 16, 1000), (400, 0.5, 32, 1200))}
DRY_SCALE = 0.05  # dry run: lengths x this (tiny model on the CPU)


@dataclass(frozen=True)
class Setup:
    dry: bool
    model: str
    flags: dict  # EngineArgs fields, shared by the replay and the server
    num_requests: int
    num_concurrent: int
    num_bench: int

    @staticmethod
    def make(dry: bool) -> Setup:
        if dry:
            return Setup(True, "tiny", {"model": "tiny", "device": "cpu", "max_model_len": 1024, "seed": 0,
                                        "async_scheduling": True}, 24, 48, 12)
        return Setup(False, "llama-3.1-8b", {"model": "llama-3.1-8b", "dtype": "bfloat16", "max_model_len": 8192,
                                             "seed": 0, "async_scheduling": True}, 400, 1000, 200)

    def cli_flags(self) -> list[str]:
        out = []
        for k, v in self.flags.items():
            flag = f"--{k.replace('_', '-')}"
            if isinstance(v, bool):  # a switch: --async-scheduling / --no-async-scheduling
                out.append(flag if v else f"--no-{flag[2:]}")
            else:
                out += [flag, str(v)]
        return out


def lengths(mix: Mix, n: int, seed: int, dry: bool) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for median, sigma, lo, hi in (mix.prompt, mix.output):
        scale = DRY_SCALE if dry else 1.0
        x = np.exp(rng.normal(math.log(median * scale), sigma, n))
        out.append(np.clip(np.rint(x), max(1, int(lo * scale)), max(2, int(hi * scale))).astype(int).tolist())
    return out[0], out[1]


def make_requests(mix: Mix, n: int, seed: int, arrivals: list[float], vocab: int, dry: bool) -> list[Request]:
    """Requests with their own random hash ids (no shared prefixes) and materialised token ids."""
    p_lens, o_lens = lengths(mix, n, seed, dry)
    rng = np.random.default_rng(seed + 1)
    reqs = []
    for i, (p, o, a) in enumerate(zip(p_lens, o_lens, arrivals)):
        hashes = tuple(int(h) for h in rng.integers(1, 2**62, -(-p // 16)))
        r = Request(request_id=i, arrival_s=a, prompt_len=p, output_len=o, hash_ids=hashes)
        reqs.append(Request(request_id=i, arrival_s=a, prompt_len=p, output_len=o, hash_ids=hashes,
                            prompt_token_ids=tuple(materialize_prompt(r, vocab))))
    return reqs


def vocab_of(model: str) -> int:
    from engine.core.model_spec import get_model

    return get_model(model).vocab_size


# ---------------------------------------------------------------------------------------- replay child
# (name, load as a fraction of saturation (inf: all at once), request-set seed): each load has
# its own prompts, so a server that ran an earlier load gets no prefix-cache hits from it
LOADS = (("offline", math.inf, 0), ("0.8sat", 0.8, 1), ("1.0sat", 1.0, 2))
REPEATED_LOAD = "0.8sat"  # the in-process side runs it twice: the run-to-run noise


def load_requests(setup: Setup, name: str, sat: float, vocab: int) -> tuple[list[Request], float]:
    """One load's requests (arrival times included) and its rate, the same on both sides."""
    from engine.serve.load_client import arrival_offsets

    _, frac, seed = next(load for load in LOADS if load[0] == name)
    n, rate = setup.num_requests, frac * sat
    arr = arrival_offsets(n, rate, seed=11 + seed)
    return make_requests(MIXES["chat"], n, seed, arr, vocab, setup.dry), rate


def replay_child(setup: Setup, out_file: Path) -> None:
    """Phase 1 in its own process: build, warm up, the offline run (saturation), then Poisson at
    80% (twice) and 100% of it, each from an empty KV cache."""
    from engine.core.config import EngineArgs
    from engine.engine_loop import EngineCore
    from engine.replay import replay

    if setup.dry:
        import torch

        # CPU: one intra-op thread, as the server's engine thread gets; two OpenMP threads on a
        # shared 2-core box spin against each other and make the replay 10-100x slower
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    core = EngineCore(EngineArgs(usage_context="api_server", **setup.flags))
    warm = core.warm_up()
    built_s = time.perf_counter() - t0
    vocab = core.spec.vocab_size
    reqs, _ = load_requests(setup, "offline", math.inf, vocab)
    offline = replay(core, reqs, honor_arrivals=False)
    sat = offline.summary().request_throughput
    runs = {"offline": _replay_stats(offline.summary().to_json_dict()) | {"rate": math.inf}}
    for name in ("0.8sat", "1.0sat", REPEATED_LOAD):
        core.start_over()
        reqs, rate = load_requests(setup, name, sat, vocab)
        key = name + "-repeat" if name in runs else name
        runs[key] = _replay_stats(replay(core, reqs).summary().to_json_dict()) | {"rate": rate}
    out_file.write_text(json.dumps({"saturation_rps": sat, "build_s": built_s, "warm_up_s": warm.seconds,
                                    "num_gpu_blocks": core.num_gpu_blocks, "async_scheduling": core.async_scheduling,
                                    "runs": runs}, indent=2, default=str))


def _replay_stats(s: dict) -> dict:
    keys = ("duration", "completed", "request_throughput", "output_throughput", "total_token_throughput",
            "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
            "num_engine_steps")
    return {k: s.get(k) for k in keys}


# ---------------------------------------------------------------------------------------- server side
class Server:
    """`costline engine serve` as a child process; stopped with SIGINT (uvicorn's graceful stop)."""

    def __init__(self, setup: Setup, port: int, log: Path) -> None:
        cmd = [sys.executable, "-m", "costline.cli", "engine", "serve", "--port", str(port), *setup.cli_flags()]
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.t0 = time.perf_counter()

    def wait_ready(self, timeout_s: float) -> float:
        while time.perf_counter() - self.t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see server.log")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - self.t0
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the server was not ready after {timeout_s:.0f} s")

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return r.read().decode()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


def client_requests(reqs: list[Request], as_text: bool):
    from engine.serve.load_client import ClientRequest

    def prompt(r: Request):
        # text: one word per token for the word tokenizer; ids: exactly the replay's tokens
        return " ".join(f"t{t}" for t in r.prompt_token_ids) if as_text else list(r.prompt_token_ids)

    return [ClientRequest(prompt(r), r.prompt_len, r.output_len) for r in reqs]


@dataclass
class HttpRun:
    label: str
    result: dict  # bench-format JSON
    scrape_before: str
    scrape_after: str


def http_run(server: Server, setup: Setup, label: str, reqs: list[Request], rate: float, *, burstiness: float = 1.0,
             chat: bool = False, as_text: bool = False, seed: int = 11) -> HttpRun:
    from engine.serve.load_client import arrival_offsets, run_load

    arr = [r.arrival_s for r in reqs] if seed is None else arrival_offsets(len(reqs), rate, burstiness, seed)
    # (seed None: the requests' own arrival times, e.g. all 0 for an all-at-once load)
    before = server.scrape()
    results, duration = asyncio.run(run_load(server.url, setup.model, client_requests(reqs, as_text), arr,
                                             chat=chat))
    after = server.scrape()
    info = RunInfo(model_id=setup.model, num_prompts=len(reqs), request_rate=rate, burstiness=burstiness,
                   endpoint_type="openai-chat" if chat else "openai", backend="openai-chat" if chat else "openai",
                   label=label)
    res = bench_result(results, duration, info, metadata={"costline_prompt": "text" if as_text else "token_ids"})
    return HttpRun(label, res, before, after)


def metric_value(scrape: str, name: str) -> float:
    """The sum of a metric's samples in a Prometheus text scrape (0 when absent)."""
    total = 0.0
    for line in scrape.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine_steps(run: HttpRun) -> int:
    """Engine steps during the run (the server's vllm:iteration_tokens_total histogram count)."""
    name = "vllm:iteration_tokens_total_count"
    return int(metric_value(run.scrape_after, name) - metric_value(run.scrape_before, name))


def server_process_deltas(run: HttpRun) -> dict:
    """The server process's CPU seconds and full (generation 2) GC collections during the run."""
    def delta(name: str) -> float:
        return metric_value(run.scrape_after, name) - metric_value(run.scrape_before, name)

    return {"server_cpu_s": delta("process_cpu_seconds_total"),
            "server_gc_gen2_collections": delta('python_gc_collections_total{generation="2"}')}


def _http_stats(res: dict) -> dict:
    keys = ("duration", "completed", "failed", "request_throughput", "output_throughput", "total_token_throughput",
            "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
            "max_concurrent_requests")
    return {k: res.get(k) for k in keys}


def bench_rate(mix: Mix, frac: float, sat_chat: float, dry: bool) -> float:
    """A load for a mix: frac x the chat set's saturation, scaled by a rough cost per request
    (a decode token ~ 8 prefill tokens); it only spreads the runs over loads, nothing is fitted to it."""
    def cost(m: Mix) -> float:
        p, o = lengths(m, 2000, 99, dry)
        return float(np.mean(p)) / 8 + float(np.mean(o))

    return frac * sat_chat * cost(MIXES["chat"]) / cost(mix)


BENCH_RUNS = (("chat", 0.5, 1.0, False), ("chat", 0.9, 0.5, False), ("long-prompt", 0.5, 1.0, False),
              ("long-prompt", 0.9, 1.0, False), ("long-output", 0.5, 1.0, True), ("long-output", 0.9, 1.0, False))


# ---------------------------------------------------------------------------------------- phases
class Budget:
    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)


def phase_replay(setup: Setup, out: Path, budget: Budget) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", "replay", "--out", str(out),
           "--num-requests", str(setup.num_requests)]
    if setup.dry:
        cmd.append("--dry-run")
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=max(30.0, budget.left() - 35))
    info = json.loads((out / "replay.json").read_text())
    return info | {"wall_s": time.perf_counter() - t}


def _deltas(http: dict, rep: dict) -> dict:
    return {"output_throughput_ratio": http["output_throughput"] / rep["output_throughput"],
            "request_throughput_ratio": http["request_throughput"] / rep["request_throughput"],
            "median_ttft_delta_ms": http["median_ttft_ms"] - rep["median_ttft_ms"],
            "p99_ttft_delta_ms": http["p99_ttft_ms"] - rep["p99_ttft_ms"],
            "median_tpot_delta_ms": http["median_tpot_ms"] - rep["median_tpot_ms"],
            "p99_tpot_delta_ms": http["p99_tpot_ms"] - rep["p99_tpot_ms"],
            # engine step period (duration / steps): whether the engine itself ran slower behind HTTP
            "step_period_ms_http": 1e3 * http["duration"] / max(1, http["num_engine_steps"]),
            "step_period_ms_in_process": 1e3 * rep["duration"] / max(1, rep["num_engine_steps"] or 1)}


# the overhead loads in order of importance: if the budget runs short, the last ones are skipped
OVERHEAD_ORDER = ("0.8sat", "offline", "1.0sat")


def overhead_need_s(replay_info: dict, name: str) -> float:
    """Seconds to set aside for one load over HTTP: its in-process duration, 30% more, 5 s of slack."""
    return 1.3 * float(replay_info["runs"][name]["duration"]) + 5.0


def phase_overhead(server: Server, setup: Setup, replay_info: dict, vocab: int, budget: Budget
                   ) -> tuple[list[HttpRun], dict, list[str]]:
    """Each load over HTTP, against the in-process replay of the same requests; plus the in-process
    side against its own repeat (how far two replays of one load differ). A load that would not
    fit the budget is skipped and named."""
    sat, runs, table, skipped = replay_info["saturation_rps"], [], {}, []
    for name in OVERHEAD_ORDER:
        need, left = overhead_need_s(replay_info, name), budget.left()
        if left < need:
            skipped.append(f"overhead {name}: needs ~{need:.0f} s, {left:.0f} s of the budget left")
            continue
        seed = next(load[2] for load in LOADS if load[0] == name)
        reqs, rate = load_requests(setup, name, sat, vocab)
        run = http_run(server, setup, f"overhead-chat-{name}", reqs, rate, seed=None if math.isinf(rate) else 11 + seed)
        runs.append(run)
        http, rep = _http_stats(run.result), replay_info["runs"][name]
        http["num_engine_steps"] = engine_steps(run)
        http |= server_process_deltas(run)
        table[name] = {"rate_rps": rate, "http": http, "in_process": rep} | _deltas(http, rep)
    first, again = replay_info["runs"][REPEATED_LOAD], replay_info["runs"].get(REPEATED_LOAD + "-repeat")
    if again:
        table[REPEATED_LOAD + " in-process repeat"] = {"rate_rps": first["rate"], "http": again,
                                                      "in_process": first} | _deltas(again, first)
    return runs, table, skipped


SHORT = Mix("short", (128, 0.4, 32, 512), (16, 0.0, 16, 16))


def phase_concurrency(server: Server, setup: Setup, vocab: int) -> tuple[HttpRun, dict]:
    n = setup.num_concurrent
    reqs = make_requests(SHORT, n, 5, [0.0] * n, vocab, setup.dry)
    run = http_run(server, setup, f"concurrent-{n}-streams", reqs, math.inf)
    errors = sorted({e for e in run.result["errors"] if e})
    return run, {"clients": n, "completed": run.result["completed"], "failed": run.result["failed"],
                 "distinct_errors": errors[:5], "max_concurrent_requests": run.result["max_concurrent_requests"],
                 "duration_s": run.result["duration"], "median_ttft_ms": run.result["median_ttft_ms"],
                 "p99_ttft_ms": run.result["p99_ttft_ms"]}


def phase_bench(server: Server, setup: Setup, sat: float, vocab: int, budget: Budget,
                mixes: list[str]) -> tuple[list[HttpRun], list]:
    runs, skipped = [], []
    for k, (mix_name, frac, burstiness, chat) in enumerate(BENCH_RUNS):
        label = f"bench-{mix_name}@{frac:.1f}-b{burstiness:g}" + ("-chat" if chat else "")
        if mix_name not in mixes:
            continue
        if budget.left() < 25:
            skipped.append(label)
            continue
        mix = MIXES[mix_name]
        rate = bench_rate(mix, frac, sat, setup.dry)
        reqs = make_requests(mix, setup.num_bench, 100 + k, [0.0] * setup.num_bench, vocab, setup.dry)
        runs.append(http_run(server, setup, label, reqs, rate, burstiness=burstiness, chat=chat, as_text=True,
                             seed=200 + k))
    return runs, skipped


def warm_http(server: Server, setup: Setup, vocab: int) -> None:
    """A few requests over HTTP first (connection set-up, the server's first-request paths)."""
    reqs = make_requests(SHORT, 8, 3, [0.0] * 8, vocab, setup.dry)
    run = http_run(server, setup, "warm-up", reqs, math.inf)
    if run.result["failed"]:
        raise RuntimeError(f"warm-up requests failed: {run.result['errors'][:3]}")


def write_runs_tar(path: Path, runs: list[HttpRun]) -> None:
    """One archive: per run NAME.json (bench format), NAME.before.prom, NAME.after.prom."""
    with tarfile.open(path, "w:gz") as tar:
        for run in runs:
            for suffix, text in ((".json", json.dumps(run.result)), (".before.prom", run.scrape_before),
                                 (".after.prom", run.scrape_after)):
                data = text.encode()
                info = tarfile.TarInfo(f"runs/{run.label}{suffix}")
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))


def serve_phases(setup: Setup, out: Path, budget: Budget, replay_info: dict, summary: dict,
                 parts: set[str]) -> list[HttpRun]:
    vocab = vocab_of(setup.model)
    server = Server(setup, 18000 + os.getpid() % 1000, out / "server.log")
    runs: list[HttpRun] = []
    try:
        summary["server_ready_s"] = server.wait_ready(max(30.0, min(200.0, budget.left() - 40)))
        warm_http(server, setup, vocab)
        skipped = summary.setdefault("skipped", [])
        if "overhead" in parts:  # first: the part the script exists for; each load guards itself
            more, summary["http_overhead"], gone = phase_overhead(server, setup, replay_info, vocab, budget)
            runs += more
            skipped += gone
        if "concurrency" in parts:
            if budget.left() > 30:
                run, summary["concurrency"] = phase_concurrency(server, setup, vocab)
                runs.append(run)
            else:
                skipped.append(f"concurrency: {budget.left():.0f} s of the budget left, needs 30")
        mixes = [m for m in MIXES if m in parts] if any(m in parts for m in MIXES) else list(MIXES)
        more, summary["bench_runs_skipped"] = ([], []) if "bench" not in parts else phase_bench(
            server, setup, replay_info["saturation_rps"], vocab, budget, mixes)
        skipped += [f"{label}: under 25 s of the budget left" for label in summary["bench_runs_skipped"]]
        runs += more
        summary["bench_runs"] = [{"label": r.label, **_http_stats(r.result),
                                  "request_rate": r.result["request_rate"]} for r in more]
    except Exception as exc:  # noqa: BLE001 - what ran so far is still written
        summary["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        summary["server_exit_code"] = server.stop()
    return runs


def report_md(s: dict) -> str:
    lines = [f"# costline engine serve on {s['device']} ({s['model']})", ""]
    rep = s.get("replay", {})
    lines.append(f"In-process saturation (offline, {s['num_requests']} chat-mix requests): "
                 f"{rep.get('saturation_rps', float('nan')):.1f} req/s; server ready after "
                 f"{s.get('server_ready_s', float('nan')):.1f} s.")
    lines += ["", ("| load | req/s | out tok/s HTTP | in-process | ratio | d median TTFT ms | d p99 TTFT | "
              "d median TPOT ms | d p99 TPOT | step ms HTTP / in-process |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for load, row in s.get("http_overhead", {}).items():
        lines.append(f"| {load} | {row['rate_rps']:.1f} | {row['http']['output_throughput']:.0f} | "
                     f"{row['in_process']['output_throughput']:.0f} | {row['output_throughput_ratio']:.3f} | "
                     f"{row['median_ttft_delta_ms']:+.1f} | {row['p99_ttft_delta_ms']:+.1f} | "
                     f"{row['median_tpot_delta_ms']:+.2f} | {row['p99_tpot_delta_ms']:+.2f} | "
                     f"{row['step_period_ms_http']:.2f} / {row['step_period_ms_in_process']:.2f} |")
    c = s.get("concurrency")
    if c:
        lines += ["", (f"{c['clients']} concurrent streaming clients: {c['completed']} completed, {c['failed']} "
                      f"failed, peak {c['max_concurrent_requests']} in flight, {c['duration_s']:.1f} s "
                      f"{c['distinct_errors'] or ''}")]
    lines += ["", "| bench run | rate | done | failed | out tok/s | median TTFT ms | median TPOT ms |",
              "|---|---|---|---|---|---|---|"]
    for b in s.get("bench_runs", []):
        lines.append(f"| {b['label']} | {b['request_rate']:.2f} | {b['completed']} | {b['failed']} | "
                     f"{b['output_throughput']:.0f} | {b['median_ttft_ms']:.1f} | {b['median_tpot_ms']:.2f} |")
    if s.get("skipped"):
        lines += ["", "Skipped (budget): " + "; ".join(s["skipped"])]
    if s.get("error"):
        lines += ["", f"error: {s['error']}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="tiny model on the CPU, few requests")
    ap.add_argument("--budget-s", type=float, default=225.0, help="stop starting new runs after this long")
    ap.add_argument("--num-requests", type=int, help="requests per overhead load (default 400; dry run 24)")
    ap.add_argument("--parts", default="overhead,concurrency,bench",
                    help="comma list of overhead, concurrency, bench, or bench mixes (chat, long-prompt, "
                         "long-output) to run only those bench runs")
    ap.add_argument("--phase", choices=("all", "replay"), default="all", help=argparse.SUPPRESS)
    a = ap.parse_args()
    setup = Setup.make(a.dry_run)
    if a.num_requests:
        setup = dataclasses.replace(setup, num_requests=a.num_requests)
    parts = set(a.parts.split(","))
    if parts & set(MIXES):
        parts.add("bench")
    a.out.mkdir(parents=True, exist_ok=True)
    if a.phase == "replay":
        return replay_child(setup, a.out / "replay.json")
    budget = Budget(a.budget_s)
    summary: dict = {"model": setup.model, "flags": setup.flags, "num_requests": setup.num_requests, "parts": sorted(parts),
                     "device": "cpu (dry run)" if setup.dry else "gpu", "mixes": {k: asdict(m) for k, m in MIXES.items()},
                     "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    runs: list[HttpRun] = []
    try:
        summary["replay"] = phase_replay(setup, a.out, budget)
        runs = serve_phases(setup, a.out, budget, summary["replay"], summary, parts)
    except Exception as exc:  # noqa: BLE001 - the summary says what failed
        summary["error"] = f"{type(exc).__name__}: {exc}"
    summary["wall_s"] = budget.seconds - budget.left()
    write_runs_tar(a.out / "runs.tar.gz", runs)
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (a.out / "summary.md").write_text(md := report_md(summary))
    print(md)
    print(f"wrote {a.out}/summary.json, summary.md, runs.tar.gz ({len(runs)} runs), server.log, replay.json; "
          f"{summary['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
