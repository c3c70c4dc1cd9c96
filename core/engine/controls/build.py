"""A request's sampling controls -> its processors, in vLLM's order.

vLLM's sampler (``vllm/v1/sample/sampler.py``, v0.32) applies, before temperature and the
top-k / top-p / min-p filters: allowed_token_ids, bad_words, min_tokens, logit_bias, then
the penalties.  The order matters (a bias then a repetition penalty is not a penalty then a
bias), so it is kept.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Sequence

import torch

from hyspec.engine.controls.masks import (AllowedTokensProcessor, BadWordsProcessor, LogitBiasProcessor,
                                          MinTokensProcessor)
from hyspec.engine.controls.penalties import PenaltyProcessor
from hyspec.errors import RequestError
from hyspec.seam.processors import TokenProcessor
from hyspec.structured import build_grammar_processor

if TYPE_CHECKING:
    from hyspec.engine.sampling_params import SamplingParams
    from hyspec.model.tokenizer import Tokenizer


def validate_ids(params: "SamplingParams", vocab_size: int) -> None:
    """Token ids a request names must be in the vocabulary (vLLM refuses them the same way)."""
    for name, ids in (("logit_bias", list(params.logit_bias or ())),
                      ("allowed_token_ids", params.allowed_token_ids or [])):
        bad = sorted({t for t in ids if not 0 <= t < vocab_size})
        if bad:
            raise RequestError(f"{name} has token ids outside the vocabulary [0, {vocab_size}): {bad[:8]}")


def bad_words_token_ids(words: Sequence[str], tokenizer: "Tokenizer | None", vocab_size: int) -> list[list[int]]:
    """vLLM's ``SamplingParams.update_from_tokenizer``: each word as written (leading space stripped)
    and, where that makes a different first token of the same length, with a leading space -- so the
    word is banned at the start of the text and after a space."""
    if tokenizer is None:
        raise RequestError("bad_words needs the tokenizer; the engine was started with skip_tokenizer_init")
    out: list[list[int]] = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not plain:
            raise RequestError(f"bad_words entry {word!r} tokenizes to no token")
        out.append(plain)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    if any(not 0 <= t < vocab_size for ids in out for t in ids):
        raise RequestError("bad_words tokenize to ids outside the model's vocabulary")
    return out


def grammar_processor(params: "SamplingParams", tokenizer: "Tokenizer | None", *, eos_ids: Collection[int],
                      vocab_size: int) -> TokenProcessor:
    """The request's structured-output constraint as a grammar processor (hyspec.structured)."""
    if tokenizer is None:
        raise RequestError("structured_outputs needs the tokenizer; the engine was started with skip_tokenizer_init")
    return build_grammar_processor(params.structured_outputs, tokenizer, vocab_size=vocab_size, eos_ids=eos_ids)


def build_processors(params: "SamplingParams", prompt_token_ids: Sequence[int], *, eos_ids: Collection[int],
                     vocab_size: int, tokenizer: "Tokenizer | None", device: torch.device) -> list[TokenProcessor]:
    """The processors of one request, empty when it asks for no control (the common case costs nothing)."""
    out: list[TokenProcessor] = []
    if params.structured_outputs is not None:  # first: vLLM masks by the grammar before its sampler's controls
        out.append(grammar_processor(params, tokenizer, eos_ids=eos_ids, vocab_size=vocab_size))
    if not params.has_controls:
        return out
    validate_ids(params, vocab_size)
    if params.allowed_token_ids is not None:
        out.append(AllowedTokensProcessor(params.allowed_token_ids, vocab_size, device))
    if params.bad_words:
        out.append(BadWordsProcessor(bad_words_token_ids(params.bad_words, tokenizer, vocab_size)))
    if params.min_tokens:
        # vLLM masks every stop id, EOS included, whether or not ignore_eos is set (_all_stop_token_ids)
        stop = {t for t in (*eos_ids, *params.stop_token_ids) if 0 <= t < vocab_size}
        out.append(MinTokensProcessor(params.min_tokens, sorted(stop), device))
    if params.logit_bias:
        out.append(LogitBiasProcessor(params.logit_bias, device))
    if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
        out.append(PenaltyProcessor(prompt_token_ids, vocab_size, device, presence=params.presence_penalty,
                                    frequency=params.frequency_penalty, repetition=params.repetition_penalty))
    return out
