"""What a chat template sees, prepared as transformers' ``apply_chat_template`` prepares it.

transformers (read at v5.25.0: ``apply_chat_template`` in tokenization_utils_base.py and
``render_jinja_template`` in utils/chat_template_utils.py) hands a template:

- ``messages``: plain JSON data (pydantic models dumped, str/int subclasses reduced to the base type, any
  other object a ``"<TypeName>"`` placeholder), keys whose value is None dropped, and a message's reasoning
  under each of ``reasoning_content`` and ``thinking`` when it has one of ``reasoning_content``, ``thinking``
  or ``reasoning``;
- ``tools``, ``documents``, ``add_generation_prompt``;
- the tokenizer's named special tokens (``bos_token``, ``eos_token``, ... those that are set);
- the caller's keyword arguments (``chat_template_kwargs``), over the special tokens; unknown ones are passed
  on (a template that does not read a name never sees it).

``continue_final_message`` leaves the final message open: a tag is appended to its text, and the rendering
is cut where the tag lands (with the whitespace before it when the template trimmed the message's end).
Written here, not called from transformers, for the reasons in chat_template.py; the tests hold the two
equal.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hyspec.errors import HyspecError

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# The names a message's reasoning goes under; the first is the one templates read (Qwen3's, DeepSeek's).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# transformers' tag: the same text, so that a template that rewrites the message cuts at the same place.
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# Template variables that have their own argument; chat_template_kwargs may not set them.
RESERVED_KWARGS = {
    "messages": "the conversation itself",
    "tools": "the tools argument",
    "documents": "the documents argument",
    "add_generation_prompt": "the add_generation_prompt field",
    "continue_final_message": "the continue_final_message field",
    "chat_template": "the chat_template field",
    "tokenize": "hyspec tokenizes the rendered text itself",
}


class ChatInputError(HyspecError):
    """A chat's inputs that no template could be rendered with; ``field`` names the argument at fault."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


@dataclass
class ChatInputs:
    """The template's variables, and the text of the final message when it is continued."""

    variables: dict[str, Any]
    continued_text: str | None = None

    def finish(self, rendered: str) -> str:
        """The rendered text, cut where the continued message's tag landed."""
        if self.continued_text is None:
            return rendered
        if self.continued_text.strip() not in rendered or CONTINUE_TAG.strip() not in rendered:
            raise _cannot_continue("the final message does not appear in the rendered chat (the chat template "
                                   "changes or drops it)")
        at = rendered.rindex(CONTINUE_TAG.strip())
        if rendered[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG:
            return rendered[:at]
        return rendered[:at].rstrip()  # the template trimmed the message's trailing whitespace, the tag's too


def prepare(messages: Any, template_source: str, special_tokens: Mapping[str, str], *,
            add_generation_prompt: bool = False, continue_final_message: bool | str = False,
            tools: list[dict[str, Any]] | None = None, documents: list[dict[str, Any]] | None = None,
            chat_template_kwargs: Mapping[str, Any] | None = None) -> ChatInputs:
    """The variables ``template_source`` is rendered with (HyspecError naming what is wrong)."""
    if continue_final_message and add_generation_prompt:
        raise ChatInputError("continue_final_message", "continue_final_message and add_generation_prompt cannot "
                             "both be set: the first continues the final message, the second starts a new one")
    kwargs = dict(chat_template_kwargs or {})
    for name in kwargs:
        if not isinstance(name, str):
            raise ChatInputError("chat_template_kwargs", f"chat_template_kwargs: keys must be strings, got {name!r}")
        if name in RESERVED_KWARGS:
            raise ChatInputError("chat_template_kwargs",
                                 f"chat_template_kwargs may not set {name!r}: that is {RESERVED_KWARGS[name]}")
    chat = _conversation(messages)
    continued = _tag_final_message(chat, continue_final_message, template_source) if continue_final_message else None
    if tools is not None and not all(isinstance(t, Mapping) for t in tools):
        raise ChatInputError("tools", "tools must be JSON schemas (dicts)")
    if documents is not None and not all(isinstance(d, Mapping) for d in documents):
        raise ChatInputError("documents", "documents must be dicts (with 'title' and 'text')")
    variables = {"messages": chat, "tools": plain_data(tools), "documents": plain_data(documents),
                 "add_generation_prompt": add_generation_prompt,
                 **{k: v for k, v in special_tokens.items() if v is not None}, **plain_data(kwargs)}
    return ChatInputs(variables, continued)


def developer_as_system(messages: list[dict[str, Any]], template_source: str) -> list[dict[str, Any]]:
    """vLLM's treatment of OpenAI's ``developer`` role (vllm/renderers/hf.py, v0.32): where the template never
    names the role, developer messages become system messages, and the system messages are then merged into
    one at the start (their text parts joined by blank lines) if there is more than one or one is not first.
    The server and LLM.chat apply it, as vLLM's do; Tokenizer.apply_chat_template, like transformers', does not."""
    if not any(m.get("role") == "developer" for m in messages) or any(
            quoted in template_source for quoted in ('"developer"', "'developer'")):
        return messages
    converted = [{**{k: v for k, v in m.items() if k != "tools"}, "role": "system"} if m.get("role") == "developer"
                 else m for m in messages]
    system_at = [i for i, m in enumerate(converted) if m.get("role") == "system"]
    if system_at == [0]:
        return converted
    texts = [text for i in system_at if (text := _text_of(converted[i].get("content")))]
    return [{"role": "system", "content": "\n\n".join(texts)}, *(m for m in converted if m.get("role") != "system")]


def _text_of(content: Any) -> str:
    """A message's content as text: a string, or its text parts joined by newlines."""
    if isinstance(content, list):
        return "\n".join(p["text"] if isinstance(p, dict) else p for p in content
                         if isinstance(p, str) or (isinstance(p, dict) and "text" in p))
    return content if isinstance(content, str) else ""


def _conversation(messages: Any) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
        raise ChatInputError("messages", f"messages must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ChatInputError("messages", "messages is empty: a chat template needs at least one message")
    chat = []
    for i, message in enumerate(plain_data(list(messages))):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ChatInputError("messages", f"messages[{i}] must be a dict with 'role' and 'content'")
        message = {k: v for k, v in message.items() if v is not None}  # templates handle a missing key, not None
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


def _tag_final_message(chat: list[dict[str, Any]], continue_final_message: bool | str, template_source: str) -> str:
    """Append CONTINUE_TAG to the final message's text; return that text as it was."""
    field = continue_final_message if isinstance(continue_final_message, str) else "content"
    final = chat[-1]
    text = final.get(field)
    if text is None:
        raise _cannot_continue(f"the final message has no {field!r}")
    fields = [field]
    if field in REASONING_FIELDS:  # the reasoning is under several names: whichever the template reads
        fields = [f for f in REASONING_FIELDS if final.get(f) == text]
    if not any(f in template_source for f in fields):
        raise _cannot_continue(f"this chat template does not read the final message's {field!r}")
    if isinstance(text, (list, tuple)):  # content parts: continue the last text part
        for part in reversed(text):
            if "text" in part:
                continued, part["text"] = part["text"], part["text"] + CONTINUE_TAG
                return continued
        raise _cannot_continue("the final message has no text part")
    if not isinstance(text, str):
        raise _cannot_continue(f"the final message's {field!r} is not text")
    for f in fields:
        final[f] = final[f] + CONTINUE_TAG
    return text


def _cannot_continue(reason: str) -> ChatInputError:
    return ChatInputError("continue_final_message", f"continue_final_message: cannot continue: {reason}")


def plain_data(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types, so that a template reaches no method of a caller's object."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    numpy = sys.modules.get("numpy")  # not imported: no value can be one of its scalars
    if numpy is not None and isinstance(value, numpy.generic):
        return plain_data(value.item())  # np.bool_(False) must stay falsy
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models (the openai client's messages)
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"
