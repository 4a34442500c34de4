"""Metrics to watch named exactly as vLLM exposes them, and their thresholds as PromQL alert
expressions in alerts.yaml (Prometheus rule format)."""

from __future__ import annotations

import re

import yaml

from advisor.advise.report import alerts_yaml, write_outputs
from sim.config import EngineConfig
from sim.run import SimConfig, run
from sim.workload_source import SourceOptions
from tests.advisor.test_advise import rec  # noqa: F401 - the module's real recommendation

# vLLM 0.33's exposition (docs: vllm/v1/metrics/loggers.py): counters carry _total, histograms _bucket
VLLM_SERIES = {"vllm:time_to_first_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
               "vllm:e2e_request_latency_seconds_bucket", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
               "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:spec_decode_num_accepted_tokens_total",
               "vllm:spec_decode_num_draft_tokens_total", "vllm:prefix_cache_hits_total",
               "vllm:prefix_cache_queries_total"}


def _series(expr: str) -> set[str]:
    return set(re.findall(r"vllm:[a-z_]+", expr))


def _exposed() -> set[str]:
    """Sample names of the simulator's own vLLM-style /metrics text, spec decode on."""
    cfg = SimConfig(engine=EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 2}))
    text = run("lab-poisson", cfg, source=SourceOptions(num_requests=30)).prometheus_text()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("vllm:")}


def test_every_watched_series_is_one_vllm_exposes(rec) -> None:  # noqa: F811
    exposed = _exposed()
    names = set()
    for m in rec.metrics_to_watch:
        assert m.promql and m.alert, m
        names |= _series(m.promql)
        for part in m.metric.split(" / "):  # the metric column names exposed series too (histogram base names)
            assert part in exposed or part + "_bucket" in exposed, part
    assert names <= VLLM_SERIES and names <= exposed, names - exposed
    # the names the report used before: not series vLLM exposes
    assert "vllm:num_preemptions" not in exposed and "vllm:prefix_cache_hits" not in exposed
    assert any(m.metric == "vllm:num_preemptions_total" for m in rec.metrics_to_watch)
    ttft = next(m for m in rec.metrics_to_watch if m.alert == "VllmTtftP99AboveSlo")
    assert ttft.promql == ("histogram_quantile(0.99, sum by (le, model_name) "
                           "(rate(vllm:time_to_first_token_seconds_bucket[5m]))) > 0.3")  # ttft_p99:300


def test_alerts_yaml_is_prometheus_rule_format(rec, tmp_path) -> None:  # noqa: F811
    doc = yaml.safe_load(alerts_yaml(rec))
    (group,) = doc["groups"]
    assert group["name"] == "costline-small-chat"
    rules = group["rules"]
    assert [r["alert"] for r in rules] == [m.alert for m in rec.metrics_to_watch]
    for r, m in zip(rules, rec.metrics_to_watch, strict=True):
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"} and r["expr"] == m.promql
        assert r["for"] == "5m" and r["labels"] == {"severity": "warning"} and r["annotations"]["description"] == m.why
    out = write_outputs(rec, tmp_path / "advice")
    assert yaml.safe_load((out / "alerts.yaml").read_text()) == doc
    assert "alerts.yaml" in (out / "report.md").read_text()
