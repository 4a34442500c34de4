"""Tensor parallelism: how weights are sharded (shapes; shards put back together = the full weight;
each rank's partial products sum to the unsharded layer's), the shape rules, and, in processes over
gloo, greedy tokens at TP=2 equal to TP=1 with chunked prefill and prefix caching, and the
collectives each forward issues."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from engine.core.flags import FlagError
from engine.core.model_spec import ModelSpec, get_model
from engine.llm import LLM
from engine.model import LlamaModel
from engine.sampling import SamplingParams
from engine.tensor_parallel import (
    TPGroup,
    check_tp_shape,
    full_param_shape,
    shard_param,
    vocab_shard_rows,
)

# 8 heads / 4 KV heads / 64 MLP split 1, 2 or 4 ways; a vocabulary of 30 (4 does not divide it: padding)
SPEC = ModelSpec(name="tp-test", num_layers=2, hidden_size=32, num_heads=8, num_kv_heads=4, head_dim=4,
                 intermediate_size=64, vocab_size=30, max_position_embeddings=256, dtype="float32",
                 qkv_bias=True)


def full_model(spec: ModelSpec = SPEC) -> LlamaModel:
    return LlamaModel(spec, max_positions=64, seed=3)


def shards(tp: int, spec: ModelSpec = SPEC) -> list[LlamaModel]:
    """Each rank's model (a group object without processes: nothing here runs a collective)."""
    return [LlamaModel(spec, max_positions=64, seed=3, tp=TPGroup(rank, tp)) for rank in range(tp)]


@pytest.mark.parametrize("tp", [2, 4])
def test_shard_shapes_are_column_and_row_splits(tp):
    m = shards(tp)[0]
    d, hq, hkv, i = SPEC.head_dim, SPEC.num_heads // tp, SPEC.num_kv_heads // tp, SPEC.intermediate_size // tp
    layer = m.layers[0]
    assert layer.qkv_proj.weight.shape == ((hq + 2 * hkv) * d, SPEC.hidden_size)  # column: output rows
    assert layer.qkv_proj.bias.shape == ((hq + 2 * hkv) * d,)
    assert layer.gate_up_proj.weight.shape == (2 * i, SPEC.hidden_size)
    assert layer.o_proj.weight.shape == (SPEC.hidden_size, hq * d)  # row: input columns
    assert layer.down_proj.weight.shape == (SPEC.hidden_size, i)
    assert m.embed_tokens.shape == (-(-30 // tp), SPEC.hidden_size)
    assert layer.input_layernorm.weight.shape == (SPEC.hidden_size,)  # replicated


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shards_put_back_together_are_the_full_weights(tp):
    """q, k and v rows of each rank (per head), gate and up rows, o and down columns, vocabulary
    rows (the padding dropped), concatenated in rank order = the unsharded model's weights."""
    full, parts = full_model(), shards(tp)
    d, q, kv = SPEC.head_dim, SPEC.num_heads * SPEC.head_dim, SPEC.num_kv_heads * SPEC.head_dim
    qn, kvn, inn = q // tp, kv // tp, SPEC.intermediate_size // tp
    for li, layer in enumerate(full.layers):
        ranks = [p.layers[li] for p in parts]
        w = [r.qkv_proj.weight for r in ranks]
        q_rows = torch.cat([x[:qn] for x in w])
        k_rows = torch.cat([x[qn: qn + kvn] for x in w])
        v_rows = torch.cat([x[qn + kvn:] for x in w])
        assert torch.equal(torch.cat([q_rows, k_rows, v_rows]), layer.qkv_proj.weight)
        b = [r.qkv_proj.bias for r in ranks]
        assert torch.equal(torch.cat([torch.cat([x[:qn] for x in b]), torch.cat([x[qn: qn + kvn] for x in b]),
                                      torch.cat([x[qn + kvn:] for x in b])]), layer.qkv_proj.bias)
        gu = [r.gate_up_proj.weight for r in ranks]
        assert torch.equal(torch.cat([torch.cat([x[:inn] for x in gu]), torch.cat([x[inn:] for x in gu])]),
                           layer.gate_up_proj.weight)
        assert torch.equal(torch.cat([r.o_proj.weight for r in ranks], dim=1), layer.o_proj.weight)
        assert torch.equal(torch.cat([r.down_proj.weight for r in ranks], dim=1), layer.down_proj.weight)
        assert d * SPEC.num_heads == q
    vocab = torch.cat([p.embed_tokens for p in parts])
    assert torch.equal(vocab[: SPEC.vocab_size], full.embed_tokens)
    assert not vocab[SPEC.vocab_size:].any()  # the last shard's padding rows are zero


def test_row_parallel_partial_products_sum_to_the_full_layer():
    """The math each all-reduce relies on: sum over ranks of (column-parallel activations x
    row-parallel weight) = the unsharded product, for o (per head) and down (per MLP slice)."""
    full, parts = full_model(), shards(2)
    g = torch.Generator().manual_seed(0)
    attn = torch.randn(5, SPEC.num_heads * SPEC.head_dim, generator=g)
    n = attn.shape[1] // 2
    summed = sum(attn[:, r * n:(r + 1) * n] @ p.layers[0].o_proj.weight.T for r, p in enumerate(parts))
    torch.testing.assert_close(summed, attn @ full.layers[0].o_proj.weight.T)
    # MLP: column-parallel gate/up -> SiLU * up per rank -> row-parallel down, summed
    h = torch.randn(5, SPEC.hidden_size, generator=g)

    def mlp(gate_up, down):
        gate, up = (h @ gate_up.T).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ down.T

    ref = mlp(full.layers[0].gate_up_proj.weight, full.layers[0].down_proj.weight)
    out = sum(mlp(p.layers[0].gate_up_proj.weight, p.layers[0].down_proj.weight) for p in parts)
    torch.testing.assert_close(out, ref)


def test_tp1_group_draws_the_same_weights_as_no_group():
    plain, one = full_model(), shards(1)[0]
    for (name, a), (_, b) in zip(plain.named_parameters(), one.named_parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("rank", [0, 1])
def test_load_full_state_dict_keeps_this_ranks_shard(rank):
    full = full_model()
    m = LlamaModel(SPEC, max_positions=64, seed=None, tp=TPGroup(rank, 2))
    m.load_full_state_dict(dict(full.named_parameters()))
    for name, p in m.named_parameters():
        assert torch.equal(p, shard_param(name, dict(full.named_parameters())[name], SPEC, 2, rank)), name
        assert full_param_shape(name, SPEC) == dict(full.named_parameters())[name].shape


def test_vocab_shard_rows_cover_the_vocabulary():
    for v in (30, 32, 1, 128256):
        for tp in (1, 2, 4, 8):
            n = vocab_shard_rows(v, tp)  # the fewest rows per rank that hold the vocabulary
            assert tp * n >= v > tp * (n - 1)


@pytest.mark.parametrize(("tp", "words"), [(8, "4 KV heads"), (3, "power of two"), (16, "8 attention heads")])
def test_bad_tp_sizes_are_named(tp, words):
    with pytest.raises(FlagError, match=words) as e:
        check_tp_shape(SPEC, tp)
    assert "tensor_parallel_size" in str(e.value)


def test_engine_refuses_a_bad_tp_before_spawning():
    with pytest.raises(FlagError, match="KV heads"):  # tiny: 2 KV heads
        LLM("tiny", device="cpu", tensor_parallel_size=4)


# --------------------------------------------------------------------------- two processes (gloo)
def prompts_with_shared_prefix() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    system = torch.randint(16, 512, (24,), generator=g).tolist()
    tails = [torch.randint(16, 512, (n,), generator=g).tolist() for n in (5, 9, 3, 12)]
    solo = [torch.randint(16, 512, (n,), generator=g).tolist() for n in (40, 17)]
    return [system + t for t in tails] + solo


_RUNS: dict[tuple, tuple[list[list[int]], list[int], LLM]] = {}
KV_BYTES = 1 << 20  # each rank's KV cache: 512 blocks at TP=1 (plenty for the prompts' 6 sequences)


def run_tp(tp: int, **kw) -> tuple[list[list[int]], list[int], LLM]:
    """The tokens, cached tokens and (closed) LLM of one run, once per module for the same arguments:
    a TP=2 run spawns a gloo worker process (~5 s), and the tests only read what a run left."""
    key = (tp, *sorted(kw.items()))
    if key not in _RUNS:
        _RUNS[key] = _run_tp(tp, **kw)
    return _RUNS[key]


def _run_tp(tp: int, **kw) -> tuple[list[list[int]], list[int], LLM]:
    args = {"device": "cpu", "dtype": "float32", "max_num_seqs": 8, "max_num_batched_tokens": 32, "seed": 0,
            "block_size": 4, "enable_prefix_caching": True, "enable_chunked_prefill": True,
            "cpu_kv_cache_bytes": KV_BYTES}
    llm = LLM("tiny", tensor_parallel_size=tp, **(args | kw))
    try:
        outs = llm.generate(prompts_with_shared_prefix(), SamplingParams(max_tokens=10))
    finally:
        llm.close()
    return [o.token_ids for o in outs], [o.num_cached_tokens for o in outs], llm


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_tp2_greedy_tokens_equal_tp1_with_chunked_prefill_and_prefix_caching(async_scheduling):
    """fp32, 2 gloo processes. A 32-token budget chunks the 40-token prompt; the shared 24-token
    system prompt is served from the prefix cache; with async scheduling the decodes' input tokens
    come from rank 0's sampled-token buffer by a device broadcast."""
    one, cached1, _ = run_tp(1, async_scheduling=async_scheduling)
    two, cached2, llm = run_tp(2, async_scheduling=async_scheduling)
    assert two == one
    assert cached2 == cached1 and sum(cached2) >= 3 * 24  # the prefix cache was hit
    assert llm.engine.runner.num_eager_forwards > 0


def test_collectives_per_forward():
    """Each forward: 2 all-reduces per layer (attention's o projection, the MLP's down projection)
    plus the vocab-parallel embedding's one; one all-gather of the logits. (The run of
    test_tp2_greedy_tokens_equal_tp1_with_chunked_prefill_and_prefix_caching[False], shared.)"""
    _, _, llm = run_tp(2, async_scheduling=False)
    forwards = llm.engine.runner.num_eager_forwards
    layers = llm.engine.spec.num_layers
    counts = llm.engine.model.tp_group.counts
    assert counts["all_reduce"] == (2 * layers + 1) * forwards
    assert counts["all_gather"] == forwards
    assert llm.engine.runner.kv_caches.shape[4] == llm.engine.spec.num_kv_heads // 2  # this rank's KV heads


def test_tp2_kv_blocks_cost_half_the_bytes():
    """The same KV bytes per rank hold twice the blocks at TP=2. (The runs of
    test_tp2_greedy_tokens_equal_tp1_with_chunked_prefill_and_prefix_caching[False], shared.)"""
    _, _, one = run_tp(1, async_scheduling=False)
    _, _, two = run_tp(2, async_scheduling=False)
    assert two.engine.runner.block_bytes() * 2 == one.engine.runner.block_bytes()
    assert two.engine.num_gpu_blocks == 2 * one.engine.num_gpu_blocks


def test_cli_engine_run_tensor_parallel(tmp_path):
    from costline.cli import app

    args = ["engine", "run", "--model", "tiny", "--device", "cpu", "--workload", "lab-random", "--first", "3",
            "--speedup", "1000", "--max-prompt-len", "40", "--max-model-len", "512", "--block-size", "8",
            "--max-num-seqs", "4", "--max-num-batched-tokens", "64"]
    res = CliRunner().invoke(app, [*args, "--tensor-parallel-size", "2", "--out", str(tmp_path / "tp2")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "tp2" / "steps.jsonl").read_text().count("\n") > 3
    assert get_model("tiny").num_kv_heads % 2 == 0
