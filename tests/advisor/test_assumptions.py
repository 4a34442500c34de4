"""Provenance of every price a recommendation rests on: tags from the profile and the knobs, the
ranges the gain interval simulates, where the advice flips, and the FP8 price override."""

from __future__ import annotations

import pytest

from advisor.advise.assumptions import (
    FP8_GEMM_SPEEDUP_RANGE,
    assumptions,
    flip_point,
    input_ranges,
    knob_assumptions,
    profile_provenance,
)
from engine.core.model_spec import get_model
from sim.config import EngineConfig, SpeculativeConfig
from sim.cost_model import Roofline
from sim.hardware import get_gpu
from sim.profile_files import load_profile
from sim.speculative import ACCEPTANCE_RANGE, DEFAULT_ACCEPTANCE

EAGLE = SpeculativeConfig(method="eagle3", num_speculative_tokens=4)
ALL_ON = EngineConfig(quantization="fp8", kv_cache_dtype="fp8", speculative_config=EAGLE)


def test_the_profile_says_measured_scaled_or_prior():
    assert profile_provenance(load_profile("h200-llama-3.1-8b")) == "measured"
    assert profile_provenance(load_profile("a100-80gb-llama-3.1-8b")) == "scaled"
    assert profile_provenance(load_profile("default")) == "prior"


def _unmeasured_fp8(prof):
    return prof.model_copy(update={"fp8_gemm_speedup": None, "fp8_step_s": None, "fp8_fit": None})


def test_fp8_weights_are_measured_on_the_h200_8b_and_carried_over_elsewhere():
    fp8 = "FP8 weights: GEMM speed-up over bf16"
    own = {a.input: a for a in knob_assumptions(ALL_ON, load_profile("h200-llama-3.1-8b"), "h200")}[fp8]
    assert own.provenance == "measured" and own.low is None
    assert own.value == "1.70x, +0.59 ms per forward" and "held-out step error 1.5%" in own.source
    h100 = {a.input: a for a in knob_assumptions(ALL_ON, load_profile("h100-sxm-llama-3.1-8b"), "h100-sxm")}[fp8]
    assert h100.provenance == "transferred" and h100.source.startswith("carried over from")
    one_b = {a.input: a for a in knob_assumptions(ALL_ON, load_profile("h200-llama-3.2-1b"), "h200")}[fp8]
    assert one_b.provenance == "prior" and (one_b.low, one_b.high) == FP8_GEMM_SPEEDUP_RANGE


def test_each_knob_names_its_provenance_and_range():
    prof = _unmeasured_fp8(load_profile("h200-llama-3.1-8b"))
    got = {a.input: a for a in knob_assumptions(ALL_ON, prof, "h200")}
    fp8 = got["FP8 weights: GEMM speed-up over bf16"]
    assert (fp8.provenance, fp8.low, fp8.high) == ("prior", *FP8_GEMM_SPEEDUP_RANGE)
    kv = got["fp8 KV cache: attention time over the 16-bit cache's"]
    assert kv.provenance == "transferred" and "costline's Triton kernels" in kv.source
    acc = got["eagle3 acceptance per draft token"]
    assert (acc.provenance, acc.low, acc.high) == ("prior", 1 - ACCEPTANCE_RANGE, 1 + ACCEPTANCE_RANGE)
    assert "vllm:spec_decode_num_accepted_tokens_total" in acc.how_to_measure
    assert got["eagle3 proposer cost per pass"].provenance == "prior"  # this profile has no SpecTerms
    # measured by the user / by a profile: tagged so, and no range to simulate
    mine = ALL_ON.model_copy(update={"speculative_config": EAGLE.model_copy(
        update={"acceptance_beta": {"default": (7.0, 3.0)}})})
    measured = prof.model_copy(update={"fp8_gemm_speedup": 1.5, "fp8_step_s": 0.0})
    got = {a.input: a for a in knob_assumptions(mine, measured, "h200")}
    assert got["eagle3 acceptance per draft token"].provenance == "measured"
    assert got["eagle3 acceptance per draft token"].low is None
    assert (got["FP8 weights: GEMM speed-up over bf16"].provenance, got["FP8 weights: GEMM speed-up over bf16"].value) \
        == ("measured", "1.50x")
    assert input_ranges(EngineConfig(), mine, measured) == []
    # nothing on: only the step costs, first
    only = assumptions(EngineConfig(), prof, "h200")
    assert [a.input for a in only] == ["step costs (cost profile)"] and "1.3%" in only[0].source


def test_ranges_come_only_with_the_rung_that_brings_the_input_in():
    prof = _unmeasured_fp8(load_profile("h200-llama-3.1-8b"))
    names = [r.name for r in input_ranges(EngineConfig(), ALL_ON, prof)]
    assert names == ["FP8 weights: GEMM speed-up over bf16", "eagle3 acceptance per draft token"]
    assert input_ranges(ALL_ON, ALL_ON, prof) == []  # already in the previous rung: not this rung's doing
    acc = input_ranges(EngineConfig(), EngineConfig(speculative_config=EAGLE), prof)[0]
    a, b = acc.engine_low["speculative_config"]["acceptance_beta"]["chat"]
    a0, b0 = DEFAULT_ACCEPTANCE["eagle3"]["chat"]
    assert a / (a + b) == pytest.approx(a0 / (a0 + b0) * (1 - ACCEPTANCE_RANGE)) and a + b == pytest.approx(a0 + b0)
    fp8 = input_ranges(EngineConfig(), EngineConfig(quantization="fp8"), prof)[0]
    assert (fp8.config_low, fp8.config_high) == ({"fp8_gemm_speedup": 1.3}, {"fp8_gemm_speedup": 2.0})


def test_flip_point_interpolates_between_the_simulated_ends():
    # gain -4% at 0.7x the prior, +8% at 1.3x: crosses +2% half-way, at 1.0x
    assert flip_point("eagle3 acceptance", 0.7, 1.3, -4.0, 8.0, 2.0) == (
        "the change clears +2% only above 1.00x the prior (simulated 0.70 to 1.30)")
    assert flip_point("FP8 weights", 1.3, 2.0, 5.0, 9.0, 2.0) is None  # both ends clear it


def test_the_fp8_gemm_price_follows_the_speedup():
    m, g = get_model("llama-3.1-8b"), get_gpu("h200")
    bf16 = Roofline.of(m, g, EngineConfig())
    datasheet = Roofline.of(m, g, EngineConfig(quantization="fp8"))
    measured = Roofline.of(m, g, EngineConfig(quantization="fp8"), fp8_gemm_speedup=1.5)
    assert datasheet.gemm_s_per_token == pytest.approx(bf16.gemm_s_per_token * g.bf16_tflops / g.fp8_tflops)
    assert measured.gemm_s_per_token == pytest.approx(bf16.gemm_s_per_token / 1.5)
    # the decoder's bytes halve whatever the rate; the LM head stays 16-bit, at the bf16 rate (as vLLM)
    head = m.vocab_size * m.hidden_size * 2 / (g.hbm_gb_per_s * 1e9)
    assert measured.weights_s == pytest.approx((bf16.weights_s - head) / 2 + head)
    assert measured.gemm_s_per_row == bf16.gemm_s_per_row
    assert Roofline.of(m, g, EngineConfig(), fp8_gemm_speedup=1.5) == bf16  # bf16 weights: no effect


def test_a_measured_acceptance_reaches_every_speculative_option():
    from advisor.advise import AdviseRequest
    from advisor.advise.space import ENGINE_DIMENSIONS, dimensions

    req = AdviseRequest(acceptance="eagle3:chat=0.5,code=0.6 ngram:chat=0.1")
    assert req.acceptance == {"eagle3": {"chat": 0.5, "code": 0.6}, "ngram": {"chat": 0.1}}
    dims = dimensions("llama-3.1-8b", 1, acceptance=req.acceptance)
    spec = next(d for d in dims if d.name == "speculative decoding")
    beta = {o.name: o.flags.get("speculative_config", {}).get("acceptance_beta") for o in spec.options}
    assert beta["off"] is None
    assert beta["eagle3 k=4"]["chat"] == pytest.approx((10.0, 10.0)) and beta["eagle3 k=2"]["code"] == pytest.approx((12.0, 8.0))
    assert beta["ngram k=4"] == {"chat": pytest.approx((2.0, 18.0))}
    assert dimensions("llama-3.1-8b", 1) == ENGINE_DIMENSIONS  # none given: the priors
    # measured: tagged so, and no range simulated for it
    eng = EngineConfig(**spec.options[3].flags)
    got = {a.input: a for a in knob_assumptions(eng, load_profile("h200-llama-3.1-8b"), "h200")}
    assert got["eagle3 acceptance per draft token"].provenance == "measured"
    assert input_ranges(EngineConfig(), eng, load_profile("h200-llama-3.1-8b")) == []
    for bad, words in (("chat=1.5", "between 0 and 1"), ("eagle9:chat=0.5", "unknown method"), ("chat", "TASK=RATE")):
        with pytest.raises(ValueError, match=words):
            AdviseRequest(acceptance=bad)


PROM = """# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 1000.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 1000.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 700.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 500.0
"""


def test_acceptance_read_from_a_vllm_scrape(tmp_path):
    from advisor.advise.vllm_metrics import acceptance_from_metrics
    from engine.core.input_files import InputFileError

    path = tmp_path / "metrics.prom"
    path.write_text(PROM)
    got = acceptance_from_metrics(path, "eagle3")
    assert set(got) == {"eagle3"} and set(got["eagle3"]) == set(DEFAULT_ACCEPTANCE["eagle3"])
    assert list(got["eagle3"].values()) == [pytest.approx(1200 / 2000)] * len(got["eagle3"])  # both engines summed
    for text, words in (("vllm:num_requests_running 3\n", "no vllm:spec_decode_num_draft_tokens_total"),
                        ("not { prometheus", "not Prometheus text")):
        path.write_text(text)
        with pytest.raises(InputFileError, match=words):
            acceptance_from_metrics(path)


def test_the_cli_takes_the_scrape_and_says_the_acceptance_is_measured(tmp_path):
    import json

    from typer.testing import CliRunner

    from costline.cli import app
    from tests.advisor.test_advise import SMALL

    (tmp_path / "m.prom").write_text(PROM)
    (tmp_path / "w.json").write_text(SMALL.with_overrides(num_requests=60).to_json())
    res = CliRunner().invoke(app, ["advise", "-w", str(tmp_path / "w.json"), "--vllm-metrics", str(tmp_path / "m.prom"),
                                   "--acceptance", "ngram:chat=0.1", "--workers", "1", "--json", "--min-gain", "0"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout[res.stdout.index("{"):])
    assert rec["request"]["acceptance"]["*"]["chat"] == pytest.approx(0.6)
    assert rec["request"]["acceptance"]["ngram"] == {"chat": 0.1} and rec["request"]["min_gain_pct"] == 0
    bad = CliRunner().invoke(app, ["advise", "--vllm-metrics", str(tmp_path / "nope.prom")])
    assert bad.exit_code == 2 and "nope.prom" in bad.output


def test_tensor_parallelism_says_whether_its_all_reduce_was_measured():
    from sim.cost_model import TPTerms

    name = "tensor-parallel all-reduce and its overlap"
    prof = load_profile("h200-llama-3.1-8b")
    tp2 = EngineConfig(tensor_parallel_size=2)
    assert name not in {a.input for a in knob_assumptions(EngineConfig(), prof, "h200")}
    prior = {a.input: a for a in knob_assumptions(tp2, prof, "h200")}[name]
    assert prior.provenance == "prior" and "datasheet" in prior.value and "--tp-runs" in prior.how_to_measure
    terms = TPTerms(tensor_parallel_size=2, allreduce_latency_s=11e-6, allreduce_bus_gb_per_s=350.0,
                    overlap_fraction=0.2, step_s=1.2e-4,
                    provenance={"status": "measured", "gpu": "h200", "fit": {"held_out_median_rel_error": 0.031}})
    measured = prof.model_copy(update={"tp": terms})
    got = {a.input: a for a in knob_assumptions(tp2, measured, "h200")}[name]
    assert got.provenance == "measured" and got.value == ("11.0 us + bytes at 350 GB/s bus per all-reduce, "
                                                          "20% hidden, 120 us per step")
    assert "held-out TP step error 3.1%" in got.source
    four = {a.input: a for a in knob_assumptions(EngineConfig(tensor_parallel_size=4), measured, "h200")}[name]
    assert four.provenance == "scaled" and "TP4" in four.source
    other = {a.input: a for a in knob_assumptions(tp2, measured, "h100-sxm")}[name]
    assert other.provenance == "transferred"


def test_eagle3_on_the_measured_gpu_and_model_is_priced_from_the_engine():
    """byte-lm-100m on the H200: EAGLE-3's acceptance and its head's cost per forward were measured
    on the engine (benchmarks/spec_decode/data/h200-eagle): tagged measured, no range simulated;
    another model keeps the prior acceptance and its range."""
    eng = EngineConfig(speculative_config={"method": "eagle3", "num_speculative_tokens": 2})
    byte = load_profile("h200-byte-lm-100m")
    got = {a.input: a for a in knob_assumptions(eng, byte, "h200")}
    acc, cost = got["eagle3 acceptance per draft token"], got["eagle3 proposer cost per pass"]
    assert (acc.provenance, acc.low, acc.high) == ("measured", None, None)
    assert "measured on the engine" in acc.source and "prose" in acc.value
    assert cost.provenance == "measured" and f"{byte.spec.eagle3_pass_s * 1e3:.3f} ms" in cost.value
    assert input_ranges(EngineConfig(), eng, byte) == []
    llama = {a.input: a for a in knob_assumptions(eng, load_profile("h200-llama-3.1-8b"), "h200")}
    assert llama["eagle3 acceptance per draft token"].provenance == "prior"
    assert llama["eagle3 proposer cost per pass"].provenance in ("prior", "transferred")
