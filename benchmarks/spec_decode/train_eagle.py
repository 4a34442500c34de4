"""Train an EAGLE-3 head (engine/spec_decode/eagle.py) on a trained byte-level target.

The target (an engine checkpoint directory, e.g. train_pair.py's `target`) is frozen; its
residual streams after the head's aux layers (low, mid, high) and its logits come from the
engine's exact math (train_pair.TrainLlama's layers, no grad, bf16 autocast on a GPU) over
random windows of the training corpora (train_pair.Batches, the target's own task mix).

Objective (EAGLE-1's two terms, EAGLE-3's training-time test): the head is unrolled `steps`
times over the window. Step 1 at position p reads (fc(low, mid, high)_p, token p + 1), as the
engine's catch-up does; step j > 1 at p reads (the head's own step j - 1 output at p - 1,
token p + 1), as draft j does, and attends to step 1's keys up to p - j + 1 and to step m's
key at p - (j - m) for m = 2..j: exactly the keys the engine's head has when it proposes
draft j. Every step's output at p is trained toward the target at p + 1:
  * token loss: cross-entropy against the target's next-token distribution at p + 1 (soft labels);
  * feature loss: smooth L1 between the head's residual stream and the target's final residual
    stream at p + 1, both over the latter's RMS (scale-free), weight `reg_weight`;
step j weighted 0.8^(j - 1) (EAGLE-3's decay). AdamW, warm-up then cosine over the time budget.
The head's layer starts as a copy of the target's last layer (the head predicts what that layer
produces); fc and mix start small and random.

    python3 benchmarks/spec_decode/train_eagle.py --target DIR/target --out DIR/eagle3 --budget-s 60   # H200
    python3 benchmarks/spec_decode/train_eagle.py --target DIR/target --out DIR/eagle3 --tiny --budget-s 5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.spec_decode import train_pair
from benchmarks.spec_decode.train_pair import TrainLayer, TrainLlama, _Norm, _rotate_half
from engine.loader import load_model
from engine.model import INIT_STD
from engine.spec_decode.eagle import EagleHead, default_aux_layers, save_head

DECAY = 0.8  # EAGLE-3's weight of step j + 1 relative to step j


@dataclass(frozen=True, slots=True)
class HeadTrainConfig:
    seq_len: int = 512
    batch_size: int = 32
    steps: int = 4  # unrolled draft steps (the engine's k = 4 at most is trained on every position)
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.0
    reg_weight: float = 0.5
    grad_clip: float = 1.0
    seed: int = 0


TINY = HeadTrainConfig(seq_len=64, batch_size=4, steps=3, warmup_steps=5, lr=3e-3)


class TrainHead(nn.Module):
    """The head with EagleHead's parameter names (so its state dict loads into one)."""

    def __init__(self, target: TrainLlama, aux_layers: tuple[int, ...]) -> None:
        super().__init__()
        spec = target.spec
        h = spec.hidden_size
        self.spec, self.aux_layers, self.eps = spec, aux_layers, spec.rms_norm_eps
        self.fc = nn.Linear(len(aux_layers) * h, h, bias=False)
        self.embed_norm, self.feature_norm, self.norm = _Norm(h), _Norm(h), _Norm(h)
        self.mix = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([TrainLayer(spec)])
        with torch.no_grad():
            for lin in (self.fc, self.mix):
                lin.weight.normal_(0.0, INIT_STD)
            self.layers[0].load_state_dict(target.layers[-1].state_dict())
            self.norm.weight.copy_(target.norm.weight)

    def inputs(self, embed: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        e = F.rms_norm(embed, (embed.shape[-1],), self.embed_norm.weight, self.eps)
        f = F.rms_norm(feature, (feature.shape[-1],), self.feature_norm.weight, self.eps)
        return self.mix(torch.cat((e, f), dim=-1))

    def layer(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: list[tuple], mask: torch.Tensor
              ) -> tuple[torch.Tensor, tuple]:
        """The head's layer at every position of one unrolled step; its queries see `past`
        steps' keys and its own under `mask` [T, steps x T]; returns (output, its (k, v))."""
        lay = self.layers[0]
        b, t, _ = x.shape
        hq, hkv, d = lay.hq, lay.hkv, lay.d
        qkv = lay.qkv_proj(F.rms_norm(x, (x.shape[-1],), lay.input_layernorm.weight, self.eps))
        heads = qkv.view(b, t, hq + 2 * hkv, d)
        qk = _rotate_half(heads[:, :, :hq + hkv], cos, sin).to(qkv.dtype)
        q, k, v = qk[:, :, :hq], qk[:, :, hq:], heads[:, :, hq + hkv:]
        kv = (k, v)
        keys = torch.cat([p[0] for p in past] + [k], dim=1).repeat_interleave(hq // hkv, dim=2)
        vals = torch.cat([p[1] for p in past] + [v], dim=1).repeat_interleave(hq // hkv, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2),
                                           attn_mask=mask)
        x = x + lay.o_proj(o.transpose(1, 2).reshape(b, t, hq * d))
        gate, up = lay.gate_up_proj(F.rms_norm(x, (x.shape[-1],), lay.post_attention_layernorm.weight,
                                               self.eps)).chunk(2, dim=-1)
        return x + lay.down_proj(F.silu(gate) * up), kv

    def logits(self, out: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        return F.linear(F.rms_norm(out, (out.shape[-1],), self.norm.weight, self.eps), lm_head)


def step_mask(t: int, j: int, device: torch.device) -> torch.Tensor:
    """[t, j x t] bool: step j's query at p sees step 1's keys at <= p - j + 1 and step m's key
    at p - (j - m) (m = 2..j), as the engine's head does when it proposes draft j."""
    p = torch.arange(t, device=device)
    blocks = [p[None, :] <= (p[:, None] - j + 1)]
    for m in range(2, j + 1):
        blocks.append(p[None, :] == (p[:, None] - (j - m)))
    mask = torch.cat(blocks, dim=1)
    mask[:, -t:] |= torch.eye(t, dtype=torch.bool, device=device)  # a query always sees itself
    return mask


@torch.no_grad()
def target_pass(target: TrainLlama, ids: torch.Tensor, aux_layers: tuple[int, ...]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(aux hidden states [B, T, 3H], final residual stream [B, T, H], logits [B, T, V])."""
    t = ids.shape[1]
    x = F.embedding(ids, target.embed_tokens)
    outs = []
    for layer in target.layers:
        x = layer(x, target.cos[:t], target.sin[:t])
        outs.append(x)
    h = F.rms_norm(x, (x.shape[-1],), target.norm.weight, target.spec.rms_norm_eps)
    lm = target.embed_tokens if target.lm_head is None else target.lm_head
    return torch.cat([outs[i] for i in aux_layers], dim=-1), x, F.linear(h, lm)


def unrolled_steps(head: TrainHead, target: TrainLlama, ids: torch.Tensor, steps: int
                   ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The head unrolled `steps` times over windows `ids` [B, L]: each step's (output [B, t, H],
    logits [B, t, V]) at head positions p = 0..t-1 (t = L - 2; token p + 1 in), and the
    target's side: its distribution, greedy token and final residual stream at p + 1."""
    aux, final, tlogits = target_pass(target, ids[:, :-1], head.aux_layers)
    t = ids.shape[1] - 2
    lm = target.embed_tokens if target.lm_head is None else target.lm_head
    embed = F.embedding(ids[:, 1:t + 1], target.embed_tokens)
    cos, sin = target.cos[:t], target.sin[:t]
    feature = head.fc(aux[:, :t])
    past: list[tuple] = []
    outs = []
    for j in range(1, steps + 1):
        out, kv = head.layer(head.inputs(embed, feature), cos, sin, past, step_mask(t, j, ids.device))
        past.append(kv)
        outs.append((out, head.logits(out, lm)))
        # the next step reads this step's output one position back (draft j at p + 1)
        feature = torch.cat((torch.zeros_like(out[:, :1]), out[:, :-1]), dim=1)
    goal = {"soft": tlogits[:, 1:t + 1].float().softmax(-1), "greedy": tlogits[:, 1:t + 1].argmax(-1),
            "final": final[:, 1:t + 1].float()}
    return outs, goal


def unrolled_losses(head: TrainHead, target: TrainLlama, ids: torch.Tensor, steps: int, reg_weight: float
                    ) -> tuple[torch.Tensor, list[float]]:
    """The loss over `steps` unrolled draft steps on windows `ids` [B, L], and each step's top-1
    agreement with the target's greedy token (teacher forced). Step j's positions p < j - 1 have
    no step-1 prefix and are left out."""
    outs, goal = unrolled_steps(head, target, ids, steps)
    scale = goal["final"].pow(2).mean().sqrt().clamp_min(1e-6)
    total, agree = 0.0, []
    for j, (out, logits) in enumerate(outs, start=1):
        valid = slice(j - 1, None)
        logp = logits[:, valid].float().log_softmax(-1)
        ce = -(goal["soft"][:, valid] * logp).sum(-1).mean()
        reg = F.smooth_l1_loss(out[:, valid].float() / scale, goal["final"][:, valid] / scale)
        total = total + DECAY ** (j - 1) * (ce + reg_weight * reg)
        agree.append(float((logp.argmax(-1) == goal["greedy"][:, valid]).float().mean()))
    return total, agree


def load_target(target_dir: Path, device: torch.device) -> TrainLlama:
    engine_model = load_model(target_dir, device="cpu", dtype=torch.float32)
    spec = engine_model.spec
    model = TrainLlama(spec, max_positions=spec.max_position_embeddings)
    model.load_state_dict(engine_model.state_dict())
    return model.to(device).eval().requires_grad_(False)


def train_head(target_dir: Path, out_dir: Path, budget_s: float, device: torch.device, *, tiny: bool = False,
               log=print) -> dict:
    """Train for `budget_s` seconds; write the head to `out_dir`; returns the report."""
    cfg = TINY if tiny else HeadTrainConfig()
    torch.manual_seed(cfg.seed)
    target = load_target(target_dir, device)
    aux = default_aux_layers(target.spec.num_layers)
    head = TrainHead(target, aux).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                            fused=device.type == "cuda")
    data = train_pair.Batches(device, cfg.seq_len + 1, cfg.batch_size, cfg.seed)
    t0, step, agree = time.perf_counter(), 0, []
    while time.perf_counter() - t0 < budget_s:
        frac = (time.perf_counter() - t0) / budget_s
        for g in opt.param_groups:
            g["lr"] = train_pair.lr_at(train_pair.TrainConfig(lr=cfg.lr, min_lr_ratio=cfg.min_lr_ratio,
                                                              warmup_steps=cfg.warmup_steps), step, frac)
        with train_pair._autocast(device):
            loss, agree = unrolled_losses(head, target, data.next(), cfg.steps, cfg.reg_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        if step % 50 == 0 or step == 1:
            log(f"eagle3 head step {step} loss {loss.item():.3f} top-1 by step {[round(a, 3) for a in agree]} "
                f"t={time.perf_counter() - t0:.0f}s")
    train_s = time.perf_counter() - t0
    held = held_out_agreement(head, target, device, cfg)
    export_head(head, target_dir, out_dir)
    return {"config": asdict(cfg), "aux_layers": list(aux), "steps": step, "train_s": train_s,
            "tokens": step * cfg.batch_size * cfg.seq_len, "final_loss": float(loss.item()) if step else None,
            "train_top1_by_step": agree, "held_out_top1_by_step": held,
            "head_params": sum(p.numel() for p in head.parameters())}


@torch.no_grad()
def held_out_agreement(head: TrainHead, target: TrainLlama, device: torch.device, cfg: HeadTrainConfig
                       ) -> dict[str, list[float]]:
    """Teacher-forced top-1 agreement with the target's greedy token per unrolled step, per task,
    on held-out windows."""
    data = train_pair.Batches(device, cfg.seq_len + 1, cfg.batch_size, seed=1234, held_out=True)
    out = {}
    for task in ("code", "prose", "json"):
        with train_pair._autocast(device):
            _, agree = unrolled_losses(head, target, data.windows(task, max(4, cfg.batch_size // 2)), cfg.steps,
                                       cfg.reg_weight)
        out[task] = [round(a, 4) for a in agree]
    return out


def to_engine_head(head: TrainHead, engine_target) -> EagleHead:
    """The trained weights in an engine EagleHead on `engine_target` (in its dtype)."""
    eh = EagleHead(engine_target, head.aux_layers, seed=None)
    eh.load_state_dict({k: v.detach().to(eh.fc.weight.device, eh.dtype) for k, v in head.state_dict().items()})
    return eh


def export_head(head: TrainHead, target_dir: Path, out_dir: Path) -> Path:
    """Written with save_head, for the engine's target loaded from `target_dir`."""
    return save_head(to_engine_head(head, load_model(target_dir, device="cpu")), out_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, required=True, help="the target's engine checkpoint directory")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="short windows, small batches: a CPU smoke test")
    a = ap.parse_args()
    rep = train_head(a.target, a.out, a.budget_s, torch.device(a.device), tiny=a.tiny)
    (a.out / "train_eagle.json").write_text(json.dumps(rep, indent=2) + "\n")
    print(json.dumps({k: rep[k] for k in ("steps", "train_s", "held_out_top1_by_step")}))


if __name__ == "__main__":
    main()

__all__ = ["HeadTrainConfig", "TrainHead", "export_head", "step_mask", "to_engine_head", "train_head", "unrolled_losses",
           "unrolled_steps"]
