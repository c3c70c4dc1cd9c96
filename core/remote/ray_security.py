"""Ray's token authentication and TLS settings, checked before hyspec starts or joins a cluster.

Anyone who can reach a Ray cluster's ports can run code on every node of it
(actor arguments are pickled), and Ray's core gRPC servers listen on all
interfaces whatever node IP they are given: Ray's shared token
(``RAY_AUTH_MODE=token``, Ray >= 2.52) and TLS are what keep others out.
Ray reads both from environment variables, in every process of the cluster:

- ``RAY_AUTH_MODE``: ``token`` to require the token, ``disabled`` to not;
- the token: ``RAY_AUTH_TOKEN`` (the value), else ``RAY_AUTH_TOKEN_PATH`` (a
  file), else ``~/.ray/auth_token``;
- ``RAY_USE_TLS=1`` with ``RAY_TLS_SERVER_CERT``, ``RAY_TLS_SERVER_KEY`` and
  ``RAY_TLS_CA_CERT`` (PEM files; every process is both server and client).

Nothing here imports Ray: ``hyspec draft-worker`` builds its ``ray start``
environment with it on a box where importing Ray would cost seconds.
docs/remote_security.md explains the choices.
"""
from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

AUTH_MODE = "RAY_AUTH_MODE"
AUTH_TOKEN = "RAY_AUTH_TOKEN"
AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
USE_TLS = "RAY_USE_TLS"
TLS_FILES = ("RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")
NO_TOKEN_HELP = (f"give the cluster's token in {AUTH_TOKEN_PATH} (a file only you can read) or {AUTH_TOKEN}, "
                 "or put it in ~/.ray/auth_token (`ray get-auth-token --generate` makes one)")


class RaySecurityError(ValueError):
    """Ray's auth or TLS settings are missing or inconsistent; ``variable`` names the one at fault."""

    def __init__(self, variable: str, message: str):
        self.variable = variable
        self.message = message
        super().__init__(f"{variable}: {message}")


def default_token_path(env: Mapping[str, str]) -> Path:
    """Where Ray looks for the token when neither variable is set (``~/.ray/auth_token``)."""
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".ray" / "auth_token"


def token_source(env: Mapping[str, str]) -> str | None:
    """Where Ray would take the token from, in Ray's precedence order; None when there is none.

    A token file named by ``RAY_AUTH_TOKEN_PATH`` must be readable and not
    empty: Ray aborts on such a file, later and less clearly.
    """
    if env.get(AUTH_TOKEN):
        return AUTH_TOKEN
    if env.get(AUTH_TOKEN_PATH):
        path = Path(env[AUTH_TOKEN_PATH])
        try:
            text = path.read_text()
        except OSError as exc:
            raise RaySecurityError(AUTH_TOKEN_PATH, f"cannot read {path}: {exc.strerror or exc}") from None
        if not text.strip():
            raise RaySecurityError(AUTH_TOKEN_PATH, f"{path} is empty")
        return f"{AUTH_TOKEN_PATH}={path}"
    default = default_token_path(env)
    try:
        if default.read_text().strip():
            return str(default)
    except OSError:
        pass
    return None


def tls_enabled(env: Mapping[str, str]) -> bool:
    """True when ``RAY_USE_TLS`` asks for TLS; raises RaySecurityError when its files are missing."""
    if env.get(USE_TLS, "0").lower() not in ("1", "true"):
        return False
    for name in TLS_FILES:
        value = env.get(name)
        if not value:
            raise RaySecurityError(name, f"{USE_TLS}={env[USE_TLS]} needs this PEM file; it is not set")
        if not os.access(value, os.R_OK):
            raise RaySecurityError(name, f"{value} is not a readable file")
    return True


def auth_mode(env: Mapping[str, str]) -> str | None:
    """``RAY_AUTH_MODE`` lower-cased, None when unset; anything but token/disabled is refused."""
    mode = env.get(AUTH_MODE)
    if mode is None:
        return None
    if mode.lower() not in ("token", "disabled"):
        raise RaySecurityError(AUTH_MODE, f"{mode!r}: expected 'token' or 'disabled'")
    return mode.lower()


def joining_env(env: Mapping[str, str], insecure: bool) -> dict[str, str]:
    """The environment for a ``ray start`` that joins a cluster: token auth on, a token present.

    ``insecure`` (the operator's explicit ``--insecure-no-auth``) joins
    without a token instead.  Raises RaySecurityError naming what is missing.
    """
    out = dict(env)
    tls_enabled(env)  # a half-configured TLS fails here rather than inside the raylet
    if insecure:
        out[AUTH_MODE] = "disabled"
        return out
    if auth_mode(env) == "disabled":
        raise RaySecurityError(AUTH_MODE, "'disabled' would join without token authentication; unset it, "
                                          "or pass --insecure-no-auth to say that this is meant")
    if token_source(env) is None:
        raise RaySecurityError(AUTH_TOKEN, f"no Ray auth token: {NO_TOKEN_HELP}; --insecure-no-auth joins without one")
    out[AUTH_MODE] = "token"
    return out


def local_cluster_env(env: Mapping[str, str]) -> dict[str, str]:
    """Variables to set before starting a local Ray: token auth, with a fresh token unless one is given.

    "Given" means ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``, not
    ``~/.ray/auth_token``: Ray >= 2.59 writes that file itself (mode 0644) and
    every default local Ray of the user shares it.  The fresh token lives in
    this process's environment only, inherited by the Ray processes it starts.
    An explicit ``RAY_AUTH_MODE=disabled`` is the operator's opt-out: nothing
    is set (the caller logs it).
    """
    tls_enabled(env)
    if auth_mode(env) == "disabled":
        return {}
    updates = {AUTH_MODE: "token"}
    if not (env.get(AUTH_TOKEN) or env.get(AUTH_TOKEN_PATH)):
        updates[AUTH_TOKEN] = secrets.token_urlsafe(32)
    else:
        token_source(env)  # an unreadable or empty token file fails here
    return updates


def connecting_env(env: Mapping[str, str]) -> dict[str, str]:
    """Variables to set before connecting to an existing cluster: token auth, whose token must be given.

    Raises RaySecurityError without a token; an explicit
    ``RAY_AUTH_MODE=disabled`` connects without one (the caller logs it).
    """
    tls_enabled(env)
    if auth_mode(env) == "disabled":
        return {}
    if token_source(env) is None:
        raise RaySecurityError(AUTH_TOKEN, f"no Ray auth token: {NO_TOKEN_HELP}; {AUTH_MODE}=disabled "
                                           "connects to a cluster without token authentication")
    return {AUTH_MODE: "token"}
