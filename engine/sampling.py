"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, seeded per request.

Greedy rows (temperature 0) take one batched argmax. Random rows are filtered (top-k, then
top-p; per row, only the rows that ask) and drawn together by inverting their CDFs at one uniform
number each. The number is counter-based: a hash of (the request's seed, how many tokens it has
drawn), so a request's tokens depend on its seed only, not on which other requests share its
batches nor on the device, and a step draws every random row in a few batched kernels (a
generator per row cost ~5 launches per row and noise over the whole vocabulary). With speculative decoding, `verify` keeps each
request's accepted drafts and one more token (engine/spec_decode/rejection.py's rule) and
`propose` draws a draft model's tokens.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from engine.spec_decode.rejection import first_rejection, greedy_verify, speculative_accept


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


_M64 = (1 << 64) - 1
_ROWS_CHUNK = 1 << 24  # elements of [rows, vocab] float64 CDFs made at once


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def counter_uniform(seed: int, counter: int) -> float:
    """One uniform (0, 1) number, a pure function of (seed, counter): a request's draw is the same in
    any batch, on any device. Made on the host (a few integer operations per row): hashed on the
    device it was ~15 one-element launches a step, the larger part of the sampler's time there."""
    bits = _splitmix64((seed & _M64) ^ _splitmix64(counter & _M64)) >> 11  # 53 bits
    return (bits + 0.5) * 2.0 ** -53


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative probability exceeds u (of the row's total):
    a draw from `probs` [rows, vocab] at the uniform numbers `u` [rows]; a zero-probability token
    is never drawn."""
    cdf = probs.double().cumsum(-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


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


def upload(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host table on `device` without blocking the host: on CUDA through pinned memory
    and a non-blocking copy (a copy from pageable memory first synchronizes the stream, so the
    host would wait for the step's whole forward before it could schedule the next step; the
    caching host allocator keeps the pinned block until the copy has run)."""
    if torch.device(device).type != "cuda":
        return torch.tensor(data, dtype=dtype, device=device)
    return torch.tensor(data, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


class Sampler:
    """Draws one token per row of a logits matrix; holds one generator per seeded request."""

    def __init__(self, device: torch.device, default_seed: int = 0) -> None:
        self.device = device
        self.default_seed = default_seed
        self._seeds: dict[int, int] = {}  # random requests: seed, tokens drawn by sample()
        self._drawn: dict[int, int] = {}
        # speculative decoding's draws: a generator per request, made from its seed on first use
        self._generators: dict[int, torch.Generator] = {}

    def add_request(self, request_id: int, params: SamplingParams) -> None:
        if params.greedy:
            return
        seed = params.seed if params.seed is not None else self.default_seed * 1_000_003 + request_id
        self._seeds[request_id], self._drawn[request_id] = seed, 0

    def remove_request(self, request_id: int) -> None:
        self._generators.pop(request_id, None)
        self._seeds.pop(request_id, None)
        self._drawn.pop(request_id, None)

    def _generator(self, request_id: int) -> torch.Generator:
        if request_id not in self._generators:
            self._generators[request_id] = torch.Generator(device=self.device).manual_seed(self._seeds[request_id])
        return self._generators[request_id]

    @property
    def has_random(self) -> bool:
        """Some request added (and not removed) samples at random."""
        return bool(self._seeds)

    def sample(self, logits: torch.Tensor, request_ids: list[int],
               params: list[SamplingParams] | None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids [rows] on the device (int64), into `out` when given; the caller reads them
        back once per step. `params` None: every row is greedy (see has_random).
        `logits` may be bf16: argmax is exact on them, random rows are upcast to fp32 first."""
        tokens = logits.argmax(dim=-1) if out is None else torch.argmax(logits, dim=-1, out=out)
        if params is None:
            return tokens
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        per_chunk = max(1, _ROWS_CHUNK // logits.shape[-1])
        for lo in range(0, len(random_rows), per_chunk):
            rows = random_rows[lo: lo + per_chunk]
            idx, drawn = self._draw_rows(logits, rows, [request_ids[i] for i in rows], params)
            tokens[idx] = drawn
        return tokens

    def _draw_rows(self, logits: torch.Tensor, rows: list[int], request_ids: list[int],
                   params: list[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor]:
        """(the rows' indices on the device, one token per row), drawn together: the rows' logits
        over their temperatures, filtered where a row asks, softmax, and each row's CDF inverted at
        its counter-based number. Row indices, temperatures and numbers go up in one copy
        (`upload`: it must not wait for the step's forward, or async scheduling stalls)."""
        host = [(i, params[i].temperature, self._next_uniform(r)) for i, r in zip(rows, request_ids)]
        cols = upload(host, torch.float64, logits.device)  # row indices < 2**53: exact in float64
        idx = cols[:, 0].long()
        x = logits.index_select(0, idx).float() / cols[:, 1, None].float()
        for j, i in enumerate(rows):
            if 0 < params[i].top_k < x.shape[-1] or params[i].top_p < 1.0:
                x[j] = _filter_top_k_top_p(x[j], params[i].top_k, params[i].top_p)
        return idx, inverse_cdf(x.softmax(-1), cols[:, 2])

    def _next_uniform(self, request_id: int) -> float:
        """The request's number for its next token (and one token more drawn)."""
        u = counter_uniform(self._seeds[request_id], self._drawn[request_id])
        self._drawn[request_id] += 1
        return u

    # ------------------------------------------------------------------ speculative decoding
    def probs(self, logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
        """Rows of `logits` [n, V] as the distribution a random request samples from
        (temperature, top-k, top-p applied), fp32."""
        rows = [_filter_top_k_top_p(row.float() / p.temperature, p.top_k, p.top_p) for row in logits]
        return torch.stack(rows).softmax(-1)

    def draw(self, probs: torch.Tensor, request_id: int) -> torch.Tensor:
        """One token per row of `probs` [n, V], from the request's own generator."""
        noise = torch.empty_like(probs).exponential_(generator=self._generator(request_id))
        return (probs / noise).argmax(-1)

    def propose(self, logits: torch.Tensor, request_ids: list[int], params: list[SamplingParams]
                ) -> tuple[list[int], list[torch.Tensor | None]]:
        """A draft model's next token per row, and the distribution q it was drawn from (None
        for a greedy request: its drafts are checked by exact match)."""
        tokens = logits.argmax(dim=-1)
        qs: list[torch.Tensor | None] = [None] * len(request_ids)
        for i, p in enumerate(params):
            if not p.greedy:
                q = self.probs(logits[i: i + 1], p)
                tokens[i] = self.draw(q, request_ids[i])[0]
                qs[i] = q[0]
        return tokens.tolist(), qs

    def verify(self, logits: torch.Tensor, request_ids: list[int], params: list[SamplingParams],
               drafts: list[list[int]], draft_probs: list[list[torch.Tensor] | None]) -> list[list[int]]:
        """The tokens each request keeps: its accepted drafts, then one token from the target
        (the correction at the first rejection, or the bonus after all were accepted).

        `logits` holds 1 + len(drafts[i]) consecutive rows per request, in order. Greedy:
        exact match with the argmax. Random: speculative sampling against q (`draft_probs`,
        None = one-hot drafts: n-gram lookup), then the bonus drawn from p."""
        argmax = logits.argmax(dim=-1).tolist()  # the step's one sync for greedy requests
        out: list[list[int]] = []
        row = 0
        for rid, p, d, qs in zip(request_ids, params, drafts, draft_probs):
            n = len(d)
            if p.greedy:
                out.append(greedy_verify(argmax[row: row + n + 1], d))
                row += n + 1
                continue
            probs = self.probs(logits[row: row + n + 1], p)
            row += n + 1
            kept = list(d)
            if n:
                gen = self._generator(rid)
                u = torch.rand(n, generator=gen, device=probs.device)
                noise = torch.empty_like(probs[:n]).exponential_(generator=gen)
                q = torch.stack(qs) if qs is not None else None
                v = speculative_accept(probs[:n], q, torch.tensor(d, device=probs.device), u, noise)
                j = first_rejection(v.accepted.tolist())
                if j < n:
                    out.append(d[:j] + [int(v.replacement[j])])
                    continue
            kept.append(int(self.draw(probs[n:], rid)[0]))
            out.append(kept)
        return out
