"""No request field is silently ignored: every field of vLLM's and OpenAI's completion and chat requests is
implemented (declared on hyspec's request model) or refused with a 400 naming it; anything else is a 400 too.

The schemas' field lists are core/engine/vllm_schemas.json (read from the installed vLLM and openai packages
by scripts/gen_vllm_schemas.py), so CI needs neither package for this walk.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hyspec.engine.vllm_args import vllm_schemas
from hyspec.server.errors import describe_validation_errors
from hyspec.server.protocol import ChatCompletionRequest, CompletionRequest
from hyspec.server.request_fields import CHAT, COMPLETIONS, refusals
from pydantic import ValidationError

REPO = Path(__file__).resolve().parents[2]
MODELS = {COMPLETIONS: CompletionRequest, CHAT: ChatCompletionRequest}
SCHEMAS = {COMPLETIONS: ("vllm.CompletionRequest", "openai.CompletionCreateParams"),
           CHAT: ("vllm.ChatCompletionRequest", "openai.ChatCompletionCreateParams")}
MINIMAL = {COMPLETIONS: {"prompt": "x"}, CHAT: {"messages": [{"role": "user", "content": "hi"}]}}
SENTINEL = "\x00hyspec-test-value"  # no field's "off" value


def schema_fields(endpoint: str) -> set[str]:
    lists = vllm_schemas()["request_fields"]
    return set().union(*(lists[name] for name in SCHEMAS[endpoint]))


def problem(endpoint: str, body: dict) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as exc:
        MODELS[endpoint].model_validate({**MINIMAL[endpoint], **body})
    return describe_validation_errors(list(exc.value.errors()))


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_every_schema_field_is_implemented_or_refused(endpoint):
    declared, refused = set(MODELS[endpoint].model_fields), set(refusals(endpoint))
    fields = schema_fields(endpoint)
    assert len(fields) > 40  # the lists were read, not empty
    neither = sorted(fields - declared - refused)
    assert not neither, f"{endpoint}: fields neither implemented nor refused: {neither}"


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_each_refused_field_is_a_400_naming_it_and_why(endpoint):
    for name, refusal in refusals(endpoint).items():
        message, param = problem(endpoint, {name: SENTINEL})
        assert param == name and message.startswith(f"{name}: not supported by hyspec") and refusal.reason in message
        for off in refusal.off:  # values that ask for nothing pass
            MODELS[endpoint].model_validate({**MINIMAL[endpoint], name: off})


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_unknown_fields_are_a_400_naming_them(endpoint):
    message, param = problem(endpoint, {"temprature": 0.5, "zz_other": 1})
    assert param == "temprature" and "`temprature`, `zz_other`" in message and "unknown fields" in message
    message, param = problem(endpoint, {"stream": True, "stream_options": {"include_usage": True, "zz": 1}})
    assert param == "stream_options.zz" and "unknown field" in message


def test_implemented_fields_still_work():
    req = CompletionRequest.model_validate({"prompt": "x", "n": 2, "logprobs": 1, "echo": True, "temperature": 0.5,
                                            "presence_penalty": 0, "use_beam_search": False})
    params = req.sampling_params(max_tokens=4)
    assert (params.n, params.logprobs, params.prompt_logprobs) == (2, 1, 1)
    chat = ChatCompletionRequest.model_validate({**MINIMAL[CHAT], "logprobs": True, "top_logprobs": 2, "tools": [],
                                                 "tool_choice": "none", "store": False})
    assert chat.sampling_params(max_tokens=4).logprobs == 2


def test_the_compatibility_doc_is_the_tables():
    spec = importlib.util.spec_from_file_location("gen_vllm_compat_doc", REPO / "scripts" / "gen_vllm_compat_doc.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert generator.DOC.read_text() == generator.render(), \
        "docs/vllm_compat.md differs from the tables: run scripts/gen_vllm_compat_doc.py"
