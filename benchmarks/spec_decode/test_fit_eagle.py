"""The simulator's EAGLE-3 against the H200 measurement (data/h200-eagle, fit_eagle.py): every sweep
of the engine re-simulated from its setup (flags, KV blocks, tasks, lengths) with the shipped
profile and acceptance table. Its speed-up over spec off lands within the measurement's error
(spec off measured twice on other prompts: sqrt(2) x that spread, plus the simulator's own
seed-to-seed spread), except at concurrency 128, where results.md states the gap and its cause:
the shipped profile's spec-off step (fitted on an older, slower engine) is 28% slow there, which
inflates the simulated speed-up; the EAGLE-3 throughput itself is within 11%."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.spec_decode import fit_eagle
from sim.config import SpeculativeConfig
from sim.speculative import AcceptanceModel, acceptance_source

CHECK = json.loads((Path(__file__).parent / "data" / "h200-eagle" / "sim_check.json").read_text())
ROWS = CHECK["speedup_check"]["rows"]
# (k, concurrency) -> the gap results.md states: simulated minus measured speed-up
STATED_GAPS = {(2, 128): 0.17, (4, 128): 0.18}


@pytest.mark.parametrize("row", ROWS, ids=[f"k{r['k']}-c{r['concurrency']}" for r in ROWS])
def test_sim_eagle3_speedup_matches_the_engine(row):
    sims = fit_eagle.sim_speedups(row["setup"]["eagle3"], row["setup"]["off"])
    sim = sum(sims) / len(sims)
    gap = sim - row["engine_speedup"]
    stated = STATED_GAPS.get((row["k"], row["concurrency"]))
    if stated is None:
        assert abs(gap) <= row["engine_error"] + (max(sims) - min(sims)) / 2
    else:
        assert 0 < gap <= stated


def test_the_simulator_draws_eagle3_acceptance_from_the_measurement():
    spec = SpeculativeConfig(method="eagle3", num_speculative_tokens=2)
    src = acceptance_source(spec, "byte-lm-100m")
    assert src.provenance == "measured" and set(src.table) == {"code", "prose", "json", "default"}
    assert src.table["code"] == pytest.approx(tuple(CHECK["acceptance"]["by_k"]["2"]["code"]))
    assert acceptance_source(spec, "llama-3.1-8b").provenance == "prior"
    assert AcceptanceModel(spec, 0, "byte-lm-100m").source.provenance == "measured"
    # per-token alpha is a property of the pair, not of k: the two fits agree within 3 points
    for task in ("code", "prose", "json"):
        means = [a / (a + b) for a, b in (CHECK["acceptance"]["by_k"][k][task] for k in ("2", "4"))]
        assert abs(means[0] - means[1]) < 0.03, task
