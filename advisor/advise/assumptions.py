"""Where every price a recommendation rests on comes from, and how a user measures the ones we
did not.

Each input is tagged `measured` (fitted on this GPU and model), `scaled` (another GPU's fit scaled
by datasheet ratios), `transferred` (measured elsewhere: another model, another kernel) or
`prior` (a literature or datasheet figure, its source named). The unmeasured ones with a range
are simulated at both ends (the gain interval's part (c), advisor/advise/uncertainty.py), and the
report says how to measure each on one's own vLLM and at which value the advice would flip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sim.config import EngineConfig
from sim.cost_model import STATUS_FIRST_PRINCIPLES, STATUS_SCALED, CostProfile
from sim.kv_dtype_costs import kv_dtype_cost
from sim.speculative import (
    ACCEPTANCE_RANGE,
    DEFAULT_ACCEPTANCE,
    acceptance_source,
    scaled_acceptance,
)

Provenance = Literal["measured", "scaled", "transferred", "prior"]

# FP8 weights' GEMM compute rate over bf16's when no profile measured it: from the lowest the
# H200 engine measured for the GEMM alone (1.43x at M = 1,024; lower still at small M, where the
# GEMMs are bandwidth-bound and the halved bytes decide) to the datasheet's 2x.
FP8_GEMM_SPEEDUP_RANGE = (1.3, 2.0)


class Assumption(BaseModel):
    """One input a recommendation's figures depend on."""

    model_config = ConfigDict(extra="forbid")

    input: str
    provenance: Provenance
    value: str
    source: str
    how_to_measure: str
    low: float | None = None  # the range the gain interval simulates (None: not varied)
    high: float | None = None
    flips_at: str | None = None  # where the advice would change, when the range crosses the bar


@dataclass(frozen=True, slots=True)
class InputRange:
    """How to simulate one unmeasured input at its low and its high end: updates to a SimConfig
    (`config`) or to its engine (`engine`)."""

    name: str
    low: float
    high: float
    config_low: Mapping[str, Any]
    config_high: Mapping[str, Any]
    engine_low: Mapping[str, Any]
    engine_high: Mapping[str, Any]


def profile_provenance(profile: CostProfile) -> Provenance:
    if profile.status == STATUS_FIRST_PRINCIPLES or not profile.is_fitted:
        return "prior"
    return "scaled" if profile.status == STATUS_SCALED else "measured"


def step_costs(profile: CostProfile) -> Assumption:
    v = profile.validation or {}
    err = v.get("median_abs_error")
    measured = profile_provenance(profile)
    source = {"prior": "datasheet rates with first-principles efficiencies (sim/profiles/default.json)",
              "scaled": f"{profile.name}: another GPU's fit scaled by datasheet ratios",
              "measured": f"{profile.name}: fitted on engine runs of this GPU and model"}[measured]
    if isinstance(err, float):
        source += f"; validated at {err:.1%} median |error| on held-out runs"
    return Assumption(input="step costs (cost profile)", provenance=measured, value=profile.name, source=source,
                      how_to_measure="`costline calibrate` on runs of your own engine (docs/calibration.md), "
                                     "then `costline validate` on held-out ones")


def _acceptance_value(method: str, table: Mapping[str, tuple[float, float]] | None = None) -> str:
    table = table or DEFAULT_ACCEPTANCE.get(method, DEFAULT_ACCEPTANCE["eagle"])
    means = {cat: a / (a + b) for cat, (a, b) in table.items()}
    return ", ".join(f"{cat} {m:.2f}" for cat, m in means.items()
                     if cat in ("chat", "code", "prose", "json", "default"))


def _eagle3_cost(profile: CostProfile) -> Assumption:
    """The EAGLE-3 head's fixed cost per forward: fitted on this GPU x model's engine runs with a
    trained head, or carried over with a scaled profile."""
    own = profile_provenance(profile) == "measured"
    where = (profile.provenance or {}).get("eagle3_pass_s") or {}
    return Assumption(
        input="eagle3 proposer cost per pass", provenance="measured" if own else "transferred",
        value=f"{profile.spec.eagle3_pass_s * 1e3:.3f} ms fixed per head forward + its roofline",
        source=(f"{profile.name}: fitted on " if own else "carried over from ")
        + f"the engine's EAGLE-3 head runs ({where.get('gpu', '?')}, {where.get('date', '?')[:10]}, "
          f"{where.get('runs', 'benchmarks/spec_decode')})",
        how_to_measure="compare `vllm:time_per_output_token_seconds` at concurrency 1 with and without "
                       "speculation against the acceptance length")


def _fp8_weights(profile: CostProfile) -> Assumption:
    """FP8 weights' price: fitted on this GPU x model's FP8 engine steps, carried over with a scaled
    profile, or the datasheet prior."""
    speedup, fit = profile.fp8_gemm_speedup, profile.fp8_fit or {}
    how = ("run `vllm bench serve` on your traffic with and without `--quantization fp8` and compare "
           "`vllm:time_per_output_token_seconds` and throughput")
    name = "FP8 weights: GEMM speed-up over bf16"
    if speedup is None:
        return Assumption(input=name, provenance="prior", value="2.0x (datasheet FP8 rate); weights' bytes halved",
                          source="datasheet; costline's H200 engine measured 1.6-2.3x for the GEMM alone "
                                 "(benchmarks/kernels/NOTES.md, run 9)",
                          how_to_measure=how, low=FP8_GEMM_SPEEDUP_RANGE[0], high=FP8_GEMM_SPEEDUP_RANGE[1])
    step = f", +{profile.fp8_step_s * 1e3:.2f} ms per forward" if profile.fp8_step_s else ""
    err = fit.get("held_out_median_error")
    where = f"FP8-weight engine steps ({fit.get('gpu', '?')}, {fit.get('model', '?')})"
    if isinstance(err, float):
        where += f", held-out step error {err:.1%}"
    own = profile_provenance(profile) == "measured"
    return Assumption(input=name, provenance="measured" if own else "transferred", value=f"{speedup:.2f}x{step}",
                      source=(f"{profile.name}: fitted on " if own else "carried over from ") + where,
                      how_to_measure=how)


def _tensor_parallel(profile: CostProfile, tp: int, gpu: str) -> Assumption:
    """TP's all-reduces: measured on this GPU pair (sim/tp_fit.py), scaled from another TP size, or
    the link's datasheet bandwidth (first principles)."""
    name = "tensor-parallel all-reduce and its overlap"
    how = ("run `benchmarks/tp/h200x2.py` (or your vLLM at --tensor-parallel-size 1 and N on the same traffic), "
           "then `costline calibrate ... --tp-runs RUN... --tp-collectives collectives.json`")
    t = profile.tp
    if t is None:
        return Assumption(input=name, provenance="prior",
                          value=f"{2 * profile.allreduce_latency_s * 1e6:.0f} us + bytes at "
                                f"{profile.allreduce_efficiency:.0%} of the link's datasheet bandwidth, per layer",
                          source="first principles: ring all-reduce over the GPU's interconnect (sim/hardware.py)",
                          how_to_measure=how)
    fit = (t.provenance or {}).get("fit", {})
    err = fit.get("held_out_median_rel_error")
    where = f"measured on {(t.provenance or {}).get('gpu', '?')} at TP{t.tensor_parallel_size}"
    if isinstance(err, float):
        where += f", held-out TP step error {err:.1%}"
    measured_on = (t.provenance or {}).get("gpu")
    prov: Provenance = ("transferred" if measured_on not in (None, gpu) else
                        "measured" if tp == t.tensor_parallel_size else "scaled")
    note = {"measured": "", "scaled": f"; latency scaled to TP{tp}", "transferred": f"; used for {gpu}"}[prov]
    return Assumption(input=name, provenance=prov,
                      value=f"{t.allreduce_latency_s * 1e6:.1f} us + bytes at {t.allreduce_bus_gb_per_s:.0f} GB/s bus "
                            f"per all-reduce, {t.overlap_fraction:.0%} hidden, {t.step_s * 1e6:.0f} us per step",
                      source=f"{profile.name}: {where}{note}", how_to_measure=how)


def _expert_parallel(ep: int, gpu: str) -> Assumption:
    """--enable-expert-parallel: planned from first principles, never measured (issue 29)."""
    from sim.expert_parallel import SOURCE, link_bytes_per_s
    from sim.hardware import get_gpu

    return Assumption(
        input="expert parallelism: expert placement and all-to-all", provenance="prior",
        value=f"not yet validated: EP{ep}, {1 / ep:.0%} of the experts whole per GPU, the busiest GPU's expected "
              f"touched experts; dispatch + combine of tokens x hidden x (EP-1)/EP per MoE layer at "
              f"{link_bytes_per_s(get_gpu(gpu)) / 1e9:.0f} GB/s, no collective latency",
        source=SOURCE,
        how_to_measure="serve with and without `--enable-expert-parallel` at the same --tensor-parallel-size and "
                       "load, compare `vllm:time_per_output_token_seconds` and `vllm:time_to_first_token_seconds`")


def knob_assumptions(engine: EngineConfig, profile: CostProfile, gpu: str) -> list[Assumption]:
    """The prices of the knobs `engine` turns on (on `gpu`), beyond the step costs."""
    out = []
    if engine.tensor_parallel_size > 1:
        out.append(_tensor_parallel(profile, engine.tensor_parallel_size, gpu))
    if engine.expert_parallel_size > 1:
        out.append(_expert_parallel(engine.expert_parallel_size, gpu))
    if engine.quantization == "fp8":
        out.append(_fp8_weights(profile))
    if engine.kv_cache_dtype not in (None, "auto"):
        kvc = kv_dtype_cost(engine.kv_cache_dtype, gpu)
        out.append(Assumption(
            input=f"{engine.kv_cache_dtype} KV cache: attention time over the 16-bit cache's", provenance="transferred",
            value=f"decode x{kvc.decode_time_ratio:.2f}, prefill x{kvc.prefill_time_ratio:.2f}; twice the KV blocks",
            source=f"measured on costline's Triton kernels, not vLLM's ({kvc.source}); FlashInfer 0.6.4's fp8 "
                   "decode, which vLLM runs, took 0.88x its bf16 time at 64 x 4096 in the same H200 run, "
                   "ours 0.84x (benchmarks/kernels/NOTES.md, run 9)",
            how_to_measure="compare `vllm:time_per_output_token_seconds` and `vllm:kv_cache_usage_perc` with and "
                           f"without `--kv-cache-dtype {engine.kv_cache_dtype}` under the same load"))
    spec = engine.speculative_config
    if spec is not None:
        src = acceptance_source(spec, profile.model)
        user, engine_measured = src.provenance == "user", src.provenance == "measured"
        fixed = user or engine_measured
        out.append(Assumption(
            input=f"{spec.method} acceptance per draft token", provenance="measured" if fixed else "prior",
            value="as given (--acceptance)" if user else _acceptance_value(spec.method, src.table),
            source=("the user's measurement" if user else src.source if engine_measured else
                    "prior table in the range public reports give (sim/speculative.py); "
                    f"simulated at \u00b1{ACCEPTANCE_RANGE:.0%}"),
            how_to_measure="scrape `vllm:spec_decode_num_accepted_tokens_total` / "
                           "`vllm:spec_decode_num_draft_tokens_total` (and `..._per_pos_total` by position) from "
                           "your vLLM, then `costline advise --acceptance TASK=RATE`",
            low=None if fixed else 1 - ACCEPTANCE_RANGE, high=None if fixed else 1 + ACCEPTANCE_RANGE))
        if spec.method == "eagle3" and profile.spec is not None and profile.spec.eagle3_pass_s is not None:
            out.append(_eagle3_cost(profile))
        elif spec.method != "ngram":
            measured = profile.spec is not None
            out.append(Assumption(
                input=f"{spec.method} proposer cost per pass", provenance="transferred" if measured else "prior",
                value=(f"{profile.spec.draft_pass_s * 1e3:.2f} ms fixed per pass" if measured else
                       f"{profile.draft_pass_overhead_s * 1e3:.2f} ms fixed per pass + the draft's roofline"),
                source=("measured on the byte-level pair's draft model (benchmarks/spec_decode), not this model"
                        if measured else "first principles"),
                how_to_measure="compare `vllm:time_per_output_token_seconds` at concurrency 1 with and without "
                               "speculation against the acceptance length"))
    return out


def assumptions(engine: EngineConfig, profile: CostProfile, gpu: str,
                flips: Mapping[str, str] | None = None) -> list[Assumption]:
    """Every input a configuration's figures rest on, the step costs first; `flips`: where the
    advice changes within an input's range (the ladder's finding)."""
    out = [step_costs(profile), *knob_assumptions(engine, profile, gpu)]
    return [a.model_copy(update={"flips_at": (flips or {}).get(a.input)}) for a in out]


def input_ranges(cur: EngineConfig, nxt: EngineConfig, profile: CostProfile) -> list[InputRange]:
    """The unmeasured inputs `nxt` brings in (`cur` does not use them), each with how to simulate
    its two ends."""
    out = []
    if nxt.quantization == "fp8" and cur.quantization != "fp8" and profile.fp8_gemm_speedup is None:
        lo, hi = FP8_GEMM_SPEEDUP_RANGE
        out.append(InputRange("FP8 weights: GEMM speed-up over bf16", lo, hi, {"fp8_gemm_speedup": lo},
                              {"fp8_gemm_speedup": hi}, {}, {}))
    spec = nxt.speculative_config
    if spec is not None and acceptance_source(spec, profile.model).provenance == "prior" \
            and cur.speculative_config is None:
        lo, hi = 1 - ACCEPTANCE_RANGE, 1 + ACCEPTANCE_RANGE
        out.append(InputRange(f"{spec.method} acceptance per draft token", lo, hi, {}, {},
                              {"speculative_config": scaled_acceptance(spec, lo)},
                              {"speculative_config": scaled_acceptance(spec, hi)}))
    return out


def flip_point(name: str, low: float, high: float, gain_low: float, gain_high: float, bar: float) -> str | None:
    """Where, between the range's ends, the gain crosses the bar (linear between the two
    simulated ends), said in the input's terms; None when both ends are on the same side."""
    if (gain_low - bar) * (gain_high - bar) > 0 or gain_low == gain_high:
        return None
    x = low + (bar - gain_low) * (high - low) / (gain_high - gain_low)
    side = "above" if gain_high > gain_low else "below"
    scale = "x the prior" if "acceptance" in name else "x"
    return f"the change clears {bar:+g}% only {side} {x:.2f}{scale} (simulated {low:.2f} to {high:.2f})"


__all__ = ["FP8_GEMM_SPEEDUP_RANGE", "Assumption", "InputRange", "Provenance", "assumptions", "flip_point", "input_ranges",
           "knob_assumptions", "profile_provenance", "step_costs"]
