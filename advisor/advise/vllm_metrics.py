"""Measured inputs from a user's own vLLM: its Prometheus text (a `curl host:8000/metrics`).

Today: speculative decoding's acceptance per draft token, vLLM's counters
`vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_draft_tokens_total`, summed
over engines (the `engine` label). vLLM does not split them by task, so one rate stands for every
task category.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from engine.core.input_files import InputFileError, decode_utf8, read_bytes
from sim.speculative import DEFAULT_ACCEPTANCE

MAX_METRICS_BYTES = 32 << 20  # a /metrics page is tens of KB; a scrape of many engines a few MB
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"


def counters(text: str, path: str | Path) -> dict[str, float]:
    """Every sample's value summed over its labels, by sample name."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise InputFileError(f"{path}: not Prometheus text exposition ({exc}); save `curl HOST:PORT/metrics` "
                             "from your vLLM") from None
    return out


def acceptance_from_metrics(path: str | Path, method: str = "*") -> dict[str, dict[str, float]]:
    """{method: {task: rate}} for `AdviseRequest.acceptance`, every task at the scrape's overall
    accepted / drafted tokens."""
    text = decode_utf8(path, read_bytes(path, max_bytes=MAX_METRICS_BYTES, what="vLLM metrics"))
    c = counters(text, path)
    drafted, accepted = c.get(DRAFTED), c.get(ACCEPTED)
    if not drafted or accepted is None:
        raise InputFileError(f"{path}: no {DRAFTED} counts (or zero drafts): scrape the /metrics of a vLLM "
                             "serving with --speculative-config after it has served traffic")
    rate = accepted / drafted
    if not 0 < rate < 1:
        raise InputFileError(f"{path}: accepted / drafted tokens = {accepted:g} / {drafted:g} = {rate:.3f}, not a "
                             "rate between 0 and 1; check the scrape")
    tasks = next(iter(DEFAULT_ACCEPTANCE.values()))
    return {method: dict.fromkeys(tasks, round(rate, 4))}


__all__ = ["ACCEPTED", "DRAFTED", "acceptance_from_metrics", "counters"]
