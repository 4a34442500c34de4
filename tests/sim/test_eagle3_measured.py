"""EAGLE-3 in the simulator from the engine's measurement: the acceptance table measured for
byte-lm-100m (nearest k) and nowhere else, provenance tagged."""

from __future__ import annotations

import json

import pytest

import sim.speculative as sp
from sim.config import SpeculativeConfig


@pytest.fixture
def measured_file(tmp_path, monkeypatch):
    data = {"method": "eagle3", "target": "byte-lm-100m", "source": "measured on the engine (test)",
            "by_k": {"2": {"code": [8.0, 2.0], "default": [6.0, 4.0]}, "4": {"code": [7.0, 3.0], "default": [5.0, 5.0]}}}
    (tmp_path / "eagle3-acceptance-byte-lm-100m.json").write_text(json.dumps(data))
    monkeypatch.setattr(sp, "PROFILES_DIR", tmp_path)
    sp._measured_file.cache_clear()
    yield data
    sp._measured_file.cache_clear()


def test_measured_acceptance_applies_to_its_target_only(measured_file):
    spec = SpeculativeConfig(method="eagle3", num_speculative_tokens=3)
    got = sp.acceptance_source(spec, "byte-lm-100m")
    assert got.provenance == "measured" and got.table == {"code": (8.0, 2.0), "default": (6.0, 4.0)}  # k=2: nearest, lower
    assert "k=2" in got.source
    k4 = sp.acceptance_source(spec.model_copy(update={"num_speculative_tokens": 6}), "byte-lm-100m")
    assert k4.table["code"] == (7.0, 3.0)
    other = sp.acceptance_source(spec, "llama-3.1-8b")
    assert other.provenance == "prior" and other.table == sp.DEFAULT_ACCEPTANCE["eagle3"]
    user = sp.acceptance_source(spec.model_copy(update={"acceptance_beta": {"chat": (1.0, 1.0)}}), "byte-lm-100m")
    assert user.provenance == "user" and user.table["chat"] == (1.0, 1.0)
    assert sp.acceptance_source(SpeculativeConfig(method="ngram", num_speculative_tokens=2),
                                "byte-lm-100m").provenance == "prior"


def test_the_simulation_draws_from_the_measured_table(measured_file):
    model = sp.AcceptanceModel(SpeculativeConfig(method="eagle3", num_speculative_tokens=2), seed=0,
                               model="byte-lm-100m")
    assert model.source.provenance == "measured"
    alphas = [model.alpha(i, "code") for i in range(4000)]
    assert sum(alphas) / len(alphas) == pytest.approx(0.8, abs=0.01)  # Beta(8, 2)
    assert model.alpha(10_000, "chat") == pytest.approx(model.alpha(10_000, "chat"))
    prose = [model.alpha(20_000 + i, "prose") for i in range(4000)]  # not measured: the pooled default
    assert sum(prose) / len(prose) == pytest.approx(0.6, abs=0.01)
