"""Every field of vLLM's and OpenAI's completion and chat requests: implemented, or refused (and why).

A field is *implemented* when the request model in hyspec.server.protocol declares it and no entry below
refuses it; it is *refused* when it has an entry here.  There is no third state: a body key that is
neither (not in either schema, or a typo) is a 400 naming it, and so is a refused field set to anything
but a value that asks for nothing (``Refusal.off``: absent, null, or e.g. ``use_beam_search: false``).
A refused field may also be declared on the request model (its type and range checked already): the entry
here wins until the feature is wired, and deleting the entry is what switches it on.

tests/server/test_request_fields.py walks the schemas' field lists (vllm_schemas.json, read from the
installed vLLM and openai packages by scripts/gen_vllm_schemas.py) against this table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COMPLETIONS = "completions"
CHAT = "chat"
ENDPOINTS = (COMPLETIONS, CHAT)


@dataclass(frozen=True)
class Refusal:
    """A field hyspec does not implement: any value but those in ``off`` is a 400 with ``reason``."""

    reason: str
    off: tuple[Any, ...] = (None,)

    def allows(self, value: Any) -> bool:
        return any(value == off and type(value) is type(off) for off in self.off)


NONE_OR_EMPTY_LIST = (None, [])
NONE_OR_EMPTY_DICT = (None, {})
NOT_YET = "not implemented yet: leave it out"  # a field being implemented now; its entry goes when it lands
MULTIMODAL = "hyspec serves text-only models (no images, audio, video or multimodal processor options)"
KV_TRANSFER = "hyspec has no disaggregated prefill or encoder-cache transfer"
TOOLS = ("tool calling needs a model-specific tool-call parser (Hermes for Qwen2.5/Qwen3, Llama-3's JSON, "
         "Mistral's) that hyspec has not got")
REASONING = "hyspec has no reasoning parser: a model's thinking stays in the content"
OPENAI_PLATFORM = "an OpenAI platform feature (storage, moderation, tiers, caching policy) hyspec has not got"

# field -> refusal, for both endpoints; COMPLETION_ONLY / CHAT_ONLY hold what differs
COMMON: dict[str, Refusal] = {
    # being implemented now (issue 47): each entry is removed when its field is wired
    # refused
    "user": Refusal("hyspec keeps no per-user records (OpenAI uses `user` for abuse monitoring)"),
    "use_beam_search": Refusal("hyspec has no beam search (n and best_of sample)", (None, False)),
    "length_penalty": Refusal("a beam-search option; hyspec has no beam search", (None, 1, 1.0)),
    "truncate_prompt_tokens": Refusal("hyspec never truncates a prompt: a prompt past the context is a 400"),
    "truncation_side": Refusal("hyspec never truncates a prompt: a prompt past the context is a 400"),
    "logprob_token_ids": Refusal("hyspec returns the top-k logprobs (logprobs / top_logprobs), not those of "
                                 "chosen token ids"),
    "return_token_offsets": Refusal("hyspec's logprobs carry text offsets (completions' text_offset) instead"),
    "spaces_between_special_tokens": Refusal("hyspec detokenizes with the tokenizer's own decoder (no spaces "
                                             "are inserted between special tokens)", (None, True)),
    "priority": Refusal("hyspec schedules first come, first served", (None, 0)),
    "request_id": Refusal("hyspec names each request itself (the response's id)"),
    "cache_salt": Refusal("hyspec's prefix cache has no per-tenant salt (it is off unless "
                          "--enable-prefix-caching)"),
    "session_id": Refusal("hyspec keeps no sessions: each request stands alone"),
    "stream_interval": Refusal("hyspec streams each engine step's tokens as they come", (None, 1)),
    "repetition_detection": Refusal("hyspec has no repetition detector (see repetition_penalty)"),
    "thinking_token_budget": Refusal(REASONING),
    "vllm_xargs": Refusal("hyspec loads no custom logits processors that would read extra arguments",
                          NONE_OR_EMPTY_DICT),
    "watermarking": Refusal("hyspec has no output watermarking"),
    "routed_experts_prompt_start": Refusal("hyspec's models are dense: no routed experts to report"),
    "kv_transfer_params": Refusal(KV_TRANSFER), "ec_transfer_params": Refusal(KV_TRANSFER),
    "mm_payload": Refusal(MULTIMODAL), "return_mm_kwargs": Refusal(MULTIMODAL, (None, False)),
}

COMPLETION_ONLY: dict[str, Refusal] = {
    "suffix": Refusal("hyspec's models have no fill-in-the-middle template to place a suffix with"),
    "prompt_embeds": Refusal("hyspec takes text or token ids as prompts, not embeddings"),
}

CHAT_ONLY: dict[str, Refusal] = {
    "chat_template": Refusal("hyspec never renders a template sent in a request (vLLM also refuses it unless "
                             "started with --trust-request-chat-template); start hyspec serve with --chat-template"),
    "add_special_tokens": Refusal("the chat template writes every special token (BOS included)", (None, False)),
    "return_prompt_text": Refusal("hyspec does not return the rendered prompt (POST /tokenize with the messages "
                                  "gives its tokens)", (None, False)),
    "echo": Refusal("chat has no prompt to echo in hyspec (completions' echo returns the prompt)", (None, False)),
    "tools": Refusal(TOOLS, NONE_OR_EMPTY_LIST),
    "tool_choice": Refusal(TOOLS, (None, "none", "auto")),
    "parallel_tool_calls": Refusal(TOOLS),
    "functions": Refusal(TOOLS, NONE_OR_EMPTY_LIST),
    "function_call": Refusal(TOOLS, (None, "none", "auto")),
    "include_reasoning": Refusal(REASONING, (None, True)),
    "reasoning_effort": Refusal(REASONING + "; a template variable such as Qwen3's enable_thinking goes in "
                                            "chat_template_kwargs"),
    "verbosity": Refusal("a parameter of OpenAI's own models: hyspec's have no verbosity setting"),
    "audio": Refusal(MULTIMODAL), "modalities": Refusal(MULTIMODAL, (None, ["text"])),
    "media_io_kwargs": Refusal(MULTIMODAL, NONE_OR_EMPTY_DICT), "mm_processor_kwargs": Refusal(MULTIMODAL, NONE_OR_EMPTY_DICT),
    "prediction": Refusal("hyspec does not draft from a client's predicted output (its drafters are the "
                          "server's --speculative-config)"),
    "web_search_options": Refusal("hyspec has no web search"),
    "metadata": Refusal(OPENAI_PLATFORM, NONE_OR_EMPTY_DICT), "store": Refusal(OPENAI_PLATFORM, (None, False)),
    "moderation": Refusal(OPENAI_PLATFORM), "service_tier": Refusal(OPENAI_PLATFORM, (None, "auto", "default")),
    "safety_identifier": Refusal(OPENAI_PLATFORM), "prompt_cache_key": Refusal(OPENAI_PLATFORM),
    "prompt_cache_options": Refusal(OPENAI_PLATFORM), "prompt_cache_retention": Refusal(OPENAI_PLATFORM),
}


def refusals(endpoint: str) -> dict[str, Refusal]:
    """The refused fields of ``endpoint`` (``completions`` or ``chat``)."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {endpoint!r}")
    return {**COMMON, **(COMPLETION_ONLY if endpoint == COMPLETIONS else CHAT_ONLY)}


def check_fields(endpoint: str, body: dict[str, Any], declared: set[str]) -> dict[str, Any]:
    """``body`` without the refused fields that ask for nothing; raises ``ValueError`` subclass ``FieldProblem``
    naming the first refused field set to something, or every key neither ``declared`` nor refused."""
    refused = refusals(endpoint)
    unknown = sorted(k for k in body if k not in declared and k not in refused)
    if unknown:
        names = ", ".join(f"`{k}`" for k in unknown)
        raise FieldProblem(unknown[0], f"unknown field{'s' if len(unknown) > 1 else ''} {names}: not in OpenAI's or "
                                       f"vLLM's {endpoint} request (docs/vllm_compat.md lists the fields)")
    out = {}
    for key, value in body.items():
        rule = refused.get(key)
        if rule is None:
            out[key] = value
        elif not rule.allows(value):
            raise FieldProblem(key, f"not supported by hyspec: {rule.reason}")
        elif key in declared:
            out[key] = value  # its "off" value, for the model's own default and checks
    return out


class FieldProblem(ValueError):
    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)
