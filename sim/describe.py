"""Workload statistics: the figures `costline workload describe` prints.

Definitions (the figures sim/traces_data/README.md quotes):
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

from sim.workload import Workload, segment_arange


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique by sorting (numpy 2's hash-based np.unique is several times slower on 10^6+ ints)."""
    if x.size == 0:
        return x
    y = np.sort(x)
    return y[np.concatenate([[True], y[1:] != y[:-1]])]


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
    """Variance / mean of the counts in `bin_s` bins from the first arrival to the last bin holding
    one. Computed from the occupied bins alone (the empty ones add zeros whose number is known),
    so time and memory grow with the requests, never with the span: a trace of three requests
    years apart costs what three requests cost."""
    if arrival_s.size == 0:
        return float("nan")
    k = np.floor((arrival_s - arrival_s.min()) / bin_s)  # float bin index: exact to 2^53 bins
    num_bins = float(k.max()) + 1.0
    counts = np.unique(k, return_counts=True)[1].astype(np.float64)
    mean = arrival_s.size / num_bins
    var = max(float(np.dot(counts, counts)) / num_bins - mean * mean, 0.0)
    return var / mean


def prefix_reuse(wl: Workload) -> dict[str, float]:
    """Share of prompt tokens (leading runs) and of block references already seen before.

    Works on the workload's runs of consecutive hash ids rather than on single ids, so a
    million generated requests (~10^8 block references) take seconds, not minutes: the run
    boundaries cut the id line into elementary segments, each run covers whole segments, and a
    segment was "seen" by a reference when an earlier request covered it."""
    n = len(wl)
    if n == 0 or wl.run_len.size == 0:
        return {"token_fraction": 0.0, "block_fraction": 0.0}
    starts, lens = wl.run_start, wl.run_len
    ends = starts + lens
    bounds = sorted_unique(np.concatenate([starts, ends]))
    seg_lo = np.searchsorted(bounds, starts)
    n_seg = np.searchsorted(bounds, ends) - seg_lo  # segments each run covers
    runs_per_req = np.diff(wl.run_offsets)
    run_req = np.repeat(np.arange(n), runs_per_req)
    run_pos = np.cumsum(lens) - lens  # block position of each run in its request ...
    run_pos -= np.repeat(run_pos[wl.run_offsets[:-1]], runs_per_req)  # ... counted from the request's start

    seg = np.repeat(seg_lo, n_seg) + segment_arange(n_seg)  # one entry per (run, segment) reference
    ref_req = np.repeat(run_req, n_seg)
    seg_len = bounds[seg + 1] - bounds[seg]
    seg_pos = np.repeat(run_pos - bounds[seg_lo], n_seg) + bounds[seg]
    first_req = np.full(bounds.size, n, dtype=np.int64)  # earliest request covering each segment
    np.minimum.at(first_req, seg, ref_req)
    seen = first_req[seg] < ref_req

    blocks = np.diff(np.concatenate([[0], np.cumsum(lens)])[wl.run_offsets])  # blocks per request
    big = np.iinfo(np.int64).max
    first_unseen = np.full(n, big, dtype=np.int64)
    np.minimum.at(first_unseen, ref_req[~seen], seg_pos[~seen])
    leading = np.minimum(first_unseen, blocks)
    reused_tokens = np.minimum(leading * wl.hash_block_size, wl.prompt_len)
    return {"token_fraction": float(reused_tokens.sum() / wl.prompt_len.sum()),
            "block_fraction": float(seg_len[seen].sum() / lens.sum())}


def describe_workload(wl: Workload) -> dict[str, Any]:
    """All describe figures as a JSON-ready dict."""
    n = len(wl)
    span = wl.duration_s
    mix = np.bincount(wl.category_code, minlength=len(wl.categories)) / n
    sessions = sorted_unique(wl.session_id[wl.session_id >= 0])
    return {
        "name": wl.name,
        "requests": n,
        "duration_s": span,
        "mean_rate_rps": n / span if span > 0 else float("nan"),
        "interarrival_cv": interarrival_cv(wl.arrival_s),
        "index_of_dispersion_1s": index_of_dispersion(wl.arrival_s),
        "distinct_arrival_times": int(sorted_unique(wl.arrival_s).size),
        "prompt_tokens": length_stats(wl.prompt_len),
        "output_tokens": length_stats(wl.output_len),
        "total_prompt_tokens": int(wl.prompt_len.sum()),
        "total_output_tokens": int(wl.output_len.sum()),
        "hash_block_size": wl.hash_block_size,
        "prefix_reuse": prefix_reuse(wl),
        "task_mix": {name: float(f) for name, f in zip(wl.categories, mix, strict=True) if f > 0},
        "sessions": int(sessions.size),
        "notes": list(wl.notes),
        "skipped_rows": dict(wl.skipped_rows),
    }
