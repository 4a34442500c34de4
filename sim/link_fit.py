"""Fit the simulator's KV link from measured transfers (engine/disagg transfer records).

Model of one transfer's time (both sides posted to the KV landed):

    t = latency_s + bytes / (bandwidth_gb_per_s * GB) + per_block_s * num_blocks
        + per_descriptor_s * num_descriptors

fitted by robust least squares on relative residuals (soft-L1 loss, every term >= 0: scipy's
least_squares): timing noise grows with the transfer, and a sweep from 1 MB to GBs must let
the small transfers fix the fixed costs; a few transfers slowed by a busy host do not pull
the line. A term is only identifiable when
its column varies apart from the others: with one block size, bytes and blocks are
proportional, and with one transfer mode the descriptor count is constant (the intercept takes
it); such terms are reported 0 and listed in `unidentified`.

The simulator's link (sim/config.DisaggConfig) has a bandwidth and a per-transfer latency only;
`disagg_fields(block_bytes)` folds the per-block cost into an effective bandwidth at that block
size, and the per-descriptor cost of the deployment's mode into the latency.

`overlap_with_compute`: the share of transfer time during which the receiving instance kept
stepping (its steps cover the transfer's interval), i.e. how much of the link's time the
decode side did not wait for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from sim.hardware import GB

TERMS = ("latency_s", "s_per_byte", "per_block_s", "per_descriptor_s")


@dataclass(frozen=True, slots=True)
class LinkFit:
    bandwidth_gb_per_s: float  # inf when the byte term was not identified
    latency_s: float
    per_block_s: float
    per_descriptor_s: float
    num_records: int
    median_abs_error_s: float
    unidentified: tuple[str, ...] = ()

    def disagg_fields(self, block_bytes: int, num_descriptors: int = 1) -> dict[str, float]:
        """DisaggConfig's `link_gb_per_s` and `link_latency_s` for transfers of `block_bytes`
        blocks in `num_descriptors` messages each."""
        per_byte = (0.0 if math.isinf(self.bandwidth_gb_per_s) else 1.0 / (self.bandwidth_gb_per_s * GB))
        per_byte += self.per_block_s / block_bytes
        gbps = math.inf if per_byte == 0 else 1.0 / (per_byte * GB)
        return {"link_gb_per_s": gbps, "link_latency_s": self.latency_s + self.per_descriptor_s * num_descriptors}


def _get(rec, name: str):
    return rec[name] if isinstance(rec, Mapping) else getattr(rec, name)


def _columns(records: list) -> tuple[np.ndarray, np.ndarray]:
    rows, y = [], []
    for rec in records:
        if _get(rec, "status") != "done":
            continue
        t = _get(rec, "transfer_s")
        if t is None or not math.isfinite(t):
            continue
        rows.append((1.0, float(_get(rec, "bytes")), float(_get(rec, "num_blocks")), float(_get(rec, "num_descriptors"))))
        y.append(float(t))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4), np.asarray(y, dtype=np.float64)


def _identified(x: np.ndarray) -> list[int]:
    """Columns kept in order (intercept, bytes, blocks, descriptors), each only if it raises the rank."""
    keep: list[int] = []
    for j in range(x.shape[1]):
        trial = keep + [j]
        sub = x[:, trial] / np.maximum(np.abs(x[:, trial]).max(axis=0), 1e-300)
        if np.linalg.matrix_rank(sub, tol=1e-9) == len(trial):
            keep = trial
    return keep


def fit_link(records: Iterable, *, f_scale: float = 0.05) -> LinkFit:
    """Fit the link model to completed transfer records (TransferRecord or transfers.jsonl rows).
    `f_scale`: relative residual beyond which the loss turns linear (outliers)."""
    x, y = _columns(list(records))
    if len(y) < 2:
        raise ValueError(f"fit_link: {len(y)} completed transfers with a time; need at least 2")
    keep = _identified(x)
    xs = x[:, keep]
    scale = np.maximum(np.abs(xs).max(axis=0), 1e-300)
    if (y <= 0).any():
        raise ValueError("fit_link: a completed transfer has a time <= 0; check its clock fields")
    a = xs / scale / y[:, None]  # rows over their own time: relative residuals a @ b - 1
    ones = np.ones_like(y)
    start = np.linalg.lstsq(a, ones, rcond=None)[0].clip(min=0.0)
    sol = least_squares(lambda b: a @ b - ones, start, bounds=(0.0, np.inf), loss="soft_l1", f_scale=f_scale)
    coef = np.zeros(4)
    coef[keep] = sol.x / scale
    resid = x @ coef - y
    return LinkFit(bandwidth_gb_per_s=math.inf if coef[1] == 0 else 1.0 / (coef[1] * GB), latency_s=float(coef[0]),
                   per_block_s=float(coef[2]), per_descriptor_s=float(coef[3]), num_records=len(y),
                   median_abs_error_s=float(np.median(np.abs(resid))),
                   unidentified=tuple(TERMS[j] for j in range(4) if j not in keep))


def overlap_with_compute(records: Iterable, steps: Mapping[str, np.ndarray]) -> float:
    """Share of the transfers' time covered by steps of their receiving instance (0..1)."""
    t0, dur, rep = (np.asarray(steps[k], dtype=np.float64) for k in ("t_start_s", "total_s", "replica"))
    covered = total = 0.0
    for rec in records:
        if _get(rec, "status") != "done":
            continue
        start = max(_get(rec, "send_start_s"), _get(rec, "recv_start_s"))
        end = _get(rec, "recv_end_s")
        if not end > start:
            continue
        mine = rep == _get(rec, "dst_replica")
        lo = np.maximum(t0[mine], start)
        hi = np.minimum(t0[mine] + dur[mine], end)
        covered += float(np.clip(hi - lo, 0.0, None).sum())
        total += end - start
    return covered / total if total > 0 else math.nan


__all__ = ["LinkFit", "fit_link", "overlap_with_compute"]
