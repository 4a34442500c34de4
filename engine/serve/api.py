"""The OpenAI-compatible HTTP API over `AsyncEngine` (FastAPI), the routes `vllm serve` exposes:
/v1/completions, /v1/chat/completions (SSE streaming or one JSON body), /v1/models, /health and
/metrics (the engine's vLLM-named Prometheus metrics, engine/metrics.py's registry).

Every failure a client can cause is a 4xx JSON body in OpenAI's error shape; a full server
(`--max-num-queued-reqs` requests in flight) is a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from engine.serve.async_engine import AsyncEngine, EngineDead, Overloaded
from engine.serve.generation import (
    BadRequest,
    Piece,
    Rejected,
    generate,
    prompt_ids,
    sampling_params,
)
from engine.serve.protocol import ChatCompletionRequest, CompletionRequest, error_body
from engine.serve.tokenizers import Tokenizer, chat_prompt

RETRY_AFTER_S = 1
_USAGE_NULL_TAIL = ',"usage":null}'


@dataclass
class ServedModel:
    engine: AsyncEngine
    tokenizer: Tokenizer
    names: tuple[str, ...]  # the first is the name responses carry (vLLM's --served-model-name)
    max_model_len: int
    vocab_size: int


def _error(status: int, message: str, err_type: str, param: str | None = None, **headers: str) -> JSONResponse:
    return JSONResponse(error_body(message, err_type, status, param), status_code=status, headers=headers or None)


def _bad(message: str, param: str | None = None) -> JSONResponse:
    return _error(400, message, "BadRequestError", param)


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or None
    return f"{field}: {err['msg']}" if field else err["msg"], field


def build_app(model: ServedModel) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        model.engine.start(asyncio.get_running_loop())
        yield
        model.engine.stop()

    app = FastAPI(title="costline engine serve", lifespan=lifespan)
    created = int(time.time())

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # a bug, not the client's fault: a JSON 500 naming it, and the server keeps serving
        return _error(500, f"internal error: {exc!r}", "InternalServerError")

    @app.get("/health")
    async def health() -> Response:
        if model.engine.error is not None:
            return _error(500, f"the engine stopped: {model.engine.error!r}", "InternalServerError")
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "costline", "root": model.names[0],
             "parent": None, "max_model_len": model.max_model_len} for name in model.names]}

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        m = model.engine.metrics
        body = generate_latest(m.registry) if m is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, model, CompletionRequest, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, model, ChatCompletionRequest, chat=True)

    return app


async def _parse(request: Request, schema):
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(*_validation_message(exc)) from None


async def _serve(request: Request, model: ServedModel, schema, *, chat: bool) -> Response:
    try:
        req = await _parse(request, schema)
        if req.model is not None and req.model not in model.names:
            return _error(404, f"the model `{req.model}` does not exist; this server serves "
                               f"{', '.join(model.names)}", "NotFoundError", "model")
        if chat:
            text = chat_prompt([{"role": m.role, "content": m.text()} for m in req.messages])
            ids = prompt_ids(text, model.tokenizer, model.vocab_size, "messages")
        else:
            ids = prompt_ids(req.prompt, model.tokenizer, model.vocab_size)
        params = sampling_params(req, len(ids), model.max_model_len)
        pieces = generate(model.engine, model.tokenizer, ids, params, req.stop, request.receive)
        first = await anext(pieces, None)  # errors before the first token still get a status code
    except BadRequest as exc:
        return _bad(str(exc), exc.param)
    except Overloaded as exc:
        return _error(503, f"the server is busy: {exc}; retry later", "ServiceUnavailableError",
                      **{"Retry-After": str(RETRY_AFTER_S)})
    except Rejected as exc:
        return _bad(f"the request can never be scheduled: {exc}", "prompt")
    except EngineDead as exc:
        return _error(500, str(exc), "InternalServerError")
    if first is None:  # the client went away before the first token
        return Response(status_code=499)
    name = req.model or model.names[0]
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    fmt = _ChunkFormat(rid, name, chat, len(ids))
    if req.stream:
        return StreamingResponse(_sse(first, pieces, fmt, req.include_usage), media_type="text/event-stream")
    try:
        text, last = first.text, first
        async for p in pieces:
            text, last = text + p.text, p
    except EngineDead as exc:
        return _error(500, str(exc), "InternalServerError")
    return JSONResponse(fmt.full(text, last))


@dataclass
class _ChunkFormat:
    """The JSON objects of one response (OpenAI's completion / chat.completion shapes)."""

    rid: str
    model: str
    chat: bool
    num_prompt_tokens: int

    def __post_init__(self) -> None:
        self._head: str | None = None
        self.created = int(time.time())
        self.object = "chat.completion" if self.chat else "text_completion"

    def usage(self, n_out: int) -> dict:
        return {"prompt_tokens": self.num_prompt_tokens, "completion_tokens": n_out,
                "total_tokens": self.num_prompt_tokens + n_out}

    def full(self, text: str, last: Piece) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": last.finish_reason, "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason,
                      "stop_reason": None}
        return {"id": self.rid, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage(last.num_output_tokens)}

    def role_chunk(self, usage: bool) -> bytes:
        """A chat stream's first chunk: the assistant role, no content yet (as vLLM sends it)."""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        obj = {"id": self.rid, "object": self.object + ".chunk", "created": self.created, "model": self.model,
               "choices": [choice]}
        if usage:
            obj["usage"] = None
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    def text_chunk(self, text: str, finish: str | None, usage: bool) -> bytes:
        """A token chunk, formatted from a per-response template: this runs once per token per
        client, on the event loop every stream shares, so only the text is JSON-encoded here.
        With include_usage every chunk carries "usage": null (OpenAI's convention)."""
        if self._head is None:
            name = self.object + ".chunk" if self.chat else self.object
            self._head = json.dumps({"id": self.rid, "object": name, "created": self.created,
                                     "model": self.model})[:-1]
        f = "null" if finish is None else json.dumps(finish)
        body = (f'{{"index":0,"delta":{{"content":{json.dumps(text)}}},"logprobs":null,"finish_reason":{f}}}'
                if self.chat else f'{{"index":0,"text":{json.dumps(text)},"logprobs":null,"finish_reason":{f}}}')
        tail = _USAGE_NULL_TAIL if usage else "}"
        return f'data: {self._head},"choices":[{body}]{tail}\n\n'.encode()

    def usage_chunk(self, n_out: int) -> bytes:
        obj = {"id": self.rid, "object": self.object + ".chunk" if self.chat else self.object,
               "created": self.created, "model": self.model, "choices": [], "usage": self.usage(n_out)}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _sse(first: Piece, rest: AsyncIterator[Piece], fmt: _ChunkFormat, include_usage: bool
               ) -> AsyncIterator[bytes]:
    if fmt.chat:
        yield fmt.role_chunk(include_usage)
    last = first
    try:
        p = first
        while True:
            # the last token's text and the finish reason travel in one chunk, as vLLM sends them
            yield fmt.text_chunk(p.text, p.finish_reason, include_usage)
            if p.finish_reason is not None:
                break
            p = await anext(rest, None)
            if p is None:  # the client went away
                return
            last = p
    except EngineDead as exc:
        yield b"data: " + json.dumps(error_body(str(exc), "InternalServerError", 500)).encode() + b"\n\n"
    finally:
        await rest.aclose()
    if include_usage:
        yield fmt.usage_chunk(last.num_output_tokens)
    yield b"data: [DONE]\n\n"
