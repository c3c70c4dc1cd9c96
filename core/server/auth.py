"""Optional API key: ``Authorization: Bearer <key>`` on the routes that need it, compared in constant time."""
from __future__ import annotations

import secrets
from typing import Any, Callable

from hyspec.server.errors import APIError


def api_key_dependency(api_key: str) -> Callable[..., Any]:
    """A FastAPI dependency that answers 401 unless the request carries ``api_key`` as a Bearer token.

    Declared through ``HTTPBearer`` so the OpenAPI schema documents the security scheme.
    """
    if not api_key:
        raise ValueError("api_key must be a non-empty string")
    from fastapi import Depends
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

    bearer = HTTPBearer(auto_error=False, description="the server's API key (hyspec serve --api-key)")
    expected = api_key.encode()

    async def require_api_key(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if credentials is None:
            raise APIError(401, "missing API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        if not secrets.compare_digest(credentials.credentials.encode(), expected):
            raise APIError(401, "invalid API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    return require_api_key
