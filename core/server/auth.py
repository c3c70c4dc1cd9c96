"""Optional API key: ``Authorization: Bearer <key>`` on the routes that need it, compared in constant time."""
from __future__ import annotations

import secrets
from typing import Any, Callable

from hyspec.server.errors import APIError

MISSING_KEY = "missing API key: send the header 'Authorization: Bearer <key>'"
WRONG_KEY = "invalid API key"


def key_problem(api_key: str, authorization: str | None) -> str | None:
    """Why an ``Authorization`` header value does not carry ``api_key`` as a Bearer token (None: it does)."""
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return MISSING_KEY
    if not secrets.compare_digest(credentials.strip().encode(), api_key.encode()):
        return WRONG_KEY
    return None


def api_key_dependency(api_key: str) -> Callable[..., Any]:
    """A FastAPI dependency that answers 401 unless the request carries ``api_key`` as a Bearer token.

    Declared through ``HTTPBearer`` so the OpenAPI schema documents the security scheme.
    """
    if not api_key:
        raise ValueError("api_key must be a non-empty string")
    from fastapi import Depends
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

    bearer = HTTPBearer(auto_error=False, description="the server's API key (hyspec serve --api-key)")

    async def require_api_key(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        header = None if credentials is None else f"{credentials.scheme} {credentials.credentials}"
        problem = key_problem(api_key, header)
        if problem is not None:
            raise APIError(401, problem, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    return require_api_key
