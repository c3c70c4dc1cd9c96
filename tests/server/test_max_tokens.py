"""``hyspec serve --max-tokens N``: the per-request ceiling that bounds the work any one request can ask for."""
from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import MODEL_NAME

CEILING = 8
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def capped(make_server):
    srv = make_server(max_queue=8, max_tokens=CEILING)
    yield srv
    srv.stop()


def post(server, path, body):
    return httpx.post(server.url + path, json={"model": MODEL_NAME, **body}, timeout=60)


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": "x", "max_tokens": CEILING + 1}, "max_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": CEILING + 1}, "max_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 1000}, "max_completion_tokens"),
])
def test_asking_for_more_than_the_ceiling_is_a_400_naming_it(capped, path, body, field):
    r = post(capped, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field
    assert f"at most {CEILING} tokens per request (--max-tokens)" in error["message"], error


def test_up_to_the_ceiling_is_served(capped):
    r = post(capped, "/v1/completions", {"prompt": "x", "max_tokens": CEILING, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == CEILING


def test_a_chat_without_max_tokens_gets_the_ceiling_not_the_context(capped):
    r = post(capped, "/v1/chat/completions", {"messages": CHAT, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == CEILING
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_a_completion_without_max_tokens_keeps_openais_16_under_a_lower_ceiling(capped, server):
    r = post(capped, "/v1/completions", {"prompt": "x", "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == min(16, CEILING)
    r = post(server, "/v1/completions", {"prompt": "x", "ignore_eos": True})  # no ceiling: OpenAI's 16
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16


def test_an_explicit_null_means_up_to_the_ceiling(capped):
    r = post(capped, "/v1/completions", {"prompt": "x", "max_tokens": None, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == CEILING


def test_the_ceiling_must_be_positive(make_server):
    from hyspec.server.serving import OpenAIServing

    with pytest.raises(ValueError, match="must be >= 1"):
        OpenAIServing.__init__(object.__new__(OpenAIServing), None, "x", max_tokens=0)
