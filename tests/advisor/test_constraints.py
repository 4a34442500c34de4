"""--allow / --forbid restrict the advisor's search space (CLI, AdviseRequest, dashboard); lossy
options recommended carry quality notes."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from advisor.advise import AdviseRequest, advise
from advisor.advise.report import markdown
from advisor.advise.space import FEATURES, dimensions, option_features
from advisor.advise.verdict import quality_notes
from costline.cli import app
from tests.advisor.test_advise import SMALL

runner = CliRunner()


def _features(dims) -> set[str]:
    return {f for d in dims for o in d.options for f in option_features(o)}


def test_forbid_and_allow_shape_the_space() -> None:
    every = _features(dimensions("llama-3.1-8b", 2))
    assert every == set(FEATURES)  # every name means something in the full space
    no_fp8w_spec = _features(dimensions("llama-3.1-8b", 2, forbid=["fp8-weights", "spec"]))
    assert no_fp8w_spec == set(FEATURES) - {"fp8-weights", "ngram", "eagle3"}
    only = dimensions("llama-3.1-8b", 2, allow=["spec", "tp"])
    assert _features(only) == {"ngram", "eagle3", "tp"}
    assert all(d.options[0].flags == {} or d.name == "parallelism" for d in only)  # defaults always stay
    # "fp8 KV + weights" changes both: allowing one of them does not let it in
    fp8 = next(d for d in dimensions("llama-3.1-8b", 1, allow=["fp8-kv"]) if d.name == "FP8")
    assert [o.name for o in fp8.options] == ["bf16", "fp8 KV cache"]


def test_a_bad_name_is_refused_naming_the_flag_and_the_names() -> None:
    with pytest.raises(ValueError, match=r"unknown name 'fp9'; use any of prefix-caching, .*fp8-weights.*spec"):
        AdviseRequest(forbid="fp9")
    assert AdviseRequest(forbid="FP8-weights, spec").forbid == ["fp8-weights", "ngram", "eagle3"]
    res = runner.invoke(app, ["advise", "-w", "lab-poisson", "-n", "20", "--allow", "spec,warp-drive"])
    assert res.exit_code == 2
    assert res.output.startswith("error: --allow 'spec,warp-drive': unknown name 'warp-drive'; use any of")


def test_a_forbidden_option_is_never_recommended(tmp_path) -> None:
    path = tmp_path / "small.json"
    path.write_text(SMALL.to_json())
    rec = advise(str(path), AdviseRequest(workers=1, slo="ttft_p99:300 tpot_p99:30", forbid="fp8,spec"))
    named = [rec.best.flags, *(s.flags_added for s in rec.ladder), *(k.flags for k in rec.kept_defaults),
             *(r.flags for r in rec.rejected)]
    for flags in named:
        assert "quantization" not in flags and "kv_cache_dtype" not in flags and "speculative_config" not in flags
    assert "--quantization" not in rec.serve_command and "--speculative-config" not in rec.serve_command
    assert rec.request.forbid == ["fp8-kv", "fp8-weights", "ngram", "eagle3"]
    assert rec.quality_notes == []


def test_lossy_options_carry_quality_notes() -> None:
    notes = quality_notes({"quantization": "fp8", "kv_cache_dtype": "fp8", "max_num_seqs": 128})
    assert len(notes) == 2 and "--forbid fp8-weights" in notes[0] and "--forbid fp8-kv" in notes[1]
    assert quality_notes({"speculative_config": {"method": "eagle3"}}) == []  # lossless


def test_quality_notes_appear_in_the_report(tmp_path) -> None:
    path = tmp_path / "small.json"
    path.write_text(SMALL.with_overrides(num_requests=60).to_json())
    rec = advise(str(path), AdviseRequest(workers=1, allow="fp8"))
    rec = rec.model_copy(update={"quality_notes": quality_notes({"quantization": "fp8"})})
    md = markdown(rec, [])
    assert "## Output quality" in md and "FP8 weights (--quantization fp8)" in md
