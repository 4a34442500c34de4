"""The run-wide counters a run keeps beside its tables (scheduler stats, for the simulator and the
engine alike): the summary (engine/core/run_summary.py) and the Prometheus exposition
(engine/core/prometheus.py) both read them.

Torch-free: the simulator imports it.
"""

from __future__ import annotations

# Run-wide counters both sides keep (scheduler stats); the summary and the exposition read them.
COUNTER_KEYS = ("prefix_cache_queries_tokens", "prefix_cache_hits_tokens", "spec_num_drafts",
                "spec_draft_tokens", "spec_accepted_tokens")
# plus, with speculative decoding, accepted drafts by position: POS_KEY.format(i) for i < k
POS_KEY = "spec_accepted_tokens_pos_{}"


def per_position_counters(accepted_per_pos: list[int]) -> dict[str, float]:
    """Accepted drafts by draft position (the scheduler's num_spec_accepted_per_pos) as counters."""
    return {POS_KEY.format(i): float(n) for i, n in enumerate(accepted_per_pos)}


def accepted_per_position(c: dict[str, float]) -> list[float]:
    """The per-position counters back as a list (empty without speculative decoding)."""
    out: list[float] = []
    while POS_KEY.format(len(out)) in c:
        out.append(c[POS_KEY.format(len(out))])
    return out


__all__ = ["COUNTER_KEYS", "POS_KEY", "accepted_per_position", "per_position_counters"]
