"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, seeded per request.

Greedy rows (temperature 0) take one batched argmax. Random rows are filtered (top-k, then
top-p) and drawn with the exponential-race trick (argmax of p / E, E ~ Exp(1)), the noise coming
from the request's own `torch.Generator`, so a request's tokens depend on its seed only, not on
which other requests share its batches.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """vLLM names. temperature 0 = greedy."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    top_k: int = Field(-1, description="-1 or 0 = off")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits of one row with everything outside top-k and the top-p nucleus set to -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (probs.cumsum(-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, idx, sorted_logits)
    return logits


class Sampler:
    """Draws one token per row of a logits matrix; holds one generator per seeded request."""

    def __init__(self, device: torch.device, default_seed: int = 0) -> None:
        self.device = device
        self.default_seed = default_seed
        self._generators: dict[int, torch.Generator] = {}

    def add_request(self, request_id: int, params: SamplingParams) -> None:
        if params.greedy:
            return
        seed = params.seed if params.seed is not None else self.default_seed * 1_000_003 + request_id
        self._generators[request_id] = torch.Generator(device=self.device).manual_seed(seed)

    def remove_request(self, request_id: int) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: list[int],
               params: list[SamplingParams]) -> torch.Tensor:
        """Token ids [rows] on the device (int64); the caller reads them back once per step.
        `logits` may be bf16: argmax is exact on them, random rows are upcast to fp32 first."""
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        for i in random_rows:
            p = params[i]
            row = _filter_top_k_top_p(logits[i].float() / p.temperature, p.top_k, p.top_p)
            probs = row.softmax(-1)
            noise = torch.empty_like(probs).exponential_(generator=self._generators[request_ids[i]])
            tokens[i] = (probs / noise).argmax()
        return tokens
