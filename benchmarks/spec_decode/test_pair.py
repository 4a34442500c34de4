"""The byte-level draft/target pair: corpora, the training model against the engine, training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.spec_decode import corpora, train_pair
from engine.core.model_spec import get_model
from engine.loader import load_model
from engine.paged_forward import new_kv, run_paged


# ---------------------------------------------------------------------------- corpora
@pytest.mark.parametrize("task", corpora.TASKS)
def test_each_task_has_train_and_held_out_documents_and_no_key_in_both(task):
    docs = corpora.documents(task)
    train, held = corpora.split(task, held_out=False), corpora.split(task, held_out=True)
    assert train and held
    assert {d.key for d in train}.isdisjoint(d.key for d in held)
    assert len(train) + len(held) == len(docs) == len({d.key for d in docs})
    assert 0.03 < len(held) / len(docs) < 0.2  # the 10% share, by hash
    assert sum(len(d.text) for d in train) > 1_000_000  # megabytes of real text to train on


def test_documents_are_rebuilt_identically():
    assert tuple(corpora.json_documents()) == corpora.documents("json")


def test_prompts_are_deterministic_cuts_of_held_out_documents():
    a = corpora.prompts("code", 5, 64, seed=3)
    assert a == corpora.prompts("code", 5, 64, seed=3)
    assert a != corpora.prompts("code", 5, 64, seed=4)
    assert corpora.prompts("code", 10, 64, seed=3)[:5] == a  # a longer draw extends a shorter one
    held = [d.text for d in corpora.split("code", held_out=True)]
    assert all(len(p) == 64 and any(p in t for t in held) for p in a)


def test_json_documents_parse_and_vary_in_indentation():
    import json

    docs = corpora.documents("json")
    for d in docs:
        json.loads(d.text)
    starts = {d.text[:3] for d in docs}
    assert {b"[\n ", b'{"c'} & starts or len(starts) > 3  # compact and indented shapes both occur


def test_byte_tokens_round_trip_and_fit_the_vocabulary():
    data = bytes(range(256))
    toks = corpora.encode(data)
    assert corpora.decode(toks) == data
    assert toks.min() == corpora.FIRST_CONTENT_TOKEN_ID and toks.max() < corpora.VOCAB_SIZE
    assert corpora.VOCAB_SIZE % 32 == 0 and corpora.VOCAB_SIZE == 288
    assert get_model("byte-lm-100m").vocab_size == get_model("byte-lm-10m").vocab_size == corpora.VOCAB_SIZE


# ---------------------------------------------------------------------------- model
def test_presets_have_the_pair_sizes():
    assert 95e6 < get_model("byte-lm-100m").num_params < 110e6
    assert 0.08 < get_model("byte-lm-10m").num_params / get_model("byte-lm-100m").num_params < 0.12


@pytest.mark.parametrize("spec", [train_pair.TINY_TARGET, train_pair.TINY_DRAFT], ids=lambda s: s.name)
def test_training_logits_equal_the_engine_forward_on_the_exported_weights(spec, tmp_path):
    """Export -> engine.loader.load_model -> a paged prefill over scattered KV blocks gives the
    training model's logits (fp32; agreement to 1e-4, the float reassociation of two code paths)."""
    model = train_pair.TrainLlama(spec, max_positions=128)
    model.init_weights(5)
    train_pair.export(model, tmp_path)
    engine = load_model(tmp_path, max_positions=128)
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(16, spec.vocab_size, (70,), generator=g).tolist()
    blocks = torch.randperm(32, generator=g)[:18].tolist()  # 70 tokens at 4 per block
    logits, _ = run_paged(engine, new_kv(spec), [(toks, 0, blocks)])
    with torch.no_grad():
        ref = model(torch.tensor([toks]))[0]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
    assert ref.std() > 1e-3  # random weights give logits that differ across the vocabulary


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = train_pair.TrainConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    assert [train_pair.lr_at(cfg, s, 0.0) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert train_pair.lr_at(cfg, 10, 0.5) == pytest.approx(0.55)
    assert train_pair.lr_at(cfg, 10, 1.0) == pytest.approx(0.1)
    assert train_pair.lr_at(cfg, 10, 2.0) == pytest.approx(0.1)


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()  # a 2-layer model trains faster on one thread than on shared cores
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_a_tiny_training_run_beats_the_unigram_entropy_on_held_out_text(one_thread):
    cfg = train_pair.TrainConfig(seq_len=32, batch_size=32, lr=1e-2, warmup_steps=5)
    _, rep = train_pair.train(train_pair.TINY_DRAFT, cfg, budget_s=1e9, device=torch.device("cpu"),
                              max_steps=60, log=lambda *a: None)
    unigram = train_pair.unigram_bits(held_out=True)
    assert rep.steps == 60 and rep.tokens == 60 * 32 * 32
    for task in corpora.TASKS:
        assert rep.held_out_bits_per_byte[task] < unigram[task] - 0.15, (task, rep.held_out_bits_per_byte, unigram)


def test_unigram_entropy_matches_a_direct_count():
    stream = corpora.token_stream("json", held_out=True)
    p = np.bincount(stream, minlength=256) / stream.size
    p = p[p > 0]
    assert train_pair.unigram_bits(held_out=True)["json"] == pytest.approx(float(-(p * np.log2(p)).sum()))
