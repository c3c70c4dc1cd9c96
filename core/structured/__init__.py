"""Structured outputs: a request's output constrained to a JSON schema, regex, choice or grammar.

:class:`StructuredOutputsParams` is vLLM's request-side shape (``SamplingParams.structured_outputs``);
:func:`build_grammar_processor` turns it into the :class:`GrammarProcessor` the engine keeps with the
sequence's other processors, so plain decoding and every speculative method apply the same mask
(docs/structured_outputs.md).  The grammar engine is llguidance, imported only when a grammar is built.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Collection

from hyspec.structured.params import StructuredOutputError, StructuredOutputsParams
from hyspec.structured.processor import GrammarProcessor, GrammarViolation

if TYPE_CHECKING:
    from hyspec.model.tokenizer import Tokenizer


def build_grammar_processor(params: StructuredOutputsParams, tokenizer: "Tokenizer", *, vocab_size: int,
                            eos_ids: Collection[int]) -> GrammarProcessor:
    """One output sequence's grammar processor (a fresh matcher: each of ``n`` samples gets its own)."""
    from hyspec.structured.grammar import GrammarTokenizer, compile_matcher

    ll_tokenizer = GrammarTokenizer.get(tokenizer, vocab_size, eos_ids)
    return GrammarProcessor(compile_matcher(params, ll_tokenizer), eos_ids, vocab_size)


__all__ = ["GrammarProcessor", "GrammarViolation", "StructuredOutputError", "StructuredOutputsParams",
           "build_grammar_processor"]
