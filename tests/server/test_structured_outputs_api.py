"""Structured outputs over HTTP: OpenAI's response_format, vLLM's structured_outputs and the deprecated guided_*
fields constrain the output (the tiny model's random text becomes JSON the schema accepts, or a choice), and a
malformed constraint is a 400 naming the field and where it is wrong."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance")

from tests.server.test_api import post  # noqa: E402

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
          "required": ["ok", "n"], "additionalProperties": False}
CHOICES = ["red", "green", "blue"]


def _text(server, path="/v1/completions", **fields):
    body = {"max_tokens": 40, "temperature": 0, **fields}
    body.setdefault("prompt" if path == "/v1/completions" else "messages",
                    "x = " if path == "/v1/completions" else [{"role": "user", "content": "hi"}])
    r = post(server, body, path=path)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"], choice["finish_reason"]


# the random model would write JSON's optional whitespace until max_tokens: every form here turns it off
COMPACT = {"disable_any_whitespace": True}


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA, "strict": True}},
     "structured_outputs": COMPACT},
    {"structured_outputs": {"json": SCHEMA, **COMPACT}},
    {"structured_outputs": {"json": json.dumps(SCHEMA), **COMPACT}},
    {"guided_json": SCHEMA, "structured_outputs": COMPACT},
])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_json_schema_forms(server, fields, path):
    jsonschema = pytest.importorskip("jsonschema")
    text, finish = _text(server, path, **fields)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("fields", [{"structured_outputs": {"choice": CHOICES}}, {"guided_choice": CHOICES},
                                    {"structured_outputs": {"regex": "(red|green|blue)"}},
                                    {"guided_regex": "(red|green|blue)"},
                                    {"guided_grammar": 'root ::= "red" | "green" | "blue"'},
                                    {"structured_outputs": {"grammar": 'start: "red" | "green" | "blue"'}}])
def test_choice_regex_and_grammar_forms(server, fields):
    assert _text(server, **fields) in [(c, "stop") for c in CHOICES]


def test_json_object_and_text(server):
    text, _ = _text(server, path="/v1/chat/completions", response_format={"type": "json_object"}, max_tokens=60,
                    structured_outputs=COMPACT)
    assert text.startswith("{")
    plain = _text(server, response_format={"type": "text"})
    assert plain == _text(server)


@pytest.mark.parametrize("fields, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "objekt"}}}},
     "response_format", "invalid JSON schema at $.type"),
    ({"structured_outputs": {"json": {"properties": {"a": {"minLength": -1}}}}},
     "structured_outputs.json", "at $.properties.a.minLength"),
    ({"guided_json": '{"type": '}, "guided_json", "not valid JSON: Expecting value at line 1 column 10"),
    ({"guided_regex": "(ab"}, "guided_regex", "unclosed group"),
    ({"structured_outputs": {"grammar": "root ::= missing"}}, "structured_outputs.grammar", "'missing' not found"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex", "one output constraint per request"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "response_format",
     "one output constraint per request"),
    ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs", "give one of"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "not implemented"),
    ({"response_format": {"type": "structural_tag", "format": {}}}, "response_format", "not implemented"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs json_schema.schema"),
    ({"guided_json": {"type": "object"}, "ignore_eos": True}, "ignore_eos", "cannot be combined"),
    ({"guided_regex": "[^\\x00-\\x{10FFFF}]"}, None, "no output satisfies"),
])
def test_bad_constraints_are_400s(server, fields, param, message):
    r = post(server, {"prompt": "x", "max_tokens": 4, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"], error
    if param is not None:
        assert error["param"] == param, error


def test_openai_client_response_format_under_suffix_speculation(make_server, server):
    """The official openai client, response_format json_schema, a suffix-speculating server: every answer is
    JSON the schema accepts and has plain constrained decoding's tokens (the plain server of this module)."""
    jsonschema = pytest.importorskip("jsonschema")
    openai = pytest.importorskip("openai")
    from tests.server.spec_serving import FAST

    spec = make_server(engine_overrides={"speculative_config": {"method": "suffix", **FAST}})
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA, "strict": True}}
    try:
        answers = {}
        for name, srv in (("plain", server), ("suffix", spec)):
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
            answers[name] = []
            # the same prompt twice: the second time the suffix cache drafts the first answer
            for prompt in ["a = {", "say yes", "a = {", "print(1)"]:
                out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                                     response_format=fmt, temperature=0, max_tokens=40,
                                                     extra_body={"structured_outputs": COMPACT,
                                                                 "return_token_ids": True})
                choice = out.choices[0]
                assert choice.finish_reason == "stop", choice
                jsonschema.validate(json.loads(choice.message.content), SCHEMA)
                answers[name].append(choice.model_extra.get("token_ids") or choice.message.content)
        assert answers["suffix"] == answers["plain"]
        drafted = spec.app.state.async_engine.engine.spec.metrics.snapshot()["totals"]["draft_tokens"]
        assert drafted > 0, "the suffix server drafted nothing"
    finally:
        spec.stop()
