"""One request's life on the server side: prompt checks, sampling params, and the stream of text
pieces (stop strings cut on the decoded text, a client disconnect aborts the engine request).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engine.sampling import SamplingParams
from engine.serve.async_engine import AsyncEngine, Delta, EngineDead
from engine.serve.protocol import ChatCompletionRequest, CompletionRequest
from engine.serve.tokenizers import Tokenizer

# vLLM's default temperature for the OpenAI API when the model's generation config gives none
DEFAULT_TEMPERATURE = 1.0
_DISCONNECTED = Delta([], finish_reason="abort")


class BadRequest(ValueError):
    """A 400 in OpenAI's error shape; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Rejected(Exception):
    """The scheduler refused the request (it can never fit the KV cache)."""


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    num_output_tokens: int  # generated so far
    finish_reason: str | None


def prompt_ids(prompt: str | list[int], tokenizer: Tokenizer, vocab_size: int, param: str = "prompt") -> list[int]:
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    else:
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})", param)
    if not ids:
        raise BadRequest(f"the {param} is empty: it must hold at least one token", param)
    return ids


def sampling_params(req: CompletionRequest | ChatCompletionRequest, num_prompt_tokens: int,
                    max_model_len: int) -> SamplingParams:
    """vLLM's rules: a prompt must leave room for one token; max_tokens defaults to the rest of
    the context; prompt + max_tokens beyond max_model_len is a 400."""
    max_tokens = req.max_tokens
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    if num_prompt_tokens >= max_model_len:
        raise BadRequest(f"this model's maximum context length is {max_model_len} tokens, and the prompt has "
                         f"{num_prompt_tokens}; shorten the prompt", "prompt")
    if max_tokens is None:
        max_tokens = max_model_len - num_prompt_tokens
    elif num_prompt_tokens + max_tokens > max_model_len:
        raise BadRequest(f"this model's maximum context length is {max_model_len} tokens, but {num_prompt_tokens} "
                         f"prompt tokens + max_tokens {max_tokens} = {num_prompt_tokens + max_tokens}; lower "
                         "max_tokens or shorten the prompt", "max_tokens")
    return SamplingParams(
        max_tokens=max_tokens, ignore_eos=req.ignore_eos, seed=req.seed,
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p, top_k=-1 if req.top_k is None else req.top_k,
        stop_token_ids=tuple(req.stop_token_ids or ()))


def first_stop(text: str, stops: list[str], start: int) -> int | None:
    """Index of the earliest stop string in text[start:], or None."""
    hits = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def _merge_pending(d: Delta, queue: asyncio.Queue) -> Delta:
    """Fold the deltas already queued behind `d` into one (a client or event loop that fell behind
    gets several tokens per chunk, as vLLM's output processor merges them); stops at a final one."""
    if queue.empty() or d.finish_reason is not None or d.error is not None or d.rejected:
        return d
    tokens = list(d.token_ids)
    while not queue.empty():
        nxt = queue.get_nowait()
        if nxt is _DISCONNECTED or nxt.error is not None or nxt.rejected:
            return nxt
        tokens += nxt.token_ids
        if nxt.finish_reason is not None:
            return Delta(tokens, nxt.finish_reason)
    return Delta(tokens)


async def _watch_disconnect(receive, engine: AsyncEngine, rid: int, queue: asyncio.Queue) -> None:
    """The request body is read, so the next ASGI message is the client going away."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            engine.abort(rid)
            queue.put_nowait(_DISCONNECTED)
            return


async def generate(engine: AsyncEngine, tokenizer: Tokenizer, ids: list[int], params: SamplingParams,
                   stops: list[str], receive) -> AsyncIterator[Piece]:
    """Text pieces of one request; the last one has its finish_reason. Text that could be the
    start of a stop string is held back until it is known not to be one."""
    rid, queue = engine.add(ids, params)
    watcher = asyncio.create_task(_watch_disconnect(receive, engine, rid, queue))
    decoder = tokenizer.decoder()
    hold = max(map(len, stops), default=1) - 1
    text, sent, n = "", 0, 0
    try:
        while True:
            d = _merge_pending(await queue.get(), queue)
            if d is _DISCONNECTED:
                return
            if d.error is not None:
                raise EngineDead(d.error)
            if d.rejected:
                raise Rejected(d.finish_reason)
            finish = d.finish_reason
            # token by token, as vLLM's detokenizer checks stops: a merged delta (the loop fell
            # behind) may hold tokens past the one that completes a stop string; they do not count
            for tok in d.token_ids:
                n += 1
                text += decoder.feed([tok])
                if stops and (cut := first_stop(text, stops, sent)) is not None:
                    text, finish = text[:cut], "stop"
                    engine.abort(rid)  # vLLM ends the request at the stop string
                    break
            end = len(text) if finish else max(sent, len(text) - hold)
            if end > sent or finish:
                yield Piece(text[sent:end], n, finish)
                sent = end
            if finish:
                return
    finally:
        watcher.cancel()
        engine.abort(rid)  # a no-op once finished
