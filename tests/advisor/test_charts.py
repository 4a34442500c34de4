"""The report's charts say what they plot: each chart's data and labels against the numbers of the
recommendation and of its text (cost lines are the mean latency cut their answers quote, or a CPU
share, not goodput; defaults / recommended; SLO lines; a legend for every line). The data come
from the matplotlib figures themselves, not from the PNGs."""

from __future__ import annotations

import math
import re

import matplotlib
from matplotlib.figure import Figure

from advisor.advise.records import CPU_LABEL, LATENCY_CUT_LABEL
from advisor.advise.report import _charts
from app.figures import cost_line_figure, gap_figure
from tests.advisor.test_advise import rec  # noqa: F401 - the module's real recommendation

matplotlib.use("Agg")


def _figures(rec, tmp_path, monkeypatch) -> dict[str, Figure]:  # noqa: F811
    saved: dict[str, Figure] = {}
    real = Figure.savefig

    def keep(self, fname, *args, **kwargs):
        saved[str(fname).rsplit("/", 1)[-1]] = self
        return real(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    _charts(rec, tmp_path)
    return saved


def test_cost_line_pngs_plot_what_their_labels_say(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    fig = _figures(rec, tmp_path, monkeypatch)["cost_lines.png"]
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
    assert len(axes) == len(rec.cost_lines)
    for ax, line in zip(axes, rec.cost_lines, strict=True):
        assert ax.get_ylabel() == line.gain_label != "goodput gain (%)"
        assert ax.get_title() == line.optimization
        data, _zero, op = ax.lines[:3]
        assert list(data.get_ydata()) == [p.gain_pct for p in line.points]
        assert list(data.get_xdata()) == [p.x for p in line.points]
        assert op.get_xdata()[0] == line.operating_point
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "your traffic" in legend and len(legend) == len(ax.lines)  # every line named, the dashed one too
        assert ax.title.get_fontsize() >= 10 and ax.xaxis.label.get_fontsize() >= 9
    labels = {line.optimization: line.gain_label for line in rec.cost_lines}
    assert labels["block manager and scheduler CPU"] == CPU_LABEL
    assert labels["prefix caching"] == LATENCY_CUT_LABEL


def test_latency_cdf_png_says_defaults_recommended_and_draws_the_slo(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    fig = _figures(rec, tmp_path, monkeypatch)["latency_cdf.png"]
    ttft, tpot, e2e = fig.axes
    assert [t.get_text() for t in ttft.get_legend().get_texts()] == ["defaults", "recommended", "SLO 300 ms"]
    assert [t.get_text() for t in tpot.get_legend().get_texts()] == ["defaults", "recommended", "SLO 30 ms"]
    assert [t.get_text() for t in e2e.get_legend().get_texts()] == ["defaults", "recommended"]  # no e2el target
    assert [ax.get_title() for ax in fig.axes] == ["TTFT: defaults vs recommended", "TPOT: defaults vs recommended",
                                                   "end-to-end latency: defaults vs recommended"]
    assert list(ttft.lines[1].get_xdata()) == rec.latency_cdfs["best"]["ttft_ms"]
    assert list(tpot.lines[0].get_xdata()) == rec.latency_cdfs["baseline"]["tpot_ms"]
    assert ttft.lines[2].get_xdata()[0] == 300 and tpot.lines[2].get_xdata()[0] == 30


# ------------------------------------------------------------- every chart against the text
# the gain figures an answer quotes, in order: (pattern, how to read a match, decimals shown)
QUOTED = (
    (re.compile(r"(cuts|raises) mean end-to-end latency by (\d+)%"),
     lambda m: [(m.start(2), float(m[2]) * (1 if m[1] == "cuts" else -1))], 0),
    (re.compile(r"leaves mean end-to-end latency (unchanged)"), lambda m: [(m.start(1), 0.0)], 0),  # |cut| < 0.5%
    (re.compile(r"latency cut from ([+-]\d+)% to ([+-]\d+)%"),
     lambda m: [(m.start(1), float(m[1])), (m.start(2), float(m[2]))], 0),
    (re.compile(r"(\d+\.\d)% (?:of step time )?at "), lambda m: [(m.start(1), float(m[1]))], 1),
)


def quoted(answer: str) -> list[tuple[float, int]]:
    """(value, decimals) of every gain figure in `answer`, in the order they appear."""
    found = [(pos, v, d) for pattern, read, d in QUOTED for m in pattern.finditer(answer) for pos, v in read(m)]
    return [(v, d) for _, v, d in sorted(found)]


def near(v: float, d: int, y: float) -> bool:
    return abs(v - y) <= 0.5 * 10 ** -d + 1e-9  # the same number once rounded as the text rounds it


def test_every_figure_a_cost_line_quotes_is_on_its_chart(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    fig = _figures(rec, tmp_path, monkeypatch)["cost_lines.png"]
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
    for ax, line in zip(axes, rec.cost_lines, strict=True):
        plotted = [float(y) for y in ax.lines[0].get_ydata()]
        marker = [ln for ln in ax.lines if ln.get_label().startswith("your traffic:")]
        if line.operating_gain_pct is not None and math.isfinite(line.operating_gain_pct):
            assert len(marker) == 1 and marker[0].get_ydata()[0] == line.operating_gain_pct
            assert marker[0].get_xdata()[0] == line.operating_point
            plotted.append(float(marker[0].get_ydata()[0]))
        nums = quoted(line.answer)
        if line.optimization != "chunked prefill token budget":  # its answer quotes preemptions and TTFT
            assert nums, line.answer
        for v, d in nums:  # e.g. the text's "cuts ... by 31%" where the chart showed 44%: refused
            assert any(near(v, d, y) for y in plotted), (line.answer, plotted)
        if marker and line.optimization not in ("block size", "chunked prefill token budget"):
            v, d = nums[0]  # the first figure quoted is the one on the user's traffic
            assert near(v, d, marker[0].get_ydata()[0]), (line.answer, marker[0].get_ydata()[0])


def test_ladder_png_ends_at_the_goodputs_the_text_shows(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    fig = _figures(rec, tmp_path, monkeypatch)["ladder.png"]
    bars = fig.axes[0].patches
    assert len(bars) == len(rec.ladder) + 1
    top = [b.get_y() + b.get_height() for b in bars]
    assert f"{top[0]:.2f}" == f"{rec.baseline.metrics.goodput_rps:.2f}"  # the report's table, to 2 decimals
    assert f"{top[-1]:.2f}" == f"{rec.best.metrics.goodput_rps:.2f}"
    for bar_top, step in zip(top[1:], rec.ladder, strict=True):
        assert math.isclose(bar_top, step.metrics.goodput_rps, rel_tol=1e-9)


def test_latency_cdfs_reach_the_p99_the_text_shows(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    fig = _figures(rec, tmp_path, monkeypatch)["latency_cdf.png"]
    ttft, tpot, _ = fig.axes
    for ax, key in ((ttft, "ttft_p99_ms"), (tpot, "tpot_p99_ms")):
        for line, scored in zip(ax.lines[:2], (rec.baseline, rec.best), strict=True):
            x, y = line.get_xdata(), line.get_ydata()
            assert y[98] == 0.99  # the 99th point of the curve is the p99 the report's table prints
            assert math.isclose(x[98], getattr(scored.metrics, key), abs_tol=1e-3), (key, x[98])


def test_dashboard_cost_line_and_gap_titles() -> None:
    line = {"optimization": "block manager and scheduler CPU", "variable": "request rate", "unit": "req/s",
            "points": [{"x": 1.0, "gain_pct": 10.0}, {"x": 2.0, "gain_pct": 30.0}], "operating_point": 1.0,
            "break_even": None}
    fig = cost_line_figure(line)
    assert fig.layout.yaxis.title.text == CPU_LABEL  # an older file without gain_label
    fig = cost_line_figure(line | {"optimization": "prefix caching", "gain_label": LATENCY_CUT_LABEL})
    assert fig.layout.yaxis.title.text == LATENCY_CUT_LABEL and "goodput" not in fig.layout.title.text
    # the dashboard's "your traffic" star sits at the measured gain the answer quotes, not an interpolation
    fig = cost_line_figure(line | {"gain_label": LATENCY_CUT_LABEL, "operating_point": 1.5, "operating_gain_pct": 31.0})
    star = next(t for t in fig.data if t.name == "your traffic")
    assert list(star.x) == [1.5] and list(star.y) == [31.0]
    gap = gap_figure({"lab_gain": 2.30, "production_gain": 2.34, "factors": []})
    assert gap.layout.title.text.startswith("Lab -> production gap: x2.30 in the lab, x2.34 on your traffic")
