"""Chat templates render as transformers renders them (issue 47, item 4).

transformers' ``apply_chat_template(tokenize=False)`` is the reference: the real templates of three model
families (SmolLM2's from the default GGUF, Llama-3.2's and Qwen3's from tests/data/chat_templates/), over
multi-turn chats with and without a system message, ``add_generation_prompt`` both ways,
``continue_final_message`` and Qwen3's ``enable_thinking``; then each piece of transformers' environment
(``{% break %}``, ``tojson``, ``strftime_now``, ``raise_exception``, ``dict``, ``namespace``, ``{% generation %}``)
on small templates.  Both sides read one tokenizer directory (the tiny test tokenizer with the family's special
tokens and template): a template's text depends on the special tokens' text, never on the vocabulary."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hyspec.errors import HyspecError
from hyspec.model.tokenizer import Tokenizer
from tests.model.tiny_checkpoint import write_tokenizer

transformers = pytest.importorskip("transformers")

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}  # Llama-3.2-3B-Instruct's config
QWEN_TOKENS = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}  # Qwen3-0.6B's

SYSTEM = {"role": "system", "content": "You are terse.  "}
CHAT = [SYSTEM,
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And <b>3 + 3</b>? Answer in \"quotes\" & Ünïcode."}]
NO_SYSTEM = CHAT[1:]
PREFILL = [*CHAT, {"role": "assistant", "content": "The answer is "}]  # continued by the model
# Qwen3: reasoning kept in history (under reasoning_content, or inline in the content)
THOUGHTS = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
            {"role": "user", "content": "Bye"},
            {"role": "assistant", "content": "<think>\nwave\n</think>\n\nBye!"},
            {"role": "user", "content": "One more"}]


@pytest.fixture(scope="module")
def tiny_tokenizer_json(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny_tok")
    write_tokenizer(path)
    return path / "tokenizer.json"


def make_pair(directory: Path, tokenizer_json: Path, template: str, special: dict):
    """hyspec's Tokenizer and transformers' over one tokenizer directory."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer_json, directory / "tokenizer.json")
    config = {**{k: v for k, v in special.items() if v is not None}, "chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer(directory), transformers.PreTrainedTokenizerFast.from_pretrained(str(directory))


def both(pair, messages, **options):
    ours, reference = pair
    options = dict(options)
    kwargs = dict(options.pop("chat_template_kwargs", {}))
    expected = reference.apply_chat_template(messages, tokenize=False, **options, **kwargs)
    return ours.apply_chat_template(messages, chat_template_kwargs=kwargs, **options), expected


@pytest.fixture(scope="module")
def families(tmp_path_factory, tiny_tokenizer_json) -> dict:
    root = tmp_path_factory.mktemp("families")
    pairs = {
        "llama-3.2": make_pair(root / "llama", tiny_tokenizer_json,
                               (TEMPLATES / "llama-3.2-3b-instruct.jinja").read_text(), LLAMA_TOKENS),
        "qwen3": make_pair(root / "qwen", tiny_tokenizer_json, (TEMPLATES / "qwen3-0.6b.jinja").read_text(),
                           QWEN_TOKENS),
    }
    from tests.model.test_default_model import needs_default

    if not needs_default.args[0]:  # the default model is installed: SmolLM2's template from its GGUF
        from hyspec.assets import default_model
        from hyspec.model.gguf_checkpoint import gguf_metadata

        meta = gguf_metadata(default_model())
        tokens = meta["tokenizer.ggml.tokens"]
        special = {name: tokens[meta[f"tokenizer.ggml.{key}"]] for name, key in (
            ("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"))}
        pairs["smollm2"] = make_pair(root / "smollm2", tiny_tokenizer_json, meta["tokenizer.chat_template"], special)
    return pairs


CASES = {
    "system-multiturn-generation-prompt": (CHAT, {"add_generation_prompt": True}),
    "system-multiturn-no-generation-prompt": (CHAT, {"add_generation_prompt": False}),
    "no-system": (NO_SYSTEM, {"add_generation_prompt": True}),
    "one-user-turn": ([{"role": "user", "content": "Hi"}], {"add_generation_prompt": True}),
    "continue-final-message": (PREFILL, {"add_generation_prompt": False, "continue_final_message": True}),
    "unknown-kwarg-passed-on": (CHAT, {"add_generation_prompt": True,
                                       "chat_template_kwargs": {"not_read_by_any_template": [1, 2]}}),
}


@pytest.mark.parametrize("family", ["smollm2", "llama-3.2", "qwen3"])
@pytest.mark.parametrize("case", list(CASES))
def test_real_templates_render_as_transformers_renders_them(families, family, case):
    if family not in families:
        pytest.skip("the default model (SmolLM2's GGUF) is not installed")
    messages, options = CASES[case]
    ours, expected = both(families[family], messages, **dict(options))
    assert ours == expected


@pytest.mark.parametrize("enable_thinking", [True, False])
@pytest.mark.parametrize("messages", [CHAT, THOUGHTS], ids=["chat", "reasoning-in-history"])
def test_qwen3_enable_thinking_renders_as_transformers_renders_it(families, enable_thinking, messages):
    ours, expected = both(families["qwen3"], messages, add_generation_prompt=True,
                          chat_template_kwargs={"enable_thinking": enable_thinking})
    assert ours == expected
    assert ours.endswith("<think>\n\n</think>\n\n") == (not enable_thinking)


def test_llama_dates_render_as_transformers_renders_them(families):
    ours, expected = both(families["llama-3.2"], CHAT, add_generation_prompt=True,
                          chat_template_kwargs={"date_string": "06 Dec 2026"})
    assert ours == expected and "Today Date: 06 Dec 2026\n" in ours
    # Without date_string the template asks strftime_now for today's date.
    ours, expected = both(families["llama-3.2"], CHAT, add_generation_prompt=True)
    assert ours == expected and "Today Date: 26 Jul 2024" not in ours


TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add <two> numbers & more",
                                            "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]


def test_named_templates_and_tools_render_as_transformers_renders_them(tmp_path, tiny_tokenizer_json):
    """A checkpoint with named templates: ``tool_use`` is picked when tools are given (here Llama-3.2's, which
    writes them with tojson(indent=4)), ``default`` otherwise, and either can be asked for by name."""
    named = [{"name": "default", "template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
             {"name": "tool_use", "template": (TEMPLATES / "llama-3.2-3b-instruct.jinja").read_text()}]
    pair = make_pair(tmp_path, tiny_tokenizer_json, named, LLAMA_TOKENS)
    options = {"add_generation_prompt": True, "chat_template_kwargs": {"date_string": "06 Dec 2026"}}
    for extra in ({"tools": TOOLS}, {}, {"chat_template": "tool_use"}, {"chat_template": "default", "tools": TOOLS}):
        ours, expected = both(pair, CHAT, **options, **extra)
        assert ours == expected, extra
    assert '"description": "Add <two> numbers & more"' in both(pair, CHAT, tools=TOOLS, **options)[0]


def test_special_tokens_come_from_where_transformers_reads_them(tmp_path, tiny_tokenizer_json):
    """An older layout: the named tokens in special_tokens_map.json, over tokenizer_config.json's."""
    ours, _ = make_pair(tmp_path, tiny_tokenizer_json, "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}",
                        {"bos_token": "<pad>"})
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": False, "normalized": False}}))
    ours, reference = Tokenizer(tmp_path), transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    assert ours.apply_chat_template(CHAT) == reference.apply_chat_template(CHAT, tokenize=False) == "<s>|</s>|"
    assert ours.eos_token_id == reference.eos_token_id


def test_continue_final_message_leaves_the_message_open(families):
    text = families["qwen3"][0].apply_chat_template(PREFILL, add_generation_prompt=False,
                                                    continue_final_message=True)
    # Qwen3 writes an (empty) thinking block before the final answer, then the prefill, left open.
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is ")


@pytest.fixture(scope="module")
def plain_pair(tmp_path_factory, tiny_tokenizer_json):
    return make_pair(tmp_path_factory.mktemp("plain"), tiny_tokenizer_json, "{{ messages[0]['content'] }}",
                     {"bos_token": "<s>", "eos_token": "</s>"})


ENVIRONMENT = {
    "break-continue": "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}"
                      "{% if loop.index0 == 3 %}{% break %}{% endif %}[{{ m.content }}]{% endfor %}",
    "tojson-plain": "{{ messages | tojson }}",
    "tojson-options": "{{ {'b': '<&>', 'a': 'é'} | tojson(indent=2, sort_keys=true) }}"
                      "{{ ['x'] | tojson(separators=(',', ':'), ensure_ascii=true) }}",
    "tojson-concatenated": "{{ 'q=' + (messages[3].content | tojson) }}",
    "strftime-now": "{{ strftime_now('%Y-%m-%d') }}",
    "dict": "{{ dict(a=1, b=2) | tojson }}{{ dict.fromkeys(['x', 'y'], 0) | tojson }}",
    "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
                 "{{ ns.n }}",
    "generation-tag": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                      "{% endgeneration %}{% else %}{{ m.role }}{% endif %}{% endfor %}",
    "special-tokens": "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ tools is none }}"
                      "|{{ documents is none }}|{{ add_generation_prompt }}",
    "trim-blocks": "{% for m in messages %}\n  {% if m.role == 'user' %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}",
}


@pytest.mark.parametrize("template", list(ENVIRONMENT.values()), ids=list(ENVIRONMENT))
def test_the_environment_is_transformers(plain_pair, template):
    ours, expected = both(plain_pair, CHAT, chat_template=template, add_generation_prompt=True)
    assert ours == expected


@pytest.mark.parametrize("template, message", [
    ("{{ raise_exception('Conversation roles must alternate user/assistant') }}",
     "Conversation roles must alternate user/assistant"),
    ("{% set ns = namespace(_secret=1) %}", "underscore"),
    ("{% set ns = namespace() %}{% set ns._secret = 1 %}", "underscore"),
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
], ids=["raise-exception", "namespace-underscore", "namespace-underscore-set", "sandbox"])
def test_what_transformers_refuses_is_refused(plain_pair, template, message):
    ours, reference = plain_pair
    with pytest.raises(Exception, match=message):
        reference.apply_chat_template(CHAT, chat_template=template, tokenize=False)
    with pytest.raises(HyspecError, match=message):
        ours.apply_chat_template(CHAT, chat_template=template)


@pytest.mark.parametrize("options, message", [
    ({"continue_final_message": True, "add_generation_prompt": True}, "cannot both be set"),
    ({"continue_final_message": True, "add_generation_prompt": False,
      "chat_template": "{{ messages[0].role }}"}, "does not read the final message's 'content'"),
    ({"continue_final_message": True, "add_generation_prompt": False,
      "chat_template": "{% for m in messages %}{{ m.content[:3] }}{% endfor %}"}, "does not appear"),
    ({"chat_template_kwargs": {"messages": []}}, "may not set 'messages'"),
    ({"chat_template_kwargs": {"chat_template": "x"}}, "may not set 'chat_template'"),
    ({"chat_template": "{% for %}"}, "chat template failed"),
], ids=["both-prompt-options", "template-without-content", "template-drops-content", "reserved-messages",
        "reserved-chat-template", "syntax-error"])
def test_bad_options_are_refused_with_the_reason(plain_pair, options, message):
    with pytest.raises(HyspecError, match=message):
        plain_pair[0].apply_chat_template(PREFILL, **options)


def test_caller_messages_are_not_changed(plain_pair):
    messages = json.loads(json.dumps(PREFILL))
    plain_pair[0].apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True,
                                      chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    assert messages == PREFILL


def test_developer_messages_become_system_where_the_template_has_no_developer_role():
    """vLLM's rule (vllm/renderers/hf.py), applied by the server and LLM.chat."""
    from hyspec.model.chat_inputs import developer_as_system

    developer = {"role": "developer", "content": "Be brief.", "tools": []}
    chat = [developer, {"role": "user", "content": "Hi"}]
    assert developer_as_system(chat, "{{ 'developer' }}") == chat  # the template knows the role
    assert developer_as_system(chat, "") == [{"role": "system", "content": "Be brief."}, chat[1]]
    later = [{"role": "system", "content": "A."}, chat[1], {"role": "developer", "content": [{"type": "text",
                                                                                          "text": "B."}]}]
    assert developer_as_system(later, "") == [{"role": "system", "content": "A.\n\nB."}, chat[1]]
    no_developer = [chat[1], {"role": "system", "content": "late"}]
    assert developer_as_system(no_developer, "") is no_developer


@pytest.mark.slow
def test_the_default_models_own_tokenizer_renders_as_transformers_reads_its_gguf():
    """The whole path on the default model: hyspec's GGUF tokenizer against transformers' GGUF loader
    (slow: transformers converts the 49152-token vocabulary)."""
    from tests.model.test_default_model import needs_default

    if needs_default.args[0]:
        pytest.skip(needs_default.kwargs["reason"])
    from hyspec.assets import default_model

    path = default_model()
    ours = Tokenizer(path)
    reference = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for messages, options in CASES.values():
        options = dict(options)
        kwargs = options.pop("chat_template_kwargs", {})
        assert ours.apply_chat_template(messages, chat_template_kwargs=kwargs, **options) == \
            reference.apply_chat_template(messages, tokenize=False, **options, **kwargs)
