"""Generation end to end: determinism, the Workload container, specs, presets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from engine.core.request import Request
from sim.describe import describe_workload, index_of_dispersion, prefix_reuse
from sim.generate import generate
from sim.workload import Workload, runs_from_flat
from sim.workload_presets import get_preset, preset_names
from sim.workload_source import SourceOptions, SpecFileError, load_spec, load_workload
from sim.workload_spec import WorkloadSpec


def columns(wl: Workload) -> tuple:
    ids, offs = wl.flat_hash_ids()
    return (wl.arrival_s, wl.prompt_len, wl.output_len, ids, offs, wl.category, wl.session_id)


def same(a: Workload, b: Workload) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(columns(a), columns(b), strict=True))


@pytest.mark.parametrize("name", preset_names())
def test_presets_generate_valid_sorted_requests(name):
    s = get_preset(name).with_overrides(num_requests=400)
    assert s.description and len(s.description) < 250  # one documented line each
    wl = generate(s)
    assert len(wl) == 400
    assert np.all(np.diff(wl.arrival_s) >= 0) and wl.arrival_s[0] == 0
    reqs = wl.requests  # building each Request checks len(hash_ids) == ceil(prompt_len / block)
    assert [r.request_id for r in reqs] == list(range(400))
    assert all(r.hash_block_size == s.hash_block_size for r in reqs)
    assert same(wl, generate(s))  # same seed, identical workload


def test_different_seed_differs_and_streams_are_independent():
    s = get_preset("chat-production").with_overrides(num_requests=500)
    assert not same(generate(s), generate(s.with_overrides(seed=1)))
    # changing the task mix must not move arrivals or lengths (each ingredient has its own stream)
    a, b = generate(s), generate(s.with_overrides(task_mix={"x": 1.0, "y": 3.0}))
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.prompt_len, b.prompt_len)


def test_production_preset_is_burstier_than_lab():
    lab = generate(get_preset("lab-poisson"))
    for name in ("chat-production", "code-bursty"):
        assert index_of_dispersion(generate(get_preset(name)).arrival_s) > 2 * index_of_dispersion(lab.arrival_s)


def test_workload_round_trips_through_request_objects():
    wl = generate(get_preset("agent-multiturn").with_overrides(num_requests=300))
    back = Workload.from_requests(wl.requests)
    assert same(wl, back)
    assert wl[5] == wl.requests[5] and wl[-1] == wl.requests[-1]
    with pytest.raises(IndexError):
        wl[300]


def test_runs_compression_is_lossless():
    ids = np.array([5, 6, 7, 1, 2, 9, 10, 11, 12, 3])
    offsets = np.array([0, 3, 5, 5, 10])  # request 2 has no ids
    run_start, run_len, run_offsets = runs_from_flat(ids, offsets)
    assert run_start.tolist() == [5, 1, 9, 3] and run_len.tolist() == [3, 2, 4, 1]
    wl = Workload(arrival_s=np.zeros(4), prompt_len=np.array([3, 2, 0, 5]), output_len=np.ones(4, np.int64),
                  run_start=run_start, run_len=run_len, run_offsets=run_offsets, hash_block_size=1,
                  category_code=np.zeros(4, np.int32), categories=("default",), session_id=-np.ones(4, np.int64))
    got_ids, got_offs = wl.flat_hash_ids()
    assert got_ids.tolist() == ids.tolist() and got_offs.tolist() == offsets.tolist()
    assert wl.hash_ids(3).tolist() == [9, 10, 11, 12, 3] and wl.hash_ids(2).size == 0


def test_window_head_and_time_scaling():
    wl = generate(get_preset("lab-poisson").with_overrides(num_requests=1000))
    w = wl.window(10.0, 20.0)
    inside = wl.arrival_s[(wl.arrival_s >= 10) & (wl.arrival_s < 20)]
    np.testing.assert_allclose(w.arrival_s, inside - 10.0)
    assert len(wl.head(7)) == 7 and wl.head(7)[6] == wl[6]
    fast = wl.scaled(2.0)
    np.testing.assert_allclose(fast.arrival_s, wl.arrival_s / 2)
    assert np.array_equal(fast.prompt_len, wl.prompt_len)
    at = wl.at_rate(3.0)
    assert len(at) / at.duration_s == pytest.approx(3.0)
    with pytest.raises(ValueError, match="no request arrives"):
        wl.window(1e9, 2e9)
    with pytest.raises(ValueError, match="speed-up"):
        wl.scaled(0)


def test_source_options_apply_window_then_first_then_rate():
    wl = load_workload("lab-poisson", SourceOptions(num_requests=500, seed=3, start_s=5, end_s=50, first=100, rate_rps=4.0))
    assert len(wl) == 100
    assert len(wl) / wl.duration_s == pytest.approx(4.0)
    assert any("first 100" in n for n in wl.notes)


def test_invalid_spec_names_the_field_path(tmp_path):
    with pytest.raises(ValidationError) as e:
        WorkloadSpec.model_validate({"arrival": {"kind": "gamma", "rate_rps": 2, "burstiness": -1},
                                     "prompt_tokens": {"kind": "fixed", "tokens": 10},
                                     "output_tokens": {"kind": "fixed", "tokens": 10}})
    assert e.value.errors()[0]["loc"] == ("arrival", "gamma", "burstiness")
    p = tmp_path / "spec.json"
    p.write_text(json.dumps({"arrival": {"kind": "poisson", "rate_rps": 1},
                             "prompt_tokens": {"kind": "lognormal", "median": 10, "sigma": 1},
                             "output_tokens": {"kind": "fixed", "tokens": 1}, "sessions": {"turns": 3}}))
    with pytest.raises(SpecFileError, match=r"field 'sessions\.turns'"):
        load_spec(p)
    p.write_text('{"arrival": ')
    with pytest.raises(SpecFileError, match="line 1"):
        load_spec(p)


def test_spec_json_round_trip(tmp_path):
    s = get_preset("agent-multiturn")
    p = tmp_path / "s.json"
    p.write_text(s.to_json())
    assert load_spec(p) == s
    assert same(load_workload(str(p), SourceOptions(num_requests=200)),
                generate(s.with_overrides(num_requests=200)))


def test_describe_figures_on_a_hand_made_workload():
    reqs = [Request(i, t, p, 1, tuple(h), 4) for i, (t, p, h) in enumerate([
        (0.0, 8, [1, 2]), (0.5, 6, [1, 3]), (2.0, 8, [1, 2]), (3.0, 3, [9])])]
    d = describe_workload(Workload.from_requests(reqs))
    assert d["mean_rate_rps"] == 4 / 3.0
    gaps = np.array([0.5, 1.5, 1.0])
    assert d["interarrival_cv"] == pytest.approx(gaps.std() / gaps.mean())
    assert d["index_of_dispersion_1s"] == pytest.approx(np.var([2, 0, 1, 1]) / 1.0)  # bins [0,1) [1,2) [2,3) [3,4)
    # reused leading tokens: r1 -> block 1 (4 tokens), r2 -> both blocks (8); of 25 prompt tokens
    assert d["prefix_reuse"]["token_fraction"] == pytest.approx(12 / 25)
    assert d["prefix_reuse"]["block_fraction"] == pytest.approx(3 / 7)


def reference_reuse(wl: Workload) -> tuple[float, float]:
    """Plain per-block reference: walk requests in order with a set of ids seen so far."""
    seen: set[int] = set()
    reused_tokens = reused_refs = refs = 0
    for r in wl:
        ids = r.hash_ids
        flags = [h in seen for h in ids]
        lead = next((i for i, f in enumerate(flags) if not f), len(ids))
        reused_tokens += min(lead * r.hash_block_size, r.prompt_len)
        reused_refs += sum(flags)
        refs += len(ids)
        seen.update(ids)
    return reused_tokens / int(wl.prompt_len.sum()), reused_refs / refs


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_run_based_reuse_matches_a_per_block_reference(data):
    bs = data.draw(st.sampled_from([1, 4, 16]))
    n = data.draw(st.integers(1, 25))
    id_lists = [data.draw(st.lists(st.integers(0, 30), min_size=1, max_size=12)) for _ in range(n)]
    prompt = [len(ids) * bs - data.draw(st.integers(0, bs - 1)) for ids in id_lists]
    lens = np.array([len(x) for x in id_lists])
    wl = Workload.from_columns(
        arrival_s=np.arange(n, dtype=float), prompt_len=np.array(prompt), output_len=np.ones(n, np.int64),
        hash_ids=np.array([h for x in id_lists for h in x]), hash_offsets=np.concatenate([[0], np.cumsum(lens)]),
        hash_block_size=bs)
    got = prefix_reuse(wl)
    want_tokens, want_blocks = reference_reuse(wl)
    assert got["token_fraction"] == pytest.approx(want_tokens, abs=1e-12)
    assert got["block_fraction"] == pytest.approx(want_blocks, abs=1e-12)


def test_run_based_reuse_matches_the_reference_on_generated_sessions():
    wl = generate(get_preset("agent-multiturn").with_overrides(num_requests=400))
    want_tokens, want_blocks = reference_reuse(wl)
    got = prefix_reuse(wl)
    assert got["token_fraction"] == pytest.approx(want_tokens, abs=1e-12)
    assert got["block_fraction"] == pytest.approx(want_blocks, abs=1e-12)


