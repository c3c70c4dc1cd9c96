"""``POST /tokenize`` and ``POST /detokenize``, shaped as vLLM's (vllm/entrypoints/serve/tokenize, v0.32).

``/tokenize`` takes a completion prompt (``prompt``) or a conversation (``messages``, rendered with the
chat template exactly as ``/v1/chat/completions`` renders it: the same request model checks the chat
fields, so a chat option is implemented, or refused, in both places at once) and answers
``{count, max_model_len, tokens, token_strs}``; ``/detokenize`` turns ``tokens`` back into ``prompt``.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from hyspec.server.errors import APIError, describe_validation_errors
from hyspec.server.protocol import (ChatCompletionRequest, DetokenizeRequest, DetokenizeResponse,
                                    TokenizeCompletionRequest, TokenizeResponse)

# vLLM's TokenizeChatRequest fields; those not listed here go to the chat request model (and its table)
_TOKENIZE_ONLY = ("return_token_strs", "add_special_tokens")
_CHAT_TOKENIZE_FIELDS = frozenset({"model", "messages", "add_generation_prompt", "return_token_strs",
                                   "continue_final_message", "add_special_tokens", "chat_template",
                                   "chat_template_kwargs", "media_io_kwargs", "mm_processor_kwargs", "tools"})


def validated(model: type[BaseModel], body: Any) -> Any:
    """``model`` from ``body``, or an APIError 400 naming the field, as the other routes answer."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param = describe_validation_errors(list(exc.errors()))
        raise APIError(400, message, param) from None


class OpenAITokenization:
    """The two routes' work, on the serving layer's tokenizer and chat rendering."""

    def __init__(self, serving: Any):
        self.serving = serving
        self.tokenizer = serving.tokenizer

    async def tokenize(self, body: Any) -> TokenizeResponse:
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object with `prompt` or `messages`")
        if "messages" in body:
            return await self._tokenize_chat(body)
        req = validated(TokenizeCompletionRequest, body)
        self.serving.check_model(req.model)
        self.serving._check_prompt_chars(len(req.prompt), "prompt")
        ids = await asyncio.to_thread(self.tokenizer.encode, req.prompt, add_special_tokens=req.add_special_tokens)
        return self._answer(ids, req.return_token_strs)

    async def _tokenize_chat(self, body: dict[str, Any]) -> TokenizeResponse:
        unknown = sorted(set(body) - _CHAT_TOKENIZE_FIELDS)
        if unknown:
            names = ", ".join(f"`{k}`" for k in unknown)
            raise APIError(400, f"{unknown[0]}: unknown field{'s' if len(unknown) > 1 else ''} {names}: not in "
                                "vLLM's tokenize request", param=unknown[0])
        return_strs = body.get("return_token_strs", False)
        if return_strs not in (None, True, False):
            raise APIError(400, "return_token_strs: must be a boolean", param="return_token_strs")
        if body.get("add_special_tokens", False) is not False:
            raise APIError(400, "add_special_tokens: not supported by hyspec for chat: the chat template writes "
                                "every special token (BOS included)", param="add_special_tokens")
        chat = validated(ChatCompletionRequest, {k: v for k, v in body.items() if k not in _TOKENIZE_ONLY})
        self.serving.check_model(chat.model)
        self.serving._check_prompt_chars(chat.prompt_chars(), "messages")
        prompt = await asyncio.to_thread(self.serving._chat_prompt, chat)
        return self._answer(prompt.token_ids, return_strs)

    async def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        self.serving.check_model(req.model)
        vocab = self.serving.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"tokens: {bad} is not a token id of this model (0 to {vocab - 1})", param="tokens")
        text = await asyncio.to_thread(self.tokenizer.decode, req.tokens, skip_special_tokens=False)
        return DetokenizeResponse(prompt=text)

    def _answer(self, ids: list[int], return_strs: Optional[bool]) -> TokenizeResponse:
        strs = [self.tokenizer.id_to_token(t) or "" for t in ids] if return_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=self.serving.max_model_len, tokens=list(ids),
                                token_strs=strs)

