"""Sampling controls over HTTP: vLLM's request fields reach the engine (they change the greedy tokens as
asked), out-of-range values and unknown token ids are 400s naming the problem."""
from __future__ import annotations

import pytest

from tests.server.test_api import post

CONTROLS = {"presence_penalty": 1.0, "frequency_penalty": 0.5, "repetition_penalty": 1.3,
            "logit_bias": {"7": 5.0, "11": -100}, "min_tokens": 4, "allowed_token_ids": list(range(3, 250))}


def test_controls_reach_the_engine(server):
    body = {"prompt": "x = [", "max_tokens": 12, "temperature": 0, "return_token_ids": True, **CONTROLS}
    got = post(server, body)
    assert got.status_code == 200, got.text
    ids = got.json()["choices"][0]["token_ids"]
    plain = post(server, {k: v for k, v in body.items() if k not in CONTROLS}).json()["choices"][0]["token_ids"]
    assert ids != plain and 11 not in ids and all(3 <= t < 250 for t in ids)
    chat = post(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
                         "bad_words": ["the"], **CONTROLS}, path="/v1/chat/completions")
    assert chat.status_code == 200, chat.text


@pytest.mark.parametrize("field, value, message", [
    ("presence_penalty", -2.5, "greater than or equal to -2"),
    ("frequency_penalty", 3, "less than or equal to 2"),
    ("repetition_penalty", 0, "greater than 0"),
    ("allowed_token_ids", [], "at least 1"),
    ("logit_bias", {"abc": 1.0}, "logit_bias key 'abc'"),
    ("logit_bias", {"100000000": 1.0}, "outside the vocabulary"),
    ("allowed_token_ids", [1, 100000000], "outside the vocabulary"),
])
def test_bad_controls_are_400s(server, field, value, message):
    r = post(server, {"prompt": "x", "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"], error
