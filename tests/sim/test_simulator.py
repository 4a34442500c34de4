"""Simulator validation: values against closed forms and the cost model, not smoke."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.model_spec import ModelSpec
from engine.core.request import Request
from sim.config import DeploymentConfig, DisaggConfig, EngineConfig
from sim.cost_model import CostModel, CostProfile
from sim.hardware import get_gpu
from sim.simulator import Simulation, delay_until, simulate
from sim.speculative import sample_accepted
from tests.sim.simhelpers import (
    decode_batch,
    deployment,
    frozen_profile,
    poisson,
    prefill_batch,
    req,
    step_s,
)
from tests.sim.step_rows import expand_step_rows


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha): mean tokens of one verification step (the closed form)."""
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def _cost(dep) -> CostModel:
    return Simulation(dep, [req(0, 0.0, 16, 1)]).replicas[0].cost


@pytest.mark.parametrize("skip", [True, False])
def test_lone_request_ttft_and_tpot_equal_step_times(skip):
    dep = deployment(enable_prefix_caching=False)
    P, O = 1000, 20
    res = simulate(dep, [req(0, 2.5, P, O)], skip_ahead=skip)
    cost = _cost(dep)
    prefill_s = step_s(cost, prefill_batch(P, 0, blocks=math.ceil(P / 16)))
    decode_s = []
    for j in range(1, O):  # decode step j: the KV holds P + j tokens after it
        new_blocks = math.ceil((P + j) / 16) - math.ceil((P + j - 1) / 16)
        decode_s.append(step_s(cost, decode_batch(1, P + j, blocks=new_blocks)))
    r = res.requests
    assert r["ttft_s"][0] == pytest.approx(prefill_s, rel=1e-12)
    assert r["queue_s"][0] == 0.0
    assert r["tpot_s"][0] == pytest.approx(sum(decode_s) / (O - 1), rel=1e-9)
    assert r["e2e_s"][0] == pytest.approx(prefill_s + sum(decode_s), rel=1e-9)
    assert r["num_output_tokens"][0] == O and r["status"][0] == "finished"


def test_md1_queueing_delay_at_low_load():
    """One server, deterministic service D, Poisson arrivals at rho = 0.5:
    M/D/1 mean wait = rho D / (2 (1 - rho)). Batching is switched off (max_num_seqs=1)."""
    dep = deployment(enable_prefix_caching=False, max_num_seqs=1)
    D = step_s(_cost(dep), prefill_batch(512, 0, blocks=32))
    rho, n = 0.5, 6000
    reqs = poisson(n, rho / D, 512, 1, seed=7)
    r = simulate(dep, reqs).requests
    assert np.allclose(r["e2e_s"] - r["queue_s"], D, rtol=1e-9)  # service is deterministic
    w = r["queue_s"]
    want = rho * D / (2 * (1 - rho))
    # waits are autocorrelated: tolerance from the spread of 30 batch means
    means = np.array([b.mean() for b in np.array_split(w, 30)])
    tol = 4 * means.std(ddof=1) / math.sqrt(len(means))
    assert abs(w.mean() - want) < tol, (w.mean(), want, tol)
    assert tol < 0.25 * want  # the check is tight enough to mean something


MHA = ModelSpec(name="mha-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32, head_dim=128,
                intermediate_size=11008, vocab_size=32000, dtype="float16")


def _disagg(link_gb_per_s=900.0, latency=0.0, p=1, d=1, **engine) -> DeploymentConfig:
    return DeploymentConfig(model=MHA, gpu=get_gpu("h200"),
                            engine=EngineConfig(max_model_len=40000, enable_prefix_caching=False, **engine),
                            disaggregation=DisaggConfig(num_prefill_replicas=p, num_decode_replicas=d,
                                                        link_gb_per_s=link_gb_per_s, link_latency_s=latency))


def test_kv_transfer_time_textbook_case():
    # 32 layers x 32 KV heads x 128 x 32,768 tokens x 2 bytes x 2 (K, V) = 17.18 GB over 900 GB/s
    res = simulate(_disagg(latency=2e-4), [Request(0, 0.0, 32768, 4, tuple(range(2048)))])
    nbytes = 2 * 32 * 32 * 128 * 32768 * 2
    assert nbytes == 17_179_869_184
    t = res.requests["kv_transfer_s"][0]
    assert t == pytest.approx(nbytes / 900e9 + 2e-4, rel=1e-12)
    assert t == pytest.approx(0.0191 + 2e-4, abs=1e-4)


def test_kv_transfers_queue_on_a_busy_link():
    reqs = [Request(i, 0.0, 4096, 2, tuple(range(i * 256, i * 256 + 256))) for i in range(2)]
    res = simulate(_disagg(link_gb_per_s=10.0, latency=0.0), reqs)
    one = 4096 * 2 * 32 * 32 * 128 * 2 / 10e9
    # both prompts finish prefill in the same step; the second waits for the first on the link
    assert sorted(res.requests["kv_transfer_s"]) == pytest.approx([one, 2 * one], rel=1e-9)
    # decode-side TTFT includes the prefill step, the transfer and a 1-token step
    r = res.requests
    assert np.all(r["ttft_s"] > r["kv_transfer_s"])


def test_a_decode_replica_takes_a_transfer_up_at_its_step_boundary():
    """The link starts when the decode replica, busy decoding another request, ends its step
    (the engine posts the receive between steps, vLLM's scheduler starts the read there)."""
    reqs = [Request(0, 0.0, 16, 400, (1,)), Request(1, 0.05, 2048, 2, tuple(range(10, 138)))]
    res = simulate(_disagg(link_gb_per_s=900.0, latency=0.0), reqs)
    steps, r = res.steps, res.requests
    pre = [(t, d) for rep, t, d in zip(steps["replica"], steps["t_start_s"], steps["total_s"]) if rep == 0 and t >= 0.05]
    t_ready = pre[0][0] + pre[0][1]  # request 1's one prefill step ends
    dec = [(t, d) for rep, t, d in zip(steps["replica"], steps["t_start_s"], steps["total_s"]) if rep == 1]
    boundaries = sorted({t for t, _ in dec} | {t + d for t, d in dec})
    link = 2048 * 2 * 32 * 32 * 128 * 2 / 900e9
    i = list(r["request_id"]).index(1)
    link_start = t_ready + r["kv_transfer_s"][i] - link
    waited = link_start - t_ready
    assert 0 < waited < max(d for _, d in dec)  # mid-step when the prompt was done
    assert min(abs(link_start - b) for b in boundaries) < 1e-9
    assert r["first_token_s"][i] > link_start + link  # admitted after the KV landed


def test_measured_links_are_the_default_where_known():
    h200, a100 = get_gpu("h200"), get_gpu("a100-80gb")
    nv = DisaggConfig(num_prefill_replicas=1, num_decode_replicas=1, link="nvlink")
    # the H200 pair's NCCL sweep (benchmarks/disagg/data/h200x2), not the datasheet's 450 GB/s
    assert nv.link_bandwidth_gb_per_s(h200) == pytest.approx(375.3)
    assert nv.link_latency(h200) == pytest.approx(130.4e-6)
    # unmeasured: the datasheet and 0.5 ms
    assert nv.link_bandwidth_gb_per_s(a100) == a100.nvlink_gb_per_s
    assert nv.link_latency(a100) == 5e-4
    given = DisaggConfig(num_prefill_replicas=1, num_decode_replicas=1, link="nvlink", link_gb_per_s=100.0,
                         link_latency_s=0.0)
    assert (given.link_bandwidth_gb_per_s(h200), given.link_latency(h200)) == (100.0, 0.0)


def test_sampled_acceptance_is_truncated_geometric():
    rng = np.random.default_rng(3)
    for alpha, k in [(0.3, 2), (0.7, 4), (0.9, 7)]:
        x = sample_accepted(rng, np.full(200_000, alpha), k)
        for j in range(k + 1):  # P(X >= j) = alpha^j
            assert (x >= j).mean() == pytest.approx(alpha**j, abs=5 * math.sqrt(alpha**j / 200_000) + 1e-3)
        assert (x + 1).mean() == pytest.approx(expected_tokens_per_step(alpha, k), rel=0.01)


def test_simulated_tokens_per_spec_step_match_formula():
    a, k = 0.7, 4
    spec = {"method": "ngram", "num_speculative_tokens": k, "acceptance_beta": {"default": (7000.0, 3000.0)}}
    dep = deployment(speculative_config=spec, enable_prefix_caching=False)
    reqs = [req(i, 0.0, 200, 3000) for i in range(8)]
    s = simulate(dep, reqs, seed=1).summary().to_json_dict()
    drafts = s["spec_decode_num_drafts"]
    length = s["spec_decode_acceptance_length"]
    want = expected_tokens_per_step(a, k)
    # std of tokens per step for a truncated geometric, and the alpha spread of Beta(7000, 3000)
    x = np.arange(k + 1)
    p = np.array([a**j * (1 - a) for j in range(k)] + [a**k])
    sd = math.sqrt((p * (x + 1 - want) ** 2).sum())
    assert abs(length - want) < 4 * sd / math.sqrt(drafts) + 0.01, (length, want, drafts)
    assert s["completed"] == 8 and s["total_output_tokens"] == 8 * 3000


def test_every_request_finishes_or_is_rejected():
    dep = deployment(max_model_len=4096, num_gpu_blocks_override=300, max_num_seqs=16)
    rng = np.random.default_rng(5)
    reqs = [req(i, float(t), int(p), int(o)) for i, (t, p, o) in
            enumerate(zip(np.sort(rng.uniform(0, 5, 150)), rng.integers(1, 3000, 150), rng.integers(1, 600, 150)))]
    reqs.append(req(150, 1.0, 4000, 200))  # longer than max_model_len
    reqs.append(req(151, 1.5, 1000, 4000))  # needs more blocks than the pool has
    res = simulate(dep, reqs)
    r = res.requests
    assert set(r["status"]) <= {"finished", "rejected"}
    fin = r["status"] == "finished"
    assert np.all(r["num_output_tokens"][fin] == r["output_len"][fin])
    assert sorted(r["request_id"][~fin]) == [150, 151]
    assert "max_model_len" in r["finish_reason"][r["request_id"] == 150][0]
    assert res.summary().num_preemptions > 0  # the small pool made it work for that


def _tables_equal(a, b) -> None:
    for k in a.requests:
        x, y = a.requests[k], b.requests[k]
        if x.dtype.kind == "f":
            np.testing.assert_array_equal(np.nan_to_num(x, nan=-1), np.nan_to_num(y, nan=-1))
        else:
            np.testing.assert_array_equal(x, y)


def test_same_seed_same_results():
    spec = {"method": "eagle", "num_speculative_tokens": 3}
    dep = deployment(replicas=2, speculative_config=spec)
    reqs = poisson(120, 20.0, 500, 100, seed=2)
    a, b, c = (simulate(dep, reqs, seed=s) for s in (11, 11, 12))
    _tables_equal(a, b)
    assert a.summary().spec_decode_accepted_tokens == b.summary().spec_decode_accepted_tokens
    assert a.summary().spec_decode_accepted_tokens != c.summary().spec_decode_accepted_tokens


@pytest.mark.parametrize("router, overlap", [("round_robin", False), ("least_loaded", False),
                                             ("prefix_aware", False), ("least_loaded", True)])
def test_skipping_equals_stepping(router, overlap):
    """Skip-ahead over pure-decode stretches gives the very same timeline as stepping
    (with async scheduling too: GPU-bound steps hide the block CPU in both)."""
    dep = deployment(replicas=2, router=router, num_gpu_blocks_override=4000, async_scheduling=overlap)
    reqs = poisson(80, 4.0, 700, 300, seed=4, prefix=tuple(range(20)))
    a = simulate(dep, reqs, skip_ahead=True)
    b = simulate(dep, reqs, skip_ahead=False)
    for k in ("first_token_s", "finish_s", "scheduled_s"):
        np.testing.assert_allclose(a.requests[k], b.requests[k], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(a.requests["replica"], b.requests["replica"])
    assert a.steps["n_steps"].sum() == b.steps["n_steps"].sum()
    assert len(a.steps["n_steps"]) < len(b.steps["n_steps"]) / 3  # it did skip
    va, wa = a.itl_samples()
    vb, wb = b.itl_samples()
    # ITL samples agree up to where block-allocation CPU time lands (per step vs per stretch)
    assert sorted(np.repeat(va, wa.astype(int))) == pytest.approx(sorted(np.repeat(vb, wb.astype(int))), abs=2e-5)
    assert a.steps["total_s"].sum() == pytest.approx(b.steps["total_s"].sum(), rel=1e-9)


@pytest.mark.parametrize("replicas, router, overlap, profile", [
    (1, "least_loaded", False, "default"), (2, "least_loaded", False, "default"),
    (2, "prefix_aware", False, "default"), (2, "round_robin", True, "default"),
    # fitted: the longest sequence's term (decode_max_kv) grows by one token a step
    (1, "least_loaded", True, "h200-llama-3.1-8b"), (1, "least_loaded", False, "h200-llama-3.1-8b")])
def test_skipping_through_finishes_equals_stepping(replicas, router, overlap, profile):
    """A skip runs through requests finishing mid-stretch (the batch shrinks; one step row per
    constant batch): request times, routing and every step's composition equal stepping."""
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(0.5, 60))
    reqs = [req(i, float(t), int(rng.integers(50, 900)), int(rng.integers(5, 400)), tuple(range(10)))
            for i, t in enumerate(arrivals)]
    dep = deployment(replicas=replicas, router=router, num_gpu_blocks_override=3000, async_scheduling=overlap)
    prof = CostProfile.load(profile) if profile == "default" else frozen_profile(profile)
    assert profile == "default" or prof.decode.decode_max_kv_multiplier(16) > 1
    a = simulate(dep, reqs, skip_ahead=True, profile=prof)
    b = simulate(dep, reqs, skip_ahead=False, profile=prof)
    for k in ("first_token_s", "finish_s", "scheduled_s"):
        np.testing.assert_allclose(a.requests[k], b.requests[k], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(a.requests["replica"], b.requests["replica"])
    through = 0
    cols = ("step_id", "num_batched_tokens", "num_prefill_tokens", "num_decode_seqs", "sum_decode_context",
            "max_decode_context", "num_output_tokens", "num_preempted")
    for rep in range(replicas):
        sa = {c: v[a.steps["replica"] == rep] for c, v in a.steps.items()}
        sb = {c: v[b.steps["replica"] == rep] for c, v in b.steps.items()}
        one = expand_step_rows(sa)
        for c in cols:
            np.testing.assert_array_equal(one[c], sb[c], err_msg=c)
        # a skip row followed at once by a row of a smaller batch: a finish mid-stretch (under async
        # scheduling a batch's first step of a stretch is a row of its own)
        multi = sa["n_steps"] > 1
        back_to_back = np.isclose(sa["t_start_s"][1:], (sa["t_start_s"] + sa["total_s"])[:-1], rtol=0, atol=1e-12)
        through += int((multi[:-1] & back_to_back & (sa["num_decode_seqs"][1:] < sa["num_decode_seqs"][:-1])).sum())
    assert through > 5, through
    assert len(a.steps["n_steps"]) < len(b.steps["n_steps"]) / 3


def test_round_robin_and_least_loaded_spread_requests():
    reqs = poisson(40, 50.0, 300, 50, seed=1)
    rr = simulate(deployment(replicas=4, router="round_robin"), reqs).requests["replica"]
    assert list(rr[:8]) == [0, 1, 2, 3, 0, 1, 2, 3]
    ll = simulate(deployment(replicas=4, router="least_loaded"), reqs).requests["replica"]
    assert set(ll) == {0, 1, 2, 3}


def test_prefix_aware_router_keeps_sessions_together():
    # 8 distinct 2K system prompts, 2 replicas whose caches hold ~5 each: prefix-aware routing
    # keeps each prompt on one replica, round-robin makes both caches thrash
    rng = np.random.default_rng(0)
    prefixes = [tuple(range(1000 * g, 1000 * g + 128)) for g in range(8)]
    reqs = [req(i, i * 0.05, 2100, 20, prefixes[int(rng.integers(8))]) for i in range(200)]
    hit = {}
    for router in ("round_robin", "prefix_aware"):
        dep = deployment(replicas=2, router=router, num_gpu_blocks_override=700)
        hit[router] = simulate(dep, reqs).summary().prefix_cache_hit_rate
    assert hit["prefix_aware"] > hit["round_robin"] + 0.05, hit


def test_disaggregated_lone_request_ttft_is_prefill_plus_transfer_plus_one_token():
    dep = _disagg(link_gb_per_s=50.0, latency=1e-3)
    sim = Simulation(dep, [Request(0, 0.0, 4096, 8, tuple(range(256)))])
    res = sim.run()
    pre, dec = sim.prefill_pool[0].cost, sim.decode_pool[0].cost
    prefill_s = step_s(pre, prefill_batch(4096, 0, blocks=256))
    transfer_s = 4096 * MHA.kv_bytes_per_token() / 50e9 + 1e-3
    # decode side: the KV arrived, only the last prompt token is computed (context 4095)
    first_s = step_s(dec, prefill_batch(1, 4095, blocks=256))
    r = res.requests
    assert r["kv_transfer_s"][0] == pytest.approx(transfer_s, rel=1e-12)
    assert r["ttft_s"][0] == pytest.approx(prefill_s + transfer_s + first_s, rel=1e-9)
    assert r["num_output_tokens"][0] == 8


def test_acceptance_drift_lowers_acceptance():
    base = {"method": "ngram", "num_speculative_tokens": 4, "acceptance_beta": {"default": (700.0, 300.0)}}
    reqs = [req(i, 0.0, 100, 1500) for i in range(4)]
    flat = simulate(deployment(speculative_config=base), reqs, seed=0).summary().to_json_dict()
    drift = simulate(deployment(speculative_config=base | {"acceptance_drift_per_s": -0.2}), reqs,
                     seed=0).summary().to_json_dict()
    assert drift["spec_decode_acceptance_rate"] < flat["spec_decode_acceptance_rate"] - 0.1


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3), st.integers(1, 2500), st.integers(1, 300)), min_size=1, max_size=40),
       st.integers(40, 400), st.sampled_from([1, 2]), st.booleans())
def test_random_workloads_finish_or_reject(rows, blocks, replicas, chunked):
    dep = deployment(replicas=replicas, num_gpu_blocks_override=blocks, max_model_len=2048, max_num_seqs=8,
                     enable_chunked_prefill=chunked, max_num_batched_tokens=1024 if chunked else 2048)
    reqs = [req(i, t, p, o, tuple(range(8))) for i, (t, p, o) in enumerate(rows)]
    r = simulate(dep, reqs).requests
    assert set(r["status"]) <= {"finished", "rejected"}
    fin = r["status"] == "finished"
    assert np.all(r["num_output_tokens"][fin] == r["output_len"][fin])
    assert np.all(r["first_token_s"][fin] <= r["finish_s"][fin])
    assert np.all(r["scheduled_s"][fin] >= r["arrival_s"][fin])
    too_long = (r["prompt_len"] + r["output_len"]) > 2048
    assert np.all(~fin[too_long])


def test_kv_block_coarsening_keeps_metrics_on_coarse_prefix_structure():
    """A trace whose prefixes are known per 512-token block loses nothing to 512-token
    scheduler blocks but fragmentation; with ample KV the metrics agree closely."""
    rng = np.random.default_rng(2)
    shared = [tuple(range(100 * g, 100 * g + 8)) for g in range(5)]  # 5 prefixes of 4K tokens
    reqs = []
    t = 0.0
    for i in range(150):
        t += float(rng.exponential(0.25))
        p = int(rng.integers(4200, 9000))
        reqs.append(req(i, t, p, int(rng.integers(50, 300)), shared[int(rng.integers(5))], hbs=512))
    dep = deployment(replicas=2, router="prefix_aware")
    sim = Simulation(dep, reqs, kv_block_coarsening="auto")
    assert sim.coarsen == 32
    fine, coarse = simulate(dep, reqs).summary().to_json_dict(), sim.run().summary().to_json_dict()
    for k in ("mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "prefix_cache_hit_rate", "output_throughput"):
        assert coarse[k] == pytest.approx(fine[k], rel=0.03), k
    assert coarse["prefix_cache_hit_rate"] > 0.3


def test_skipping_equals_stepping_with_coarse_blocks():
    dep = deployment(num_gpu_blocks_override=3000)
    reqs = poisson(40, 3.0, 900, 200, seed=9)
    a = simulate(dep, reqs, kv_block_coarsening=4)
    b = simulate(dep, reqs, kv_block_coarsening=4, skip_ahead=False)
    np.testing.assert_allclose(a.requests["finish_s"], b.requests["finish_s"], rtol=1e-9)


def test_prefill_replica_holds_blocks_until_the_transfer_ends():
    # 2 prompts of 4,096 tokens prefilled in one step; each transfer takes 2.15 s on a 1 GB/s
    # link (one at a time). At 1 s both prompts' blocks (2 x 256) are still held on the prefill
    # replica; at the end every block is back and nothing is held.
    reqs = [Request(i, 0.0, 4096, 2, tuple(range(i * 256, i * 256 + 256))) for i in range(2)]
    sim = Simulation(_disagg(link_gb_per_s=1.0, latency=0.0), reqs)
    pre = sim.prefill_pool[0].sched
    sim.env.run(until=1.0)
    st = pre.stats
    assert (st.num_held_requests, st.num_held_blocks, st.num_running) == (2, 512, 0)
    assert st.num_free_blocks == st.num_gpu_blocks - 512
    res = sim.run()
    assert list(res.requests["status"]) == ["finished", "finished"]
    for rep in sim.replicas:
        st = rep.sched.stats
        assert st.num_held_requests == 0 and st.num_free_blocks == st.num_gpu_blocks
    assert sim.decode_pool[0].sched.stats.external_computed_tokens == 2 * 4095


def test_arrivals_never_land_before_their_time():
    """SimPy adds delays to the clock: 0.2740583980656664 + (0.92 - 0.2740583980656664) is one ulp
    below 0.92, and no delay reaches 0.92 exactly; the arrival lands on the next clock time."""
    now, t = 0.2740583980656664, 0.92
    assert now + (t - now) < t
    d = delay_until(now, t)
    assert now + d >= t and now + math.nextafter(d, -math.inf) < t
    dep = deployment(num_gpu_blocks_override=40, max_model_len=2048, max_num_batched_tokens=1024)
    r = simulate(dep, [req(0, t, 1, 1), req(1, now, 1, 1)]).requests
    assert np.all(r["scheduled_s"] >= r["arrival_s"]) and r["queue_s"].max() < 1e-15


@pytest.mark.parametrize("variant", ["mixed", "disagg", "spec"])
def test_a_run_creates_no_reference_cycles_and_restores_the_collector(variant):
    """Simulation.run pauses the cyclic collector, which is only sound if a run leaves no cyclic
    garbage behind: whatever it drops, reference counting must free. Preemptions (small pool),
    prefix hits, skips woken by arrivals, P/D transfers and speculative draws all take part."""
    import gc
    if variant == "disagg":
        dep = _disagg(link_gb_per_s=50.0, latency=1e-3)
    elif variant == "spec":
        dep = deployment(replicas=2, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    else:
        dep = deployment(replicas=2, router="prefix_aware", num_gpu_blocks_override=400)
    reqs = poisson(150, 30.0, 700, 60, seed=3)
    collector_on: list[bool] = []  # sampled while the clock runs
    sim = Simulation(dep, reqs, progress=lambda _: collector_on.append(gc.isenabled()))
    gc.collect()
    # objects that existed before the run are not its garbage: an earlier test's in the same worker
    # (38,996 matplotlib objects of a chart test's figure once) can turn unreachable while it runs
    before = {id(o) for o in gc.get_objects()}
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        res = sim.run()
        assert gc.isenabled()
        gc.collect()
        garbage = [type(o).__qualname__ for o in gc.garbage if id(o) not in before]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert garbage == []
    assert collector_on and not any(collector_on)
    assert res.summary().completed > 0
    gc.disable()
    try:
        sim2 = Simulation(dep, reqs)
        sim2.run()
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_a_run_leaves_its_objects_out_of_the_young_generation_and_keeps_frozen_ones():
    """After a run the collector is on, and the objects the run made sit in the oldest generation
    (the young one holds a handful), so the next allocation does not scan them; objects a caller
    froze stay frozen (no promotion then)."""
    import gc
    reqs = poisson(100, 30.0, 300, 40, seed=2)
    gc.collect()
    Simulation(deployment(), reqs).run()
    assert gc.isenabled() and gc.get_count()[0] < 100, gc.get_count()
    keep = [[i] for i in range(50)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        Simulation(deployment(), reqs).run()
        assert gc.get_freeze_count() >= frozen - 100  # (frozen objects freed meanwhile leave it)
    finally:
        gc.unfreeze()
    assert keep


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4) | st.none()), min_size=1, max_size=6),
       st.lists(st.integers(0, 4), max_size=6))
def test_first_of_keeps_simpy_event_order(sleepers, others):
    """The skip's sleep (`_first_of(timeout, wake)`) resumes its process at the very place in
    SimPy's event order that `timeout | wake` does, ties at one instant included: each sleeper
    waits d or until kicked at k, among other processes logging at the same instants."""
    from sim.simulator import _first_of

    def trace(use_condition: bool) -> list:
        env = simpy.Environment()
        log = []

        def sleeper(i, d, kick_at):
            wake = env.event()
            if kick_at is not None:
                env.process(kicker(wake, kick_at))
            to = env.timeout(d)
            yield (to | wake) if use_condition else _first_of(env, to, wake)
            log.append(("sleeper", i, env.now, wake.triggered))

        def kicker(wake, t):
            yield env.timeout(t)
            log.append(("kick", t))
            wake.succeed()

        def other(j, t):
            yield env.timeout(t)
            log.append(("other", j, env.now))

        for i, (d, k) in enumerate(sleepers):
            env.process(sleeper(i, d, k))
        for j, t in enumerate(others):
            env.process(other(j, t))
        env.run()
        return log

    assert trace(False) == trace(True)


def _counting_steps(sim: Simulation) -> list[int]:
    """Count the events sim's clock processes (SimPy's env.run calls env.step once per event)."""
    count = [0]
    step = sim.env.step

    def counted() -> None:
        count[0] += 1
        step()

    sim.env.step = counted
    return count


def _folded_and_stepped(dep, reqs, until_s):
    folded, plain = Simulation(dep, reqs), Simulation(dep, reqs)
    n_folded, n_plain = _counting_steps(folded), _counting_steps(plain)
    a = folded.run(until_s=until_s)
    plain.env.run(until=until_s)
    b = plain._result(0.0)
    _tables_equal(a, b)
    for k in a.steps:
        np.testing.assert_array_equal(a.steps[k], b.steps[k], err_msg=k)
    return a, n_folded[0], n_plain[0]


def test_a_lone_replica_folding_steps_equals_stepping_them():
    """Simulation.run lets a lone replica apply a step as it starts (nothing can happen before its
    end) and sleep once through the stretch after it; a clock driven by env.run does not (the
    replica cannot see its stop time). Both give the very same tables, with fewer events folded,
    and so do runs stopped in the middle of steps (until_s). Arrivals on a 10 ms grid, some at
    one instant, land on and next to step ends."""
    rng = np.random.default_rng(3)
    t = np.round(np.cumsum(rng.exponential(0.08, 150)), 2)
    t[40:44] = t[40]
    reqs = [req(i, float(x), int(rng.integers(20, 1500)), int(rng.integers(1, 300))) for i, x in enumerate(t)]
    dep = deployment(num_gpu_blocks_override=2500)
    full, n_folded, n_plain = _folded_and_stepped(dep, reqs, None)
    assert n_folded < n_plain - 50, (n_folded, n_plain)
    prefills = np.flatnonzero(full.steps["num_prefill_tokens"] > 0)
    for row in prefills[5::len(prefills) // 6]:  # stopped half-way through a prefill step
        _folded_and_stepped(dep, reqs, float(full.steps["t_start_s"][row] + full.steps["total_s"][row] / 2))


def _arrivals_on_prefill_ends(dep, n: int, seed: int) -> list[Request]:
    """Requests arriving at the very clock time a prefill step ends (most of them; some in twos,
    one instant), where SimPy's order of equal-time events decides which step takes them: each
    placed at the end of the step that prefills the one before (a run without it tells when)."""
    rng = np.random.default_rng(seed)
    reqs = [req(0, 0.0, 600, 40)]
    while len(reqs) < n:
        plain = Simulation(dep, reqs)
        plain.env.run()
        steps = plain._result(0.0).steps
        ends = steps["t_start_s"] + steps["total_s"]  # (SimPy's own sum t0 + dt)
        later = ends[(steps["num_prefill_tokens"] > 0) & (ends > reqs[-1].arrival_s)]
        t = float(later[0]) if later.size and rng.random() < 0.8 else reqs[-1].arrival_s + float(rng.exponential(0.1))
        for _ in range(1 + (rng.random() < 0.3)):
            reqs.append(req(len(reqs), t, int(rng.integers(20, 1500)), int(rng.integers(2, 200))))
    return reqs


@pytest.mark.parametrize("seed", [0, 2])
def test_folding_keeps_simpy_order_at_equal_times(seed):
    """Arrivals landing exactly on step ends: a lone replica that folds steps (Simulation.run)
    gives the very tables of one driven by env.run, which folds none."""
    dep = deployment(num_gpu_blocks_override=2500)
    _folded_and_stepped(dep, _arrivals_on_prefill_ends(dep, 30, seed), None)
