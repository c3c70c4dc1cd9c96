"""The real server on 127.0.0.1 through the official openai client and raw HTTP: completions, chat,
SSE streaming, usage, models/health/metrics, and bad requests answered with 4xx + message."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.conftest import MAX_MODEL_LEN, MODEL_NAME, engine_of

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "add two numbers"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def sse_events(response: httpx.Response) -> list[str]:
    """The data payloads of an SSE body, checking the framing: 'data: ...' events separated by blank lines."""
    body = response.text
    assert body.endswith("\n\n"), body[-50:]
    events = body[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events[:3]
    return [e[len("data: "):] for e in events]


def test_completion_with_openai_client_counts_usage(server, client):
    tok = engine_of(server).tokenizer
    out = client.completions.create(model=MODEL_NAME, prompt="def add(a, b):", max_tokens=7, **GREEDY)
    assert out.object == "text_completion" and out.model == MODEL_NAME and len(out.choices) == 1
    choice = out.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length" and isinstance(choice.text, str)
    assert out.usage.prompt_tokens == len(tok.encode("def add(a, b):"))
    assert out.usage.completion_tokens == 7
    assert out.usage.total_tokens == out.usage.prompt_tokens + 7

    again = client.completions.create(model=MODEL_NAME, prompt="def add(a, b):", max_tokens=7,
                                      temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    assert again.choices[0].text == choice.text  # greedy is deterministic
    ids = again.choices[0].model_extra["token_ids"]
    assert len(ids) == 7 and tok.decode(ids) == choice.text


def test_batched_and_token_id_prompts(server, client):
    tok = engine_of(server).tokenizer
    prompts = ["import os\n", "class Foo:"]
    alone = [client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=5, **GREEDY).choices[0].text
             for p in prompts]
    batch = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=5, **GREEDY)
    assert [c.index for c in batch.choices] == [0, 1]
    assert [c.text for c in batch.choices] == alone
    assert batch.usage.prompt_tokens == sum(len(tok.encode(p)) for p in prompts)
    assert batch.usage.completion_tokens == 10
    by_ids = client.completions.create(model=MODEL_NAME, prompt=tok.encode(prompts[0]), max_tokens=5, **GREEDY)
    assert by_ids.choices[0].text == alone[0]


def test_chat_uses_the_tokenizer_chat_template(server, client):
    tok = engine_of(server).tokenizer
    out = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_completion_tokens=6, **GREEDY)
    assert out.object == "chat.completion"
    msg = out.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str) and out.choices[0].finish_reason == "length"
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert text.endswith("<|assistant|>\n")
    assert out.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))
    assert out.usage.completion_tokens == 6


def test_chat_streaming_adds_up_to_the_non_streamed_answer(server, client):
    full = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=10, **GREEDY)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=10, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_is_sse_ending_with_done(server, client):
    full = client.completions.create(model=MODEL_NAME, prompt="x = [", max_tokens=9, **GREEDY)
    body = {"model": MODEL_NAME, "prompt": "x = [", "max_tokens": 9, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    text = "".join(ch["text"] for c in chunks for ch in c["choices"])
    ids = [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]]
    assert text == full.choices[0].text and len(ids) == 9  # no token lost or repeated
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 9


def test_stop_string_ends_the_completion(server, client):
    base = client.completions.create(model=MODEL_NAME, prompt="def add(a, b):", max_tokens=20, **GREEDY)
    text = base.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert len(stop) == 2, text
    out = client.completions.create(model=MODEL_NAME, prompt="def add(a, b):", max_tokens=20, stop=[stop], **GREEDY)
    assert out.choices[0].text == text[: text.index(stop)]
    assert out.choices[0].finish_reason == "stop" and out.choices[0].model_extra["stop_reason"] == stop


def test_models_health_and_metrics(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME] and models[0].model_extra["max_model_len"] == MAX_MODEL_LEN
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other-model")
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=3, **GREEDY)
    metrics = httpx.get(server.url + "/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    for name in ("hyspec_time_to_first_token_seconds_bucket", "hyspec_time_per_output_token_seconds_count",
                 "hyspec_e2e_request_latency_seconds_sum", "vllm:time_to_first_token_seconds_count",
                 'hyspec_requests_finished_total{finish_reason="length",model_name="tiny"}',
                 "hyspec_num_requests_waiting", "hyspec_num_requests_running", "hyspec_kv_cache_usage_perc",
                 "vllm:kv_cache_usage_perc", 'hyspec_http_requests_total{endpoint="/v1/completions",method="POST",'
                 'status="200"}'):
        assert name in text, name


def post(server, body: bytes | str | dict, path: str = "/v1/completions", **kw) -> httpx.Response:
    if isinstance(body, dict):
        return httpx.post(server.url + path, json=body, timeout=30, **kw)
    return httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30, **kw)


HUGE = "lorem ipsum " * 4000
BAD_COMPLETIONS = [
    (b'{"prompt": "x", "max_tokens": 5', 400, None, "not valid JSON"),
    (b"[1, 2]", 400, None, "JSON object"),
    (b'{"max_tokens": 5}', 400, "prompt", "Field required"),
    ({"prompt": 17}, 400, "prompt", "expected a string"),
    ({"prompt": "x", "max_tokens": "5"}, 400, "max_tokens", "valid integer"),
    ({"prompt": "x", "max_tokens": -3}, 400, "max_tokens", "greater than or equal to 1"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "greater than or equal to 1"),
    ({"prompt": "x", "max_tokens": 10_000}, 400, "max_tokens", "maximum context length"),
    ({"prompt": HUGE}, 400, "prompt", "maximum context length"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature", "greater than or equal to 0"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature", "valid number"),
    (b'{"prompt": "x", "temperature": NaN}', 400, "temperature", "finite number"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p", "greater than 0"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream", "valid boolean"),
    ({"prompt": "x", "n": 0}, 400, "n", "greater than or equal to 1"),
    ({"prompt": "x", "n": 2, "temperature": 0}, 400, "n", "n must be 1 when using greedy sampling"),
    ({"prompt": "x", "n": 3, "best_of": 2}, 400, "best_of", "must be at least n (3)"),
    ({"prompt": "x", "n": 1, "best_of": 2, "stream": True}, 400, "best_of", "cannot be streamed"),
    ({"prompt": "x", "n": 64}, 400, "n", "this server takes at most"),
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs", "at most 20 (--max-logprobs)"),
    ({"prompt": "x", "logprobs": -1}, 400, "logprobs", "greater than or equal to 0"),
    ({"prompt": "x", "min_tokens": -1}, 400, "min_tokens", "greater than or equal to 0"),
    ({"prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty", "less than or equal to 2"),
    ({"prompt": "x", "suffix": "y"}, 400, "suffix", "not supported"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", "stream is true"),
    ({"prompt": [5, 10**6]}, 400, "prompt", "token ids must be in"),
    ({"prompt": []}, 400, "prompt", "at least 1"),
    ({"prompt": ""}, 400, "prompt", "empty"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model", "this server serves `tiny`"),
    (b'{"prompt": "a\\ud800b"}', 400, "prompt", "unpaired UTF-16 surrogate"),
    (b'{"prompt": "x", "stop": ["\\udfff"]}', 400, "stop[0]", "unpaired UTF-16 surrogate"),
]


@pytest.mark.parametrize("body, status, param, message", BAD_COMPLETIONS,
                         ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_COMPLETIONS)])
def test_bad_completion_requests_get_4xx_naming_the_field(server, body, status, param, message):
    r = post(server, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param, error
    assert error["type"] == "invalid_request_error" and error["code"] in (status, "model_not_found")


BAD_CHATS = [
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "Input should be"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type", "Input should be 'text'"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1}, "max_completion_tokens",
     "greater than or equal to 1"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}, "max_tokens", "maximum context length"),
    ({"messages": [{"role": "user", "content": HUGE}]}, "messages", "maximum context length"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools", "not supported"),
    ({"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo", "not supported"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 50}, "top_logprobs",
     "at most 20"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2, "temperature": 0}, "n", "greedy sampling"),
    (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages[0].content", "unpaired UTF-16 surrogate"),
]


@pytest.mark.parametrize("body, param, message", BAD_CHATS, ids=[str(i) for i in range(len(BAD_CHATS))])
def test_bad_chat_requests_get_400_naming_the_field(server, body, param, message):
    r = post(server, body, path="/v1/chat/completions")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_the_server_keeps_serving_after_bad_requests(server, client):
    for body, *_ in BAD_COMPLETIONS:
        post(server, body)
    out = client.completions.create(model=MODEL_NAME, prompt="def add(a, b):", max_tokens=4, **GREEDY)
    assert out.usage.completion_tokens == 4
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert 'status="400"' in httpx.get(server.url + "/metrics").text
    assert r"\u" not in post(server, {"prompt": "x", "n": 2, "temperature": 0}).text  # plain JSON, not double-encoded


def test_oversized_body_is_refused_before_it_is_read(make_server):
    srv = make_server(max_body_bytes=1000)
    try:
        r = post(srv, {"prompt": "x" * 2000})
        assert r.status_code == 413 and "limit is 1000" in r.json()["error"]["message"]
        assert post(srv, {"prompt": "x", "max_tokens": 2}).status_code == 200
    finally:
        srv.stop()


def test_api_key(make_server):
    srv = make_server(api_key="s3cret", protect_metrics=True)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            r = post(srv, {"prompt": "x", "max_tokens": 2}, headers=headers)
            assert r.status_code == 401 and "API key" in r.json()["error"]["message"], r.text
            assert r.headers["www-authenticate"] == "Bearer"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2).usage.completion_tokens <= 2
        assert httpx.get(srv.url + "/health").status_code == 200  # health stays open
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert httpx.get(srv.url + "/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        security = httpx.get(srv.url + "/openapi.json", headers={"Authorization": "Bearer s3cret"}).json()[
            "components"]["securitySchemes"]  # the schema needs the key too (issue 50, item 5)
        assert security["HTTPBearer"]["scheme"] == "bearer"
    finally:
        srv.stop()


def test_a_speculating_server_streams_the_same_tokens_and_exports_spec_metrics(server, make_server):
    body = {"prompt": "x = [", "max_tokens": 24, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    plain = post(server, body).json()["choices"][0]
    srv = make_server(engine_overrides={"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}})
    try:
        assert engine_of(srv).spec.enabled
        r = post(srv, {**body, "stream": True})
        chunks = [json.loads(e) for e in sse_events(r)[:-1]]
        assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == plain["token_ids"]
        assert "".join(c["choices"][0]["text"] for c in chunks) == plain["text"]
        text = httpx.get(srv.url + "/metrics").text
        assert "hyspec_spec_steps_total" in text and "vllm:spec_decode_num_drafts_total" in text
    finally:
        srv.stop()
