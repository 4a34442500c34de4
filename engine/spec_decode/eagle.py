"""EAGLE-3 proposer: a one-layer draft head on the target's own hidden states.

The head (`EagleHead`) is one decoder layer of the target's width. At position p its input is
the target's features at p, fused from three of its layers (low, mid, high: the residual
stream after each, `aux_layers`) by a linear layer `fc` [3H -> H], combined by `mix`
[2H -> H] with the embedding of token p + 1 (the target's embedding table); its output, through
its own norm and the target's LM head, predicts token p + 2. Drafting k tokens is k greedy
steps: the first reads the target's features, each later one the head's own output at the
previous position (its residual stream, `hidden_out`), as EAGLE does.

Where its KV lives: the head's one layer has its own KV tensor paged with the target's block
ids (as `DraftModelProposer`'s draft model), not a separate pool: the scheduler's allocation,
prefix caching, preemption and draft rollback then cover the head with no second allocator,
for 1 / num_layers of the target's KV per block (8% on the 12-layer byte-level target).
A prefix-cache hit reuses the head's KV of the cached blocks; the last position of a cached
block was computed with the token after it, which another request may not share: a slightly
worse draft, never a wrong output (the target verifies every draft).

When it runs, per engine step:
  * `propose`, after `schedule()`: for each decode with d drafts, draft 1 was made by the
    previous step's catch-up; drafts 2..d come from d - 1 single-token head steps, each at
    the next position (inside the slots the scheduler allocated for this step's drafts),
    chained on the device (argmax feeds the next step's in-flight input); one read-back.
  * `catch_up`, after the target's forward and verification, before the scheduler releases
    rejected drafts' slots: one head forward over exactly the positions the target computed
    this step (the same entries, so the head's rows align with the target's and its features
    are `fc(aux_hidden[:T])` with no gather), token inputs shifted by one (token p + 1 at p:
    the accepted drafts and the step's sampled token; padding where drafts were rejected: those
    positions lie past the tokens kept and are rewritten before any later step reads them). Its
    output at each continuing request's last kept position gives that request's draft 1 and
    the feature for draft 2, kept on the device for the next `propose`.
Drafts are greedy (argmax of the head): the rejection sampler treats them as one-hot, so
random sampling stays exact.

A head directory holds `eagle3.json` (aux layers, the target's shape) and `eagle3.safetensors`
(the head's own weights: fc, mix, its two input norms, its layer, its final norm).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.core.scheduler_output import ScheduledRequest
from engine.model import INIT_STD, DecoderLayer, LlamaModel, RMSNorm
from engine.runner import ModelRunner
from engine.spec_decode.proposers import Proposal

CONFIG_FILE = "eagle3.json"
WEIGHTS_FILE = "eagle3.safetensors"


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """Low, middle and high layers whose outputs the head reads. vLLM's EAGLE-3 takes the inputs
    of layers (2, L // 2, L - 3), i.e. the outputs of layers (1, L // 2 - 1, L - 4); clamped to
    the model's layers for small ones."""
    last = num_layers - 1
    return tuple(min(max(i, 0), last) for i in (1, num_layers // 2 - 1, num_layers - 4))  # type: ignore[return-value]


class EagleHead(nn.Module):
    """The draft head; `forward` has LlamaModel's signature (so a `ModelRunner` runs it) and reads
    its per-token features from the persistent buffer `features` (rows aligned with the step's
    tokens), writing its residual stream to `hidden_out`."""

    def __init__(self, target: LlamaModel, aux_layers: Sequence[int] | None = None, *,
                 seed: int | None = 0) -> None:
        super().__init__()
        tspec = target.spec
        self.aux_layers = tuple(aux_layers) if aux_layers is not None else default_aux_layers(tspec.num_layers)
        self.spec = tspec.model_copy(update={"name": f"{tspec.name}-eagle3", "num_layers": 1})
        self.dtype = target.dtype
        self._target = (target,)  # shared embedding, LM head, rotary tables: not our parameters
        # a ModelRunner pages its KV by these; speculative decoding is refused at TP > 1, so one rank
        self.tp_group, self.tp_size, self.tp_rank = None, 1, 0
        h = tspec.hidden_size
        kw = {"device": target.embed_tokens.device, "dtype": target.dtype}
        self.fc = nn.Linear(len(self.aux_layers) * h, h, bias=False, **kw)
        self.embed_norm = RMSNorm(h, tspec.rms_norm_eps, **kw)
        self.feature_norm = RMSNorm(h, tspec.rms_norm_eps, **kw)
        self.mix = nn.Linear(2 * h, h, bias=False, **kw)
        self.layers = nn.ModuleList([DecoderLayer(self.spec, kw["device"], kw["dtype"])])
        self.norm = RMSNorm(h, tspec.rms_norm_eps, **kw)
        self.features = torch.zeros(0, h, **kw)
        self.hidden_out = torch.zeros(0, h, **kw)
        if seed is not None:
            self.init_random(seed)

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        g = torch.Generator(device=self.fc.weight.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, INIT_STD, generator=g)

    # what ModelRunner reads of a model
    @property
    def target(self) -> LlamaModel:
        return self._target[0]

    @property
    def embed_tokens(self) -> torch.Tensor:
        return self.target.embed_tokens

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.target.lm_head_weight

    @property
    def rotary(self):
        return self.target.rotary

    @property
    def backend(self):
        return self.target.backend

    def allocate_buffers(self, max_tokens: int) -> None:
        """The persistent feature-in and hidden-out rows (CUDA graphs capture their pointers)."""
        h = self.spec.hidden_size
        kw = {"device": self.fc.weight.device, "dtype": self.dtype}
        self.features = torch.zeros(max_tokens, h, **kw)
        self.hidden_out = torch.zeros(max_tokens, h, **kw)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's low/mid/high hidden states [T, 3H] -> the head's features [T, H]."""
        return F.linear(aux, self.fc.weight)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Normed hidden states [T, H] of the head for tokens `input_ids` (token p + 1 at
        position p) over features `features[:T]`; the residual stream goes to `hidden_out[:T]`."""
        t = input_ids.shape[0]
        e = self.embed_norm(F.embedding(input_ids, self.embed_tokens))
        x = F.linear(torch.cat((e, self.feature_norm(self.features[:t])), dim=-1), self.mix.weight)
        layer = self.layers[0]
        x, delta = layer(x, layer.input_layernorm(x), positions, self.rotary, self.backend, kv_caches[0, 0],
                         kv_caches[0, 1], meta)
        x, h = self.backend.add_rms_norm(x, delta, self.norm.weight, self.norm.eps)
        self.hidden_out[:t].copy_(x)
        return h

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.target.compute_logits(hidden, out=out)

    def weights_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def save_head(head: EagleHead, path: str | Path) -> Path:
    """Write the head's config and its own weights (not the target's) under `path`."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    s = head.target.spec
    cfg = {"format": "costline-eagle3/1", "aux_layers": list(head.aux_layers), "target_name": s.name,
           "hidden_size": s.hidden_size, "num_layers": s.num_layers, "vocab_size": s.vocab_size}
    (path / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}, str(path / WEIGHTS_FILE))
    return path


def is_head_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def load_head(path: str | Path, target: LlamaModel) -> EagleHead:
    """A head saved by `save_head` for `target`; a head trained for another shape is refused."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg = json.loads((path / CONFIG_FILE).read_text())
    s = target.spec
    for key in ("hidden_size", "num_layers", "vocab_size"):
        if cfg.get(key) != getattr(s, key):
            raise ValueError(f"--speculative-config: the EAGLE-3 head in {path} was trained for a target with "
                             f"{key}={cfg.get(key)}, this target has {getattr(s, key)}; train a head for it "
                             "(benchmarks/spec_decode/train_eagle.py)")
    head = EagleHead(target, cfg["aux_layers"], seed=None)
    tensors = load_file(str(path / WEIGHTS_FILE))
    head.load_state_dict({k: v.to(head.dtype) for k, v in tensors.items()})
    return head


class Shifted:
    """A request's tokens seen one place on (item p = token p + 1), then `extra` tokens: the
    head's input at position p is token p + 1. Read like a list by the runner, no copy."""

    __slots__ = ("base", "extra")

    def __init__(self, base: list[int], extra: list[int]) -> None:
        self.base, self.extra = base, extra

    def __len__(self) -> int:
        return len(self.base) - 1 + len(self.extra)

    def __getitem__(self, i):
        nb = len(self.base) - 1
        if isinstance(i, slice):
            start, stop, _ = i.indices(len(self))
            if stop <= nb:
                return self.base[start + 1: stop + 1]
            if start >= nb:
                return self.extra[start - nb: stop - nb]
            return self.base[start + 1:] + self.extra[: stop - nb]
        return self.base[i + 1] if i < nb else self.extra[i - nb]


@dataclass(slots=True)
class _FirstDrafts:
    """One catch-up's output for the requests that go on: draft 1 [n] and the head's residual
    stream at their last kept position [n, H] (the feature of draft 2), on the device."""

    tokens: torch.Tensor
    hidden: torch.Tensor


class EagleProposer:
    """Runs an `EagleHead` beside the target (see the module docstring)."""

    def __init__(self, head: EagleHead, *, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, target_max_tokens: int) -> None:
        self.head = head
        self.runner = ModelRunner(head, block_size=block_size, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len)
        head.allocate_buffers(max(self.runner.d_input_ids.shape[0], target_max_tokens))
        head.target.enable_aux_hidden(head.aux_layers, target_max_tokens)
        # per request: the catch-up that made its draft 1, and its row there
        self.first: dict[int, tuple[_FirstDrafts, int]] = {}

    def weights_bytes(self) -> int:
        return self.head.weights_bytes()

    def allocate_kv(self, num_blocks: int) -> None:
        """The head's KV tensor: as many blocks as the target's, indexed by the same ids."""
        self.runner.kv_caches = self.runner.new_kv(num_blocks)
        self.runner.num_blocks = num_blocks

    def forget(self, request_id: int) -> None:
        self.first.pop(request_id, None)

    def reset(self) -> None:
        self.first.clear()

    # ---------------------------------------------------------------- after the target's step
    @torch.inference_mode()
    def catch_up(self, scheduled: Sequence[ScheduledRequest], num_target_tokens: int,
                 token_ids: dict[int, list[int]], kept: dict[int, int]) -> None:
        """The head over the positions the target computed this step (`scheduled`, the target's
        entries, its forward of `num_target_tokens` tokens just run), token inputs shifted by
        one; `token_ids` already holds the kept tokens; `kept`: tokens kept per request that
        sampled (1 + accepted drafts). Draft 1 and its feature for each such request."""
        views, rows, logit_rows = {}, [], []
        verify = any(s.num_spec_tokens for s in scheduled)
        qs = np.cumsum([0] + [s.num_new_tokens for s in scheduled])
        logit_at = 0
        sampled = []
        for i, s in enumerate(scheduled):
            base = token_ids[s.request_id]
            end = s.num_computed_tokens + s.num_new_tokens
            views[s.request_id] = Shifted(base, [0] * max(0, end - (len(base) - 1)))
            if not s.samples:
                continue
            n_rows = 1 + s.num_spec_tokens if verify else 1
            keep = kept.get(s.request_id)
            if keep is not None:
                offset = keep - 1  # the last kept position: the draft after it is draft 1
                rows.append(int(qs[i]) + s.num_new_tokens - 1 - s.num_spec_tokens + offset)
                logit_rows.append(logit_at + (offset if verify else 0))
                sampled.append(s.request_id)
            logit_at += n_rows
        head = self.head
        t = num_target_tokens
        head.features[:t].copy_(head.fuse(head.target.aux_hidden[:t]))
        inp = self.runner.prepare(scheduled, views, verify=verify)
        logits = self.runner.forward(inp)
        if not sampled:
            return
        n = len(sampled)
        idx = torch.tensor(logit_rows + rows).to(logits.device, non_blocking=True)  # one upload
        first = _FirstDrafts(logits.index_select(0, idx[:n]).argmax(dim=-1),
                             head.hidden_out.index_select(0, idx[n:]))
        for r, rid in enumerate(sampled):
            self.first[rid] = (first, r)

    # ---------------------------------------------------------------- before the target's step
    @torch.inference_mode()
    def propose(self, scheduled: Sequence[ScheduledRequest], token_ids: dict[int, list[int]]
                ) -> dict[int, Proposal]:
        """Greedy drafts for every scheduled decode with num_spec_tokens > 0."""
        wanted = [s for s in scheduled if s.num_spec_tokens]
        if not wanted:
            return {}
        tokens, hidden = self._first_drafts([s.request_id for s in wanted])
        rounds: list[tuple[list[int], torch.Tensor]] = [([s.request_id for s in wanted], tokens)]
        head = self.head
        for i in range(1, max(s.num_spec_tokens for s in wanted)):
            live = [s for s in wanted if s.num_spec_tokens > i]
            prev_rids, prev = rounds[-1]
            row_of = {rid: r for r, rid in enumerate(prev_rids)}
            if len(live) == len(prev_rids):
                feat = hidden
            else:
                feat = hidden.index_select(0, torch.tensor([row_of[s.request_id] for s in live],
                                                           device=hidden.device))
            head.features[: len(live)].copy_(feat)
            # draft i + 1 at position c + i - 1 (c: the step's first position = the sampled token's)
            step = [ScheduledRequest(s.request_id, 1, s.num_computed_tokens + i - 1, 0, 0, False, True,
                                     s.block_ids, ()) for s in live]
            # i - 1 placeholders: the round's input (draft i) is the one token still in flight
            views = {s.request_id: Shifted(token_ids[s.request_id], [0] * (i - 1)) for s in live}
            inp = self.runner.prepare(step, views, (row_of, prev))
            tok = self.runner.forward(inp).argmax(dim=-1)
            hidden = head.hidden_out[: len(live)]
            rounds.append(([s.request_id for s in live], tok))
        flat = torch.cat([t for _, t in rounds]).tolist()  # the proposal's one sync
        out = {s.request_id: Proposal([]) for s in wanted}
        j = 0
        for rids, t in rounds:
            for rid, tok in zip(rids, flat[j: j + len(rids)]):
                out[rid].tokens.append(tok)
            j += len(rids)
        return out

    def _first_drafts(self, rids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft 1 and its feature for `rids`, from the catch-ups that made them."""
        try:
            held = [self.first[rid] for rid in rids]
        except KeyError as exc:
            raise RuntimeError(f"EAGLE-3: request {exc.args[0]} decodes with drafts but no catch-up made its "
                               "first draft") from None
        gen = held[0][0]
        dev = gen.tokens.device
        if all(g is gen for g, _ in held):
            idx = [r for _, r in held]
            if idx == list(range(gen.tokens.shape[0])):
                return gen.tokens, gen.hidden
            ix = torch.tensor(idx, device=dev)
            return gen.tokens.index_select(0, ix), gen.hidden.index_select(0, ix)
        return (torch.stack([g.tokens[r] for g, r in held]), torch.stack([g.hidden[r] for g, r in held]))


def random_head(target: LlamaModel, seed: int) -> EagleHead:
    """A seeded random head for `target` (tests; a model name that is not a head directory)."""
    return EagleHead(target, seed=seed)


__all__ = ["EagleHead", "EagleProposer", "Shifted", "default_aux_layers", "is_head_dir", "load_head",
           "random_head", "save_head"]
