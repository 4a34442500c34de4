"""vLLM flags defined once: defaults per GPU and entry point, start-up rules, identical in engine and sim."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import EngineArgs, scheduler_config
from engine.core.flags import (
    FLAGS_BY_NAME,
    GIB,
    SCHEDULING_FLAGS,
    FlagError,
    batch_defaults,
    parse_size,
    resolve_batch,
)
from engine.core.model_spec import get_model
from engine.core.scheduler import SchedulerConfig
from sim.config import ENGINE_CONFIG_FLAGS, EngineConfig
from sim.hardware import GPU_PRESETS, get_gpu

FLAGS = {"max_num_batched_tokens": 512, "max_num_seqs": 7, "max_model_len": 1024, "block_size": 32,
         "enable_prefix_caching": False, "prefix_caching_hash_algo": "sha256",
         "enable_chunked_prefill": True, "long_prefill_token_threshold": 64, "scheduling_policy": "priority"}
M8 = get_model("llama-3.1-8b")  # 32 attention heads, 131,072 positions


def test_engine_and_sim_args_give_the_same_scheduler_config():
    expected = SchedulerConfig(num_gpu_blocks=99, num_speculative_tokens=2, **FLAGS)
    for args in (EngineArgs(**FLAGS), EngineConfig(**FLAGS)):
        assert scheduler_config(args, num_gpu_blocks=99, num_speculative_tokens=2) == expected


def test_one_definition_per_flag_and_its_model_field():
    assert EngineArgs().gpu_memory_utilization == 0.92 == EngineConfig().gpu_memory_utilization
    for flag in ENGINE_CONFIG_FLAGS:
        field = EngineConfig.model_fields[flag.name]
        assert field.default == flag.default and field.description == flag.help
    for flag in SCHEDULING_FLAGS:  # the engine's copy of each shared flag is the same field
        assert EngineArgs.model_fields[flag.name].default == flag.default
    # what a dashboard needs to draw a control
    gmu = FLAGS_BY_NAME["gpu_memory_utilization"]
    assert (gmu.type, gmu.default, gmu.gt, gmu.le, gmu.expectation()) == (float, 0.92, 0.0, 1.0, "must be in (0, 1]")
    assert FLAGS_BY_NAME["scheduling_policy"].choices == ("fcfs", "priority")


@pytest.mark.parametrize("name, memory_bytes, usage, expected", [
    # vLLM's get_batch_defaults: >= 70 GiB other than A100 -> 8192/1024 served, 16384/1024 offline;
    # everything else (A100 included) -> 2048/256 served, 8192/256 offline. No >= 160 GiB tier.
    ("NVIDIA H200", 141e9, "api_server", (8192, 1024)),
    ("NVIDIA H200", 141e9, "offline", (16384, 1024)),
    ("b200", 180e9, "api_server", (8192, 1024)),
    ("NVIDIA A100-SXM4-80GB", 80e9, "api_server", (2048, 256)),
    ("NVIDIA A100-SXM4-80GB", 80e9, "offline", (8192, 256)),
    ("l4", 24e9, "api_server", (2048, 256)),
    ("x", 70 * GIB, "api_server", (8192, 1024)),
    ("x", 70 * GIB - 1, "api_server", (2048, 256)),
    ("cpu", 0.0, "offline", (8192, 256)),
])
def test_batch_defaults_by_gpu_and_entry_point(name, memory_bytes, usage, expected):
    d = batch_defaults(name, memory_bytes, usage)
    assert (d.max_num_batched_tokens, d.max_num_seqs) == expected


@pytest.mark.parametrize("gpu", sorted(GPU_PRESETS))
def test_engine_and_simulator_resolve_identical_defaults(gpu):
    g = get_gpu(gpu)
    sim = EngineConfig().resolved_for(g, M8)
    eng = EngineArgs().resolved(device_name=g.name, device_memory_bytes=g.hbm_bytes,
                                max_position_embeddings=M8.max_position_embeddings)
    assert sim.max_model_len == eng.max_model_len == 131072
    assert (sim.max_num_batched_tokens, sim.max_num_seqs) == (eng.max_num_batched_tokens, eng.max_num_seqs)
    assert eng.gpu_memory_utilization == sim.gpu_memory_utilization == 0.92


@pytest.mark.parametrize(("given", "moe", "expected"), [
    ({}, False, 2048),  # a dense model: the flag's default
    ({}, True, 8192),  # a mixture of experts: the H200 api_server budget
    ({"max_num_batched_tokens": 4096}, True, 4096),  # ... whatever the budget resolves to
    ({"max_cudagraph_capture_size": 512}, True, 512),  # a value the user gave is kept
])
def test_moe_models_capture_mixed_graphs_up_to_the_token_budget(given, moe, expected):
    g = get_gpu("h200")
    eng = EngineArgs(**given).resolved(device_name=g.name, device_memory_bytes=g.hbm_bytes,
                                       max_position_embeddings=M8.max_position_embeddings, moe=moe)
    assert eng.max_cudagraph_capture_size == expected


@settings(max_examples=60, deadline=None)
@given(budget=st.one_of(st.none(), st.integers(1, 40000)), seqs=st.one_of(st.none(), st.integers(1, 3000)),
       mml=st.integers(1, 40000), chunked=st.booleans(), large=st.booleans(), offline=st.booleans())
def test_resolve_batch_obeys_vllm_rules(budget, seqs, mml, chunked, large, offline):
    defaults = batch_defaults("h200" if large else "l4", 141e9 if large else 24e9,
                              "offline" if offline else "api_server")
    try:
        got = resolve_batch(budget, seqs, max_model_len=mml, enable_chunked_prefill=chunked, defaults=defaults)
    except FlagError as e:
        # an error only where a rule is broken, naming a flag the user can change
        b = budget if budget is not None else None
        assert e.field in ("max_num_batched_tokens", "max_num_seqs")
        assert (b is not None and seqs is not None and b < seqs) or (b is not None and not chunked and b < mml) \
            or (b is None and seqs is not None)
        return
    assert got.max_num_batched_tokens >= got.max_num_seqs  # SchedulerConfig._verify_args
    if not chunked:
        assert got.max_num_batched_tokens >= mml  # verify_max_model_len
    if budget is not None:
        assert got.max_num_batched_tokens == budget  # a value the user set is never changed
    else:  # default, raised to max_model_len without chunking, capped at max_num_seqs x max_model_len
        want = defaults.max_num_batched_tokens if chunked else max(defaults.max_num_batched_tokens, mml)
        assert got.max_num_batched_tokens == min(want, (seqs or defaults.max_num_seqs) * mml)
    if seqs is not None:
        assert got.max_num_seqs == seqs
    else:
        assert got.max_num_seqs == min(defaults.max_num_seqs, got.max_num_batched_tokens)


def test_resolution_by_hand():
    h200 = get_gpu("h200")
    off = EngineConfig(enable_chunked_prefill=False, max_model_len=32768).resolved_for(h200, M8)
    assert (off.max_num_batched_tokens, off.max_num_seqs) == (32768, 1024)  # raised to max_model_len
    short = EngineConfig(max_num_seqs=2, max_model_len=1000).resolved_for(h200, M8)
    assert short.max_num_batched_tokens == 2000  # capped at 2 x 1000
    tight = EngineConfig(max_num_batched_tokens=512).resolved_for(h200, M8)
    assert tight.max_num_seqs == 512  # capped at the budget


@pytest.mark.parametrize("kwargs, match", [
    ({"max_num_batched_tokens": 100, "max_num_seqs": 200},
     r"max_num_batched_tokens 100: must be >= max_num_seqs \(200\)"),
    ({"max_num_batched_tokens": 1024, "max_model_len": 2048, "enable_chunked_prefill": False},
     r"max_num_batched_tokens 1024: must be >= max_model_len \(2048\) when chunked prefill is off"),
    ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization"),
    ({"gpu_memory_utilization": 0.0}, r"gpu_memory_utilization"),
    ({"block_size": 0}, r"block_size"),
    ({"max_num_seqs": 0}, r"max_num_seqs"),
    ({"scheduling_policy": "lifo"}, r"scheduling_policy"),
])
def test_bad_values_raise_value_errors_naming_the_field(kwargs, match):
    for cls in (EngineArgs, EngineConfig):
        with pytest.raises(ValueError, match=match):
            cls(**kwargs)


def test_gpu_memory_utilization_upper_bound_is_inclusive():
    assert EngineConfig(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0


def test_rules_that_need_the_gpu_or_the_model():
    h200 = get_gpu("h200")
    with pytest.raises(ValueError, match=r"max_num_seqs 4096: must be <= max_num_batched_tokens \(2048"):
        EngineConfig(max_num_seqs=4096).resolved_for(get_gpu("a100-80gb"), M8)  # default budget 2048
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3: must divide the model's 32 attention heads"):
        EngineConfig(tensor_parallel_size=3).resolved_for(h200, M8)
    assert EngineConfig(tensor_parallel_size=4).resolved_for(h200, M8).tensor_parallel_size == 4
    with pytest.raises(ValueError, match=r"max_model_len 200000: exceeds the model's max_position_embeddings"):
        EngineConfig(max_model_len=200000).resolved_for(h200, M8)
    with pytest.raises(ValueError, match=r"resolve_limits"):
        scheduler_config(EngineConfig(), num_gpu_blocks=10)


def test_block_size_per_attention_backend():
    # the simulator models vLLM's FlashAttention (multiples of 16); the engine's kernels take any size
    with pytest.raises(ValueError, match=r"block_size 8: must be a multiple of 16 for the flash_attn"):
        EngineConfig(block_size=8)
    assert EngineConfig(block_size=32).block_size == 32
    assert EngineArgs(block_size=4).block_size == 4
    # simulating costline's own engine (calibration, cross-check) takes its kernels' rule
    assert EngineConfig(block_size=4, attention_backend="costline").block_size == 4
    with pytest.raises(ValueError, match=r"block_size 8: must be a multiple of 16 for the flashinfer"):
        EngineConfig(block_size=8, attention_backend="flashinfer")


@given(st.integers(0, 10**6))
def test_human_sizes(n):
    assert parse_size(str(n), "x") == n
    assert parse_size(f"{n}k", "x") == n * 1000 and parse_size(f"{n}K", "x") == n * 1024
    assert parse_size(f"{n}M", "x") == n * 2**20 and parse_size(f"{n}g", "x") == n * 10**9


def test_bad_size_names_the_field():
    assert parse_size("1.5k", "x") == 1500
    with pytest.raises(FlagError, match=r"max_model_len 'lots': use an integer"):
        parse_size("lots", "max_model_len")


def test_to_vllm_args_prints_each_changed_flag_with_its_vllm_spelling():
    base = EngineConfig()
    changed = {"max_num_batched_tokens": 16384, "max_num_seqs": 64, "max_model_len": 8192, "block_size": 32,
               "gpu_memory_utilization": 0.8, "num_gpu_blocks_override": 100, "enable_prefix_caching": False,
               "prefix_caching_hash_algo": "xxhash", "enable_chunked_prefill": False,
               "long_prefill_token_threshold": 256, "scheduling_policy": "priority", "async_scheduling": True,
               "kv_cache_dtype": "fp8", "quantization": "fp8", "tensor_parallel_size": 2,
               "enable_expert_parallel": True, "speculative_config": {"method": "ngram", "num_speculative_tokens": 4},
               "attention_backend": "costline"}
    assert set(changed) == {f.name for f in ENGINE_CONFIG_FLAGS}  # every flag is exercised
    args = EngineConfig(**changed).to_vllm_args(base)
    assert args == [
        "--max-num-batched-tokens", "16384", "--max-num-seqs", "64", "--max-model-len", "8192",
        "--block-size", "32", "--gpu-memory-utilization", "0.8", "--num-gpu-blocks-override", "100",
        "--disable-prefix-caching", "--prefix-caching-hash-algo", "xxhash", "--disable-chunked-prefill",
        "--long-prefill-token-threshold", "256", "--scheduling-policy", "priority", "--async-scheduling",
        "--kv-cache-dtype", "fp8", "--quantization", "fp8", "--tensor-parallel-size", "2",
        "--enable-expert-parallel", "--speculative-config", """'{"method":"ngram","num_speculative_tokens":4}'"""]  # no attention_backend
    assert EngineConfig().to_vllm_args() == []
    # costline's own hash key has no vLLM spelling: never printed
    assert EngineConfig(prefix_caching_hash_algo="sha256").to_vllm_args(
        EngineConfig(prefix_caching_hash_algo="builtin")) == ["--prefix-caching-hash-algo", "sha256"]
    assert EngineConfig(prefix_caching_hash_algo="builtin").to_vllm_args(
        EngineConfig(prefix_caching_hash_algo="sha256")) == []


@pytest.mark.parametrize(("text", "expected"), [
    # vllm/engine/arg_utils.py `human_readable_int`: decimal suffixes k m g t, binary K M G T
    ("3t", 3 * 10**12), ("2T", 2 * 2**40), ("25.6k", 25600), ("-1", -1), (" 16 ", 16), ("+4", 4),
])
def test_sizes_as_vllm_parses_them(text, expected):
    assert parse_size(text, "x") == expected


@pytest.mark.parametrize(("text", "match"), [
    ("1.5K", "did you mean 1.5k"),  # vLLM: no decimals with a binary suffix
    ("1.5", "use an integer"), ("1e3", "use an integer"), ("8kk", "use an integer"), ("", "use an integer"),
])
def test_sizes_vllm_refuses(text, match):
    with pytest.raises(FlagError, match=match) as exc:
        parse_size(text, "max_num_seqs")
    assert exc.value.field == "max_num_seqs"


def test_seed_is_never_negative():
    with pytest.raises(ValueError, match="seed"):
        EngineArgs(seed=-1)
    assert EngineArgs(seed=0).seed == 0


def test_the_kv_cache_must_hold_one_max_model_len_request():
    from sim.memory import check_one_request_fits, plan_memory

    # llama-3.1-8b: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 bytes per token
    assert M8.kv_bytes_per_token("auto") == 131072
    l4 = get_gpu("l4")
    plan = plan_memory(M8, l4, EngineConfig(max_model_len=8192).resolved_for(l4, M8))
    with pytest.raises(FlagError, match=f"estimated maximum model length is {plan.kv_capacity_tokens}") as exc:
        plan_memory(M8, l4, EngineConfig().resolved_for(l4, M8))  # 131,072 tokens = 16 GiB
    assert exc.value.field == "max_model_len" and "16.00 GiB" in str(exc.value)
    check_one_request_fits(100, 100, 1.0, where="x")  # exactly one request fits
    with pytest.raises(FlagError, match="estimated maximum model length is 99"):
        check_one_request_fits(99, 100, 1.0, where="x")
