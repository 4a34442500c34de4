"""`--speculative-config` as the engine reads it: vLLM's keys and defaults, one clear error per
bad value naming the flag and the key, async scheduling resolved off, the CLI."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from advisor.options import cli_message
from costline.cli import app
from engine.core.config import EngineArgs
from engine.core.speculative_config import SpeculativeConfig, parse_speculative_config
from sim.config import EngineConfig


def test_method_is_inferred_from_a_draft_model():
    c = parse_speculative_config('{"model": "tiny", "num_speculative_tokens": 3}')
    assert c.method == "draft_model" and c.model == "tiny" and c.num_speculative_tokens == 3


@pytest.mark.parametrize(("given", "window"), [({}, (5, 5)), ({"prompt_lookup_max": 3}, (3, 3)),
                                               ({"prompt_lookup_min": 2}, (2, 2)),
                                               ({"prompt_lookup_min": 2, "prompt_lookup_max": 4}, (2, 4))])
def test_ngram_lookup_window_defaults_as_vllm(given, window):
    c = SpeculativeConfig(method="ngram", num_speculative_tokens=2, **given)
    assert (c.lookup_min, c.lookup_max) == window
    # printed back as typed: no filled-in defaults in the vllm serve JSON
    typed = "".join(f',"{k}":{given[k]}' for k in ("prompt_lookup_max", "prompt_lookup_min") if k in given)
    assert c.vllm_json() == '{"method":"ngram","num_speculative_tokens":2' + typed + "}"


def test_engine_args_take_json_or_dict_and_run_synchronously():
    a = EngineArgs(speculative_config='{"method":"ngram","num_speculative_tokens":4}', async_scheduling=True)
    b = EngineArgs(speculative_config={"method": "ngram", "num_speculative_tokens": 4}, async_scheduling=True)
    assert a.speculative_config == b.speculative_config and a.num_speculative_tokens == 4
    resolved = a.resolved(device_name="cpu", device_memory_bytes=0.0, max_position_embeddings=4096)
    assert resolved.async_scheduling is False
    assert EngineArgs(async_scheduling=True).resolved(
        device_name="cpu", device_memory_bytes=0.0, max_position_embeddings=4096).async_scheduling is True


@pytest.mark.parametrize(("value", "says"), [
    ('{"method":"ngram","num_speculative_tokens":17}', 'key "num_speculative_tokens" = 17'),
    ('{"method":"ngram"}', 'key "num_speculative_tokens" is required'),
    ('{"method":"ngram","num_speculative_tokens":2,"lookahead":1}', 'key "lookahead" is not a speculative-config key'),
    ('{"method":"medusa","num_speculative_tokens":2}', 'key "method" = \'medusa\''),
    ('{"num_speculative_tokens":2}', 'needs "method"'),
    ('{"method":"draft_model","num_speculative_tokens":2}', 'needs "model"'),
    ('{"model":"tiny","num_speculative_tokens":2,"draft_tensor_parallel_size":2}',
     '"draft_tensor_parallel_size" 2: only 1'),
    ('{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":4,"prompt_lookup_max":2}',
     '"prompt_lookup_min" 4 exceeds'),
    ('{"method":', 'is not valid JSON'),
    ('[1, 2]', 'must be a JSON object'),
])
def test_bad_values_name_the_flag_and_the_key(value, says):
    with pytest.raises(ValueError) as e:
        EngineArgs(speculative_config=value)
    msg = cli_message(e.value)
    assert msg.startswith("--speculative-config ") and says in msg and "\n" not in msg


def test_draft_tensor_parallel_one_is_accepted():
    c = parse_speculative_config({"model": "tiny", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1})
    assert c.draft_tensor_parallel_size == 1


def test_simulator_config_keeps_its_methods_and_keys():
    e = EngineConfig(speculative_config={"method": "eagle", "num_speculative_tokens": 3,
                                         "acceptance_beta": {"code": (2.0, 1.0)}})
    assert e.speculative_config.vllm_json() == '{"method":"eagle","num_speculative_tokens":3}'
    assert EngineConfig(speculative_config={"model": "tiny", "num_speculative_tokens": 2}
                        ).speculative_config.method == "draft_model"


def test_engine_bench_cli_runs_with_drafts_and_refuses_bad_json(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["engine", "bench", "--device", "cpu", "--dtype", "float32", "--num-prompts", "3",
                             "--max-num-seqs", "4", "--max-model-len", "256", "--input-len", "12",
                             "--output-len", "6", "--speculative-config",
                             '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":1}'])
    assert ok.exit_code == 0, ok.output
    assert '"spec_decode_num_drafts"' in ok.output  # repeats of random prompts are rare, 1-grams are not
    bad = runner.invoke(app, ["engine", "bench", "--device", "cpu", "-sc", '{"method":"ngram"}'])
    assert bad.exit_code == 2
    assert 'error: -sc ' in bad.output and "num_speculative_tokens" in bad.output  # the option as typed
    assert "Traceback" not in bad.output
