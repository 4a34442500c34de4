"""Train a byte-level target (`byte-lm-100m`) and draft (`byte-lm-10m`) on the code/prose/json corpora.

The training model is plain PyTorch with the engine's exact math (engine/model.py): RMSNorm
(torch's fused one, the same eps), rotary embeddings from the engine's own `rope_inv_freq`
(rotate-half, applied in fp32 then rounded to the activation dtype), grouped-query attention
(query head h reads KV head h // group), SwiGLU with gate first in one fused gate/up matrix, and
causal SDPA; its parameters carry the engine's names and fused layouts, so `export` copies them
into an engine `LlamaModel` and writes them with `engine.loader.save_model`, and
`engine.loader.load_model(dir)` loads them back (benchmarks/spec_decode/test_pair.py checks the logits agree).

Training: bf16 autocast over fp32 master weights, AdamW (0.9, 0.95, weight decay 0.1 on matrices),
linear warm-up then a cosine decay over the time budget (the schedule follows elapsed seconds, so
a run stops on time whatever the GPU), gradient clipping at 1, sequences of 1024 bytes drawn at
random offsets, the tasks mixed 45/20/35 (code/prose/json: prose is the smallest corpus, ~2 MB, and
a larger share would repeat it ~10 times in a 130 s budget).

Cost, measured: one step of the 2-layer test config (110k parameters, 8 x 128 tokens, fp32) takes
~48 ms on one thread of this repo's shared 2-core CPU (load ~7), ~15 GFLOP/s. Estimated, H200: the
104M target needs ~0.63 GFLOP per trained token (6 x parameters) plus ~0.06 for causal attention at
1024 positions; at 35% of the 989 TFLOP/s bf16 peak (eager PyTorch, flash SDPA, fused AdamW at this
size) that is ~500k tokens/s, so a 130 s budget sees ~65M tokens (~3.5 passes over the ~18 MB
training mix); the 9.7M draft costs ~10x less per token and sees ~2.5x more tokens in 35 s.

    python3 benchmarks/spec_decode/train_pair.py --out DIR --target-s 130 --draft-s 35   # H200
    python3 benchmarks/spec_decode/train_pair.py --out DIR --tiny --target-s 20 --draft-s 10  # CPU
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.spec_decode import corpora
from engine.core.model_spec import ModelSpec, get_model
from engine.loader import save_model
from engine.model import INIT_STD, LlamaModel, rope_inv_freq

TASK_MIX = {"code": 0.45, "prose": 0.2, "json": 0.35}
TINY_TARGET = ModelSpec(name="byte-tiny-target", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                        head_dim=16, intermediate_size=128, vocab_size=corpora.VOCAB_SIZE, rope_theta=10000.0,
                        max_position_embeddings=1024, dtype="float32")
TINY_DRAFT = TINY_TARGET.model_copy(update={"name": "byte-tiny-draft", "num_layers": 1, "hidden_size": 32,
                                            "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64})


@dataclass(frozen=True, slots=True)
class TrainConfig:
    seq_len: int = 1024
    batch_size: int = 64  # sequences per step
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0


TINY_TRAIN = TrainConfig(seq_len=128, batch_size=8, lr=3e-3, warmup_steps=10)


# ---------------------------------------------------------------------------- model
class TrainLayer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.hq, self.hkv, self.d, self.eps = spec.num_heads, spec.num_kv_heads, d, spec.rms_norm_eps
        self.input_layernorm = _Norm(h)
        self.qkv_proj = nn.Linear(h, (self.hq + 2 * self.hkv) * d, bias=False)
        self.o_proj = nn.Linear(self.hq * d, h, bias=False)
        self.post_attention_layernorm = _Norm(h)
        self.gate_up_proj = nn.Linear(h, 2 * spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hq, hkv, d = self.hq, self.hkv, self.d
        qkv = self.qkv_proj(F.rms_norm(x, (x.shape[-1],), self.input_layernorm.weight, self.eps))
        heads = qkv.view(b, t, hq + 2 * hkv, d)
        qk = _rotate_half(heads[:, :, :hq + hkv], cos, sin).to(qkv.dtype)
        q, k, v = qk[:, :, :hq], qk[:, :, hq:], heads[:, :, hq + hkv:]
        group = hq // hkv
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.o_proj(o.transpose(1, 2).reshape(b, t, hq * d))
        gate, up = self.gate_up_proj(F.rms_norm(x, (x.shape[-1],), self.post_attention_layernorm.weight,
                                                self.eps)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


class _Norm(nn.Module):
    """Holds an RMSNorm weight under the engine's parameter name (`<norm>.weight`)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] rotated in fp32 by cos/sin [T, D/2] (the engine's rotate-half convention)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[None, :, None], sin[None, :, None]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class TrainLlama(nn.Module):
    """The engine's Llama for training: [B, T] token ids in, [B, T, vocab] logits out."""

    def __init__(self, spec: ModelSpec, max_positions: int) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size))
        self.layers = nn.ModuleList(TrainLayer(spec) for _ in range(spec.num_layers))
        self.norm = _Norm(spec.hidden_size)
        self.lm_head = None if spec.tie_word_embeddings else nn.Parameter(torch.empty(spec.vocab_size,
                                                                                       spec.hidden_size))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), rope_inv_freq(spec))
        self.register_buffer("cos", freqs.cos().float(), persistent=False)
        self.register_buffer("sin", freqs.sin().float(), persistent=False)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """N(0, 0.02) matrices, the residual-branch outputs scaled by 1/sqrt(2 x layers) (GPT-2's
        rule: keeps the residual stream's variance flat at init); norms at one."""
        g = torch.Generator().manual_seed(seed)
        out_std = INIT_STD / math.sqrt(2 * self.spec.num_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                std = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else INIT_STD
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = F.embedding(ids, self.embed_tokens)
        for layer in self.layers:
            x = layer(x, self.cos[:t], self.sin[:t])
        h = F.rms_norm(x, (x.shape[-1],), self.norm.weight, self.spec.rms_norm_eps)
        return F.linear(h, self.embed_tokens if self.lm_head is None else self.lm_head)


def export(model: TrainLlama, out_dir: Path, dtype: torch.dtype | None = None) -> Path:
    """Copy the weights into an engine `LlamaModel` and write them in the loader's format."""
    spec = model.spec
    engine = LlamaModel(spec, max_positions=spec.max_position_embeddings, dtype=dtype, seed=None)
    missing, unexpected = engine.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()},
                                                 strict=False)
    if missing or unexpected:
        raise RuntimeError(f"training and engine parameter names differ: {missing[:4]} {unexpected[:4]}")
    save_model(engine, out_dir)
    return out_dir


# ---------------------------------------------------------------------------- data
class Batches:
    """Random windows of seq_len + 1 bytes from each task's training stream, mixed by TASK_MIX."""

    def __init__(self, device: torch.device, seq_len: int, batch_size: int, seed: int,
                 held_out: bool = False) -> None:
        self.streams = {t: torch.from_numpy(corpora.token_stream(t, held_out).copy()).to(device)
                        for t in corpora.TASKS}
        self.seq_len, self.batch_size, self.device = seq_len, batch_size, device
        self.g = torch.Generator(device="cpu").manual_seed(seed)
        self.weights = torch.tensor([TASK_MIX[t] for t in corpora.TASKS])

    def windows(self, task: str, n: int) -> torch.Tensor:
        """[n, seq_len + 1] token ids from `task`'s stream at random offsets."""
        s = self.streams[task]
        starts = torch.randint(0, s.numel() - self.seq_len - 1, (n,), generator=self.g)
        idx = starts.to(self.device)[:, None] + torch.arange(self.seq_len + 1, device=self.device)
        return s[idx].long() + corpora.FIRST_CONTENT_TOKEN_ID

    def next(self) -> torch.Tensor:
        tasks = torch.multinomial(self.weights, self.batch_size, replacement=True, generator=self.g)
        counts = torch.bincount(tasks, minlength=len(corpora.TASKS)).tolist()
        return torch.cat([self.windows(t, c) for t, c in zip(corpora.TASKS, counts) if c])


@torch.no_grad()
def bits_per_byte(model: TrainLlama, data: Batches, windows: int = 16) -> dict[str, float]:
    """Mean next-byte cross-entropy in bits on `windows` fixed random windows of each task's stream."""
    model.eval()
    out = {}
    for task in corpora.TASKS:
        w = data.windows(task, windows)
        with _autocast(data.device):
            logits = model(w[:, :-1])
        out[task] = float(F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten())) / math.log(2)
    model.train()
    return out


def _autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


# ---------------------------------------------------------------------------- training
@dataclass
class TrainReport:
    name: str
    num_params: int
    steps: int
    tokens: int
    train_s: float
    tokens_per_s: float
    final_loss_bits: float
    held_out_bits_per_byte: dict[str, float]


def lr_at(cfg: TrainConfig, step: int, time_fraction: float) -> float:
    """Linear warm-up over `warmup_steps`, then cosine from lr to lr x min_lr_ratio over the budget."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, time_fraction)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


def _optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95),
                             fused=device.type == "cuda")


def train(spec: ModelSpec, cfg: TrainConfig, budget_s: float, device: torch.device, *,
          max_steps: int | None = None, log=print) -> tuple[TrainLlama, TrainReport]:
    """Train `spec` for `budget_s` seconds (or `max_steps`); returns the model and its report."""
    torch.manual_seed(cfg.seed)
    model = TrainLlama(spec, max_positions=cfg.seq_len)
    model.init_weights(cfg.seed)
    model.to(device)
    opt = _optimizer(model, cfg, device)
    data = Batches(device, cfg.seq_len, cfg.batch_size, cfg.seed)
    t0, step, loss_bits = time.perf_counter(), 0, math.nan
    while (time.perf_counter() - t0 < budget_s) and (max_steps is None or step < max_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step, (time.perf_counter() - t0) / budget_s)
        batch = data.next()
        with _autocast(device):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        if step % 50 == 0 or step == 1:
            loss_bits = loss.item() / math.log(2)  # a sync: keeps the wall clock honest
            log(f"{spec.name} step {step} loss {loss_bits:.3f} bits/byte t={time.perf_counter() - t0:.0f}s")
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
    loss_bits = loss.item() / math.log(2) if step else math.nan
    held = bits_per_byte(model, Batches(device, cfg.seq_len, cfg.batch_size, seed=1234, held_out=True))
    tokens = step * cfg.batch_size * cfg.seq_len
    return model, TrainReport(spec.name, spec.num_params, step, tokens, train_s, tokens / max(train_s, 1e-9),
                              loss_bits, held)


def unigram_bits(held_out: bool = False) -> dict[str, float]:
    """Entropy in bits of each task's byte distribution: the loss of the best context-free model."""
    out = {}
    for task in corpora.TASKS:
        counts = np.bincount(corpora.token_stream(task, held_out), minlength=256).astype(np.float64)
        p = counts[counts > 0] / counts.sum()
        out[task] = float(-(p * np.log2(p)).sum())
    return out


def train_pair(out_dir: Path, target_s: float, draft_s: float, device: torch.device, *, tiny: bool = False,
               log=print) -> dict:
    """Train the draft and the target, export both under out_dir/{target,draft}; returns the reports."""
    cfg = TINY_TRAIN if tiny else TrainConfig()
    specs = {"draft": TINY_DRAFT if tiny else get_model("byte-lm-10m"),
             "target": TINY_TARGET if tiny else get_model("byte-lm-100m")}
    budgets = {"draft": draft_s, "target": target_s}
    reports = {}
    for role, spec in specs.items():
        role_cfg = cfg if role == "target" else TrainConfig(**{**asdict(cfg), "lr": cfg.lr * 2})
        model, rep = train(spec, role_cfg, budgets[role], device, log=log)
        export(model, out_dir / role)
        reports[role] = asdict(rep)
        log(f"{role}: {json.dumps(reports[role])}")
        del model
    return reports


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target-s", type=float, default=130.0)
    ap.add_argument("--draft-s", type=float, default=35.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="2-layer models, short sequences: a CPU smoke test")
    a = ap.parse_args()
    reports = train_pair(a.out, a.target_s, a.draft_s, torch.device(a.device), tiny=a.tiny)
    (a.out / "train.json").write_text(json.dumps({"reports": reports, "unigram_bits": unigram_bits(True)},
                                                 indent=2) + "\n")


if __name__ == "__main__":
    main()
