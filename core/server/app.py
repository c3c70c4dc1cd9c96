"""The OpenAI-compatible FastAPI app: routes, lifespan, API key, metrics middleware, OpenAPI schema.

>>> app = create_app({"model": "/path/to/model", "max_num_seqs": 32}, api_key="secret")
>>> # uvicorn.run(app, host="127.0.0.1", port=8000)  -- or `hyspec serve`

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET
/v1/models``, ``GET /v1/models/{model}``, ``POST /tokenize`` and ``POST
/detokenize`` (vLLM's), ``GET /version``, ``GET /health`` (200 while
serving, 503 while draining or after an engine failure), ``GET /metrics``
(Prometheus text).  With an API key, ``/v1/*`` and ``/openapi.json`` need it
(``/docs`` and ``/redoc``, browser pages that cannot send the key and load
their scripts from a CDN, are off); ``/health`` never does and ``/metrics``
only with ``protect_metrics``.

Before any route runs, ``_HTTPGuard`` refuses a Host header outside
``allowed_hosts`` (400: a DNS-rebinding page must not drive a keyless
loopback server), a POST without the API key (401, its body unread) and a
body past ``max_body_bytes`` (413), declared or counted as it arrives.
"""
from __future__ import annotations

import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Mapping, Sequence

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from hyspec import __version__
from hyspec.engine.engine import LLMEngine
from hyspec.server.async_engine import AsyncEngine
from hyspec.server.auth import api_key_dependency, key_problem
from hyspec.server.errors import APIError, error_body
from hyspec.server.handlers import install_exception_handlers
from hyspec.server.metrics import ServerMetrics
from hyspec.server.protocol import (ChatCompletionRequest, ChatCompletionResponse, CompletionRequest,
                                    CompletionResponse, ErrorResponse, HealthResponse, ModelCard, ModelList,
                                    TokenizeCompletionRequest)
from hyspec.server.serving import OpenAIServing
from hyspec.server.tokenization import (DetokenizeRequest, DetokenizeResponse, OpenAITokenization,
                                        TokenizeResponse)

DEFAULT_MAX_BODY_BYTES = 16 << 20
# Host names a loopback server answers to; IPv6 literals are bracketed, as in a Host header.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# Endpoint labels of the HTTP counter; any other path counts as "other" (fuzzers must not grow the label set).
ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
                       "/openapi.json", "/docs", "/redoc", "/tokenize", "/detokenize", "/version"})
_ERRORS = {status: {"model": ErrorResponse, "description": text} for status, text in (
    (400, "invalid request (the message names the field)"), (401, "missing or invalid API key"),
    (404, "unknown model"), (413, "request body too large"), (429, "queue full; retry later"),
    (500, "the engine failed while running this request"), (503, "shutting down, or the engine failed"))}
# /tokenize takes either body; the route reads it itself (hyspec.server.tokenization), so it is declared here
_TOKENIZE_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"oneOf": [
    {"$ref": "#/components/schemas/TokenizeCompletionRequest"},
    {"$ref": "#/components/schemas/ChatCompletionRequest"}]}}}}}
# OpenAPI 3.1: the schema of a text/event-stream describes one event (3.2's itemSchema).
_SSE_DOC = {"schema": {
    "type": "object", "required": ["data"],
    "description": "with stream=true, server-sent events: each `data` is one JSON chunk; the last is [DONE]",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}}


def create_app(
    engine: "LLMEngine | AsyncEngine | Mapping[str, Any]",
    *,
    api_key: str | None = None,
    served_model_name: str | Sequence[str] | None = None,
    max_queue: int = 256,
    protect_metrics: bool = False,
    drain_timeout: float = 30.0,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_tokens: int | None = None,
    max_prompt_chars: int | None = None,
    max_n: int | None = None,
    split_special_tokens_in_content: bool = True,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
    chat_template: str | None = None,
    docs: bool = True,
) -> FastAPI:
    """Build the app around ``engine``: an ``LLMEngine``, an ``AsyncEngine``, or LLMEngine keyword
    arguments (a mapping with ``model`` and any of ``dtype``, ``max_model_len``, ``max_num_seqs``,
    ``kv_cache_bytes``, ``memory_fraction``, ``speculative_config``, ...).

    ``max_queue``: requests that may wait beyond the running batch before new ones get 429.
    ``drain_timeout``: seconds in-flight requests get to finish at shutdown before they are aborted.
    ``max_tokens``: the most tokens one request may generate (``--max-tokens``; None: the context).
    ``max_prompt_chars``, ``max_n``, ``split_special_tokens_in_content``: see ``OpenAIServing``.
    ``allowed_hosts``: the names the Host header may carry (Starlette's patterns: ``*.example.com``;
    ``["*"]``: any); the default suits a server bound to loopback.
    ``served_model_name``: one name or several (vLLM's ``--served-model-name a b``): requests may name any,
    responses report the first.  ``chat_template``: the template text to render chat requests with instead
    of the tokenizer's.  ``docs``: serve /docs, /redoc and /openapi.json (never with an API key).
    """
    allowed_hosts = _host_patterns(allowed_hosts)
    owns_engine = isinstance(engine, Mapping)
    if owns_engine:
        args = dict(engine)
        engine = LLMEngine(args.pop("model"), **args)
    async_engine = engine if isinstance(engine, AsyncEngine) else AsyncEngine(engine, max_queue=max_queue)
    model_path = Path(async_engine.engine.model_path)
    names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name or ())
    # without a name, the file or directory name is reported, and the path as given (vLLM's default name:
    # `vllm serve DIR` answers to `"model": "DIR"`) is accepted too
    path_alias = [] if names else [str(model_path)]
    model_id = getattr(async_engine.engine, "model_id", None)
    if not names and model_id is not None:  # a Hub id resolved from the local cache: served under the id
        names = [model_id]
    if not names:
        names = [model_path.stem if model_path.suffix.lower() == ".gguf" else model_path.name]
    if not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"served_model_name: each name must be a non-empty string, got {served_model_name!r}")
    name = names[0]
    if chat_template is not None:
        async_engine.engine.tokenizer.chat_template = chat_template
    created = int(time.time())
    metrics = ServerMetrics(async_engine, name)
    serving = OpenAIServing(async_engine, name, max_tokens=max_tokens, max_prompt_chars=max_prompt_chars, max_n=max_n,
                            split_special_tokens_in_content=split_special_tokens_in_content,
                            other_names=[*names[1:], *path_alias])
    tokenization = OpenAITokenization(serving)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        yield
        await async_engine.shutdown(drain_timeout)
        if owns_engine:  # stop what the speculative decoder runs beside the engine (rule watcher, workers)
            close = getattr(getattr(async_engine.engine, "spec", None), "close", None)
            if close is not None:
                close()

    open_docs = {} if api_key is None and docs else {"openapi_url": None, "docs_url": None, "redoc_url": None}
    app = FastAPI(title="hyspec", version=__version__, lifespan=lifespan, **open_docs,
                  description="OpenAI-compatible API of hyspec, a lossless speculative-decoding runtime.")
    app.state.async_engine = async_engine
    app.state.metrics = metrics
    app.state.served_model_name = name
    install_exception_handlers(app)

    auth = [Depends(api_key_dependency(api_key))] if api_key else []
    v1 = APIRouter(prefix="/v1", dependencies=auth, responses=_ERRORS)

    @v1.post("/completions", response_model=CompletionResponse,
             responses={200: {"content": {"text/event-stream": _SSE_DOC}}})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await serving.completions(body, request)

    @v1.post("/chat/completions", response_model=ChatCompletionResponse,
             responses={200: {"content": {"text/event-stream": _SSE_DOC}}})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await serving.chat(body, request)

    def card(model_id: str = name) -> ModelCard:
        # The file or directory name only: the absolute path tells clients about the server's disk.
        return ModelCard(id=model_id, created=created, root=model_path.name, max_model_len=serving.max_model_len)

    @v1.get("/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return ModelList(data=[card(n) for n in names])

    @v1.get("/models/{model_id:path}", response_model=ModelCard)
    async def get_model(model_id: str) -> ModelCard:
        serving.check_model(model_id)
        return card(model_id)

    app.include_router(v1)

    # vLLM's tokenizer routes, at the root as vLLM serves them (behind the API key here, as every POST is)
    tok = APIRouter(dependencies=auth, responses=_ERRORS)

    @tok.post("/tokenize", response_model=TokenizeResponse, openapi_extra=_TOKENIZE_BODY,
              description="a body with `prompt` (TokenizeCompletionRequest) or with `messages` (the chat "
                          "request's fields that vLLM's TokenizeChatRequest has, and return_token_strs)")
    async def tokenize(request: Request) -> TokenizeResponse:
        return await tokenization.tokenize(await _json_body(request))

    @tok.post("/detokenize", response_model=DetokenizeResponse)
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return await tokenization.detokenize(body)

    app.include_router(tok)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health() -> Response:
        if async_engine.failed is not None:
            return JSONResponse({"status": "failed", "detail": async_engine.failed}, status_code=503)
        if not async_engine.accepting:
            return JSONResponse({"status": "draining", "detail": "shutting down"}, status_code=503)
        if async_engine.started and not async_engine.thread_alive:
            return JSONResponse({"status": "failed", "detail": "the engine thread stopped"}, status_code=503)
        return JSONResponse({"status": "ok", "detail": None})

    metrics_deps = auth if protect_metrics else []

    @app.get("/metrics", dependencies=metrics_deps,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition format"},
                        **({401: _ERRORS[401]} if protect_metrics else {})})
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    if api_key:
        @app.get("/openapi.json", dependencies=auth, include_in_schema=False)
        async def openapi_schema() -> Response:
            return JSONResponse(app.openapi())

    app.add_middleware(_HTTPGuard, metrics=metrics, endpoints=ENDPOINTS, max_body_bytes=max_body_bytes,
                       allowed_hosts=allowed_hosts, api_key=api_key)
    app.openapi = lambda: _openapi(app)
    return app


class _HTTPGuard:
    """Pure ASGI middleware (streams pass through untouched): counts responses by endpoint and status, refuses
    a Host header outside ``allowed_hosts`` (400), a POST without ``api_key`` (401: every POST route needs it,
    and its body is not worth reading), and a body over ``max_body_bytes`` (413): at once when its
    Content-Length says so, else (chunked) as soon as the bytes read pass the limit, without reading on."""

    def __init__(self, app: Any, metrics: ServerMetrics, endpoints: frozenset[str], max_body_bytes: int,
                 allowed_hosts: list[str], api_key: str | None = None):
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints
        self.max_body_bytes = max_body_bytes
        self.allowed_hosts = allowed_hosts
        self.api_key = api_key
        # Starlette's matching (ports, IPv6 brackets, wildcards); its plain-text refusal becomes ours.
        self.host_check = TrustedHostMiddleware(_mark_trusted, allowed_hosts=allowed_hosts, www_redirect=False)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in self.endpoints else "/v1/models/{model_id}" if path.startswith("/v1/models/") \
            else "other"
        status = 500

        async def send_and_record(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refusal = await self._refusal(scope)
            if refusal is not None:
                status = refusal.status_code
                return await refusal(scope, receive, send)
            await self.app(scope, self._bounded(receive), send_and_record)
        finally:
            self.metrics.observe_http(endpoint, scope.get("method", ""), status)

    async def _refusal(self, scope: dict) -> JSONResponse | None:
        headers = dict(scope.get("headers") or [])
        await self.host_check(scope, _never_receive, _discard)
        if not scope.pop("hyspec.trusted_host", False):
            host = headers.get(b"host", b"").decode("latin-1")
            return JSONResponse(error_body(400, f"the Host header `{host}` is not one this server answers to "
                                                f"({', '.join(self.allowed_hosts)}; --allowed-hosts)"),
                                status_code=400)
        if self.api_key and scope.get("method") == "POST":
            problem = key_problem(self.api_key, headers.get(b"authorization", b"").decode("latin-1") or None)
            if problem is not None:
                return JSONResponse(error_body(401, problem, code="invalid_api_key"), status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return JSONResponse(error_body(413, f"the request body has {int(length)} bytes; the limit is "
                                                f"{self.max_body_bytes}"), status_code=413)
        return None

    def _bounded(self, receive: Any) -> Any:
        """``receive`` that counts body bytes and raises a 413 once they pass the limit (reading no further)."""
        received = 0

        async def bounded_receive() -> dict:
            nonlocal received
            if received > self.max_body_bytes:
                raise _body_too_large(received, self.max_body_bytes)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _body_too_large(received, self.max_body_bytes)
            return message

        return bounded_receive


async def _json_body(request: Request) -> Any:
    """The request's JSON body, or a 400 saying it is not JSON."""
    import json

    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None


def _body_too_large(received: int, limit: int) -> HTTPException:
    # An HTTPException passes FastAPI's body parsing unchanged and becomes a 413 error body (errors.py).
    return HTTPException(413, f"the request body passed {limit} bytes (the limit) after {received} bytes")


async def _mark_trusted(scope: dict, receive: Any, send: Any) -> None:
    scope["hyspec.trusted_host"] = True


async def _never_receive() -> dict:
    raise RuntimeError("the host check does not read the body")


async def _discard(message: dict) -> None:
    pass


def _host_patterns(hosts: Sequence[str]) -> list[str]:
    """``hosts`` as Host-header patterns (an IPv6 literal bracketed), checked the way Starlette checks them."""
    import ipaddress

    patterns = []
    for host in hosts:
        try:
            host = f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
        except ValueError:
            pass
        if not host or ("*" in host[1:]) or (host.startswith("*") and host != "*" and not host.startswith("*.")):
            raise ValueError(f"allowed_hosts: {host!r} is not a host name, an address, `*.domain` or `*`")
        patterns.append(host)
    if not patterns:
        raise ValueError("allowed_hosts is empty: name at least one host, or `*` for any")
    return patterns


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema without its 422 responses: validation errors here are OpenAI-style 400s."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        # /tokenize reads its body itself (a prompt or a conversation): its schema, for the docs and fuzzers
        components["TokenizeCompletionRequest"] = TokenizeCompletionRequest.model_json_schema(
            ref_template="#/components/schemas/{model}")
        app.openapi_schema = schema
    return app.openapi_schema

