"""The offline API: `LLM(model=...).generate(prompts, sampling_params)`, as in vLLM.

There is no tokenizer: a prompt is a list of token ids (or `{"prompt_token_ids": [...]}`);
a plain string is encoded byte by byte (token = byte + 16), enough for smoke runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from engine.core.config import EngineArgs
from engine.core.records import StepRecord
from engine.core.request import FIRST_CONTENT_TOKEN_ID, Request
from engine.engine_loop import EngineCore, RequestState, content_hash_ids
from engine.model import LlamaModel
from engine.preflight import check_engine_args
from engine.sampling import SamplingParams
from engine.tensor_parallel import TPGroup

HASH_BLOCK_TOKENS = 16


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated
    finish_reason: str | None  # "length", "stop", or a rejection reason
    status: str  # the scheduler's final status ("finished", "rejected", ...)
    num_cached_tokens: int
    num_preemptions: int


def encode_prompt(prompt: Any, vocab_size: int) -> list[int]:
    if isinstance(prompt, dict):
        prompt = prompt.get("prompt_token_ids")
        if prompt is None:
            raise ValueError("a dict prompt needs the key 'prompt_token_ids'")
    if isinstance(prompt, str):
        ids = [b + FIRST_CONTENT_TOKEN_ID for b in prompt.encode()]
    else:
        ids = [int(t) for t in prompt]
    if not ids:
        raise ValueError("empty prompt: give at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    return ids


class LLM:
    """Offline batched generation. Keyword arguments are `EngineArgs` fields (vLLM names)."""

    def __init__(self, model: str = "tiny", *, llm_model: LlamaModel | None = None,
                 eos_token_id: int | None = None, tp: TPGroup | None = None, **engine_args: Any) -> None:
        engine_args.setdefault("usage_context", "offline")  # vLLM's LLM class has its own defaults
        self.config = EngineArgs(model=model, **engine_args)
        if llm_model is None:  # device, backend and model size checked before anything is built
            check_engine_args(self.config)
        eos = (eos_token_id,) if eos_token_id is not None else ()
        self.engine = EngineCore(self.config, model=llm_model, eos_token_ids=eos, tp=tp)
        self._next_id = 0
        self.step_traces: list[StepRecord] = []

    def close(self) -> None:
        """Stop the tensor-parallel workers (with --tensor-parallel-size > 1; else nothing)."""
        self.engine.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, prompts: Sequence[Any],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run all prompts to completion; outputs come back in prompt order."""
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        vocab = self.engine.spec.vocab_size
        ids: list[int] = []
        for prompt, p in zip(prompts, params):
            tok = encode_prompt(prompt, vocab)
            rid = self._next_id
            self._next_id += 1
            req = Request(request_id=rid, arrival_s=0.0, prompt_len=len(tok), output_len=p.max_tokens,
                          hash_ids=content_hash_ids(tok, HASH_BLOCK_TOKENS), prompt_token_ids=tuple(tok))
            self.engine.add_request(req, p, tok)
            ids.append(rid)
        done: dict[int, RequestState] = {}
        while self.engine.has_unfinished():
            res = self.engine.step()
            if res.trace is not None:
                self.step_traces.append(res.trace)
            for st in res.finished:
                done[st.request.request_id] = st
        # Anything rejected at the last schedule call is returned there too.
        missing = [r for r in ids if r not in done]
        if missing:
            raise RuntimeError(f"requests {missing[:5]} neither finished nor were rejected")
        return [self._output(done[r]) for r in ids]

    @staticmethod
    def _output(st: RequestState) -> RequestOutput:
        return RequestOutput(
            request_id=st.request.request_id,
            prompt_token_ids=st.token_ids[: st.num_prompt_tokens],
            token_ids=st.output_token_ids,
            finish_reason=st.finish_reason,
            status=st.status,
            num_cached_tokens=st.num_cached_tokens,
            num_preemptions=st.num_preemptions,
        )
