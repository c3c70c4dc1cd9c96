"""logprobs / top_logprobs / echo / n / best_of through the official openai client against the real server:
the documented shapes, streamed and not, and the same numbers as the offline API."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from hyspec import SamplingParams
from tests.server.conftest import engine_of
from tests.server.test_api import sse_events

MESSAGES = [{"role": "user", "content": "add two numbers"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_completion_logprobs_have_the_legacy_shape(server, client):
    r = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=6, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True, "return_token_ids": True,
                                              "return_tokens_as_token_ids": True})
    choice = r.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert lp.tokens == [f"token_id:{t}" for t in choice.token_ids] and lp.text_offset[0] == 0
    as_text = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=6, temperature=0, logprobs=3,
                                        extra_body={"ignore_eos": True}).choices[0]
    assert "".join(as_text.logprobs.tokens) == as_text.text == choice.text
    for tok_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert tok_lp <= 0 and 3 <= len(top) <= 4  # the top 3, plus the sampled token when it is not among them
        assert tok_lp == max(top.values())  # greedy: the sampled token is the most likely one
    # the offline API's numbers, exactly: the same engine computed them
    ids = engine_of(server).tokenizer.encode("def f(x):")
    ref = _offline(server, ids, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3))
    assert choice.token_ids == ref.token_ids
    # another engine instance in this process: the same numbers up to rounding (measured 5e-7 once in CI)
    assert max(abs(a - e[t].logprob) for a, e, t in zip(lp.token_logprobs, ref.logprobs, ref.token_ids)) < 1e-5


def _offline(server, ids, params):
    """Run one request on the server's engine from this thread is not allowed; use a fresh LLM on the same files."""
    from hyspec import LLM
    from tests.server.conftest import ENGINE_ARGS

    engine = engine_of(server)
    llm = LLM(str(engine.model_path), **ENGINE_ARGS)
    return llm.generate([ids], params)[0].outputs[0]


def test_echo_returns_the_prompt_with_its_logprobs(server, client):
    prompt = "import os\nimport sys"
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0, logprobs=1, echo=True,
                                  extra_body={"ignore_eos": True})
    choice = r.choices[0]
    n_prompt = r.usage.prompt_tokens
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    assert len(lp.tokens) == n_prompt + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)
    # the prompt part equals prompt_logprobs of the offline API
    ids = engine_of(server).tokenizer.encode(prompt)
    from hyspec import LLM  # noqa: F401  (imported by _offline)

    engine = engine_of(server)
    from tests.server.conftest import ENGINE_ARGS

    out = LLM(str(engine.model_path), **ENGINE_ARGS).generate(
        [ids], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=1))[0]
    assert max(abs(a - e[t].logprob) for a, e, t in zip(lp.token_logprobs[1:n_prompt], out.prompt_logprobs[1:],
                                                         ids[1:])) < 1e-5


def test_token_id_prompts_with_echo_as_lm_eval_sends_them(server):
    """lm-eval's local-completions scores a continuation: token-id prompts, echo, logprobs=1, max_tokens=1."""
    tok = engine_of(server).tokenizer
    prompts = [tok.encode("x = 1\ny = 2"), tok.encode("for i in range(3):")]
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": prompts, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True, "seed": 1234})
    assert r.status_code == 200, r.text
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1]
    for ids, c in zip(prompts, choices):
        assert len(c["logprobs"]["token_logprobs"]) == len(ids) + 1
        for value, top in zip(c["logprobs"]["token_logprobs"][1:], c["logprobs"]["top_logprobs"][1:]):
            assert value <= max(top.values())


def test_n_and_best_of_choices(server, client):
    r = client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=5, temperature=0.9, n=3, seed=7,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == list(range(6))  # prompt-major: prompt i's choices are 3i..3i+2
    assert r.usage.completion_tokens == 30 and r.usage.prompt_tokens == sum(
        len(engine_of(server).tokenizer.encode(p)) for p in "ab")  # each prompt counted once
    b = client.completions.create(model="tiny", prompt="a", max_tokens=5, temperature=0.9, n=2, best_of=4, seed=7,
                                  logprobs=0, extra_body={"ignore_eos": True})
    assert [c.index for c in b.choices] == [0, 1]
    means = [sum(c.logprobs.token_logprobs) / 5 for c in b.choices]
    assert means[0] >= means[1]


def test_streamed_logprobs_and_samples_add_up(server, client):
    kw = dict(model="tiny", prompt="def g():", max_tokens=6, temperature=0.8, n=2, seed=3, logprobs=2,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    texts, logprobs = {0: "", 1: ""}, {0: [], 1: []}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.logprobs is not None:
                logprobs[c.index] += c.logprobs.token_logprobs
    for c in whole.choices:
        assert texts[c.index] == c.text and logprobs[c.index] == c.logprobs.token_logprobs


def test_chat_logprobs_have_the_chat_shape(server, client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob == item.logprob  # greedy: the token is the top one
        assert item.bytes == list(item.token.encode("utf-8"))
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == r.choices[0].message.content


def test_chat_n_streams_each_choice(server, client):
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=4, temperature=1.0, n=2, seed=9, logprobs=True,
              extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw)
    assert [c.index for c in whole.choices] == [0, 1]
    streamed = {0: "", 1: ""}
    tokens = {0: 0, 1: 0}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            if c.logprobs is not None:
                tokens[c.index] += len(c.logprobs.content)
    assert streamed == {c.index: c.message.content for c in whole.choices}
    assert tokens == {0: 4, 1: 4}


def test_a_speculating_server_reports_the_same_logprobs(server, make_server):
    body = {"prompt": "a b a b a b a b a b", "max_tokens": 12, "temperature": 0, "logprobs": 2,
            "ignore_eos": True}
    plain = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    spec_server = make_server(engine_overrides={"speculative_config": {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}})
    try:
        spec = httpx.post(spec_server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
        accepted = engine_of(spec_server).spec.metrics.snapshot()["totals"]["accepted_tokens"]
    finally:
        spec_server.stop()
    assert spec["text"] == plain["text"] and accepted > 0
    diffs = [abs(a - b) for a, b in zip(plain["logprobs"]["token_logprobs"], spec["logprobs"]["token_logprobs"])]
    assert max(diffs) < 1e-5, diffs


def test_n_samples_prefill_the_prompt_once(server):
    engine = engine_of(server)
    prompt = "the same prompt for four samples " * 2
    calls = []
    run = engine.runner.run

    def counting(feeds, **kw):
        calls.append(sum(len(f.tokens) for f in feeds if len(f.tokens) > 1))  # prefill tokens of this step
        return run(feeds, **kw)

    engine.runner.run = counting
    try:
        r = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "prompt": prompt, "max_tokens": 3, "temperature": 0.8, "n": 4, "ignore_eos": True})
    finally:
        engine.runner.run = run
    assert r.status_code == 200 and len(r.json()["choices"]) == 4
    assert sum(calls) == r.json()["usage"]["prompt_tokens"], calls
    assert json.dumps(r.json())  # a plain JSON body
