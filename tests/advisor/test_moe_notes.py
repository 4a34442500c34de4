"""The advice's mixture-of-experts lines: the batch from which every expert is read, and the
spec-decode break-even, against hand computations."""

from __future__ import annotations

import pytest

from advisor.advise.moe_notes import break_even_acceptance, moe_notes
from engine.core.model_spec import get_model
from sim.cost_model import CostProfile
from sim.hardware import get_gpu


def test_break_even_acceptance_solves_the_expected_tokens():
    # k = 3: tokens per verify step 1 + a + a^2 + a^3; at a = 0.5 that is 1.875
    assert break_even_acceptance(1.875, 3) == pytest.approx(0.5, abs=1e-9)
    assert break_even_acceptance(1.0, 3) == pytest.approx(0.0, abs=1e-9)
    assert break_even_acceptance(4.0, 3) is None  # even every draft accepted yields only 4 tokens


def test_notes_quote_the_all_experts_batch_and_dense_models_get_none():
    prof = CostProfile.load("default")
    notes = moe_notes(get_model("qwen3-30b-a3b"), get_gpu("h200"), prof)
    assert len(notes) == 2
    assert "from 72 tokens per step" in notes[0]  # ln 0.01 / ln(15/16) = 71.4 (uniform routing)
    assert "break-even acceptance" in notes[1]
    assert "from 17 tokens per step" in moe_notes(get_model("mixtral-8x7b"), get_gpu("h200"), prof)[0]
    assert moe_notes(get_model("llama-3.1-8b"), get_gpu("h200"), prof) == []
