"""EAGLE-3 in the engine (CPU, fp32, tiny target, seeded random head): greedy tokens with eagle3
are the tokens without it (through chunked prefills, preemptions, prefix-cache hits, stop
tokens); every draft the engine proposes is what a dense fp64 re-computation of the head over
the whole sequence (target features fused from the aux layers, token p + 1 at position p, its
own output fed back for drafts 2..k) proposes; the head saves and loads; bad configs are named."""

from __future__ import annotations

import math

import pytest
import torch

from engine.core.request import Request
from engine.sampling import SamplingParams
from engine.spec_decode.eagle import EagleHead, Shifted, default_aux_layers, load_head, save_head
from tests.engine.test_spec_decode import (
    BASE,
    MAX_LEN,
    TARGET,
    drive,
    engine,
    prompts_of,
    reference,
    workload,
)


def head(seed: int = 3) -> EagleHead:
    return EagleHead(TARGET, seed=seed)


def test_shifted_view_reads_one_place_on():
    v = Shifted([1, 2, 3, 4], [9, 8])
    assert len(v) == 5 and [v[i] for i in range(5)] == [2, 3, 4, 9, 8]
    assert v[1:4] == [3, 4, 9] and v[0:2] == [2, 3] and v[3:5] == [9, 8]


def test_default_aux_layers_are_vllms_low_mid_high():
    assert default_aux_layers(32) == (1, 15, 28)
    assert default_aux_layers(12) == (1, 5, 8)
    assert default_aux_layers(2) == (1, 0, 0)


@pytest.mark.parametrize("blocks", [None, 13])  # 13 blocks of 4 tokens: preemptions
@pytest.mark.parametrize("k", [2, 4])
def test_greedy_tokens_equal_without_speculation(blocks, k):
    core = engine({"method": "eagle3", "model": "random", "num_speculative_tokens": k}, head(),
                  num_gpu_blocks_override=blocks)
    assert drive(core, workload(0)) == reference(0, blocks)
    s = core.scheduler.stats
    assert s.num_spec_drafts > 0 and s.prefix_cache_hits_tokens > 0
    if blocks is not None:
        assert s.num_preemptions > 0
    assert s.num_free_blocks == s.num_gpu_blocks
    assert not core.eagle.first  # every request's first drafts were dropped when it ended


def _split_layer(layer, spec) -> dict[str, torch.Tensor]:
    hq, hkv, d, i = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size
    q, k, v = layer.qkv_proj.weight.double().split([hq * d, hkv * d, hkv * d])
    gate, up = layer.gate_up_proj.weight.double().split([i, i])
    return {"in": layer.input_layernorm.weight.double(), "q": q, "k": k, "v": v,
            "o": layer.o_proj.weight.double(), "post": layer.post_attention_layernorm.weight.double(),
            "gate": gate, "up": up, "down": layer.down_proj.weight.double()}


def _norm(t, g, eps):
    return g * t / torch.sqrt((t * t).mean(-1, keepdim=True) + eps)


def _dense_layer(x: torch.Tensor, w: dict, spec) -> torch.Tensor:
    """One Llama layer over the whole sequence x [n, H] (fp64, causal, rotate-half rope)."""
    n, hq, hkv, d = x.shape[0], spec.num_heads, spec.num_kv_heads, spec.head_dim
    inv = 1.0 / spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rope(t):
        return t * cos + torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1) * sin

    h = _norm(x, w["in"], spec.rms_norm_eps)
    q = rope((h @ w["q"].T).view(n, hq, d))
    k = rope((h @ w["k"].T).view(n, hkv, d)).repeat_interleave(hq // hkv, 1)
    v = (h @ w["v"].T).view(n, hkv, d).repeat_interleave(hq // hkv, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    x = x + torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(n, hq * d) @ w["o"].T
    h = _norm(x, w["post"], spec.rms_norm_eps)
    return x + (torch.nn.functional.silu(h @ w["gate"].T) * (h @ w["up"].T)) @ w["down"].T


def dense_drafts(hd: EagleHead, tokens: list[int], k: int) -> list[int]:
    """The head's k greedy drafts after `tokens` (the last one not yet computed by the target),
    everything recomputed densely from scratch."""
    t, spec, eps = hd.target, hd.target.spec, hd.target.spec.rms_norm_eps
    emb = t.embed_tokens.double()
    x = emb[torch.tensor(tokens[:-1])]
    outs = []
    for layer in t.layers:
        x = _dense_layer(x, _split_layer(layer, spec), spec)
        outs.append(x)
    feats = torch.cat([outs[i] for i in hd.aux_layers], -1) @ hd.fc.weight.double().T
    seq_f, seq_t = list(feats), list(tokens[1:])
    lw = _split_layer(hd.layers[0], hd.spec)
    drafts = []
    for _ in range(k):
        e = _norm(emb[torch.tensor(seq_t)], hd.embed_norm.weight.double(), eps)
        f = _norm(torch.stack(seq_f), hd.feature_norm.weight.double(), eps)
        y = _dense_layer(torch.cat([e, f], -1) @ hd.mix.weight.double().T, lw, hd.spec)
        logits = _norm(y[-1], hd.norm.weight.double(), eps) @ t.lm_head_weight.double().T
        drafts.append(int(logits.argmax()))
        seq_f.append(y[-1])
        seq_t.append(drafts[-1])
    return drafts


def test_drafts_match_a_dense_recomputation_of_the_head():
    """No prefix caching (a cached block's last head position saw another request's next token);
    chunked prefills (budget 24 < prompt 30), a tight pool (preemptions and recomputation)."""
    k = 3
    hd = head(7)
    core = engine({"method": "eagle3", "model": "random", "num_speculative_tokens": k}, hd,
                  enable_prefix_caching=False, num_gpu_blocks_override=15)
    seen = []
    propose = core.eagle.propose

    def spy(scheduled, token_ids):
        out = propose(scheduled, token_ids)
        for s in scheduled:
            if s.num_spec_tokens:
                seen.append((list(token_ids[s.request_id]), out[s.request_id].tokens, s.num_spec_tokens))
        return out

    core.eagle.propose = spy
    a, b, c = prompts_of(11, [7, 30, 12])
    drive(core, [(0, a), (0, b), (2, c)], max_tokens=9)
    assert core.scheduler.stats.num_preemptions > 0 and len(seen) > 10
    for toks, drafts, d in seen:
        assert drafts == dense_drafts(hd, toks, d)[:d]


def test_head_saves_and_loads(tmp_path):
    hd = head(4)
    save_head(hd, tmp_path / "h")
    back = load_head(tmp_path / "h", TARGET)
    assert back.aux_layers == hd.aux_layers
    for (n1, p1), (n2, p2) in zip(hd.state_dict().items(), back.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    core = engine({"method": "eagle3", "model": str(tmp_path / "h"), "num_speculative_tokens": 2})
    p = prompts_of(2, [9])[0]
    core.add_request(Request(request_id=0, arrival_s=0.0, prompt_len=9, output_len=6, hash_ids=(0,)),
                     SamplingParams(max_tokens=6, ignore_eos=True), p)
    while core.has_unfinished():
        core.step()
    assert core.requests[0].output_token_ids == drive(engine(None), [(0, p)], max_tokens=6)[0]


def test_eagle3_without_a_model_is_named():
    from engine.core.config import EngineArgs

    with pytest.raises(ValueError, match="eagle3.*needs \"model\""):
        EngineArgs(model="tiny", max_model_len=MAX_LEN, **BASE,
                   speculative_config={"method": "eagle3", "num_speculative_tokens": 2})


def test_catch_up_is_not_waited_for_and_is_charged_a_step_later():
    """On a GPU the catch-up is launched and left running (the host goes on to the scheduler);
    its events are read by the next step, whose propose_s carries it. A CUDA-event stand-in
    checks both: the catch-up's end event is still incomplete when its step returns."""
    from tests.engine.test_core_events import FakeEvent, FakeStream

    core = engine({"method": "eagle3", "model": "random", "num_speculative_tokens": 2}, head())
    stream = FakeStream()
    core._use_events = True
    core._new_event = lambda: FakeEvent(stream)
    p = prompts_of(5, [9])[0]
    core.add_request(Request(request_id=0, arrival_s=0.0, prompt_len=9, output_len=7, hash_ids=(0,)),
                     SamplingParams(max_tokens=7, ignore_eos=True), p)
    charged = []
    while core.has_unfinished():
        res = core.step()
        e1 = core._catch_up_events[1]
        assert e1.n > stream.completed_upto  # launched, not waited for
        charged.append(res.trace.propose_s)
    assert charged[0] == 0.0  # the prefill step: nothing launched before it
    assert all(x > 0 for x in charged[1:])  # each later step: the previous catch-up + its head steps
    assert core.requests[0].output_token_ids == drive(engine(None), [(0, p)], max_tokens=7)[0]
