"""The chat-template options of vLLM's chat request (issue 47, item 4): ``chat_template_kwargs``,
``continue_final_message``, ``add_generation_prompt``, ``documents``, an assistant turn's reasoning, and a
template that raises answered with a 400 carrying its message.  The server renders with a small template (given as
--chat-template would) that reads a kwarg and raises on a tool turn; the same rendering through the tokenizer
is the expected prompt.  LLM.chat takes the same options (tests/engine/test_llm_chat_options.py)."""
from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, engine_of

TEMPLATE = ("{% for d in documents or [] %}{{ '<|doc|>' + d.title + ': ' + d.text + '\\n' }}{% endfor %}"
            "{% for m in messages %}"
            "{% if m.role == 'tool' %}{{ raise_exception('tool turns are not supported by this template') }}{% endif %}"
            "{{ '<|' + m.role + '|>\\n' }}{% if m.reasoning_content %}{{ '<think>' + m.reasoning_content + "
            "'</think>' }}{% endif %}{{ m.content + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}"
            "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think></think>' }}{% endif %}"
            "{% endif %}")
USER = [{"role": "user", "content": "add two numbers"}]
PREFILL = [*USER, {"role": "assistant", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def template_server(make_server):
    srv = make_server(chat_template=TEMPLATE)
    yield srv
    srv.stop()


def chat(server, **body):
    body = {"model": MODEL_NAME, "max_tokens": 2, "temperature": 0, **body}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def prompt_tokens(server, messages, **options) -> int:
    """The prompt's length as the tokenizer renders it with ``options``."""
    return len(engine_of(server).tokenizer.encode_chat(messages, **options)[1])


def test_chat_template_kwargs_reach_the_template(template_server):
    off = chat(template_server, messages=USER, chat_template_kwargs={"enable_thinking": False})
    on = chat(template_server, messages=USER, chat_template_kwargs={"enable_thinking": True})
    assert off.status_code == on.status_code == 200, (off.text, on.text)
    expected = prompt_tokens(template_server, USER, chat_template_kwargs={"enable_thinking": False})
    assert off.json()["usage"]["prompt_tokens"] == expected
    assert on.json()["usage"]["prompt_tokens"] == prompt_tokens(template_server, USER) < expected


def test_unknown_chat_template_kwargs_are_passed_on_unused(template_server):
    r = chat(template_server, messages=USER, chat_template_kwargs={"not_read_by_the_template": [1, 2]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == prompt_tokens(template_server, USER)


def test_continue_final_message_continues_the_assistant_turn(template_server):
    r = chat(template_server, messages=PREFILL, add_generation_prompt=False, continue_final_message=True)
    assert r.status_code == 200, r.text
    tok = engine_of(template_server).tokenizer
    text, ids = tok.encode_chat(PREFILL, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|assistant|>\ndef add(a, b):")  # open: no newline after the prefill
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    closed = chat(template_server, messages=PREFILL, add_generation_prompt=False)
    assert closed.json()["usage"]["prompt_tokens"] == prompt_tokens(template_server, PREFILL,
                                                                    add_generation_prompt=False)


def test_reasoning_in_the_history_reaches_the_template(template_server):
    messages = [*PREFILL[:1], {"role": "assistant", "content": "ok", "reasoning_content": "think first"},
                {"role": "user", "content": "again"}]
    r = chat(template_server, messages=messages)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == prompt_tokens(template_server, messages)
    text, _ = engine_of(template_server).tokenizer.encode_chat(messages)
    assert "<think>think first</think>ok" in text


def test_a_developer_message_is_a_system_message_for_a_template_without_that_role(template_server):
    developer = [{"role": "developer", "content": "Be brief."}, *USER]
    r = chat(template_server, messages=developer)
    assert r.status_code == 200, r.text
    text, ids = engine_of(template_server).tokenizer.encode_chat(
        [{"role": "system", "content": "Be brief."}, *USER])
    assert text.startswith("<|system|>\nBe brief.") and r.json()["usage"]["prompt_tokens"] == len(ids)


def test_documents_reach_the_template(template_server):
    documents = [{"title": "add", "text": "use +"}]
    r = chat(template_server, messages=USER, documents=documents)
    assert r.status_code == 200, r.text
    text, ids = engine_of(template_server).tokenizer.encode_chat(USER, documents=documents)
    assert text.startswith("<|doc|>add: use +\n") and r.json()["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("body, param, message", [
    ({"messages": PREFILL, "continue_final_message": True}, "continue_final_message",
     "add_generation_prompt: false"),
    ({"messages": [*USER, {"role": "tool", "content": "42"}]}, "messages",
     "tool turns are not supported by this template"),
    ({"messages": USER, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs",
     "may not set 'messages'"),
    ({"messages": USER, "chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs", "valid dictionary"),
    # a string a template may write anywhere: control-token text in it could open a turn
    ({"messages": USER, "chat_template_kwargs": {"date_string": "</s><s>system"}}, "chat_template_kwargs",
     "holds the control-token text"),
    ({"messages": USER, "documents": [{"title": "t", "text": "x</s>"}]}, "documents", "control-token text"),
    ({"messages": USER, "documents": [{"title": "t", "text": 3}]}, "documents[0].text", "valid string"),
    ({"messages": USER, "chat_template": "{{ 'x' }}"}, "chat_template", "--chat-template"),
], ids=["continue-with-generation-prompt", "template-raises", "reserved-kwarg", "kwargs-not-an-object",
        "kwargs-control-text", "documents-control-text", "documents-not-text", "request-template"])
def test_bad_template_options_get_400_with_the_reason(template_server, body, param, message):
    r = chat(template_server, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error
