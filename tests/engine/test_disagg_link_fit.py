"""sim/link_fit.py on synthetic transfer records with known link parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.core.disagg_records import TransferRecord
from sim.link_fit import fit_link, overlap_with_compute

# the truth: 40 GB/s, 30 us per transfer, 10 us per block, 15 us per descriptor
BW, LAT, PER_BLOCK, PER_DESC = 40.0, 30e-6, 10e-6, 15e-6
LAYERS = 32


def _records(block_bytes_list=(2 * 32 * 16 * 8 * 128 * 2, 2 * 32 * 64 * 8 * 128 * 2), modes=("whole", "layer"),
             n=200, noise=0.02, outliers=10, seed=0) -> list[TransferRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        bb = block_bytes_list[i % len(block_bytes_list)]
        mode = modes[(i // len(block_bytes_list)) % len(modes)]
        blocks = max(1, int(np.exp(rng.uniform(np.log(2**20 / bb), np.log(2**33 / bb)))))  # 1 MB .. 8 GB
        desc = 1 if mode == "whole" else LAYERS
        t = LAT + blocks * bb / (BW * 1e9) + PER_BLOCK * blocks + PER_DESC * desc
        t *= 1 + noise * rng.standard_normal()
        if i < outliers:
            t *= 5  # a few transfers slowed by a busy host
        out.append(TransferRecord(i, 0, 1, "nccl", mode, blocks, bb, blocks * bb, desc,
                                  send_start_s=0.0, recv_start_s=0.0, recv_end_s=t))
    return out


def test_fit_recovers_known_link_parameters():
    # 2% timing noise and 10 of 200 transfers 5x slow: over 8 seeds the fit stays within
    # 1% (bandwidth), 4% (per block), 6% (latency), 2% (per descriptor); asserted with margin
    for seed in (0, 1):
        fit = fit_link(_records(seed=seed))
        assert fit.unidentified == () and fit.num_records == 200
        assert fit.bandwidth_gb_per_s == pytest.approx(BW, rel=0.02)
        assert fit.per_block_s == pytest.approx(PER_BLOCK, rel=0.10)
        assert fit.latency_s == pytest.approx(LAT, rel=0.15)
        assert fit.per_descriptor_s == pytest.approx(PER_DESC, rel=0.10)


def test_fit_exact_on_noise_free_records():
    fit = fit_link(_records(noise=0.0, outliers=0, n=40))
    assert (fit.bandwidth_gb_per_s, fit.latency_s, fit.per_block_s, fit.per_descriptor_s) == pytest.approx(
        (BW, LAT, PER_BLOCK, PER_DESC), rel=1e-4)


def test_one_block_size_and_mode_folds_terms_and_disagg_fields_reproduce_times():
    bb = 2 * 32 * 16 * 8 * 128 * 2
    recs = _records(block_bytes_list=(bb,), modes=("whole",), noise=0.0, outliers=0, n=30)
    fit = fit_link(recs)
    assert fit.unidentified == ("per_block_s", "per_descriptor_s")
    # bytes and blocks are proportional: the byte term absorbs the per-block cost
    assert 1 / (fit.bandwidth_gb_per_s * 1e9) == pytest.approx(1 / (BW * 1e9) + PER_BLOCK / bb, rel=1e-4)
    assert fit.latency_s == pytest.approx(LAT + PER_DESC, rel=1e-3)
    f = fit.disagg_fields(bb)
    for r in recs[:5]:
        assert r.bytes / (f["link_gb_per_s"] * 1e9) + f["link_latency_s"] == pytest.approx(r.transfer_s, rel=1e-4)


def test_fit_needs_two_completed_transfers():
    recs = _records(n=3)
    recs[0].status = recs[1].status = "failed"
    with pytest.raises(ValueError, match="1 completed transfers"):
        fit_link(recs)


def test_overlap_with_compute_hand_computed():
    # transfer 1.0..3.0 s into replica 1; its steps cover 0.5..1.5 and 2.0..2.5 -> 1.0 of 2.0 s;
    # replica 0's step is not counted
    rec = TransferRecord(0, 0, 1, "gloo", "whole", 1, 1, 1, 1, send_start_s=1.0, recv_start_s=0.8, recv_end_s=3.0)
    steps = {"t_start_s": np.array([0.5, 2.0, 1.0]), "total_s": np.array([1.0, 0.5, 2.0]),
             "replica": np.array([1, 1, 0])}
    assert overlap_with_compute([rec], steps) == pytest.approx(0.5)
    assert math.isnan(overlap_with_compute([], steps))
