"""Hand-computed schedules and the plain cases of the vLLM-V1-style scheduler."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.core.request import Request
from engine.core.scheduler import FINISHED, REJECTED, Scheduler, SchedulerConfig


def req(rid: int, prompt: int, out: int, *, hash_ids=None, hbs: int = 4, arrival: float | None = None,
        priority: int = 0) -> Request:
    if hash_ids is None:
        hash_ids = tuple(1000 * (rid + 1) + j for j in range(-(-prompt // hbs)))
    return Request(rid, float(rid if arrival is None else arrival), prompt, out, tuple(hash_ids),
                   hash_block_size=hbs, priority=priority)


def run_all(s: Scheduler, sampled=None, max_steps: int = 10_000):
    """Step to completion; returns [(step composition)], results."""
    steps, results = [], []
    for _ in range(max_steps):
        if not s.has_unfinished():
            break
        out = s.schedule()
        steps.append([(x.request_id, x.num_new_tokens) for x in out.scheduled])
        results += s.update_from_output(out, sampled)
        s.check_invariants()
    assert not s.has_unfinished()
    return steps, results


def test_import_does_not_pull_torch():
    code = "import sys, engine.core.scheduler, engine.core.block_pool; assert 'torch' not in sys.modules; " \
           "assert 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_three_requests_budget_8_chunked_exact_steps():
    # block 4, budget 8. Prompts 5, 6, 3; outputs 3, 2, 4.
    # step 1: r0 prefill 5 (samples), r1 chunk 3 (budget exhausted)
    # step 2: r0 decode 1, r1 last chunk 3, r2 prefill 3
    # step 3: decodes of all three; r0 reaches 3 tokens, r1 2 tokens: both finish
    # steps 4, 5: r2 alone until its 4th token
    cfg = SchedulerConfig(max_num_batched_tokens=8, num_gpu_blocks=20, block_size=4)
    s = Scheduler(cfg)
    for r in (req(0, 5, 3), req(1, 6, 2), req(2, 3, 4)):
        s.add_request(r)
    steps, results = run_all(s)
    assert steps == [
        [(0, 5), (1, 3)],
        [(0, 1), (1, 3), (2, 3)],
        [(0, 1), (1, 1), (2, 1)],
        [(2, 1)],
        [(2, 1)],
    ]
    assert [(r.request_id, r.num_generated, r.reason) for r in results] == [
        (0, 3, "length"), (1, 2, "length"), (2, 4, "length")]
    st = s.stats
    assert st.num_free_blocks == 20 and st.kv_usage == 0.0 and s.kv_usage == 0.0
    assert st.num_prompt_tokens_computed == 14 and st.num_generated_tokens == 9


def test_output_fields_of_first_step():
    cfg = SchedulerConfig(max_num_batched_tokens=8, num_gpu_blocks=20, block_size=4,
                          enable_prefix_caching=False)
    s = Scheduler(cfg)
    s.add_request(req(0, 5, 3))
    s.add_request(req(1, 6, 2))
    out = s.schedule()
    a, b = out.scheduled
    assert (a.num_new_tokens, a.num_computed_tokens, a.is_prefill, a.samples) == (5, 0, True, True)
    assert (b.num_new_tokens, b.num_computed_tokens, b.is_prefill, b.samples) == (3, 0, True, False)
    assert a.block_ids == [0, 1] and a.new_block_ids == (0, 1)
    assert b.block_ids == [2] and b.new_block_ids == (2,)
    assert out.num_batched_tokens == 8 and out.num_prefill_tokens == 8 and out.num_prefill_seqs == 2
    assert out.sum_prefill_context == 8 and out.num_blocks_allocated == 3
    s.update_from_output(out, {0: 1})
    out = s.schedule()
    a, b = out.scheduled
    assert (a.request_id, a.num_new_tokens, a.num_computed_tokens, a.is_prefill) == (0, 1, 5, False)
    assert a.new_block_ids == ()  # position 5 is inside block 1
    assert (b.request_id, b.num_new_tokens, b.num_computed_tokens, b.samples) == (1, 3, 3, True)
    assert b.new_block_ids == (3,)
    assert out.num_decode_seqs == 1 and out.sum_decode_context == 6
    assert out.sum_prefill_context == 6


def test_chunked_prefill_off_prefill_first():
    # budget 8 -> raised to max_model_len 16 (vLLM rule). Whole prompts; a step that admits
    # prompts does no decode.
    cfg = SchedulerConfig(max_num_batched_tokens=8, max_model_len=16, num_gpu_blocks=20,
                          block_size=4, enable_chunked_prefill=False)
    assert cfg.max_num_batched_tokens == 16
    s = Scheduler(cfg)
    s.add_request(req(0, 10, 2))
    s.add_request(req(1, 9, 2))  # 10 + 9 > 16: waits for the next step
    steps, _ = run_all(s)
    assert steps == [[(0, 10)], [(1, 9)], [(0, 1), (1, 1)]]


def test_long_prefill_threshold_caps_chunks():
    cfg = SchedulerConfig(max_num_batched_tokens=100, num_gpu_blocks=50, block_size=4,
                          long_prefill_token_threshold=6)
    s = Scheduler(cfg)
    s.add_request(req(0, 14, 1))
    s.add_request(req(1, 4, 1))
    steps, _ = run_all(s)
    assert steps == [[(0, 6), (1, 4)], [(0, 6)], [(0, 2)]]


def test_max_num_seqs_caps_running():
    cfg = SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=2, num_gpu_blocks=50, block_size=4)
    s = Scheduler(cfg)
    for i in range(3):
        s.add_request(req(i, 4, 2))
    steps, _ = run_all(s)
    assert steps == [[(0, 4), (1, 4)], [(0, 1), (1, 1)], [(2, 4)], [(2, 1)]]


def test_rejections_have_reasons_and_are_reported_once():
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=40, num_gpu_blocks=4, block_size=4)
    s = Scheduler(cfg)
    s.add_request(req(0, 30, 20))  # 50 > max_model_len
    s.add_request(req(1, 15, 3))   # 17 tokens in KV -> 5 blocks > 4
    s.add_request(req(2, 13, 4))   # 16 tokens in KV -> 4 blocks: fits exactly
    out = s.schedule()
    assert [rid for rid, _ in out.rejected] == [0, 1]
    assert "max_model_len" in out.rejected[0][1] and "num_gpu_blocks" in out.rejected[1][1]
    res = s.update_from_output(out)
    assert [(r.request_id, r.status) for r in res] == [(0, REJECTED), (1, REJECTED)]
    _, rest = run_all(s)
    assert [(r.request_id, r.status) for r in rest] == [(2, FINISHED)]
    assert s.stats.num_rejected == 2


def test_protocol_errors_are_clear():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4))
    s.add_request(req(0, 4, 2))
    with pytest.raises(ValueError, match="already added"):
        s.add_request(req(0, 4, 2))
    out = s.schedule()
    with pytest.raises(RuntimeError, match="update_from_output"):
        s.schedule()
    with pytest.raises(ValueError, match="no sampled entry"):
        s.update_from_output(out, {})


def test_bad_sampled_changes_nothing():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4))
    s.add_request(req(0, 4, 2))
    out = s.schedule()
    with pytest.raises(ValueError, match="expected 1..1"):
        s.update_from_output(out, {0: 2})
    assert s.update_from_output(out, {0: 1}) == []


def test_engine_requests_need_token_ids_back():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4))
    s.add_request(req(0, 3, 2), prompt_token_ids=[5, 6, 7])
    out = s.schedule()
    with pytest.raises(ValueError, match="token ids"):
        s.update_from_output(out)
    with pytest.raises(ValueError, match="token ids"):
        s.update_from_output(out, {0: 1})
    with pytest.raises(ValueError, match="do not sample"):
        s.update_from_output(out, {0: [9], 5: [1]})
    assert s.update_from_output(out, {0: [9]}) == []
    assert s.requests[0].token_ids == [5, 6, 7, 9]


def test_stop_on_plain_decode_and_on_last_token():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4))
    s.add_request(req(0, 2, 5), prompt_token_ids=[5, 6])
    s.add_request(req(1, 2, 2), prompt_token_ids=[5, 7])
    out = s.schedule()
    assert s.update_from_output(out, {0: [3], 1: [3]}) == []
    out = s.schedule()
    res = s.update_from_output(out, {0: [2], 1: [2]}, stopped={0, 1})
    # request 1 stopped on its last allowed token: the stop wins the reason
    assert [(r.request_id, r.reason, r.num_generated) for r in res] == [(0, "stop", 2), (1, "stop", 2)]


def test_prompt_token_ids_from_the_request_and_length_checked():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=2))
    r = Request(0, 0.0, 3, 1, (1,), hash_block_size=4, prompt_token_ids=(4, 5, 6))
    s.add_request(r)
    assert s.requests[0].token_ids == [4, 5, 6]
    with pytest.raises(ValueError, match="prompt_token_ids for prompt_len"):
        s.add_request(req(1, 3, 1), prompt_token_ids=[1, 2])


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        SchedulerConfig(num_gpu_blocks=0)
    with pytest.raises(ValueError, match="scheduling_policy"):
        SchedulerConfig(num_gpu_blocks=4, scheduling_policy="lifo")
    with pytest.raises(ValueError, match="max_num_seq"):
        SchedulerConfig(num_gpu_blocks=4, max_num_seq=3)  # typo: extra fields are refused


def test_requests_added_during_a_step():
    # the simulator adds arrivals while a step runs: they wait for the next schedule(),
    # and a rejection made then is reported by this step's update, in out.rejected too
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4, max_model_len=64))
    s.add_request(req(0, 4, 2))
    out = s.schedule()
    s.add_request(req(1, 4, 2))
    s.add_request(req(2, 60, 10))  # too long
    res = s.update_from_output(out)
    assert [(r.request_id, r.status) for r in res] == [(2, REJECTED)]
    assert [rid for rid, _ in out.rejected] == [2]
    out = s.schedule()
    assert [x.request_id for x in out.scheduled] == [0, 1] and out.rejected == []


def test_running_context_lens_and_kv_usage_mid_run():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8, num_gpu_blocks=20, block_size=4))
    for r in (req(0, 5, 3), req(1, 6, 2)):
        s.add_request(r)
    s.update_from_output(s.schedule())
    assert s.running_context_lens() == [5, 3]
    assert s.kv_usage == pytest.approx(3 / 20)  # blocks: 2 for request 0, 1 for request 1


def test_stopped_is_per_request_for_the_same_token():
    """Both requests sample token 2 in one step: it stops request 0 (its caller said so) and
    not request 1 (ignore_eos), which runs on to its length."""
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4))
    s.add_request(req(0, 3, 5), prompt_token_ids=[5, 6, 7])
    s.add_request(req(1, 3, 2), prompt_token_ids=[5, 6, 8])
    out = s.schedule()
    res = s.update_from_output(out, {0: [2], 1: [2]}, stopped={0})
    assert [(r.request_id, r.reason, r.num_generated) for r in res] == [(0, "stop", 1)]
    assert s.requests[0].status == FINISHED and s.num_running == 1
    s.check_invariants()
    out = s.schedule()
    assert [x.request_id for x in out.scheduled] == [1]
    res = s.update_from_output(out, {1: [2]})
    assert [(r.request_id, r.reason, r.num_generated) for r in res] == [(1, "length", 2)]
    assert s.stats.num_free_blocks == 8


def test_stopped_must_name_sampling_requests():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4))
    s.add_request(req(0, 3, 5), prompt_token_ids=[5, 6, 7])
    out = s.schedule()
    with pytest.raises(ValueError, match=r"stopped names requests \[4\]"):
        s.update_from_output(out, {0: [9]}, stopped={4})
    assert s.update_from_output(out, {0: [9]}) == []  # nothing changed by the refused call


def test_finish_requests_between_steps():
    """Running: blocks freed; waiting: leaves the queue; finished: skipped; mid-step: refused."""
    s = Scheduler(SchedulerConfig(num_gpu_blocks=3, block_size=4, max_num_seqs=1))
    s.add_request(req(0, 6, 4), prompt_token_ids=[5, 6, 7, 8, 9, 10])
    s.add_request(req(1, 2, 4), prompt_token_ids=[5, 11])
    s.add_request(req(2, 2, 1), prompt_token_ids=[5, 12])
    out = s.schedule()
    with pytest.raises(RuntimeError, match="after update_from_output"):
        s.finish_requests([0])
    s.update_from_output(out, {0: [3]})
    assert s.stats.num_free_blocks == 1
    with pytest.raises(ValueError, match=r"unknown request ids \[9\]"):
        s.finish_requests([9])
    res = s.finish_requests([1, 0], "abort")
    assert [(r.request_id, r.reason, r.num_generated) for r in res] == [(1, "abort", 0), (0, "abort", 1)]
    assert s.num_running == 0 and s.num_waiting == 1 and s.stats.num_free_blocks == 3
    assert s.finish_requests([0, 1]) == []
    out = s.schedule()
    assert [x.request_id for x in out.scheduled] == [2]
    assert [r.request_id for r in s.update_from_output(out, {2: [4]})] == [2]
    assert not s.has_unfinished()
    s.check_invariants()


def test_forget_finished_drops_only_ended_requests():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4, max_num_seqs=1))
    s.add_request(req(0, 2, 1), prompt_token_ids=[5, 6])
    s.add_request(req(1, 2, 4), prompt_token_ids=[5, 7])
    out = s.schedule()
    assert [r.request_id for r in s.update_from_output(out, {0: [3]})] == [0]
    assert s.forget_finished([0, 1, 7]) == 1  # 1 is waiting, 7 unknown: both left alone
    assert sorted(s.requests) == [1]
    s.add_request(req(2, 2, 1), prompt_token_ids=[5, 8])  # the table keeps working
    while s.has_unfinished():
        out = s.schedule()
        s.update_from_output(out, {x.request_id: [4] for x in out.scheduled})
    assert s.forget_finished([1, 2]) == 2 and not s.requests
    s.check_invariants()


def test_finish_requests_priority_queue():
    s = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4, max_num_seqs=1,
                                  scheduling_policy="priority"))
    for rid in range(3):
        s.add_request(req(rid, 2, 1, arrival=float(rid)), prompt_token_ids=[5, 20 + rid])
    assert [r.request_id for r in s.finish_requests([1])] == [1]
    order = []
    while s.has_unfinished():
        out = s.schedule()
        order += [x.request_id for x in out.scheduled]
        s.update_from_output(out, {x.request_id: [4] for x in out.scheduled})
    assert order == [0, 2]
