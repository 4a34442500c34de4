"""Live Prometheus metrics of the engine, vLLM's names and buckets: `EngineMetrics` is the one
writer in engine/core/prometheus.py (`LiveMetrics`), kept under this name for the engine's
commands (`engine run --metrics-file/--metrics-port`, the server's /metrics).
"""

from __future__ import annotations

from engine.core.prometheus import LiveMetrics, metric_families, prometheus_text
from engine.core.vllm_metrics import build_1_2_5_buckets

EngineMetrics = LiveMetrics

__all__ = ["EngineMetrics", "LiveMetrics", "build_1_2_5_buckets", "metric_families", "prometheus_text"]
