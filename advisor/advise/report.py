"""The recommendation for people: a rich terminal report, and `--out DIR` files:
recommendation.json, report.md with PNG charts, serve.sh."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from advisor.advise.cost_lines import CPU_BOTTLENECK_SHARE
from advisor.advise.records import CPU_LABEL, LadderStep, Metrics, Recommendation
from advisor.console import styled
from engine.core.outputs import check_output_dir, staged_dir


def _n(x: float | None, fmt: str = ",.1f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:+.1f}%"


def _gain(step: LadderStep) -> str:
    """A rung's goodput gain with its interval (the interval's own text), else the point."""
    return step.gain.text() if step.gain is not None else _pct(step.delta_goodput_pct)


def _metric_rows(m: Metrics) -> list[str]:
    return [_n(m.goodput_rps, ".2f"), f"{m.slo_attainment:.1%}", _n(m.ttft_p50_ms), _n(m.ttft_p99_ms),
            _n(m.tpot_p50_ms), _n(m.tpot_p99_ms), str(m.preemptions)]


def print_report(rec: Recommendation, console: Console) -> None:
    """The terminal report, in the order a reader needs it: verdict and cost first, the run command last."""
    _print_header(rec, console)
    _print_metrics_table(rec, console)
    _print_ladder(rec, console)
    _print_findings(rec, console)
    _print_gap_and_robustness(rec, console)
    _print_questions_and_assumptions(rec, console)
    if rec.gpu_comparison:
        _print_gpu_comparison(rec, console)
    _print_run(rec, console)


def _print_header(rec: Recommendation, console: Console) -> None:
    w = rec.workload
    if rec.verdict is not None:  # first: what a reader needs if they read nothing else
        console.print(styled(("verdict: ", "bold"), (rec.verdict.text, "bold green" if rec.verdict.meets else "bold red")),
                      highlight=False)
    console.print(styled(("cost: ", "bold"), cost_line(rec)), highlight=False)
    console.print(styled(("costline advise", "bold"), f": {w['name']} ({w['num_requests']:,} requests, "
                         f"{w['rate_rps']:.2f} req/s), {rec.request.model} on {rec.request.num_gpus}x {rec.request.gpu}, "
                         f"SLO {rec.request.slo}, objective {rec.request.objective}; profile {rec.profile.name} "
                         f"({rec.profile.status})"))


def _print_metrics_table(rec: Recommendation, console: Console) -> None:
    # light borders and one-word rows: eight columns fit an 80-column terminal unwrapped
    t = Table(title="defaults vs recommended (goodput in req/s, latencies in ms)", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for c in ("", "goodput", "SLO met", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "preempt."):
        t.add_column(c, justify="right" if c else "left", no_wrap=not c)
    t.add_row("defaults", *_metric_rows(rec.baseline.metrics))
    t.add_row(styled(("recommended", "bold green")), *_metric_rows(rec.best.metrics))
    console.print(t)
    # the label can be long: under the table, not in a column the terminal width squeezes
    console.print(f"recommended = {rec.best.label}", highlight=False)


def _print_ladder(rec: Recommendation, console: Console) -> None:
    lad = Table(title=f"ladder: one optimization at a time (each kept only if its gain's 90% interval "
                      f"stays above {rec.request.min_gain_pct:+g}%)", title_justify="left")
    for c in ("optimization", "gain (90% interval)", "TTFT p99", "TPOT p99", "GPUs needed"):
        lad.add_column(c, justify="left" if c == "optimization" else "right")
    for s in rec.ladder:
        lad.add_row(s.optimization, _gain(s), _pct(s.delta_ttft_p99_pct), _pct(s.delta_tpot_p99_pct),
                    str(s.gpus_needed or "-"))
    console.print(lad)
    if not rec.ladder:
        console.print("  no change clears the bar: vLLM's defaults are the recommendation", highlight=False)


def _print_findings(rec: Recommendation, console: Console) -> None:
    """Kept defaults, rejected options, where each optimization stops paying, notes on the model."""
    for k in rec.kept_defaults:
        console.print(f"  - {k.reason}", highlight=False)
    console.print(styled(("rejected", "bold")))
    for r in rec.rejected:
        console.print(f"  - {r.reason}", highlight=False)
    console.print(styled(("where each optimization stops paying", "bold")))
    for line in rec.cost_lines:
        console.print(f"  - {line.answer}", highlight=False)
    if rec.model_notes:
        console.print(styled(("the model", "bold")))
        for note in rec.model_notes:
            console.print(f"  - {note}", highlight=False, markup=False)


def _print_gap_and_robustness(rec: Recommendation, console: Console) -> None:
    if rec.gap:
        g = rec.gap
        shares = ", ".join(f"{f.factor} {f.share_pct:+.0f}%" for f in g.factors)
        console.print(styled(("lab -> production", "bold"), f": gain x{g.lab_gain:.2f} in the lab, "
                             f"x{g.production_gain:.2f} on your traffic ({g.gain_metric}); factors: {shares}"))
    rb = rec.robustness
    console.print(styled(("robustness", "bold"), ": " + ", ".join(f"{r.perturbation} regret {r.regret_pct:.1f}%"
                                                                  for r in rb.rows)
                         + f"; fallback: {rb.fallback.label} (worst regret {rb.fallback_max_regret_pct:.1f}%)"))


def _print_questions_and_assumptions(rec: Recommendation, console: Console) -> None:
    console.print(styled(("your questions", "bold")))
    for q in rec.questions:
        console.print(f"  - {q.question}\n    {q.answer}", highlight=False)
    console.print(styled(("what the figures rest on", "bold"), " (measured / scaled / transferred / prior)"))
    for a in rec.assumptions:
        flip = f"; {a.flips_at}" if a.flips_at else ""
        console.print(f"  - [{a.provenance}] {a.input}: {a.value} ({a.source}){flip}", highlight=False, markup=False)
        if a.provenance != "measured":
            console.print(f"    measure it: {a.how_to_measure}", highlight=False, markup=False)


def _print_gpu_comparison(rec: Recommendation, console: Console) -> None:
    ct = Table(title="GPU types side by side (same workload, SLO and objective)", title_justify="left",
               box=box.SIMPLE_HEAD, pad_edge=False)
    for c in GPU_COLUMNS:  # headers wrap onto two lines; cells never do
        ct.add_column(c, justify="left" if c == "GPU" else "right", no_wrap=False, min_width=len(max(c.split(), key=len)))
    for row in gpu_rows(rec):
        ct.add_row(*row)
    console.print(ct)
    console.print(cheapest_text(rec), highlight=False)


def _print_run(rec: Recommendation, console: Console) -> None:
    console.print(styled(("run", "bold"), f": {rec.serve_command}"), soft_wrap=True)
    for note in rec.serve_notes:
        console.print(f"  note: {note}", highlight=False, markup=False)
    for note in rec.quality_notes:
        console.print(f"  quality: {note}", highlight=False, markup=False)
    console.print(f"{rec.num_simulations} simulations in {rec.elapsed_s:.1f} s")


def cost_line(rec: Recommendation) -> str:
    if rec.cost is not None:
        return rec.cost.text
    return (f"no default price for {rec.request.gpu}: pass --gpu-hour-usd (e.g. --gpu-hour-usd 0.8) for $/hour "
            "and $/million output tokens")


# short headers: ten columns fit 80 terminal columns
GPU_COLUMNS = ("GPU", "SLO", "GPUs for SLO", "TTFT p99 ms", "TPOT p99 ms", "$ per GPU-hour", "$ per hour at SLO",
               "$ per M output tokens at SLO")


def gpu_rows(rec: Recommendation) -> list[list[str]]:
    def usd(x: float | None) -> str:
        return "-" if x is None else f"{x:,.2f}"

    return [[o.gpu, "met" if o.meets else "MISSED", str(o.gpus_needed or "-"),
             _n(o.ttft_p99_ms), _n(o.tpot_p99_ms), usd(o.usd_per_gpu_hour), usd(o.usd_per_hour_at_slo),
             usd(o.usd_per_m_output_tokens_at_slo)] for o in rec.gpu_comparison]


def cheapest_text(rec: Recommendation) -> str:
    from advisor.advise.dollars import cheapest

    best = cheapest(rec.gpu_comparison)
    if best is None:
        return "no GPU type has a price: pass --gpu-hour-usd GPU=USD,..."
    return (f"cheapest within the SLO: {best.gpu}, about {best.gpus_needed} GPU(s) at "
            f"${best.usd_per_hour_at_slo:,.2f}/hour (${best.usd_per_m_output_tokens_at_slo:,.2f} per million output tokens)")


CPU_BOTTLENECK_PCT = CPU_BOTTLENECK_SHARE * 100  # the CPU line's bar: half the step time


def slo_ms(rec: Recommendation, key: str) -> float | None:
    slo = rec.request.parsed_slo()
    return slo.as_dict().get(key) if slo else None


def _charts(rec: Recommendation, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    names = []
    fig, ax = plt.subplots(figsize=(7, 3.5))
    level = rec.baseline.metrics.goodput_rps
    labels, bottoms, heights = ["vLLM defaults"], [0.0], [level]
    for s in rec.ladder:
        labels.append(s.optimization)
        bottoms.append(level)
        heights.append(s.metrics.goodput_rps - level)
        level = s.metrics.goodput_rps
    ax.bar(range(len(labels)), heights, bottom=bottoms, color=["grey"] + ["tab:green" if h >= 0 else "tab:red" for h in heights[1:]])
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=9)
    ax.set_ylabel("goodput (req/s)", fontsize=10)
    ax.set_title("ladder: goodput from vLLM defaults to recommended, one optimization at a time", fontsize=10)
    fig.tight_layout()
    fig.savefig(folder / "ladder.png", dpi=110)
    names.append("ladder.png")
    plt.close(fig)
    lines = rec.cost_lines
    cols = 3
    fig, axes = plt.subplots(math.ceil(len(lines) / cols), cols, figsize=(13, 3.8 * math.ceil(len(lines) / cols)),
                             squeeze=False)
    for ax, line in zip(axes.flat, lines, strict=False):
        cpu = line.gain_label == CPU_LABEL
        ax.plot([p.x for p in line.points], [p.gain_pct for p in line.points], marker="o", color="tab:blue",
                label=line.gain_label.removesuffix(" (%)"))
        ax.axhline(CPU_BOTTLENECK_PCT if cpu else 0, color="grey", lw=0.8,
                   label="half the step: CPU-bound" if cpu else "no change")
        ax.axvline(line.operating_point, color="tab:orange", ls="--", lw=1.2, label="your traffic")
        if line.operating_gain_pct is not None and math.isfinite(line.operating_gain_pct):
            # the figure the line's answer quotes, where the answer says it is
            ax.plot([line.operating_point], [line.operating_gain_pct], marker="D", ls="none", color="tab:orange",
                    label=f"your traffic: {line.operating_gain_pct:+.{1 if cpu else 0}f}%")
        ax.set_title(line.optimization, fontsize=10)
        ax.set_xlabel(f"{line.variable} ({line.unit})", fontsize=9)
        ax.set_ylabel(line.gain_label, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(lines):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(folder / "cost_lines.png", dpi=100)
    names.append("cost_lines.png")
    plt.close(fig)
    if rec.latency_cdfs.get("best", {}).get("ttft_ms"):
        names.append(_latency_cdf_png(rec, folder, plt))
    return names


CDF_PANELS = (("ttft_ms", "ttft", "TTFT"), ("tpot_ms", "tpot", "TPOT"), ("e2e_ms", "e2el", "end-to-end latency"))


def _latency_cdf_png(rec: Recommendation, folder: Path, plt: Any) -> str:
    """TTFT, TPOT and end-to-end latency CDFs of the vLLM defaults and the recommendation, each
    with its SLO target (where the SLO sets one) as a dashed line."""
    panels = [p for p in CDF_PANELS if rec.latency_cdfs["best"].get(p[0])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, (key, slo_key, name) in zip(axes[0], panels, strict=True):
        for who, label, color in (("baseline", "defaults", "grey"), ("best", "recommended", "tab:green")):
            v = rec.latency_cdfs[who].get(key) or []
            ax.plot(v, [p / 100 for p in range(1, len(v) + 1)], color=color, label=label)
        target = slo_ms(rec, slo_key)
        if target is not None:
            ax.axvline(target, color="tab:red", ls="--", lw=1.2, label=f"SLO {target:g} ms")
        ax.set_xscale("log")
        ax.set_title(f"{name}: defaults vs recommended", fontsize=10)
        ax.set_xlabel(f"{name} (ms)", fontsize=10)
        ax.set_ylabel("share of requests", fontsize=10)
        ax.tick_params(labelsize=9)
        ax.legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(folder / "latency_cdf.png", dpi=100)
    plt.close(fig)
    return "latency_cdf.png"


def markdown(rec: Recommendation, charts: list[str]) -> str:
    b, r = rec.baseline.metrics, rec.best.metrics
    out = [f"# costline advise: {rec.workload['name']}", ""]
    if rec.verdict is not None:
        out += [f"**Verdict: {rec.verdict.text}**", ""]
    out += [f"**Cost:** {cost_line(rec)}", ""]
    out += [(f"{rec.request.model} on {rec.request.num_gpus}x {rec.request.gpu}, SLO `{rec.request.slo}`, objective "
           f"{rec.request.objective}, cost profile {rec.profile.name} ({rec.profile.status})."), "",
           "| | goodput req/s | SLO met | TTFT p99 ms | TPOT p99 ms |", "|---|---|---|---|---|",
           f"| vLLM defaults | {b.goodput_rps:.2f} | {b.slo_attainment:.1%} | {_n(b.ttft_p99_ms)} | {_n(b.tpot_p99_ms)} |",
           (f"| recommended: {rec.best.label} | {r.goodput_rps:.2f} | {r.slo_attainment:.1%} | {_n(r.ttft_p99_ms)} | "
           f"{_n(r.tpot_p99_ms)} |"), "", "```sh", rec.serve_command, "```", ""]
    out += [f"Note: {n}" for n in rec.serve_notes] + ([""] if rec.serve_notes else [])
    if rec.quality_notes:
        out += ["## Output quality", ""] + [f"- {n}" for n in rec.quality_notes] + [""]
    out += ["## Ladder", "",
           (f"Each change is kept only if the low end of its gain's 90% interval is above "
            f"{rec.request.min_gain_pct:+g}% (the interval: the profile's validation error, other realizations of "
            "the traffic, the range of every unmeasured input; docs/advisor.md)."), "",
           "| optimization | gain (90% interval) | TTFT p99 | TPOT p99 | GPUs needed |", "|---|---|---|---|---|"]
    out += [f"| {s.optimization} | {_gain(s)} | {_pct(s.delta_ttft_p99_pct)} | "
            f"{_pct(s.delta_tpot_p99_pct)} | {s.gpus_needed or '-'} |" for s in rec.ladder]
    if not rec.ladder:
        out += ["", "No change clears the bar: vLLM's defaults are the recommendation."]
    if rec.kept_defaults:
        out += ["", "Kept at vLLM's default (inside the error bars):", ""] + [f"- {k.reason}" for k in rec.kept_defaults]
    if rec.gpu_comparison:
        out += ["", "## GPU types side by side", "", "| " + " | ".join(GPU_COLUMNS) + " |",
                "|" + "---|" * len(GPU_COLUMNS)]
        out += ["| " + " | ".join(r) + " |" for r in gpu_rows(rec)] + ["", cheapest_text(rec)]
    out += ["", "## Rejected", ""] + [f"- {x.reason}" for x in rec.rejected]
    out += ["", "## Where each optimization stops paying", ""] + [f"- {c.answer}" for c in rec.cost_lines]
    if rec.model_notes:
        out += ["", "## The model", ""] + [f"- {n}" for n in rec.model_notes]
    if rec.gap:
        out += ["", "## Lab -> production", "", (f"Gain x{rec.gap.lab_gain:.2f} in the lab, x{rec.gap.production_gain:.2f} "
                f"on this traffic ({rec.gap.gain_metric})."), "", "| factor | gain with it | share of the gap |", "|---|---|---|"]
        out += [f"| {f.factor} | x{f.gain:.2f} | {f.share_pct:+.0f}% |" for f in rec.gap.factors]
    out += ["", "## Robustness", "", "| perturbation | best option's goodput | recommended goodput | regret |",
            "|---|---|---|---|"]
    out += [f"| {x.perturbation} | {x.best_goodput_rps:.2f} | {x.kept_goodput_rps:.2f} | {x.regret_pct:.1f}% |"
            for x in rec.robustness.rows]
    out += ["", (f"Fallback safe under all of them: {rec.robustness.fallback.label} "
            f"(worst regret {rec.robustness.fallback_max_regret_pct:.1f}%)."), "", "## Questions", ""]
    out += [f"- **{q.question}** {q.answer}" for q in rec.questions]
    out += ["", "## What the figures rest on", "",
            "| input | provenance | value | source | how to measure it | where the advice flips |",
            "|---|---|---|---|---|---|"]
    out += [f"| {a.input} | {a.provenance} | {a.value} | {a.source} | {a.how_to_measure} | {a.flips_at or '-'} |"
            for a in rec.assumptions]
    out += ["", "## Metrics to watch", "", ("As vLLM exposes them on `/metrics`; the alert expressions are in "
            "alerts.yaml (Prometheus rule format)."), "", "| metric | threshold | alert when (PromQL) | why |",
            "|---|---|---|---|"]
    out += [f"| `{m.metric}` | {m.threshold} | `{m.promql}` | {m.why} |" for m in rec.metrics_to_watch]
    out += ["", "## Charts", ""] + [f"![{c}]({c})" for c in charts]
    out += ["", f"{rec.num_simulations} simulations in {rec.elapsed_s:.1f} s.", ""]
    return "\n".join(out)


def alerts_yaml(rec: Recommendation) -> str:
    """The metrics to watch as Prometheus alerting rules (`rule_files:` in prometheus.yml, or
    `promtool check rules alerts.yaml`); strings JSON-quoted, which YAML reads as they are."""
    q = json.dumps
    lines = ["# costline advise: when these fire, the recommendation stops holding on your traffic",
             f"# {rec.request.model} on {rec.best.num_gpus}x {rec.request.gpu}: {rec.best.label}",
             "groups:", f"  - name: {q('costline-' + str(rec.workload['name']))}", "    rules:"]
    for m in rec.metrics_to_watch:
        if not m.promql:
            continue
        lines += [f"      - alert: {m.alert}", f"        expr: {q(m.promql)}", "        for: 5m",
                  "        labels:", "          severity: warning", "        annotations:",
                  f"          summary: {q(f'{m.metric} {m.threshold}')}", f"          description: {q(m.why)}"]
    return "\n".join(lines) + "\n"


def serve_script(rec: Recommendation) -> str:
    watch = "\n".join(f"#   {m.metric} {m.threshold}: {m.why}" for m in rec.metrics_to_watch)
    watch += "\n#   alert expressions: alerts.yaml"
    verdict = (f"# verdict: {rec.verdict.text}\n" if rec.verdict is not None else "") + f"# cost: {cost_line(rec)}\n"
    notes = "".join(f"# NOTE: {n}\n" for n in rec.serve_notes + rec.quality_notes)
    return (f"#!/usr/bin/env bash\n# costline advise: {rec.best.label}\n{verdict}{notes}"
            f"# Prometheus metrics to watch:\n{watch}\n"
            f"set -euo pipefail\n{rec.serve_command}\n")


def write_outputs(rec: Recommendation, out_dir: str | Path, *, force: bool = False,
                  inputs: Sequence[str | Path | None] = ()) -> Path:
    """recommendation.json, report.md + PNG charts, serve.sh and alerts.yaml in `out_dir`; an existing run is
    refused without `force`, an input never replaced, and an interrupted write leaves the
    previous one whole."""
    out = check_output_dir(out_dir, flag="--out", force=force, inputs=inputs)
    with staged_dir(out) as tmp:
        (tmp / "recommendation.json").write_text(json.dumps(json.loads(rec.model_dump_json()), indent=2) + "\n")
        charts = _charts(rec, tmp)
        (tmp / "report.md").write_text(markdown(rec, charts))
        (tmp / "serve.sh").write_text(serve_script(rec))
        (tmp / "alerts.yaml").write_text(alerts_yaml(rec))
        (tmp / "serve.sh").chmod(0o755)
    return out
