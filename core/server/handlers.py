"""The exception handlers the app installs: every error a route can raise, as an OpenAI error body.

Apart from :mod:`hyspec.server.errors` (the bodies) because they name the engine's and the
serving layer's exceptions, and both of those modules raise errors.py's ``APIError``.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from hyspec.errors import HyspecError
from hyspec.server.async_engine import EngineStepError, ServerBusyError, ServiceUnavailableError
from hyspec.server.errors import APIError, describe_validation_errors, error_response, request_error_param
from hyspec.server.serving import ClientDisconnected

log = logging.getLogger("hyspec.server.errors")  # the logger these handlers logged to before they moved here


def install_exception_handlers(app: FastAPI) -> None:
    """Map every error the routes can raise onto an OpenAI error body."""
    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        message, param = describe_validation_errors(list(exc.errors()))
        return error_response(400, message, param)

    @app.exception_handler(HyspecError)
    async def _hyspec_error(request, exc: HyspecError):
        return error_response(400, str(exc), request_error_param(str(exc)))

    @app.exception_handler(ServerBusyError)
    async def _busy(request, exc: ServerBusyError):
        return error_response(429, str(exc), headers={"Retry-After": "1"})

    @app.exception_handler(ServiceUnavailableError)
    async def _unavailable(request, exc: ServiceUnavailableError):
        retry = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
        return error_response(503, str(exc), headers=retry)

    @app.exception_handler(EngineStepError)
    async def _step_failed(request, exc: EngineStepError):
        return error_response(500, str(exc))

    @app.exception_handler(ClientDisconnected)
    async def _client_left(request, exc: ClientDisconnected):
        # Nobody reads this; 499 (nginx's "client closed request") keeps it apart in the status counters.
        return error_response(499, "client disconnected")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request, exc: Exception):
        log.exception("unhandled error serving %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
