"""The plain verdict every report opens with: does the recommended configuration meet each SLO on
the GPUs given, and if not, what it would take.

A target is checked at the percentile the user named (`ttft_p99:500` -> TTFT p99; vLLM's
`ttft:500` -> p99), and the whole SLO by the share of requests that meet every target against
the line the search uses (`SLO_MET`, 99%).
"""

from __future__ import annotations

from advisor.advise.ladder import gpus_needed
from advisor.advise.records import Metrics, SloCheck, Verdict
from advisor.advise.search import SLO_MET

_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2E latency"}


def slo_targets(text: str) -> list[tuple[str, str, float]]:
    """(key, percentile, target ms) per target of the SLO as the user typed it."""
    out = []
    for part in text.replace(",", " ").split():
        key, _, raw = part.partition(":")
        base, _, pct = key.partition("_")
        out.append((base, pct or "p99", float(raw)))
    return out


def _value(m: Metrics, key: str, pct: str) -> tuple[float, str]:
    """The metric's value at `pct`; the recommendation holds p50 and p99 (p99 otherwise, the stricter)."""
    if key == "e2el":
        return m.e2e_p99_ms, "p99"
    shown = "p50" if pct == "p50" else "p99"
    return getattr(m, f"{key}_{shown}_ms"), shown


def checked(v: Verdict, need: int | None, m: Metrics | None, tried: int) -> Verdict:
    """`v` with the GPUs the simulator found meeting the SLO (`need`, its metrics `m`), or with the
    most it tried (`tried`) when none did; the estimate's sentence is replaced."""
    head = v.text.split(" To meet it:")[0]
    if need is not None and m is not None:
        fix = (f" To meet it: {need} GPUs, checked in simulation (the same flags on {need} GPUs: SLO met by "
               f"{m.slo_attainment:.1%} of requests, TTFT p99 {m.ttft_p99_ms:,.1f} ms, TPOT p99 {m.tpot_p99_ms:,.1f} ms; "
               f"re-run with --num-gpus {need} for the full advice there).")
    else:
        fix = (f" To meet it: more than {tried} GPUs of this configuration (none up to {tried} met it in "
               "simulation); loosen the targets, or try a larger --gpu.")
    return v.model_copy(update={"gpus_needed": need, "gpus_checked": need is not None, "text": head + fix})


def verdict(m: Metrics, slo_text: str, num_gpus: int, gpu: str) -> Verdict:
    checks = []
    for key, pct, target in slo_targets(slo_text):
        value, shown = _value(m, key, pct)
        checks.append(SloCheck(metric=f"{_NAMES.get(key, key)} {shown}", target_ms=target, value_ms=value,
                               met=value <= target))
    meets = all(c.met for c in checks) and m.slo_attainment >= SLO_MET
    need = num_gpus if meets else gpus_needed(m, num_gpus)
    parts = [f"{c.metric} {c.value_ms:,.1f} ms {'<=' if c.met else '>'} {c.target_ms:g} ms target: "
             f"{'met' if c.met else 'MISSED'}" for c in checks]
    line = "below" if m.slo_attainment < SLO_MET else "at or above"
    parts.append(f"SLO met by {m.slo_attainment:.1%} of requests, {line} the {SLO_MET:.0%} line")
    head = (f"{'MEETS' if meets else 'MISSES'} the SLO at the recommended configuration on {num_gpus}x {gpu}")
    if meets:
        fix = ""
    elif need is None:
        fix = (" To meet it: no request met the SLO on these GPUs, so no replica count can be estimated; loosen "
               "the targets, or try a larger --gpu or --num-gpus.")
    else:
        fix = (f" To meet it: about {need} GPUs (estimated from the share of requests served within the SLO; "
               f"check with --num-gpus {need}, or --objective min-gpus --num-gpus {need} for the fewest).")
    return Verdict(meets=meets, num_gpus=num_gpus, gpu=gpu, checks=checks, slo_attainment=m.slo_attainment,
                   attainment_line=SLO_MET, gpus_needed=need, text=f"{head}: " + "; ".join(parts) + "." + fix)


# What a lossy option may do to outputs (no accuracy figure: it depends on the model and the task).
QUALITY_NOTES = {
    "quantization": ("FP8 weights (--quantization fp8) quantize a BF16 checkpoint's linear layers on load: outputs "
                     "can differ from BF16 and accuracy can drop, by an amount that depends on the model and task. "
                     "Run your own quality evaluation before rollout, or pass --forbid fp8-weights."),
    "kv_cache_dtype": ("An FP8 KV cache (--kv-cache-dtype fp8) stores keys and values in 8 bits (scale 1.0 unless "
                       "the checkpoint carries calibrated scales): attention is approximate, most visibly on long "
                       "contexts. Check quality on your own prompts, or pass --forbid fp8-kv."),
}


def quality_notes(flags: dict[str, object]) -> list[str]:
    """A note per lossy option among the recommended flags (speculative decoding is lossless)."""
    return [note for flag, note in QUALITY_NOTES.items() if flags.get(flag) not in (None, "auto")]


def meets(m: Metrics, slo_text: str) -> bool:
    return verdict(m, slo_text, 1, "-").meets


__all__ = ["QUALITY_NOTES", "checked", "meets", "quality_notes", "slo_targets", "verdict"]
