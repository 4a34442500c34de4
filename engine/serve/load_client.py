"""A streaming load client for OpenAI-compatible servers, measured as `vllm bench serve` measures:
requests sent at Gamma-distributed intervals (burstiness 1 = Poisson), each streamed over SSE, TTFT
and inter-chunk gaps timed on the client, output tokens from the server's `usage`. The per-request
results go through engine/core/bench_format.py (vLLM's `--save-detailed` JSON).

It exists because the load generators people use (GuideLLM, AIPerf, `vllm bench serve`) are not
on the GPU machine; on a machine with them, use them (docs/serve.md says how) and keep this for
runs that must match an in-process replay request for request (same prompts, same arrival times).
"""

from __future__ import annotations

import asyncio
import json
import math
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.core.bench_format import RequestResult

REQUEST_TIMEOUT_S = 6 * 3600  # as vLLM's client: a slow run is measured, not cut off


@dataclass(frozen=True, slots=True)
class ClientRequest:
    prompt: str | list[int]  # text, or token ids (the same work as an in-process replay of those ids)
    prompt_len: int
    max_tokens: int


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times (s from the start) as vLLM draws them: the first at 0, then Gamma(shape=burstiness,
    scale=1/(rate*burstiness)) intervals; all 0 for rate inf."""
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate {rate} and burstiness {burstiness} must be positive")
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=max(0, n - 1))
    return [0.0, *np.cumsum(gaps).tolist()][:n]


def raise_fd_limit() -> None:
    """Thousands of concurrent streams need as many sockets (vLLM's set_ulimit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _payload(req: ClientRequest, model: str, chat: bool, temperature: float) -> dict:
    body = {"model": model, "max_tokens": req.max_tokens, "temperature": temperature, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        text = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
        return body | {"messages": [{"role": "user", "content": text}]}
    return body | {"prompt": req.prompt}


def _chunk_text(obj: dict, chat: bool) -> str | None:
    """The text a chunk carries (None: no choice in it, e.g. the usage chunk or a role-only delta)."""
    choices = obj.get("choices")
    if not choices:
        return None
    if chat:
        return choices[0].get("delta", {}).get("content") or None
    return choices[0].get("text", "")


async def _one(session, url: str, req: ClientRequest, model: str, chat: bool, temperature: float,
               t0: float) -> RequestResult:
    res = RequestResult(prompt_len=req.prompt_len)
    st = time.perf_counter()
    res.start_s = st - t0
    last, pieces = st, []
    try:
        async with session.post(url, json=_payload(req, model, chat, temperature)) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res.error = str(obj["error"].get("message", obj["error"]))
                    return res
                text = _chunk_text(obj, chat)
                if text is not None:
                    now = time.perf_counter()
                    if not pieces:
                        res.ttft_s = now - st
                    else:
                        res.itls_s.append(now - last)
                    last = now
                    pieces.append(text)
                if usage := obj.get("usage"):
                    res.output_len = int(usage["completion_tokens"])
    except Exception as exc:  # noqa: BLE001 - a failed request is a row of the result, as in vLLM
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    res.generated_text = "".join(pieces)
    res.latency_s = last - st
    res.success = bool(pieces)
    if not res.success:
        res.error = "no tokens streamed"
    return res


async def run_load(base_url: str, model: str, requests: Sequence[ClientRequest], arrivals_s: Sequence[float], *,
                   chat: bool = False, temperature: float = 0.0, max_concurrency: int | None = None
                   ) -> tuple[list[RequestResult], float]:
    """Send each request at its arrival offset; (results in request order, the run's duration in s)."""
    import aiohttp

    raise_fd_limit()
    url = base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False),
                                     timeout=timeout, read_bufsize=2**16) as session:
        t0 = time.perf_counter()

        async def send(req: ClientRequest, at: float) -> RequestResult:
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            if gate is None:
                return await _one(session, url, req, model, chat, temperature, t0)
            async with gate:
                return await _one(session, url, req, model, chat, temperature, t0)

        results = await asyncio.gather(*(send(r, a) for r, a in zip(requests, arrivals_s)))
        return list(results), time.perf_counter() - t0
