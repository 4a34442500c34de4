"""--kv-cache-dtype fp8 in the engine: the pool holds twice the blocks of a bf16 cache, and the
model's logits and greedy tokens stay close to those over the bf16 cache."""

from __future__ import annotations

import types

import pytest
import torch

from engine.core.config import EngineArgs
from engine.core.flags import FlagError
from engine.core.model_spec import get_model
from engine.llm import LLM
from engine.model import LlamaModel
from engine.runner import ModelRunner, kv_cache_torch_dtype
from engine.sampling import SamplingParams

TINY = get_model("tiny")
# Logits over an fp8 cache vs a bf16 cache, relative norm error. Each cached value is off by up
# to 2**-4 of itself (e4m3's 3 mantissa bits), RMS ~0.036 per value; on the two steps below the
# logits moved 0.016-0.021 (torch and Triton kernels, per-tensor scales from 0.002 to 1 and
# per-head scales alike). The bound leaves 2x room; reading a cache under the wrong scales
# moves them by more than 0.1 (the last test).
LOGITS_BOUND = 0.04
GREEDY_TOKENS_EQUAL = 8  # greedy tokens per prompt that match the bf16 cache's (seen: all 12)


def make_runner(kv_cache_dtype: str, backend: str = "torch", seed: int = 0) -> ModelRunner:
    model = LlamaModel(TINY, max_positions=256, dtype=torch.bfloat16, attention_backend=backend,
                       seed=seed)
    return ModelRunner(model, block_size=4, max_num_seqs=8, max_num_batched_tokens=128,
                       max_model_len=128, kv_cache_dtype=kv_cache_dtype)


def sched(rid, new, computed, blocks):
    return types.SimpleNamespace(request_id=rid, num_new_tokens=new, num_computed_tokens=computed,
                                 samples=True, block_ids=blocks, num_spec_tokens=0)


def two_step_logits(r: ModelRunner, between=None) -> list[torch.Tensor]:
    """A prefill of three prompts, then one decode step of each: the logits of both steps
    (`between(r)` runs between the two)."""
    r.allocate_kv_cache(num_gpu_blocks_override=40)
    g = torch.Generator().manual_seed(1)
    lens = [20, 9, 31]
    tokens = {i: torch.randint(0, TINY.vocab_size, (n + 1,), generator=g).tolist()
              for i, n in enumerate(lens)}
    blocks = {0: list(range(6)), 1: list(range(6, 9)), 2: list(range(9, 18))}
    prefill = [sched(i, n, 0, blocks[i]) for i, n in enumerate(lens)]
    decode = [sched(i, 1, n, blocks[i]) for i, n in enumerate(lens)]
    first = r.forward(r.prepare(prefill, tokens)).float()
    if between is not None:
        between(r)
    return [first, r.forward(r.prepare(decode, tokens)).float()]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_fp8_pool_holds_twice_the_blocks():
    bf16, fp8 = make_runner("auto"), make_runner("fp8")
    assert fp8.block_bytes() * 2 == bf16.block_bytes()
    # K+V x layers x block x kv heads x head dim x 1 byte
    assert fp8.block_bytes() == 2 * TINY.num_layers * 4 * TINY.num_kv_heads * TINY.head_dim
    budget = 50 * bf16.block_bytes()
    assert bf16.allocate_kv_cache(cpu_kv_cache_bytes=budget) == 50
    assert fp8.allocate_kv_cache(cpu_kv_cache_bytes=budget) == 100
    assert fp8.kv_caches.dtype == torch.float8_e4m3fn
    assert fp8.kv_caches.numel() * fp8.kv_caches.element_size() == budget


def test_kv_cache_dtype_flag():
    assert EngineArgs(kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    assert kv_cache_torch_dtype("fp8_e4m3", torch.bfloat16) == torch.float8_e4m3fn
    assert kv_cache_torch_dtype("auto", torch.float16) == torch.float16
    assert kv_cache_torch_dtype("bfloat16", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineArgs(kv_cache_dtype="int8")
    # vLLM's other spellings pass the flag's choices; the engine names what it can store
    for other in ("fp8_e5m2", "float16"):
        with pytest.raises(FlagError, match="stores auto .= the model's bfloat16. or fp8"):
            kv_cache_torch_dtype(other, torch.bfloat16)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_logits_over_an_fp8_cache_stay_close_to_bf16(backend):
    bf16 = two_step_logits(make_runner("auto", backend))
    fp8 = two_step_logits(make_runner("fp8", backend))
    for step_bf16, step_fp8 in zip(bf16, fp8):
        assert 0 < rel_err(step_fp8, step_bf16) <= LOGITS_BOUND


def test_greedy_tokens_over_an_fp8_cache_match_bf16():
    """Chunked prefills and decodes mixed (a 32-token budget); the torch kernels here, the
    Triton ones' logits are bounded above (the interpreter makes a whole generation slow)."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(16, 512, (n,), generator=g).tolist() for n in (14, 5, 23, 40)]
    outs = {}
    for kv in ("auto", "fp8"):
        llm = LLM("tiny", device="cpu", dtype="bfloat16", max_num_seqs=8, max_num_batched_tokens=32,
                  seed=0, block_size=4, kv_cache_dtype=kv, attention_backend="torch")
        outs[kv] = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=GREEDY_TOKENS_EQUAL))]
    assert outs["fp8"] == outs["auto"]


def set_kv_scales(model, k_scale: list[float], v_scale: list[float]) -> None:
    """The same per-layer FP8 KV-cache scales on every layer (1 or num_kv_heads values each)."""
    for layer in model.layers:
        layer.k_scale = torch.tensor(k_scale, dtype=torch.float32, device=layer.k_scale.device)
        layer.v_scale = torch.tensor(v_scale, dtype=torch.float32, device=layer.v_scale.device)


def test_per_layer_scales_are_used():
    """Scales set on the model's layers reach the writer and the attention kernel: the right ones
    keep the logits close; a cache written under one scale and read under another does not."""
    ref = two_step_logits(make_runner("auto"))
    r = make_runner("fp8")
    set_kv_scales(r.model, [0.05, 0.1], [0.02])
    assert rel_err(two_step_logits(r)[1], ref[1]) <= LOGITS_BOUND

    def rescale(r: ModelRunner) -> None:  # the decode reads the prefill's cache under other scales
        set_kv_scales(r.model, [0.5, 1.0], [0.2])

    assert rel_err(two_step_logits(make_runner("fp8"), rescale)[1], ref[1]) > 0.1


def test_block_bytes_are_what_the_simulator_plans_with():
    """The simulator sizes an fp8 pool (sim/memory.py) and prices decode KV reads
    (sim/cost_model.py) from ModelSpec.kv_bytes_per_token("fp8"); the engine's blocks hold
    exactly that many bytes per token."""
    for kv in ("fp8", "fp8_e4m3"):
        assert make_runner(kv).block_bytes() == TINY.kv_bytes_per_token(kv) * 4
    assert make_runner("auto").block_bytes() == TINY.kv_bytes_per_token("bfloat16") * 4
