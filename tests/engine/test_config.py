"""The shared vLLM scheduling flags: one translation to SchedulerConfig for engine and simulator."""

import pytest

from engine.config import EngineArgs, scheduler_config
from engine.model_spec import get_model
from engine.scheduler import SchedulerConfig
from sim.config import EngineConfig
from sim.hardware import get_gpu

FLAGS = {"max_num_batched_tokens": 512, "max_num_seqs": 7, "max_model_len": 1024, "block_size": 8,
         "enable_prefix_caching": False, "prefix_caching_hash_algo": "sha256",
         "enable_chunked_prefill": True, "long_prefill_token_threshold": 64, "scheduling_policy": "priority"}


def test_engine_and_sim_args_give_the_same_scheduler_config():
    expected = SchedulerConfig(num_gpu_blocks=99, num_speculative_tokens=2, **FLAGS)
    for args in (EngineArgs(**FLAGS), EngineConfig(**FLAGS)):
        assert scheduler_config(args, num_gpu_blocks=99, num_speculative_tokens=2) == expected


def test_overrides_and_defaults_kept_per_side():
    sc = scheduler_config(EngineArgs(), num_gpu_blocks=10, max_model_len=300, block_size=32)
    assert (sc.max_num_batched_tokens, sc.max_num_seqs, sc.max_model_len, sc.block_size) == (8192, 256, 300, 32)
    assert EngineArgs().gpu_memory_utilization == 0.92 == EngineConfig().gpu_memory_utilization
    # the simulator's budgets are GPU-dependent: unresolved, they cannot become a scheduler config
    with pytest.raises(ValueError, match="resolve"):
        scheduler_config(EngineConfig(), num_gpu_blocks=10)
    resolved = EngineConfig().resolved_for(get_gpu("h200"), get_model("llama-3.1-8b"))
    sc = scheduler_config(resolved, num_gpu_blocks=10)
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (8192, 1024)
