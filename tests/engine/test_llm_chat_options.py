"""LLM.chat takes vLLM's chat-template options (issue 47, item 4): chat_template, add_generation_prompt,
continue_final_message, chat_template_kwargs; a template that raises is a RequestError with its message."""
from __future__ import annotations

import pytest

from hyspec import SamplingParams
from hyspec.errors import RequestError
from tests.server.test_chat_template_options import PREFILL, TEMPLATE, USER


def test_llm_chat_takes_the_same_options(tiny_llm):
    tok = tiny_llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    out = tiny_llm.chat(PREFILL, params, chat_template=TEMPLATE, add_generation_prompt=False,
                        continue_final_message=True, chat_template_kwargs={"enable_thinking": False})[0]
    text = tok.apply_chat_template(PREFILL, add_generation_prompt=False, continue_final_message=True,
                                   chat_template=TEMPLATE)
    assert out.prompt == text and text.endswith("def add(a, b):")
    expected = tiny_llm.generate({"prompt_token_ids": tok.encode(text, add_special_tokens=False)}, params)[0]
    assert out.outputs[0].token_ids == expected.outputs[0].token_ids
    thinking_off = tiny_llm.chat(USER, params, chat_template=TEMPLATE, chat_template_kwargs={"enable_thinking": False})
    assert thinking_off[0].prompt.endswith("<|assistant|>\n<think></think>")
    with pytest.raises(RequestError, match="tool turns are not supported"):
        tiny_llm.chat([*USER, {"role": "tool", "content": "42"}], params, chat_template=TEMPLATE)
    with pytest.raises(RequestError, match="cannot both be set"):
        tiny_llm.chat(PREFILL, params, continue_final_message=True)
