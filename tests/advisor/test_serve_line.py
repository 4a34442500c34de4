"""The one `vllm serve` line builder (sim/serve_line.py): models by their Hugging Face ids, a draft
head where the method needs one, only non-default flags; every line parsed by vLLM's rules."""

from __future__ import annotations

import itertools

import pytest
from typer.testing import CliRunner

from advisor.advise.records import AdviseRequest
from advisor.advise.space import ENGINE_DIMENSIONS, Layout, serve_command
from costline.cli import app
from sim.config import EngineConfig
from sim.models import HF_MODEL_IDS, hf_model_id, preset_of
from sim.run import SimConfig, run
from sim.serve_line import serve_line
from sim.workload_source import SourceOptions
from tests.advisor.vllm_serve_rules import parse_serve_line

runner = CliRunner()


def test_models_by_hugging_face_id() -> None:
    assert preset_of("meta-llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b"
    assert preset_of("META-LLAMA/llama-3.1-8b") == "llama-3.1-8b"  # the base checkpoint, any case
    assert hf_model_id("llama-3.1-8b") == "meta-llama/Llama-3.1-8B-Instruct"
    assert hf_model_id("meta-llama/llama-3.1-8b") == "meta-llama/Llama-3.1-8B"  # as typed, canonical case
    assert SimConfig(model="Qwen/Qwen2.5-7B-Instruct").model == "qwen2.5-7b"
    req = AdviseRequest(model="meta-llama/Llama-3.1-8B-Instruct")
    assert (req.model, req.preset) == ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b")
    with pytest.raises(ValueError, match=r"unknown model 'llama-9'.*meta-llama/Llama-3.1-8B-Instruct"):
        preset_of("llama-9")
    # a model spec that is no preset (the simulator takes any ModelSpec) prints under its own name
    assert hf_model_id("mha-7b") == "mha-7b"
    assert serve_line("mha-7b", EngineConfig(speculative_config={"method": "eagle3", "num_speculative_tokens": 2})
                      ).draft_placeholder == "<eagle3-head-for-mha-7b>"


def test_cli_accepts_a_hugging_face_id() -> None:
    res = runner.invoke(app, ["simulate", "-w", "lab-poisson", "-n", "30", "--model",
                              "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64"])
    assert res.exit_code == 0, res.output
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 64" in res.output.replace("\n", " ")


def test_the_old_line_is_refused_by_the_rules() -> None:
    # what costline printed before: a preset alias and an EAGLE-3 config without its head
    with pytest.raises(ValueError, match="needs a draft checkpoint"):
        parse_serve_line("""vllm serve llama-3.1-8b --speculative-config '{"method":"eagle3","num_speculative_tokens":4}'""")
    with pytest.raises(ValueError, match="default"):
        parse_serve_line("vllm serve m --enable-prefix-caching")
    with pytest.raises(ValueError, match="refuse"):
        parse_serve_line("vllm serve m --preemption-mode swap")


def test_eagle3_gets_the_public_head_or_a_placeholder() -> None:
    eng = EngineConfig(quantization="fp8", speculative_config={"method": "eagle3", "num_speculative_tokens": 4})
    line = serve_line("llama-3.1-8b", eng)
    args = parse_serve_line(line.command)
    assert args["model"] == "meta-llama/Llama-3.1-8B-Instruct" and args["quantization"] == "fp8"
    assert args["speculative_config"] == {"method": "eagle3", "model": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
                                          "num_speculative_tokens": 4}
    assert line.draft_placeholder is None
    other = serve_line("qwen2.5-7b", eng)
    assert other.draft_placeholder == "<eagle3-head-for-Qwen/Qwen2.5-7B-Instruct>"
    assert parse_serve_line(other.command)["speculative_config"]["model"] == other.draft_placeholder
    ngram = serve_line("llama-3.1-8b", EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 4}))
    assert "model" not in parse_serve_line(ngram.command)["speculative_config"]


@pytest.mark.parametrize("model", list(HF_MODEL_IDS))
def test_every_searched_configuration_parses(model: str) -> None:
    """Every combination of the advisor's engine options, on every layout kind, prints a line vLLM
    parses, with the model's Hugging Face id and no flag at its default."""
    layouts = [Layout(1, 1), Layout(2, 4), Layout(1, 4, 1, 3)]
    for picks in itertools.product(*(d.options for d in ENGINE_DIMENSIONS)):
        flags: dict = {}
        for opt in picks:
            flags |= opt.flags
        for lay in layouts:
            eng = EngineConfig(**flags, **({"tensor_parallel_size": 2} if lay.tensor_parallel_size == 2 else {}))
            args = parse_serve_line(serve_command(model, eng, lay).command)
            assert args["model"] == HF_MODEL_IDS[model][0]
            assert ("kv_transfer_config" in args) == bool(lay.prefill_replicas)


def test_the_simulators_line_is_the_same_builder() -> None:
    cfg = SimConfig(model="llama-3.1-8b", num_gpus=2,
                    engine=EngineConfig(speculative_config={"method": "eagle3", "num_speculative_tokens": 2}))
    s = run("lab-poisson", cfg, source=SourceOptions(num_requests=20)).summary().to_json_dict()
    args = parse_serve_line(s["serve_command"])
    assert args["speculative_config"]["model"] == "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"
    assert s["serve_command"].endswith("# x2 replicas behind a router")
