"""What a request constrains its output to: vLLM's ``StructuredOutputsParams``, same names.

Exactly one constraint per request: ``json`` (a JSON schema, as a dict or its JSON text),
``regex``, ``choice`` (the output is one of these strings), ``grammar`` (GBNF as in
llama.cpp, or Lark as llguidance reads it) or ``json_object`` (any JSON object).  The
options ``disable_any_whitespace``, ``disable_additional_properties`` and
``whitespace_pattern`` shape the JSON ones as in vLLM.  ``structural_tag`` is refused:
hyspec does not implement it.

This module is plain data and its checks; the grammar engine is imported only when a
grammar is compiled (``hyspec.structured.grammar``), so ``import hyspec`` needs nothing
more.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hyspec.errors import RequestError

#: the constraint fields: exactly one is set
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputError(RequestError):
    """A structured-output constraint that cannot be used: names the field and what is wrong."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass
class StructuredOutputsParams:
    """One request's output constraint (vLLM's ``vllm.sampling_params.StructuredOutputsParams``)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in CONSTRAINTS if getattr(self, name) is not None]
        if len(given) != 1:
            raise StructuredOutputError(
                "structured_outputs", f"exactly one of {', '.join(CONSTRAINTS)} must be given, got "
                f"{', '.join(given) if given else 'none'}")
        if self.structural_tag is not None:
            raise StructuredOutputError("structural_tag", "not implemented by hyspec (json, regex, choice, "
                                                          "grammar and json_object are)")
        if self.json is not None:
            self.json = parse_schema(self.json)
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise StructuredOutputError("regex", "must be a non-empty string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise StructuredOutputError("grammar", "must be a non-empty string (GBNF or Lark)")
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice
                    or not all(isinstance(c, str) and c for c in self.choice)):
                raise StructuredOutputError("choice", "must be a non-empty list of non-empty strings")
            self.choice = list(self.choice)
        if self.json_object is not None and self.json_object is not True:
            raise StructuredOutputError("json_object", f"must be true when given, got {self.json_object!r}")
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise StructuredOutputError(name, f"must be a boolean, got {getattr(self, name)!r}")
        if self.whitespace_pattern is not None:
            if not isinstance(self.whitespace_pattern, str) or not self.whitespace_pattern:
                raise StructuredOutputError("whitespace_pattern", "must be a non-empty regex")
            if self.json is None and self.json_object is None:
                raise StructuredOutputError("whitespace_pattern", "applies to json and json_object only")
            if self.disable_any_whitespace:
                raise StructuredOutputError("whitespace_pattern", "contradicts disable_any_whitespace")

    @property
    def kind(self) -> str:
        """The constraint given: ``json``, ``regex``, ``choice``, ``grammar`` or ``json_object``."""
        return next(name for name in CONSTRAINTS if getattr(self, name) is not None)


def parse_schema(schema: Any) -> dict[str, Any]:
    """A JSON schema given as a dict or as its JSON text -> the dict (invalid text: an error with its position)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise StructuredOutputError(
                "json", f"the schema is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
                        f"(character {exc.pos})") from None
    if schema is True:  # JSON Schema's "anything"
        schema = {}
    if schema is False:
        raise StructuredOutputError("json", "the schema false admits no value, so no output satisfies it")
    if not isinstance(schema, dict):
        raise StructuredOutputError("json", f"a JSON schema is an object, got {type(schema).__name__}")
    return schema
