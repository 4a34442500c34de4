"""The advisor's recommendation as the Advisor page shows it: read from the advisor's object or from
a saved recommendation.json (the same keys), and rendered from those keys only.

`advisor.advise` is imported lazily: the dashboard works without it and says so.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import streamlit as st

from app.figures import cost_line_figure, gap_figure, waterfall_figure
from app.scenario import FLAGS
from app.widgets import fmt
from engine.core.input_files import InputFileError, decode_utf8, parse_json

METRICS = (("goodput_rps", "Goodput (req/s)"), ("throughput_tok_s", "Throughput (tok/s)"),
           ("ttft_p99_ms", "p99 TTFT (ms)"), ("tpot_p99_ms", "p99 TPOT (ms)"),
           ("slo_attainment", "SLO attainment"))
TABLE_METRICS = ("goodput_rps", "throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
                 "itl_p99_ms", "e2e_p99_ms", "slo_attainment", "preemptions")
SCALED = "scaled, not validated"


class RecommendationError(ValueError):
    """A recommendation.json that cannot be shown; the message says what is missing."""


def advise_api() -> tuple[Callable[..., Any], type] | None:
    """(advise, AdviseRequest), or None when the advisor is not installed."""
    try:
        from advisor.advise import AdviseRequest, advise
    except ImportError:
        return None
    return advise, AdviseRequest


def as_dict(rec: Any) -> dict[str, Any]:
    """A Recommendation (pydantic model or dataclass) or its JSON dict, as plain JSON data."""
    if hasattr(rec, "model_dump"):
        rec = rec.model_dump(mode="json")
    elif dataclasses.is_dataclass(rec) and not isinstance(rec, type):
        rec = dataclasses.asdict(rec)
    data = json.loads(json.dumps(rec, default=str))
    if not isinstance(data, dict):
        raise RecommendationError(f"not a recommendation: a JSON {type(data).__name__}, not an object "
                                  "(load the recommendation.json `costline advise --out` writes)")
    missing = [k for k in ("best", "baseline", "ladder") if k not in data]
    if missing:
        raise RecommendationError(f"not a recommendation: missing {', '.join(missing)} "
                                  "(load the recommendation.json `costline advise --out` writes)")
    return data


def load_json(data: bytes) -> dict[str, Any]:
    try:
        return as_dict(parse_json(decode_utf8("recommendation.json", data), "recommendation.json"))
    except InputFileError as exc:
        raise RecommendationError(f"not a JSON recommendation ({exc}); load a recommendation.json") from None


def flags_text(flags: Any) -> str:
    """Flags as `vllm serve` arguments, from a {flag name: value} dict, a list of arguments or text."""
    if isinstance(flags, dict):
        parts: list[str] = []
        for name, value in flags.items():
            key = str(name).removeprefix("--").replace("-", "_")
            if isinstance(value, dict):
                parts += ["--" + key.replace("_", "-"), "'" + json.dumps(value, separators=(",", ":")) + "'"]
            elif key in FLAGS:  # vLLM's own spelling, e.g. --disable-prefix-caching
                parts += FLAGS[key].vllm_args(value) or [f"--{key.replace('_', '-')}", str(value)]
            else:
                parts += ["--" + key.replace("_", "-"), str(value)]
        return " ".join(parts)
    if isinstance(flags, (list, tuple)):
        return " ".join(str(f) for f in flags)
    return "" if flags is None else str(flags)


def config_label(config: Any) -> str:
    """A ScoredConfig's label (or the text given)."""
    return str(config.get("label") or flags_text(config.get("flags"))) if isinstance(config, dict) else str(config)


def headline(rec: dict[str, Any]) -> None:
    best, base = rec["best"]["metrics"], rec["baseline"]["metrics"]
    cols = st.columns(len(METRICS))
    for col, (key, label) in zip(cols, METRICS, strict=True):
        b, a = best.get(key), base.get(key)
        delta = fmt(b - a) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None
        col.metric(label, fmt(b), delta=delta, delta_color="inverse" if key.endswith("_ms") else "normal")


def metrics_table(rec: dict[str, Any]) -> list[dict[str, Any]]:
    best, base = rec["best"], rec["baseline"]
    return [{"metric": k, f"vLLM defaults ({base.get('label')})": fmt(base["metrics"].get(k)),
             f"recommended ({best.get('label')})": fmt(best["metrics"].get(k))} for k in TABLE_METRICS]


def interval_text(gain: Any) -> str:
    """A GainInterval's JSON as '+10.7% (90%: +2.3% to +18.7%)'; '-' without one."""
    if not isinstance(gain, dict):
        return "-"
    g, lo, hi = (gain.get(k) for k in ("gain_pct", "low_pct", "high_pct"))
    if not all(isinstance(x, (int, float)) for x in (g, lo, hi)):
        return "-"
    return f"{g:+.1f}% (90%: {lo:+.1f}% to {hi:+.1f}%)"


def ladder_table(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"optimization": r["optimization"], "flags added": flags_text(r.get("flags_added")),
             "goodput %": _pct1(r.get("delta_goodput_pct")), "90% interval": interval_text(r.get("gain")),
             "p99 TTFT %": _pct1(r.get("delta_ttft_p99_pct")),
             "p99 TPOT %": _pct1(r.get("delta_tpot_p99_pct")), "GPUs": r.get("gpus_needed")}
            for r in rec.get("ladder") or []]


def kept_defaults_table(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The changes the search found whose interval does not clear the bar: vLLM's default stays."""
    return [{"optimization": k.get("optimization"), "flags it would add": flags_text(k.get("flags")),
             "gain (90% interval)": interval_text(k.get("gain")), "why": k.get("reason")}
            for k in rec.get("kept_defaults") or []]


def render(rec: dict[str, Any]) -> None:
    """Every part of a recommendation, from its keys."""
    profile = rec.get("profile") or {}
    verdict = rec.get("verdict")
    if isinstance(verdict, dict) and verdict.get("text"):  # first: the answer in one paragraph
        (st.success if verdict.get("meets") else st.warning)(f"Verdict: {verdict['text']}")
    if isinstance(rec.get("cost"), dict) and rec["cost"].get("text"):
        st.markdown(f"**Cost:** {rec['cost']['text']}")
    st.subheader(f"Recommended: {rec['best'].get('label')} on {rec['best'].get('num_gpus')} GPU(s)")
    st.caption(f"flags: {flags_text(rec['best'].get('flags')) or '(vLLM defaults)'}")
    st.caption(f"cost profile {profile.get('name', '-')} ({profile.get('status', 'unknown')}) | "
               f"{rec.get('num_simulations', '-')} simulations in {fmt(rec.get('elapsed_s'))} s")
    if profile.get("status") == SCALED:
        st.warning(f"Profile {profile.get('name')} is scaled from another GPU, not validated on this one: "
                   "treat absolute figures with care.")
    headline(rec)
    st.dataframe(metrics_table(rec), hide_index=True, key="rec.metrics")
    st.code(rec.get("serve_command") or "", language="bash")
    for note in (rec.get("serve_notes") or []) + (rec.get("quality_notes") or []):
        st.warning(note)
    for note in rec.get("model_notes") or []:  # a mixture of experts: what its routing does to the advice
        st.info(note)
    if rec.get("gpu_comparison"):
        st.subheader("GPU types side by side")
        st.dataframe([{"GPU": o.get("gpu"), "GPUs": o.get("num_gpus"), "SLO": "met" if o.get("meets") else "MISSED",
                       "GPUs for SLO": o.get("gpus_needed"), "goodput (req/s)": fmt(o.get("goodput_rps")),
                       "TTFT p99 (ms)": fmt(o.get("ttft_p99_ms")), "TPOT p99 (ms)": fmt(o.get("tpot_p99_ms")),
                       "$/GPU-hour": fmt(o.get("usd_per_gpu_hour")), "$/hour at SLO": fmt(o.get("usd_per_hour_at_slo")),
                       "$/M output tokens at SLO": fmt(o.get("usd_per_m_output_tokens_at_slo"))}
                      for o in rec["gpu_comparison"]], hide_index=True, key="rec.gpus")
    st.subheader("The ladder")
    st.plotly_chart(waterfall_figure(rec.get("ladder") or []), key="rec.waterfall")
    st.dataframe(ladder_table(rec), hide_index=True, key="rec.ladder")
    min_gain = (rec.get("request") or {}).get("min_gain_pct")
    if not rec.get("ladder"):
        st.info("No change clears the bar: vLLM's defaults are the recommendation.")
    if rec.get("kept_defaults"):
        st.markdown(f"**Kept at vLLM's default** (the low end of the gain's 90% interval is not above "
                    f"{min_gain:.1f}%)" if isinstance(min_gain, (int, float)) else "the bar)")
        st.dataframe(kept_defaults_table(rec), hide_index=True, key="rec.kept")
    if rec.get("rejected"):
        st.markdown("**Rejected**")
        st.dataframe([{"optimization": r["optimization"], "flags": flags_text(r.get("flags")),
                       "goodput %": _pct1(r.get("delta_goodput_pct")), "why": r.get("reason")}
                      for r in rec["rejected"]], hide_index=True, key="rec.rejected")
    if rec.get("assumptions"):
        st.subheader("What the figures rest on")
        st.dataframe([{"input": a.get("input"), "provenance": a.get("provenance"), "value": a.get("value"),
                       "source": a.get("source"), "how to measure it": a.get("how_to_measure"),
                       "where the advice flips": a.get("flips_at") or "-"} for a in rec["assumptions"]],
                     hide_index=True, key="rec.assumptions")
    cost_lines(rec.get("cost_lines") or [])
    if rec.get("gap"):
        st.subheader("Lab -> production gap")
        st.plotly_chart(gap_figure(rec["gap"]), key="rec.gap")
    robustness(rec.get("robustness") or {})
    details(rec)


def cost_lines(lines: list[dict[str, Any]]) -> None:
    if not lines:
        return
    st.subheader("Cost lines: where each optimization pays")
    for i, line in enumerate(lines):
        st.plotly_chart(cost_line_figure(line), key=f"rec.cost_line.{i}")
        if line.get("answer"):
            st.caption(line["answer"])


def robustness(rob: dict[str, Any]) -> None:
    if not rob.get("rows"):
        return
    st.subheader("Robustness")
    st.dataframe([{"perturbation": r["perturbation"], "best option's goodput (req/s)": fmt(r.get("best_goodput_rps")),
                   "recommended goodput (req/s)": fmt(r.get("kept_goodput_rps")),
                   "regret %": _pct1(r.get("regret_pct"))} for r in rob["rows"]], hide_index=True, key="rec.robust")
    if rob.get("fallback"):
        st.caption(f"fallback: {config_label(rob['fallback'])} (max regret {_pct1(rob.get('fallback_max_regret_pct'))}%)")


def _pct1(x: Any) -> str:
    """A percentage in a sentence, to 0.1 as report.md writes it."""
    return f"{x:.1f}" if isinstance(x, (int, float)) else "-"


def details(rec: dict[str, Any]) -> None:
    if rec.get("metrics_to_watch"):
        st.subheader("Metrics to watch in production")
        st.dataframe(rec["metrics_to_watch"], hide_index=True, key="rec.watch")
    for q in rec.get("questions") or []:
        with st.expander(q["question"]):
            st.write(q["answer"])
    files = report_files(rec)
    cols = st.columns(3)
    cols[0].download_button("recommendation.json", json.dumps(rec, indent=2), file_name="recommendation.json",
                            mime="application/json", key="dl.recommendation")
    if not files:
        st.caption("report.md and serve.sh need a recommendation with every field `costline advise` writes")
        return
    cols[1].download_button("report.md", files["report.md"], file_name="report.md", mime="text/markdown",
                            key="dl.report")
    cols[2].download_button("serve.sh", files["serve.sh"], file_name="serve.sh", mime="text/x-shellscript",
                            key="dl.serve")


def report_files(rec: dict[str, Any]) -> dict[str, str]:
    """report.md (without its PNG charts: `costline advise --out` writes those) and serve.sh, as
    `costline advise --out` writes them; {} when the advisor is missing or the dict is not a full
    recommendation (an older or hand-made file)."""
    try:
        from advisor.advise.records import Recommendation
        from advisor.advise.report import markdown, serve_script
    except ImportError:
        return {}
    try:
        model = Recommendation.model_validate(rec)
    except ValueError:
        return {}
    return {"report.md": markdown(model, []), "serve.sh": serve_script(model)}


__all__ = ["SCALED", "RecommendationError", "advise_api", "as_dict", "config_label", "flags_text", "ladder_table",
           "load_json", "metrics_table", "render", "report_files"]
