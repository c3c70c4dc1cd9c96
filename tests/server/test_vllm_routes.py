"""vLLM's /tokenize, /detokenize and /version, several served names, a --chat-template and
--disable-fastapi-docs, on a real server."""
from __future__ import annotations

import httpx
import pytest
from hyspec import __version__

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"


@pytest.fixture(scope="module")
def vllm_like(make_server):
    srv = make_server(served_model_name=["tiny", "alias"], chat_template=TEMPLATE, docs=False)
    yield srv
    srv.stop()


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=30)


def test_tokenize_and_detokenize_as_vllm(vllm_like):
    tok = vllm_like.app.state.async_engine.engine.tokenizer
    r = post(vllm_like, "/tokenize", {"prompt": "hello world", "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode("hello world") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 96 and len(body["token_strs"]) == body["count"]
    plain = post(vllm_like, "/tokenize", {"prompt": "hello world", "add_special_tokens": False}).json()
    assert plain["tokens"] == tok.encode("hello world", add_special_tokens=False) and plain["token_strs"] is None
    back = post(vllm_like, "/detokenize", {"model": "alias", "tokens": plain["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": tok.decode(plain["tokens"], skip_special_tokens=False)}


def test_tokenize_renders_chat_with_the_servers_template(vllm_like):
    tok = vllm_like.app.state.async_engine.engine.tokenizer
    r = post(vllm_like, "/tokenize", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == tok.encode("<user>hi>", add_special_tokens=False)
    r = post(vllm_like, "/tokenize", {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False})
    assert r.json()["tokens"] == tok.encode("<user>hi", add_special_tokens=False)


@pytest.mark.parametrize("path, body, param, words", [
    ("/tokenize", {"prompt": "x", "bogus": 1}, "bogus", "unknown field"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}, "max_tokens", "unknown field"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools",
     "tool-call parser"),
    ("/tokenize", {"prompt": "x", "model": "other"}, "model", "does not exist"),
    ("/detokenize", {"tokens": [10 ** 9]}, "tokens", "not a token id"),
    ("/detokenize", {"tokens": [-1]}, "tokens", "greater than or equal"),
])
def test_tokenizer_routes_name_what_is_wrong(vllm_like, path, body, param, words):
    r = post(vllm_like, path, body)
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    assert error["param"].startswith(param) and words in error["message"], error


def test_version_and_several_served_names(vllm_like):
    assert httpx.get(vllm_like.url + "/version").json() == {"version": __version__}
    assert httpx.get(vllm_like.url + "/openapi.json").status_code == 404  # --disable-fastapi-docs
    assert [m["id"] for m in httpx.get(vllm_like.url + "/v1/models").json()["data"]] == ["tiny", "alias"]
    for name in ("tiny", "alias"):
        r = post(vllm_like, "/v1/completions", {"model": name, "prompt": "a", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["model"] == "tiny"
    assert post(vllm_like, "/v1/completions", {"model": "nope", "prompt": "a"}).status_code == 404


def test_completion_prompts_with_or_without_special_tokens(vllm_like):
    tok = vllm_like.app.state.async_engine.engine.tokenizer
    for flag in (True, False):
        r = post(vllm_like, "/v1/completions", {"prompt": "hello world", "max_tokens": 1, "temperature": 0,
                                                "add_special_tokens": flag})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(tok.encode("hello world", add_special_tokens=flag))


def test_prompt_logprobs_as_vllm_returns_them(vllm_like):
    body = {"prompt": "hello world again", "max_tokens": 1, "temperature": 0}
    ids = post(vllm_like, "/tokenize", {"prompt": body["prompt"]}).json()["tokens"]
    r = post(vllm_like, "/v1/completions", {**body, "prompt_logprobs": 2, "echo": True, "logprobs": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    echoed = choice["logprobs"]["token_logprobs"][:len(ids)]  # echo's logprobs: the same numbers, another layout
    for tok, entry, same in zip(ids[1:], entries[1:], echoed[1:]):
        assert str(tok) in entry and entry[str(tok)]["logprob"] == same and entry[str(tok)]["rank"] >= 1
        assert sum(1 for e in entry.values() if e["rank"] <= 2) >= 2  # the top 2 as well
    chat = post(vllm_like, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                                    "temperature": 0, "prompt_logprobs": 0})
    chat_ids = post(vllm_like, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
    assert chat.status_code == 200 and len(chat.json()["prompt_logprobs"]) == len(chat_ids)
    assert post(vllm_like, "/v1/completions", {**body, "prompt_logprobs": 1}).json()["choices"][0]["logprobs"] is None
    refused = post(vllm_like, "/v1/completions", {**body, "prompt_logprobs": 1, "stream": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt_logprobs"
    too_many = post(vllm_like, "/v1/completions", {**body, "prompt_logprobs": 21})
    assert too_many.status_code == 400 and "--max-logprobs" in too_many.json()["error"]["message"]
