"""The request fields that constrain a completion's output, as OpenAI and vLLM clients send them.

* OpenAI's ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``, or
  ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``;
* vLLM's ``structured_outputs``: one of ``json``, ``regex``, ``choice``, ``grammar``, ``json_object``, with
  the options ``disable_any_whitespace``, ``disable_additional_properties``, ``whitespace_pattern``;
* vLLM's deprecated ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar`` (removed from
  vLLM's schema in 0.x, where they are now silently ignored; hyspec still honours them).

Exactly one constraint may be given across them all (``structured_outputs``' options combine with
``response_format``'s schema as in vLLM).  The request is refused while it is read (a 400 naming the
field) when the constraint is malformed: a schema against its meta-schema (with the JSON path of the
problem), a regex or grammar's syntax (with the position).  What needs the model's tokenizer -- a
grammar no token can start -- is checked when the engine takes the request, also a 400.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictStr, model_validator

from hyspec.structured.params import StructuredOutputError, StructuredOutputsParams


def _field_error(field: str, message: str) -> ValueError:
    """hyspec.server.protocol's FieldError (a 400 naming ``field``); imported here because protocol imports
    this module."""
    from hyspec.server.protocol import FieldError

    return FieldError(field, message)


class _Body(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")


class JsonSchemaFormat(_Body):
    """``response_format.json_schema`` (OpenAI): the schema is under ``schema``."""

    name: StrictStr = Field(description="the schema's name (OpenAI requires one)")
    description: Optional[StrictStr] = None
    json_schema: Optional[dict[str, Any]] = Field(None, alias="schema", description="the JSON schema")
    strict: Optional[StrictBool] = Field(None, description="hyspec always enforces the schema")


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"] = Field(
        description="text: no constraint; json_object: any JSON object; json_schema: JSON the schema accepts "
                    "(structural_tag is not implemented)")
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_structural_tag(cls, body: Any) -> Any:
        if isinstance(body, dict) and body.get("type") == "structural_tag":
            raise _field_error("response_format", "type structural_tag is not implemented by hyspec (text, "
                                                "json_object and json_schema are)")
        return body


class StructuredOutputsBody(_Body):
    """vLLM's ``structured_outputs`` request field (its ``StructuredOutputsParams``)."""

    json_: Optional[Union[dict[str, Any], StrictStr, StrictBool]] = Field(
        None, alias="json", description="a JSON schema (an object, or its JSON text)")
    regex: Optional[StrictStr] = None
    choice: Optional[Annotated[list[StrictStr], Field(min_length=1)]] = None
    grammar: Optional[StrictStr] = Field(None, description="GBNF (llama.cpp's) or Lark")
    json_object: Optional[StrictBool] = None
    disable_any_whitespace: StrictBool = False
    disable_additional_properties: StrictBool = False
    whitespace_pattern: Optional[StrictStr] = None
    structural_tag: Optional[StrictStr] = Field(None, description="not implemented by hyspec (must be absent)")

    def constraints(self) -> dict[str, Any]:
        fields = {"json": self.json_, "regex": self.regex, "choice": self.choice, "grammar": self.grammar,
                  "json_object": self.json_object, "structural_tag": self.structural_tag}
        return {k: v for k, v in fields.items() if v is not None}

    def options(self) -> dict[str, Any]:
        return {"disable_any_whitespace": self.disable_any_whitespace,
                "disable_additional_properties": self.disable_additional_properties,
                "whitespace_pattern": self.whitespace_pattern}


#: the deprecated vLLM fields -> the StructuredOutputsParams field each one sets
GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}


class StructuredOutputFields(BaseModel):
    """Declared on both request models (completions and chat)."""

    response_format: Optional[ResponseFormat] = Field(
        None, description="OpenAI's: text, json_object or json_schema (constrained as structured_outputs)")
    structured_outputs: Optional[StructuredOutputsBody] = Field(
        None, description="vLLM extension: json, regex, choice, grammar or json_object")
    guided_json: Optional[Union[dict[str, Any], StrictStr]] = Field(
        None, description="deprecated vLLM extension: structured_outputs.json")
    guided_regex: Optional[StrictStr] = Field(None, description="deprecated vLLM extension: structured_outputs.regex")
    guided_choice: Optional[Annotated[list[StrictStr], Field(min_length=1)]] = Field(
        None, description="deprecated vLLM extension: structured_outputs.choice")
    guided_grammar: Optional[StrictStr] = Field(
        None, description="deprecated vLLM extension: structured_outputs.grammar")

    _structured: Optional[StructuredOutputsParams] = PrivateAttr(None)

    @model_validator(mode="after")
    def _read_structured_outputs(self) -> "StructuredOutputFields":
        given: dict[str, tuple[str, Any]] = {}  # request field -> (constraint, value)
        if self.response_format is not None and self.response_format.type != "text":
            fmt = self.response_format
            if fmt.type == "json_object":
                given["response_format"] = ("json_object", True)
            elif fmt.json_schema is None or fmt.json_schema.json_schema is None:
                raise _field_error("response_format", "type json_schema needs json_schema.schema")
            else:
                given["response_format"] = ("json", fmt.json_schema.json_schema)
        options: dict[str, Any] = {}
        if self.structured_outputs is not None:
            options = self.structured_outputs.options()
            for constraint, value in self.structured_outputs.constraints().items():
                given[f"structured_outputs.{constraint}"] = (constraint, value)
        for name, constraint in GUIDED_FIELDS.items():
            if getattr(self, name) is not None:
                given[name] = (constraint, getattr(self, name))
        if not given:
            if self.structured_outputs is not None:
                raise _field_error("structured_outputs", "give one of json, regex, choice, grammar, json_object")
            return self
        if len(given) > 1:
            raise _field_error(next(iter(given)), f"one output constraint per request; got {', '.join(given)}")
        (field, (constraint, value)), = given.items()
        try:
            params = StructuredOutputsParams(**{constraint: value}, **options)
            from hyspec.structured.grammar import check_constraint
            check_constraint(params)
        except StructuredOutputError as exc:
            raise _field_error(field, str(exc).split(": ", 1)[-1]) from None
        self._structured = params
        return self

    @property
    def structured_outputs_params(self) -> Optional[StructuredOutputsParams]:
        """The request's constraint for SamplingParams (None: unconstrained)."""
        return self._structured
