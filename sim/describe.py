"""Workload statistics: the figures `costline workload describe` prints.

Definitions (the same as ../shared/traces/README.md):
- mean rate = requests / (last arrival - first arrival);
- inter-arrival CV = std / mean of the gaps between consecutive arrivals (population std);
- index of dispersion = variance / mean of the request counts in 1-second bins laid from the
  first arrival (bin k holds arrivals in [t0 + k, t0 + k + 1));
- percentiles interpolate linearly (numpy's default);
- prefix reuse (an upper bound: an infinite cache, no eviction): a block reference is reused
  when an earlier request already used that hash id; a request's reused tokens are its leading
  run of such blocks, times the block size, capped at its prompt length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.workload import Workload


def length_stats(x: np.ndarray) -> dict[str, float]:
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(np.mean(x)), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "min": float(np.min(x)), "max": float(np.max(x))}


def interarrival_cv(arrival_s: np.ndarray) -> float:
    gaps = np.diff(arrival_s)
    if gaps.size == 0 or gaps.mean() == 0:
        return float("nan")
    return float(gaps.std() / gaps.mean())


def index_of_dispersion(arrival_s: np.ndarray, bin_s: float = 1.0) -> float:
    if arrival_s.size == 0:
        return float("nan")
    counts = np.bincount(np.floor((arrival_s - arrival_s[0]) / bin_s).astype(np.int64))
    return float(counts.var() / counts.mean())


def prefix_reuse(wl: Workload) -> dict[str, float]:
    """Share of prompt tokens (leading runs) and of block references already seen before."""
    ids, offsets = wl.flat_hash_ids()
    n = len(wl)
    counts = np.diff(offsets)
    if ids.size == 0:
        return {"token_fraction": 0.0, "block_fraction": 0.0}
    req = np.repeat(np.arange(n), counts)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    seen = req[first][inverse] < req  # first used by an earlier request
    pos = np.arange(ids.size) - offsets[req]
    big = np.iinfo(np.int64).max
    first_unseen = np.full(n, big, dtype=np.int64)
    nonempty = counts > 0
    first_unseen[nonempty] = np.minimum.reduceat(np.where(seen, big, pos), offsets[:-1][nonempty])
    leading = np.minimum(first_unseen, counts)
    reused_tokens = np.minimum(leading * wl.hash_block_size, wl.prompt_len)
    return {"token_fraction": float(reused_tokens.sum() / wl.prompt_len.sum()),
            "block_fraction": float(seen.mean())}


def describe_workload(wl: Workload) -> dict[str, Any]:
    """All describe figures as a JSON-ready dict."""
    n = len(wl)
    span = wl.duration_s
    mix = np.bincount(wl.category_code, minlength=len(wl.categories)) / n
    sessions = wl.session_id[wl.session_id >= 0]
    return {
        "name": wl.name,
        "requests": n,
        "duration_s": span,
        "mean_rate_rps": n / span if span > 0 else float("nan"),
        "interarrival_cv": interarrival_cv(wl.arrival_s),
        "index_of_dispersion_1s": index_of_dispersion(wl.arrival_s),
        "distinct_arrival_times": int(np.unique(wl.arrival_s).size),
        "prompt_tokens": length_stats(wl.prompt_len),
        "output_tokens": length_stats(wl.output_len),
        "total_prompt_tokens": int(wl.prompt_len.sum()),
        "total_output_tokens": int(wl.output_len.sum()),
        "hash_block_size": wl.hash_block_size,
        "prefix_reuse": prefix_reuse(wl),
        "task_mix": {name: float(f) for name, f in zip(wl.categories, mix, strict=True) if f > 0},
        "sessions": int(np.unique(sessions).size),
        "notes": list(wl.notes),
        "skipped_rows": dict(wl.skipped_rows),
    }
