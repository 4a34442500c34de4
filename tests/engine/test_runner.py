"""Runner input preparation against hand-computed batches; KV sizing; the timed replay and metrics."""

from __future__ import annotations

import json
import types

import pytest
import torch

from engine.core.config import EngineArgs
from engine.core.cuda_graphs import decode_graph_buckets
from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.metrics import EngineMetrics, build_1_2_5_buckets
from engine.model import LlamaModel
from engine.replay import replay
from engine.runner import ModelRunner

TINY = get_model("tiny")


def runner(**kw) -> ModelRunner:
    m = LlamaModel(TINY, max_positions=256, seed=0)
    args = {"block_size": 4, "max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 64}
    return ModelRunner(m, **(args | kw))


def sched(rid, new, computed, blocks, samples):
    return types.SimpleNamespace(request_id=rid, num_new_tokens=new, num_computed_tokens=computed,
                                 samples=samples, block_ids=blocks, num_spec_tokens=0)


def test_prepare_mixed_batch_hand_computed():
    r = runner()
    # Request 7: prefill chunk of tokens 4..9 (10 prompt tokens, first 4 cached), blocks [5, 2, 9].
    # Request 3: a decode at position 6 (7 tokens known), blocks [0, 11].
    toks = {7: list(range(100, 110)), 3: [50, 51, 52, 53, 54, 55, 56]}
    inp = r.prepare([sched(7, 6, 4, [5, 2, 9], True), sched(3, 1, 6, [0, 11], True)], toks)
    assert inp.num_tokens == 7 and inp.graph_size is None
    assert inp.sample_request_ids == [7, 3]
    assert r.d_input_ids[:7].tolist() == [104, 105, 106, 107, 108, 109, 56]
    assert r.d_positions[:7].tolist() == [4, 5, 6, 7, 8, 9, 6]
    # slot = block_ids[pos // 4] * 4 + pos % 4
    assert r.d_slots[:7].tolist() == [8, 9, 10, 11, 36, 37, 46]
    assert r.d_qsl[:3].tolist() == [0, 6, 7]
    assert r.d_seq_lens[:2].tolist() == [10, 7]
    assert r.d_logits_idx[:2].tolist() == [5, 6]
    assert r.d_block_tables[0, :3].tolist() == [5, 2, 9] and r.d_block_tables[1, :2].tolist() == [0, 11]
    assert (inp.max_query_len, inp.max_seq_len) == (6, 10)


def test_prepare_chunk_that_does_not_sample_and_inflight_gather():
    r = runner()
    toks = {1: list(range(20, 40)), 2: [60, 61, 62]}  # request 2's 4th token is still on the device
    prev_tokens = torch.tensor([9, 8, 77])
    inp = r.prepare([sched(1, 8, 0, [3, 4], False), sched(2, 1, 3, [6], True)], toks,
                    inflight=({2: 2, 5: 0}, prev_tokens))
    assert inp.sample_request_ids == [2]
    assert r.d_input_ids[:9].tolist() == list(range(20, 28)) + [77]
    assert r.d_logits_idx[:1].tolist() == [8]
    with pytest.raises(RuntimeError, match="unknown"):
        r.prepare([sched(2, 1, 3, [6], True)], toks)  # no inflight info: the token is missing


def test_decode_graph_buckets():
    assert decode_graph_buckets(4) == [1, 2, 4]
    assert decode_graph_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert decode_graph_buckets(256)[-3:] == [240, 248, 256]


def test_cpu_kv_sizing():
    r = runner(max_num_seqs=2, max_model_len=64)
    assert r.block_bytes() == 2 * 2 * 4 * 2 * 16 * 4  # K+V, layers, block, kv heads, head dim, fp32
    assert r.allocate_kv_cache(cpu_kv_cache_bytes=10 * r.block_bytes()) == 10
    assert r.kv_caches.shape == (2, 2, 10, 4, 2, 16)
    # Capped at what max_num_seqs full-length sequences could use (2 x 16 blocks + 1).
    assert runner(max_num_seqs=2).allocate_kv_cache(cpu_kv_cache_bytes=1 << 30) == 33
    with pytest.raises(ValueError, match="gpu-memory-utilization"):
        runner().allocate_kv_cache(cpu_kv_cache_bytes=1)


def test_metric_buckets_follow_vllm():
    assert build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)


def test_replay_honors_arrivals_and_writes_metrics(tmp_path):
    core = EngineCore(EngineArgs(model="tiny", device="cpu", max_model_len=128, block_size=4,
                                   max_num_batched_tokens=32, seed=0))
    reqs = [Request(0, 0.0, 9, 4, (1, 2, 3), hash_block_size=4),
            Request(1, 0.25, 9, 3, (1, 2, 4), hash_block_size=4),  # shares 8 prompt tokens with 0
            Request(2, 0.25, 120, 20, tuple(range(30)), hash_block_size=4)]  # 140 > max_model_len
    metrics = EngineMetrics("tiny", 128)
    res = replay(core, reqs, metrics=metrics, trace_file=tmp_path / "steps.jsonl")
    rows = {r["request_id"]: r for r in res.request_rows()}
    assert rows[2]["status"] == "rejected" and "max_model_len" in rows[2]["finish_reason"]
    assert rows[0]["num_output_tokens"] == 4 and rows[1]["num_output_tokens"] == 3
    assert rows[1]["arrival_s"] == 0.25
    # Request 1 was not admitted before it arrived: its first step starts after 0.25 s.
    first_step_of_1 = min((s for s in res.step_rows() if s["t_start_s"] >= 0.25), key=lambda s: s["t_start_s"])
    # ... and it was scheduled by that step: queued from its arrival to the end of that schedule()
    assert rows[1]["queue_s"] == pytest.approx(
        first_step_of_1["t_start_s"] + first_step_of_1["schedule_s"] - 0.25, abs=1e-9)
    assert rows[1]["ttft_s"] >= rows[1]["queue_s"] and rows[1]["e2e_s"] >= rows[1]["ttft_s"]
    assert rows[1]["num_cached_tokens"] == 8
    assert rows[0]["tpot_s"] == pytest.approx((rows[0]["finish_s"] - rows[0]["first_token_s"]) / 3)
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert len(lines) == len(res.step_rows())
    assert sum(json.loads(x)["num_output_tokens"] for x in lines) == 7
    s = res.summary().to_json_dict()
    assert s["completed"] == 2 and s["rejected"] == 1 and s["total_output_tokens"] == 7
    assert s["prefix_cache_hit_rate"] == pytest.approx(8 / 18)
    metrics.write(str(tmp_path / "metrics.prom"))
    text = (tmp_path / "metrics.prom").read_text()
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="tiny"}' in text
    assert 'vllm:generation_tokens_total{model_name="tiny"} 7.0' in text
    assert 'vllm:prefix_cache_hits_total{model_name="tiny"} 8.0' in text
    assert 'vllm:request_success_total{finished_reason="length",model_name="tiny"} 2.0' in text
    assert "vllm:admission_rejections_total" in text
    assert 'vllm:iteration_tokens_total_bucket{le="16384.0",model_name="tiny"}' in text
