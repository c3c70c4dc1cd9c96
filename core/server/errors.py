"""OpenAI-style error bodies (the app's exception handlers, hyspec.server.handlers, produce them).

Every error the server returns is ``{"error": {"message", "type", "param",
"code"}}`` with the HTTP status in ``code``, whatever raised it: a pydantic
validation error (400, ``param`` = the field), a bad request the engine
refused (400), an unknown model (404), a missing or wrong API key (401), a
full queue (429), a draining or failed engine (503), an engine step that
failed (500).  Nothing reaches the client as FastAPI's default 422 or a bare
traceback.
"""
from __future__ import annotations

import json
from typing import Any

from hyspec.server.protocol import (ChatCompletionRequest, ChatMessage, CompletionRequest, DetokenizeRequest, FieldError,
                                    TokenizeCompletionRequest)

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
               500: "server_error", 503: "service_unavailable"}

_REQUEST_MODELS = (CompletionRequest, ChatCompletionRequest, ChatMessage, TokenizeCompletionRequest, DetokenizeRequest)
_FIELD_NAMES = frozenset(name for m in _REQUEST_MODELS for name in m.model_fields) | {"text", "type", "include_usage"}
_DESCRIPTIONS = {name: f.description for m in _REQUEST_MODELS for name, f in m.model_fields.items() if f.description}


class APIError(Exception):
    """Raised by route code to answer with an OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code if code is not None else status
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code if code is not None else status}}


def error_response(status: int, message: str, param: str | None = None, code: str | int | None = None,
                   headers: dict[str, str] | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def sse_error(status: int, message: str) -> str:
    """An error inside an event stream, the way vLLM sends one (the stream then ends with [DONE])."""
    return f"data: {json.dumps(error_body(status, message))}\n\n"


def request_error_param(message: str) -> str | None:
    """The field a RequestError is about, when its message starts with one (``"max_tokens must be ..."``)."""
    head = message.split(" ", 1)[0].rstrip(":=")
    head = head.split("=", 1)[0]
    return head if head in _FIELD_NAMES else None


def describe_validation_errors(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for pydantic/FastAPI validation errors: the first error, with its field path.

    Union members show up in ``loc`` as type tags (``"str"``, ``"list[int]"``); they are dropped from
    the path and the field's description says what it accepts instead.
    """
    if not errors:
        return "invalid request", None
    err = _most_specific(errors)
    ctx_error = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_error, FieldError):
        return f"{ctx_error.field}: {ctx_error}", ctx_error.field
    loc = list(err.get("loc") or ())
    if loc and loc[0] == "body":
        loc = loc[1:]
    if err.get("type") == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON{': ' + str(detail) if detail else ''}", None
    path, through_union = "", False
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _FIELD_NAMES:
            path += f".{part}" if path else part
        else:
            through_union = True
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden" and loc:  # a nested unknown key: name it, with where it is
        path = f"{path}.{loc[-1]}" if path else str(loc[-1])
        return f"{path}: unknown field (not in OpenAI's or vLLM's schema)", path
    if not path:
        if err.get("type") in ("missing", "model_attributes_type", "dict_type", "model_type"):
            return f"the request body must be a JSON object ({msg})", None
        return msg, None
    top = path.split(".", 1)[0].split("[", 1)[0]
    if through_union and top in _DESCRIPTIONS and str(err.get("type", "")).endswith("_type"):
        msg = f"{msg} (expected {_DESCRIPTIONS[top]})"
    return f"{path}: {msg}", path


def _most_specific(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """Of the errors about the first error's field, one that is not just "wrong type".

    A union reports one error per member; ``prompt: []`` is "not a string" for the str member but
    "too short" for the list members, and the latter is what the client needs to hear.
    """
    field = errors[0].get("loc", ())[:2]
    same = [e for e in errors if tuple(e.get("loc", ())[:2]) == tuple(field)]
    for e in same:
        if not str(e.get("type", "")).endswith("_type"):
            return e
    return errors[0]
