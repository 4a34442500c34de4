"""`costline engine serve` driven by the OpenAI Python client (a client we did not write) against a
real uvicorn server on a free port, tiny model on the CPU.

References are independent of the server's code: token counts from the word tokenizer's rule
(one token per whitespace word, docs/serve.md), stop-string cuts from `str.find` on the full
greedy text, the scheduler's own block counts after a disconnect.
"""

from __future__ import annotations

import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from engine.core.config import EngineArgs
from engine.serve.server import ServerThread, build_served_model

PROMPT = "the quick brown fox jumps over the lazy dog"  # 9 words = 9 tokens


def _model(**flags):
    cfg = EngineArgs(model="tiny", device="cpu", usage_context="api_server", seed=0, **flags)
    return build_served_model(cfg, ["tiny", "costline/tiny"], warm_up=False)


@pytest.fixture(scope="module")
def server():
    model = _model()
    with ServerThread(model) as url:
        yield model, url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="none", max_retries=0, timeout=60)


def _greedy(client, prompt=PROMPT, n=12, **kw):
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                     extra_body={"ignore_eos": True}, **kw)


def test_models_lists_every_served_name(client):
    assert [m.id for m in client.models.list().data] == ["tiny", "costline/tiny"]


def test_completion_counts_and_text(client):
    out = _greedy(client)
    assert out.usage.prompt_tokens == len(PROMPT.split())
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == 12 + len(PROMPT.split())
    assert len(out.choices[0].text.split()) == 12  # one word per generated token
    assert out.choices[0].finish_reason == "length"


def test_streaming_equals_non_streaming(client):
    full = _greedy(client).choices[0].text
    chunks = list(_greedy(client, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 12 and usage[0].prompt_tokens == 9
    assert chunks[-1].usage is not None and not chunks[-1].choices  # the usage chunk comes last


def test_token_id_prompt(client):
    out = client.completions.create(model="tiny", prompt=[17, 18, 19, 20], max_tokens=3, temperature=0)
    assert out.usage.prompt_tokens == 4 and out.usage.completion_tokens == 3


def test_chat_streaming_and_not(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}]
    kw = {"model": "costline/tiny", "messages": msgs, "max_tokens": 7, "temperature": 0}
    out = client.chat.completions.create(**kw)
    # the template: "system: be brief\nuser: <prompt>\nassistant:" -> 3 + 10 + 1 words
    assert out.usage.prompt_tokens == 3 + 1 + len(PROMPT.split()) + 1
    assert out.usage.completion_tokens == 7
    assert out.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 7


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_text_and_ends_request(client, stream):
    full = _greedy(client, n=20).choices[0].text
    words = full.split()
    stop = " " + words[5]  # the sixth token's text (or an earlier token that contains it)
    cut = full.find(stop)
    # tokens generated up to the one whose text completes the stop string
    ends = [sum(len(" " + w) for w in words[: i + 1]) for i in range(len(words))]
    want_tokens = next(i + 1 for i, e in enumerate(ends) if e >= cut + len(stop))
    if stream:
        chunks = list(_greedy(client, n=20, stop=[stop], stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        n_out = chunks[-1].usage.completion_tokens
    else:
        out = _greedy(client, n=20, stop=stop)
        text, finish, n_out = out.choices[0].text, out.choices[0].finish_reason, out.usage.completion_tokens
    assert text == full[:cut]
    assert finish == "stop"
    assert n_out == want_tokens


def test_seed_makes_sampling_repeatable(client):
    def sample(seed):
        return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0,
                                         seed=seed).choices[0].text

    a, b, c = sample(7), sample(7), sample(8)
    assert a == b
    assert a != c  # 16 draws from 512 ids: equal by chance with probability ~0


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "nope", "prompt": "a"}, 404, "model"),
    ({"prompt": "a " * 5000, "max_tokens": 1}, 400, "prompt"),  # 5000 tokens > max_model_len 4096
    ({"prompt": "a b", "max_tokens": 4095}, 400, "max_tokens"),  # 2 + 4095 > 4096
    ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "a", "temperature": -1}, 400, "temperature"),
    ({"prompt": [5, 100000]}, 400, "prompt"),  # outside the vocabulary
    ({"prompt": ""}, 400, "prompt"),
    ({"max_tokens": 3}, 400, "prompt"),  # missing
    ({"prompt": ["a", "b"]}, 400, "prompt"),  # a batch of prompts
])
def test_bad_requests_get_openai_errors(server, body, status, param):
    r = httpx.post(server[1] + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == status and err["param"] == param and err["message"]


def test_bad_json_and_client_error_classes(server, client):
    r = httpx.post(server[1] + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="a", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[], max_tokens=1)
    assert httpx.get(server[1] + "/health").status_code == 200  # still serving


def _wait_idle(model, deadline_s=60.0):
    """Until the engine thread has nothing left (bounded: a hung request fails the test)."""
    core, t = model.engine.core, time.monotonic()
    while (core.has_unfinished() or model.engine.num_in_flight) and time.monotonic() - t < deadline_s:
        time.sleep(0.05)
    time.sleep(0.1)  # the thread's last step has returned


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_disconnect_mid_stream_frees_everything(async_scheduling):
    model = _model(async_scheduling=async_scheduling, enable_prefix_caching=False)
    with ServerThread(model) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        streams = [client.completions.create(model="tiny", prompt=PROMPT + f" {i}", max_tokens=4000,
                                             temperature=0, stream=True, extra_body={"ignore_eos": True})
                   for i in range(3)]
        for s in streams:
            for _, _chunk in zip(range(3), s):
                pass
            s.close()  # the client goes away mid-stream
        _wait_idle(model)
        sched = model.engine.core.scheduler
        assert not model.engine.core.has_unfinished()
        assert sched.num_running == 0 and sched.num_waiting == 0
        stats = sched.stats
        assert stats.num_free_blocks == stats.num_gpu_blocks  # every KV block back in the pool
        assert model.engine.num_in_flight == 0
        metrics = model.engine.metrics.text()  # what /metrics serves
        assert 'vllm:request_success_total{finished_reason="abort",model_name="tiny"} 3.0' in metrics
        # the engine's request table is emptied as requests end (no state kept per old request)
        out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0)
        assert out.usage.completion_tokens == 2
        _wait_idle(model)
        assert len(model.engine.core.requests) <= 1
        assert len(sched.requests) <= 1  # ended requests leave the scheduler's table too


def test_full_server_answers_503_with_retry_after():
    model = _model()
    model.engine.max_num_queued_reqs = 1
    with ServerThread(model) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        long = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4000, stream=True,
                                         extra_body={"ignore_eos": True})
        next(iter(long))  # in flight
        r = httpx.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
        long.close()
        _wait_idle(model)
        assert client.completions.create(model="tiny", prompt="a", max_tokens=1).usage.completion_tokens == 1


def test_metrics_carry_vllm_names(server, client):
    _greedy(client, n=4)
    text = httpx.get(server[1] + "/metrics").text
    for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
                 "vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:iteration_tokens_total_bucket", "vllm:request_success_total",
                 "python_gc_collections_total", "process_cpu_seconds_total"):
        assert name in text


def test_load_client_measures_every_token(server):
    """The load client (vLLM bench's measurement) against the live server: at most one SSE chunk
    per token (the server merges tokens a slow loop has queued, as vLLM does), so at most
    output_len - 1 gaps; lengths as sent and as the server counted."""
    import asyncio

    from engine.core.bench_format import RunInfo, bench_result
    from engine.serve.load_client import ClientRequest, arrival_offsets, run_load

    reqs = [ClientRequest(prompt=" ".join(f"w{i}x{j}" for j in range(5 + i)), prompt_len=5 + i, max_tokens=3 + i % 4)
            for i in range(8)]
    results, duration = asyncio.run(run_load(server[1], "tiny", reqs, arrival_offsets(8, 50.0, seed=1)))
    assert all(r.success for r in results), [r.error for r in results]
    assert [r.output_len for r in results] == [r.max_tokens for r in reqs]
    assert all(len(r.itls_s) <= r.output_len - 1 for r in results)
    assert all(len(r.generated_text.split()) == r.output_len for r in results)
    out = bench_result(results, duration, RunInfo(model_id="tiny", num_prompts=8, request_rate=50.0))
    assert out["completed"] == 8 and out["failed"] == 0
    assert out["input_lens"] == [5 + i for i in range(8)]
    assert out["total_output_tokens"] == sum(r.max_tokens for r in reqs)
    chat, _ = asyncio.run(run_load(server[1], "tiny", reqs[:2], [0.0, 0.0], chat=True))
    assert [r.output_len for r in chat] == [3, 4] and all(len(r.itls_s) <= r.output_len - 1 for r in chat)


def test_queued_deltas_merge_up_to_the_final_one():
    import asyncio

    from engine.serve.async_engine import Delta
    from engine.serve.generation import _merge_pending

    q = asyncio.Queue()
    for d in (Delta([2]), Delta([3], "length"), Delta([9])):
        q.put_nowait(d)
    assert _merge_pending(Delta([1]), q) == Delta([1, 2, 3], "length")
    assert q.qsize() == 1  # nothing after the final delta is taken
    assert _merge_pending(Delta([5], "stop"), q) == Delta([5], "stop")


def test_stop_string_inside_a_merged_delta_counts_tokens_up_to_it():
    """A loop that fell behind gets several tokens in one delta; tokens past the one that completes
    the stop string are neither sent nor counted (vLLM's detokenizer checks stops token by token)."""
    import asyncio

    from engine.serve.async_engine import Delta
    from engine.serve.generation import generate
    from engine.serve.tokenizers import WordTokenizer

    class OneDeltaEngine:
        def __init__(self):
            self.aborted: list[int] = []

        def add(self, ids, params):
            q = asyncio.Queue()
            q.put_nowait(Delta([10, 11, 12, 13, 14]))  # " t10 t11 t12 t13 t14", not finished
            return 7, q

        def abort(self, rid):
            self.aborted.append(rid)

    async def run():
        eng = OneDeltaEngine()
        never = asyncio.Event()

        async def receive():
            await never.wait()
        return [p async for p in generate(eng, WordTokenizer(512), [1], None, [" t12"], receive)], eng

    pieces, eng = asyncio.run(run())
    assert "".join(p.text for p in pieces) == " t10 t11"
    assert (pieces[-1].num_output_tokens, pieces[-1].finish_reason) == (3, "stop")
    assert 7 in eng.aborted


def test_tokenizers_round_trip_counts():
    from engine.serve.tokenizers import ByteTokenizer, WordTokenizer, tokenizer_for

    w = WordTokenizer(512)
    ids = w.encode("one two  three\nfour")
    assert len(ids) == 4 and all(16 <= t < 512 for t in ids) and w.encode("two") == [ids[1]]
    text = w.decoder().feed([20, 21]) + w.decoder().feed([300])
    assert text == " t20 t21 t300" and len(w.encode(text)) == 3
    b = ByteTokenizer(288)
    enc = b.encode("hé")  # 'é' is two UTF-8 bytes
    assert enc == [ord("h") + 16, 0xC3 + 16, 0xA9 + 16]
    dec = b.decoder()
    assert [dec.feed([t]) for t in enc] == ["h", "", "é"]  # a split character comes out whole
    assert tokenizer_for("auto", "byte-lm-10m", 288).name == "byte"
    assert tokenizer_for("auto", "tiny", 512).name == "word"


def test_a_prompt_the_kv_cache_can_never_hold_is_a_400():
    model = _model(num_gpu_blocks_override=8)  # 8 blocks x 16 tokens: 128 tokens of KV in all
    with ServerThread(model) as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": "w " * 300, "max_tokens": 4}, timeout=30)
        assert r.status_code == 400 and "never be scheduled" in r.json()["error"]["message"], r.text
        ok = httpx.post(url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        _wait_idle(model)
        assert model.engine.core.scheduler.stats.num_free_blocks == 8
