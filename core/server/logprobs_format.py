"""The engine's per-token logprobs in OpenAI's two response layouts.

* ``/v1/completions`` (legacy): parallel lists ``tokens``, ``token_logprobs``,
  ``top_logprobs`` (token text -> logprob) and ``text_offset`` (each token's
  first character in the choice's text); with ``echo`` the prompt's tokens
  come first, the very first with ``None`` (nothing predicts it).
* ``/v1/chat/completions``: ``content`` is a list of ``{token, logprob,
  bytes, top_logprobs: [{token, logprob, bytes}]}``.

JSON has no ``-inf``: a token the request's filters removed (only in the
``processed_logprobs`` mode) reports -9999.0, as vLLM does.
"""
from __future__ import annotations

from typing import Any, Callable

from hyspec.engine.logprobs import Logprob

FLOOR = -9999.0

TokenText = Callable[[int], str]


def _lp(value: float) -> float:
    return max(value, FLOOR)


def prompt_logprobs(entries: list[dict[int, Logprob] | None] | None, token_text: TokenText
                    ) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token (the first None), token id -> logprob, rank, decoded token."""
    return [None if entry is None else {
        str(tid): {"logprob": _lp(lp.logprob), "rank": lp.rank,
                   "decoded_token": lp.decoded_token if lp.decoded_token is not None else token_text(tid)}
        for tid, lp in entry.items()} for entry in entries or []]


class CompletionLogprobBuilder:
    """Builds one choice's legacy logprobs, incrementally (a stream sends each step's slice)."""

    def __init__(self, token_text: TokenText, top_k: int, offset: int = 0):
        self.token_text = token_text
        self.top_k = top_k
        self.offset = offset  # characters of the choice's text before the next token

    def entries(self, token_ids: list[int], logprobs: list[dict[int, Logprob] | None]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for tok, entry in zip(token_ids, logprobs):
            text = self.token_text(tok)
            out["tokens"].append(text)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(_lp(entry[tok].logprob))
            top: dict[str, float] = {}
            for tid, lp in entry.items():  # the scored token and the top k (vLLM's logprobs + 1 entries)
                if tid == tok or lp.rank <= self.top_k:
                    top.setdefault(_text(lp, tid, self.token_text), _lp(lp.logprob))
            out["top_logprobs"].append(top)
        return out


def chat_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob]], token_text: TokenText,
                  top_k: int) -> list[dict[str, Any]]:
    """``choices[i].logprobs.content`` for these tokens."""
    content = []
    for tok, entry in zip(token_ids, logprobs):
        text = _text(entry[tok], tok, token_text)
        ranked = sorted(((lp.rank, tid, lp) for tid, lp in entry.items() if lp.rank <= top_k),
                        key=lambda item: item[0])[:top_k]
        content.append({"token": text, "logprob": _lp(entry[tok].logprob), "bytes": list(text.encode("utf-8")),
                        "top_logprobs": [{"token": _text(lp, tid, token_text), "logprob": _lp(lp.logprob),
                                          "bytes": list(_text(lp, tid, token_text).encode("utf-8"))}
                                         for _, tid, lp in ranked]})
    return content


def _text(lp: Logprob, token_id: int, token_text: TokenText) -> str:
    # the server's naming (text, or token_id:N), not the engine's decoded_token
    return token_text(token_id)
