"""Plotly figures and the small computations behind them, free of Streamlit so tests check the
data each chart shows against an independent reference.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.workload import Workload

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E"))
PCTS = ("p50", "p90", "p99")


# ------------------------------------------------------------------------- workload
def arrivals_per_bin(arrival_s: np.ndarray, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(bin start in s, arrivals in [start, start + bin_s)) from the first arrival on."""
    if arrival_s.size == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    t0 = float(arrival_s.min())
    counts = np.bincount(np.floor((arrival_s - t0) / bin_s).astype(np.int64))
    return t0 + bin_s * np.arange(counts.size), counts


def prefix_reuse_curve(hash_ids: Iterable[Sequence[int]], prompt_len: np.ndarray,
                       hash_block_size: int) -> np.ndarray:
    """Cumulative share of prompt tokens an infinite prefix cache would serve, after each request:
    a request reuses its leading run of blocks whose hash ids an earlier request used (capped at
    its prompt length), the definition `sim.describe.prefix_reuse` totals."""
    seen: set[int] = set()
    reused = np.zeros(prompt_len.size, dtype=np.float64)
    for i, ids in enumerate(hash_ids):
        lead = 0
        while lead < len(ids) and ids[lead] in seen:
            lead += 1
        reused[i] = min(lead * hash_block_size, int(prompt_len[i]))
        seen.update(ids)
    return np.cumsum(reused) / np.maximum(np.cumsum(prompt_len, dtype=np.float64), 1.0)


def _bin_width(duration_s: float) -> float:
    """About a hundred bars over the workload's span, at a round width; never more than ~150 bars,
    however long the span (a trace spanning years gets wide bars, not billions of them)."""
    for width in (0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 3600):
        if duration_s / width <= 150:
            return float(width)
    return float(max(3600.0, math.ceil(duration_s / 150 / 3600) * 3600))


def arrivals_figure(wl: Workload) -> go.Figure:
    width = _bin_width(wl.duration_s)
    t, counts = arrivals_per_bin(wl.arrival_s, width)
    fig = go.Figure(go.Bar(x=t, y=counts / width, name="arrivals", marker_line_width=0))
    fig.update_layout(title=f"Arrivals over time ({width:g}-s bins)", xaxis_title="time (s)",
                      yaxis_title="requests/s", bargap=0)
    return fig


def lengths_figure(wl: Workload) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prompt tokens", "output tokens"))
    fig.add_trace(go.Histogram(x=wl.prompt_len, nbinsx=60, name="prompt"), row=1, col=1)
    fig.add_trace(go.Histogram(x=wl.output_len, nbinsx=60, name="output"), row=1, col=2)
    fig.update_layout(title="Length histograms", showlegend=False)
    fig.update_yaxes(title_text="requests", row=1, col=1)
    return fig


def reuse_figure(curve: np.ndarray) -> go.Figure:
    fig = go.Figure(go.Scatter(x=np.arange(1, curve.size + 1), y=100 * curve, mode="lines", name="reuse"))
    fig.update_layout(title="Prefix reuse (infinite cache): share of prompt tokens already seen",
                      xaxis_title="requests so far", yaxis_title="reused prompt tokens (%)")
    return fig


# ------------------------------------------------------------------------- a run
NOT_SET = "not set"
NOT_JUDGED = "—"
# vLLM's --goodput takes ttft, tpot and e2el: ITL (each gap between tokens) has no target of its
# own; judging it against the TPOT one (a per-request mean) would fail runs that meet every SLO
SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2el"}


def latency_rows(summary: Mapping[str, Any], slo: Mapping[str, float] | None) -> list[dict[str, Any]]:
    """TTFT/TPOT/ITL/E2E p50/p90/p99 in ms against the SLO: the target as text ("not set" where
    the SLO names none, "—" for ITL, which vLLM's --goodput has no target for) and whether p99
    meets it ("yes"/"no", "—" where there is nothing to judge)."""
    slo = slo or {}
    rows = []
    for key, name in LATENCIES:
        row: dict[str, Any] = {"metric": f"{name} (ms)"}
        for p in PCTS:
            row[p] = summary.get(f"{p}_{key}_ms")
        target = slo.get(SLO_KEYS[key]) if key in SLO_KEYS else None
        row["SLO (ms)"] = NOT_JUDGED if key not in SLO_KEYS else NOT_SET if target is None else f"{target:,g}"
        p99 = row["p99"]
        row["p99 meets SLO"] = NOT_JUDGED if target is None or p99 is None else "yes" if p99 <= target else "no"
        rows.append(row)
    return rows


def ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted finite values, share of values <= each)."""
    v = np.sort(values[np.isfinite(values)])
    return v, np.arange(1, v.size + 1) / max(v.size, 1)


def cdf_figure(requests: Mapping[str, np.ndarray], slo: Mapping[str, float] | None,
               other: Mapping[str, np.ndarray] | None = None) -> go.Figure:
    """TTFT, TPOT and E2E CDFs of finished requests (ms), SLO lines dashed; `other` (a pinned run)
    dotted beside."""
    slo = slo or {}
    panels = (("ttft_s", "TTFT", "ttft"), ("tpot_s", "TPOT", "tpot"), ("e2e_s", "E2E", "e2el"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] + " (ms)" for p in panels])
    for run_name, table, dash in (("B", requests, None), ("A", other, "dot")):
        if table is None:
            continue
        done = table["status"] == "finished"
        for col, (column, name, key) in enumerate(panels, start=1):
            x, y = ecdf(1e3 * table[column][done])
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{name} {run_name}" if other else name,
                                     line={"dash": dash}, showlegend=other is not None), row=1, col=col)
    for col, (_, _, key) in enumerate(panels, start=1):
        if slo.get(key) is not None:
            fig.add_vline(x=slo[key], line_dash="dash", line_color="red", row=1, col=col)
    fig.update_yaxes(title_text="share of requests", row=1, col=1)
    fig.update_layout(title="Latency CDFs (finished requests)")
    return fig


def timeline_series(steps: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per step row, in time order: start time, batch size (sequences scheduled), KV usage,
    waiting queue, replica, and preemptions so far (all replicas)."""
    order = np.argsort(steps["t_start_s"], kind="stable")
    return {
        "t_s": steps["t_start_s"][order],
        "replica": steps["replica"][order],
        "batch_size": (steps["num_prefill_seqs"] + steps["num_decode_seqs"])[order],
        "kv_usage_pct": 100 * steps["kv_usage"][order],
        "queue": steps["num_waiting"][order],
        "preemptions_so_far": np.cumsum(steps["num_preempted"][order]),
    }


def decimate(n: int, max_points: int) -> np.ndarray:
    """Indices of at most `max_points` of `n` rows, evenly spread, first and last kept: a chart
    of 10k+ steps draws as fast as one of 2k and looks the same at screen resolution."""
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))


MAX_TIMELINE_POINTS = 2500


def timeline_figure(steps: Mapping[str, np.ndarray]) -> go.Figure:
    full = timeline_series(steps)
    keep = decimate(full["t_s"].size, MAX_TIMELINE_POINTS)
    s = {k: v[keep] for k, v in full.items()}
    names = (("batch_size", "batch size (sequences)"), ("kv_usage_pct", "KV cache usage (%)"),
             ("queue", "waiting requests"))
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[n for _, n in names] + ["preemptions so far"])
    replicas = np.unique(s["replica"])
    for row, (key, _) in enumerate(names, start=1):
        for r in replicas:
            m = s["replica"] == r
            fig.add_trace(go.Scatter(x=s["t_s"][m], y=s[key][m], mode="lines", name=f"replica {r}",
                                       legendgroup=str(r), showlegend=row == 1 and replicas.size > 1),
                          row=row, col=1)
    fig.add_trace(go.Scatter(x=s["t_s"], y=s["preemptions_so_far"], mode="lines", name="preemptions",
                               showlegend=False), row=4, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=4, col=1)
    fig.update_layout(title="Engine timelines", height=720)
    return fig


# ------------------------------------------------------------------------- the advisor
def waterfall_figure(ladder: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Each rung's goodput gain (%) over the rung before, and the total."""
    names = [r["optimization"] for r in ladder]
    deltas = [r.get("delta_goodput_pct") or 0.0 for r in ladder]
    fig = go.Figure(go.Waterfall(x=[*names, "total"], y=[*deltas, None],
                                 measure=["relative"] * len(deltas) + ["total"],
                                 text=[f"{d:+.1f}%" for d in deltas] + [f"{sum(deltas):+.1f}%"]))
    fig.update_layout(title="The ladder: goodput gain per optimization (%)", yaxis_title="goodput gain (%)")
    return fig


def interpolate_gain(points: Sequence[Mapping[str, float]], x: float) -> float:
    """A cost line's gain at `x`, linear between its points (held flat beyond them)."""
    xs = np.array([p["x"] for p in points], dtype=float)
    ys = np.array([p["gain_pct"] for p in points], dtype=float)
    order = np.argsort(xs)
    return float(np.interp(x, xs[order], ys[order]))


def cost_line_label(line: Mapping[str, Any]) -> str:
    """What a cost line's gain_pct measures: its own `gain_label`, else (an older file) the mean
    latency cut, or the CPU line's share of step time."""
    if line.get("gain_label"):
        return str(line["gain_label"])
    cpu = str(line.get("optimization", "")).endswith("CPU")
    return "CPU share of step time (%)" if cpu else "mean E2E latency cut (%)"


def cost_line_figure(line: Mapping[str, Any]) -> go.Figure:
    pts = line["points"]
    label = cost_line_label(line)
    fig = go.Figure(go.Scatter(x=[p["x"] for p in pts], y=[p["gain_pct"] for p in pts], mode="lines+markers",
                               name=label.removesuffix(" (%)")))
    op = line.get("operating_point")
    if op is not None and pts:
        # the gain measured on the user's traffic (what the answer quotes); an older file: interpolated
        here = line.get("operating_gain_pct")
        y = here if isinstance(here, (int, float)) else interpolate_gain(pts, op)
        fig.add_trace(go.Scatter(x=[op], y=[y], mode="markers", name="your traffic",
                                 marker={"size": 14, "symbol": "star", "color": "red"}))
    be = line.get("break_even")
    if be is not None:
        fig.add_vline(x=be, line_dash="dash", annotation_text="break-even")
    fig.add_hline(y=0, line_color="grey")
    unit = f" ({line['unit']})" if line.get("unit") else ""
    fig.update_layout(title=f"{line['optimization']}: {label.removesuffix(' (%)')} vs {line['variable']}",
                      xaxis_title=f"{line['variable']}{unit}", yaxis_title=label)
    return fig


def gap_figure(gap: Mapping[str, Any]) -> go.Figure:
    factors = gap.get("factors") or []
    fig = go.Figure(go.Bar(x=[f["factor"] for f in factors], y=[f["share_pct"] for f in factors],
                           text=[f"{f['share_pct']:.0f}%" for f in factors]))
    # lab_gain / production_gain are ratios (mean E2E latency, defaults / recommended), not percents
    fig.update_layout(title=f"Lab -> production gap: {_times(gap.get('lab_gain'))} in the lab, "
                      f"{_times(gap.get('production_gain'))} on your traffic; share of the gap per factor",
                      yaxis_title="share of the gap (%)")
    return fig


def _times(x: Any) -> str:
    return "-" if not isinstance(x, (int, float)) or math.isnan(x) else f"x{x:.2f}"


def _pct(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1f}%"


__all__ = ["arrivals_figure", "arrivals_per_bin", "cdf_figure", "cost_line_figure", "cost_line_label", "decimate", "ecdf", "gap_figure",
           "interpolate_gain", "latency_rows", "lengths_figure", "prefix_reuse_curve", "reuse_figure",
           "timeline_figure", "timeline_series", "waterfall_figure"]
