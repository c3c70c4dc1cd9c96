"""Constraints -> llguidance grammars, and the tokenizer llguidance matches them against.

llguidance (https://github.com/guidance-ai/llguidance, on PyPI; vLLM's ``guidance``
structured-output backend) does the matching: JSON schemas, regexes, choices and
GBNF / Lark grammars all become its grammar text, and its ``LLMatcher`` gives the token
mask after any prefix, validates a draft without consuming it, and rolls back.  Imported
lazily: it is the ``structured`` extra.

Bad input is reported before a request is queued, with where it is wrong: a schema's
JSON path (checked against its meta-schema by the ``jsonschema`` package), a regex's
character, or llguidance's own message for what it cannot compile.
"""
from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections import OrderedDict
import weakref
from typing import TYPE_CHECKING, Any, Collection

from hyspec.errors import HyspecError
from hyspec.structured.params import StructuredOutputError, StructuredOutputsParams

if TYPE_CHECKING:
    import llguidance

    from hyspec.model.tokenizer import Tokenizer

INSTALL_HINT = "structured outputs need llguidance: pip install 'hyspec[structured]'"


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise HyspecError(INSTALL_HINT) from None
    return llguidance


def check_json_schema(schema: dict[str, Any], field: str = "json") -> None:
    """The schema against its meta-schema; an error names the JSON path of the first problem."""
    try:
        import jsonschema
    except ImportError:
        raise HyspecError(INSTALL_HINT + " (and jsonschema)") from None
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(
        validator(validator.META_SCHEMA, format_checker=validator.FORMAT_CHECKER).iter_errors(schema))
    if error is not None:
        raise StructuredOutputError(field, f"invalid JSON schema at {error.json_path}: {error.message}")


def _forbid_additional_properties(schema: Any) -> Any:
    """vLLM's ``disable_additional_properties``: every object schema that does not say otherwise gets
    ``additionalProperties: false`` (returns a copy)."""
    if isinstance(schema, list):
        return [_forbid_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _forbid_additional_properties(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def grammar_text(params: StructuredOutputsParams) -> str:
    """llguidance's grammar for a request's constraint (not yet checked against a tokenizer)."""
    llg = _llguidance()
    kind = params.kind
    if kind in ("json", "json_object"):
        schema = {"type": "object"} if kind == "json_object" else params.json
        check_json_schema(schema, kind)
        if params.disable_additional_properties:
            schema = _forbid_additional_properties(schema)
        options: dict[str, Any] = {"whitespace_flexible": not params.disable_any_whitespace}
        if params.whitespace_pattern is not None:
            options["whitespace_pattern"] = params.whitespace_pattern
        try:
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        except (ValueError, RuntimeError) as exc:
            raise StructuredOutputError(kind, f"cannot compile the JSON schema: {exc}") from None
    try:
        # "grammar" takes GBNF (llama.cpp's, converted to Lark by llguidance) or Lark as written
        return llg.grammar_from(kind, params.choice if kind == "choice" else getattr(params, kind))
    except (ValueError, RuntimeError) as exc:
        raise StructuredOutputError(kind, str(exc)) from None


def check_constraint(params: StructuredOutputsParams) -> None:
    """What can be checked without a tokenizer (the server does it while reading the request): the schema against
    its meta-schema, and the regex or grammar's syntax.  Raises StructuredOutputError naming the problem."""
    llg = _llguidance()
    grammar = grammar_text(params)
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise _compile_error(params.kind, messages[0])


def _compile_error(kind: str, message: str) -> StructuredOutputError:
    # llguidance appends the Lark grammar it wrapped a regex or choice in; the user wrote the part above it
    if kind in ("regex", "choice"):
        message = re.sub(r"^at \d+\(\d+\): ", "", message.split("\n   1 | start:")[0].rstrip())
    return StructuredOutputError(kind, message)


class GrammarTokenizer:
    """A model's tokenizer as llguidance reads it: built once per (tokenizer, vocabulary, EOS ids) and
    shared by every request (building it walks the whole vocabulary: ~0.6 s for 49k tokens)."""

    _cache: "weakref.WeakKeyDictionary[Tokenizer, dict[tuple, llguidance.LLTokenizer]]" = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    @classmethod
    def get(cls, tokenizer: "Tokenizer", vocab_size: int, eos_ids: Collection[int]) -> "llguidance.LLTokenizer":
        """``vocab_size`` is the model's logits width (may exceed the tokenizer's: padding rows stay masked)."""
        llg = _llguidance()
        key = (vocab_size, tuple(sorted(eos_ids)))
        with cls._lock:
            per_tokenizer = cls._cache.setdefault(tokenizer, {})
            if key not in per_tokenizer:
                if not eos_ids:
                    raise HyspecError("structured outputs need an end-of-sequence token; the model names none")
                per_tokenizer[key] = llg.LLTokenizer(tokenizer.to_json(), n_vocab=vocab_size,
                                                     eos_token=list(key[1]))
            return per_tokenizer[key]


#: compiled matchers at the start of the output, by (tokenizer, constraint): requests repeat their schema, and
#: compiling one (~4 ms for a small regex) costs more than a whole step of a small model; copies are ~1 us
_TEMPLATES: "OrderedDict[tuple[int, str], tuple[llguidance.LLTokenizer, llguidance.LLMatcher]]" = OrderedDict()
_TEMPLATES_MAX = 64
_templates_lock = threading.Lock()


def compile_matcher(params: StructuredOutputsParams, ll_tokenizer: "llguidance.LLTokenizer") -> "llguidance.LLMatcher":
    """A fresh matcher for one output sequence, at the start of the output.  Raises StructuredOutputError for a
    constraint llguidance rejects, and for one that no output satisfies (no token allowed at the start)."""
    key = (id(ll_tokenizer), json.dumps(dataclasses.asdict(params), sort_keys=True))
    with _templates_lock:
        hit = _TEMPLATES.get(key)
        if hit is not None and hit[0] is ll_tokenizer:
            _TEMPLATES.move_to_end(key)
            return hit[1].deep_copy()
    template = _compile(params, ll_tokenizer)
    with _templates_lock:
        _TEMPLATES[key] = (ll_tokenizer, template)
        while len(_TEMPLATES) > _TEMPLATES_MAX:
            _TEMPLATES.popitem(last=False)
    return template.deep_copy()


def _compile(params: StructuredOutputsParams, ll_tokenizer: "llguidance.LLTokenizer") -> "llguidance.LLMatcher":
    llg = _llguidance()
    grammar = grammar_text(params)
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, ll_tokenizer)
    if is_error:
        raise _compile_error(params.kind, messages[0])
    matcher = llg.LLMatcher(ll_tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise _compile_error(params.kind, matcher.get_error())
    if not matcher.is_accepting() and only_eos_allowed(matcher, ll_tokenizer.eos_tokens):
        raise StructuredOutputError(params.kind, "no output satisfies this constraint (no token can start it)")
    return matcher


def only_eos_allowed(matcher: "llguidance.LLMatcher", eos_ids: Collection[int]) -> bool:
    """Whether the matcher's next-token mask allows end-of-sequence tokens and nothing else (llguidance's
    answer for a finished grammar, and for a state from which nothing can follow)."""
    import numpy as np

    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    allowed = set(np.flatnonzero(bits).tolist())
    return allowed <= set(eos_ids)
