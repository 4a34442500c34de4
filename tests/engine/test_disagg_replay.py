"""Disaggregated prefill across two CPU processes (gloo), tiny model: the decode instance's
greedy tokens equal an aggregated run's, every KV block is freed exactly once on both sides, a
transfer record's bytes are its blocks x the hand-computed block bytes, and a prefill instance
killed mid-transfer leaves every request failed with a reason (none lost, nothing hung) and
the decode pool intact. Every wait inside replay_disagg has a timeout."""

from __future__ import annotations

import math
import time

import pytest

from engine.core.config import EngineArgs
from engine.core.disagg_records import DisaggSplit
from engine.core.records import REQUEST_COLUMNS, STEP_COLUMNS
from engine.core.request import Request, materialize_prompt
from engine.disagg.router import Deployment, Fault, replay_disagg
from engine.engine_loop import EngineCore
from engine.sampling import SamplingParams

BLOCK = 4
ARGS = EngineArgs(model="tiny", device="cpu", max_model_len=256, block_size=BLOCK, num_gpu_blocks_override=48,
                  max_num_seqs=8, max_num_batched_tokens=64)
# tiny: 2 layers, 2 KV heads of 16, float32 on CPU; K and V
TINY_BLOCK_BYTES = 2 * 2 * BLOCK * 2 * 16 * 4


def _requests() -> list[Request]:
    # prompts 9..44 tokens (hash blocks of 16); requests 4 and 5 share request 3's first 16 tokens,
    # so both instances see prefix-cache hits; one prompt of 1 token (nothing to transfer but a block)
    lens = [9, 17, 30, 44, 40, 33, 1]
    hashes = [(10,), (20, 21), (30, 31), (40, 41, 42), (40, 51, 52), (40, 61, 62), (70,)]
    return [Request(i, 0.02 * i, n, 4 + i % 3, h) for i, (n, h) in enumerate(zip(lens, hashes))]


def _aggregated_tokens(reqs: list[Request]) -> dict[int, list[int]]:
    core = EngineCore(ARGS)
    for r in reqs:
        core.add_request(r, SamplingParams(max_tokens=r.output_len, ignore_eos=True),
                         materialize_prompt(r, core.spec.vocab_size), arrival_s=0.0)
    out: dict[int, list[int]] = {}
    while core.has_unfinished():
        for st in core.step().finished:
            out[st.request.request_id] = st.output_token_ids
    return out


def _cut_requests() -> list[Request]:
    # 12 requests of 40-token prompts at once, 140 output tokens each (45 of the 48 blocks: they
    # take turns), cut off after 0.1 s: 40 output tokens each finished inside 0.3 s on a fast box
    return [Request(i, 0.0, 40, 140, (100 + i, 200 + i, 300 + i)) for i in range(12)]


@pytest.fixture(scope="module")
def disagg_runs():
    """Two replays of one deployment (each starts over from empty pools), then a third cut off by
    max_wall_s (on this deployment rather than a new one: two instance processes fewer to start)."""
    reqs = _requests()
    with Deployment(ARGS, split="1:1", warm_up=False, timeout_s=60, transfer_timeout_s=20) as dep:
        return reqs, dep.replay(reqs), dep.replay(reqs, time_scale=0.5), dep.replay(_cut_requests(), max_wall_s=0.1)


@pytest.fixture(scope="module")
def disagg_run(disagg_runs):
    return disagg_runs[:2]


def test_greedy_tokens_equal_an_aggregated_run(disagg_run):
    reqs, res = disagg_run
    assert res.errors == []
    expected = _aggregated_tokens(reqs)
    assert res.output_token_ids == expected
    # the prefill side's token is the decode side's first (it recomputes the last prompt token)
    assert res.first_token_ids == {rid: toks[0] for rid, toks in expected.items()}
    r = res.requests
    assert r["status"].tolist() == ["finished"] * len(reqs)
    assert r["replica"].tolist() == [1] * len(reqs)  # decode instance: replica P + 0
    assert (r["num_output_tokens"] == r["output_len"]).all()
    assert (r["ttft_s"] > r["kv_transfer_s"]).all() and (r["kv_transfer_s"] > 0).all()


def test_every_block_freed_exactly_once_on_both_sides(disagg_run):
    _, res = disagg_run
    assert sorted(res.pools) == [0, 1]
    for pool in res.pools.values():
        assert pool.intact, pool
        assert pool.num_free_blocks == 48
    steps = res.steps
    assert set(steps["replica"].tolist()) == {0, 1}
    # the prefill instance only prefills: no decode rows there
    pre = steps["replica"] == 0
    assert steps["num_decode_seqs"][pre].sum() == 0
    assert tuple(steps) == STEP_COLUMNS and tuple(res.requests) == REQUEST_COLUMNS


def test_transfer_records_bytes_are_blocks_times_block_bytes(disagg_run):
    reqs, res = disagg_run
    assert [t.request_id for t in res.transfers] == [r.request_id for r in reqs]
    for t, r in zip(res.transfers, reqs):
        assert t.status == "done" and (t.src_replica, t.dst_replica) == (0, 1)
        assert t.num_blocks == math.ceil(r.prompt_len / BLOCK)
        assert t.block_bytes == TINY_BLOCK_BYTES
        assert t.bytes == t.num_blocks * TINY_BLOCK_BYTES
        assert (t.mode, t.transport, t.num_descriptors) == ("whole", "gloo", 1)
        # one clock: prefill's token, then the link, then the decode side's first step
        assert t.ready_s <= t.send_start_s <= t.recv_end_s <= t.first_step_s
        assert t.transfer_s >= 0 and t.handover_s >= 0


def test_the_prefill_side_sends_before_its_next_step(disagg_run):
    """The KV leaves in the loop turn that finished the prompt: no step of the prefill instance
    starts between a prompt's first token and its send (waiting for the router's word meant
    waiting out the next prefill step: up to 0.3 s of an 8B model's 8K-token chunk on the H200)."""
    _, res = disagg_run
    starts = sorted(res.steps["t_start_s"][res.steps["replica"] == 0].tolist())
    assert res.transfers
    for t in res.transfers:
        assert not any(t.ready_s < s < t.send_start_s for s in starts), t


def test_a_decode_instance_is_chosen_at_arrival_and_kept():
    """1:2: the router picks the least-loaded decode instance when a request arrives; the
    transfer goes there and the request decodes there."""
    reqs = _requests()
    res = replay_disagg(ARGS, reqs, split="1:2", warm_up=False, timeout_s=60, honor_arrivals=False)
    assert res.errors == [] and res.output_token_ids == _aggregated_tokens(reqs)
    by_req = {t.request_id: t.dst_replica for t in res.transfers}
    decoded_on = dict(zip(res.requests["request_id"].tolist(), res.requests["replica"].tolist()))
    assert by_req == decoded_on
    assert set(by_req.values()) == {1, 2}  # all at once: least-loaded alternates
    assert all(p.intact for p in res.pools.values())


def test_killed_prefill_mid_transfer_fails_requests_and_keeps_the_decode_pool():
    reqs = _requests()[:3]
    t0 = time.perf_counter()
    # layer by layer (2 messages); the prefill instance dies after posting the first
    res = replay_disagg(ARGS, reqs, split="1:1", mode="layer", warm_up=False, timeout_s=60,
                        transfer_timeout_s=20, fault=Fault(replica=0, after_pieces=1))
    assert time.perf_counter() - t0 < 50  # noticed by exit code, not by a timeout
    r = res.requests
    assert r["status"].tolist() == ["unfinished"] * 3  # none finished, none lost
    reasons = r["finish_reason"].tolist()
    assert all(x.startswith("failed: ") for x in reasons), reasons
    # the router's news of the death, or gloo's closed connection, whichever came first
    assert reasons[0].startswith("failed: kv transfer failed (")
    assert "died" in reasons[0] or "Connection closed by peer" in reasons[0]
    assert any("exited with code 17" in e for e in res.errors)
    assert list(res.pools) == [1] and res.pools[1].intact
    first = res.transfers[0]
    assert first.status == "failed" and first.num_descriptors == 2


def test_a_deployment_replays_again_from_empty_pools(disagg_runs):
    reqs, first, second, _ = disagg_runs
    assert second.output_token_ids == first.output_token_ids
    assert all(p.intact for p in second.pools.values()) and len(second.transfers) == len(reqs)
    # the second replay's clock starts at 0 again, its arrivals at half the times
    assert second.requests["arrival_s"].tolist() == pytest.approx([0.01 * i for i in range(len(reqs))])
    assert second.steps["t_start_s"].min() >= 0


def test_aggregated_replicas_serve_the_same_tokens():
    reqs = _requests()
    with Deployment(ARGS, split=None, num_replicas=2, warm_up=False, timeout_s=60) as dep:
        res = dep.replay(reqs, honor_arrivals=False)  # all at once: least-loaded alternates
    assert res.output_token_ids == _aggregated_tokens(reqs)
    assert res.transfers == [] and set(res.requests["replica"].tolist()) == {0, 1}
    assert all(p.intact for p in res.pools.values()) and res.meta["disaggregation"] is None


def test_killed_decode_mid_transfer_fails_requests_and_releases_prefill_blocks():
    reqs = _requests()[:3]
    res = replay_disagg(ARGS, reqs, split="1:1", warm_up=False, timeout_s=60, transfer_timeout_s=20,
                        fault=Fault(replica=1, after_pieces=0))
    r = res.requests
    assert r["status"].tolist() == ["unfinished"] * 3
    why = ("failed: decode instance 1 died during the kv transfer", "failed: kv transfer failed")
    assert all(x.startswith(why) for x in r["finish_reason"].tolist())
    # the prefill side released every held block once its sends failed: its pool is whole
    assert list(res.pools) == [0] and res.pools[0].intact
    assert all(t.status == "failed" for t in res.transfers)


def test_two_prefill_instances_over_ipc_serve_the_same_tokens():
    # 2:1, the KV through shared memory (CUDA IPC on GPUs): both prefill instances send
    reqs = _requests()
    res = replay_disagg(ARGS, reqs, split="2:1", transport="ipc", warm_up=False, timeout_s=60,
                        honor_arrivals=False)  # all at once: both prefill instances get requests
    assert res.errors == [] and res.output_token_ids == _aggregated_tokens(reqs)
    assert {t.src_replica for t in res.transfers} == {0, 1} and {t.dst_replica for t in res.transfers} == {2}
    assert all(t.transport == "ipc" and t.num_descriptors == 1 for t in res.transfers)
    assert sorted(res.pools) == [0, 1, 2] and all(p.intact for p in res.pools.values())


def test_split_parse():
    assert DisaggSplit.parse("3:2") == DisaggSplit(3, 2)
    assert [DisaggSplit(2, 1).role_of(i) for i in range(3)] == ["prefill", "prefill", "decode"]
    for bad in ("1", "0:1", "a:b", "1:2:3"):
        with pytest.raises(ValueError, match="expected P:D"):
            DisaggSplit.parse(bad)


def test_a_replay_cut_off_by_max_wall_s_leaves_both_pools_whole(disagg_runs):
    res = disagg_runs[3]
    status = res.requests["status"].tolist()
    assert "unfinished" in status and len(status) == 12
    assert set(status) <= {"finished", "unfinished"}
    assert sorted(res.pools) == [0, 1] and all(p.intact for p in res.pools.values())
