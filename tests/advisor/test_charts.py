"""The report's charts say what they plot: each chart's data and labels against the numbers of the
recommendation (cost lines are latency speed-ups or a CPU share, not goodput; defaults /
recommended; SLO lines; a legend for every line)."""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from advisor.advise.records import CPU_LABEL, SPEEDUP_LABEL
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
        assert "your traffic" in legend and len(legend) == 3  # every line named, the dashed one too
        assert ax.title.get_fontsize() >= 10 and ax.xaxis.label.get_fontsize() >= 9
    labels = {line.optimization: line.gain_label for line in rec.cost_lines}
    assert labels["block manager and scheduler CPU"] == CPU_LABEL
    assert labels["prefix caching"] == SPEEDUP_LABEL


def test_latency_cdf_png_says_defaults_recommended_and_draws_the_slo(rec, tmp_path, monkeypatch) -> None:  # noqa: F811
    fig = _figures(rec, tmp_path, monkeypatch)["latency_cdf.png"]
    ttft, e2e = fig.axes
    assert [t.get_text() for t in ttft.get_legend().get_texts()] == ["defaults", "recommended", "SLO 300 ms"]
    assert [t.get_text() for t in e2e.get_legend().get_texts()] == ["defaults", "recommended"]  # no e2el target
    assert list(ttft.lines[1].get_xdata()) == rec.latency_cdfs["best"]["ttft_ms"]
    assert ttft.lines[2].get_xdata()[0] == 300


def test_dashboard_cost_line_and_gap_titles() -> None:
    line = {"optimization": "block manager and scheduler CPU", "variable": "request rate", "unit": "req/s",
            "points": [{"x": 1.0, "gain_pct": 10.0}, {"x": 2.0, "gain_pct": 30.0}], "operating_point": 1.0,
            "break_even": None}
    fig = cost_line_figure(line)
    assert fig.layout.yaxis.title.text == CPU_LABEL  # an older file without gain_label
    fig = cost_line_figure(line | {"optimization": "prefix caching", "gain_label": SPEEDUP_LABEL})
    assert fig.layout.yaxis.title.text == SPEEDUP_LABEL and "goodput" not in fig.layout.title.text
    gap = gap_figure({"lab_gain": 2.30, "production_gain": 2.34, "factors": []})
    assert gap.layout.title.text.startswith("Lab -> production gap: x2.30 in the lab, x2.34 on your traffic")
