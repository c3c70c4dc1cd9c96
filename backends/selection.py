"""Which backend hyspec uses: "Ascend first" (npu, cuda, cpu), or the one the user forces.

The choice comes from, in order: the ``backend`` argument (``--backend``),
the ``HYSPEC_BACKEND`` environment variable, else ``auto``.  A forced backend
that cannot run here is an error that says what is missing and how to get it;
``auto`` never fails because the CPU backend always runs.
"""
from __future__ import annotations

import os
from typing import Mapping

from hyspec.backends.records import BACKEND_NAMES, SELECTION_ORDER
from hyspec.errors import BackendUnavailableError, ConfigError

ENV_VAR = "HYSPEC_BACKEND"
VALID_NAMES = (*BACKEND_NAMES, "auto")


def requested_backend(backend: str | None = None, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(name, who asked): name is one of VALID_NAMES; who is "argument", HYSPEC_BACKEND or "auto"."""
    env = os.environ if env is None else env
    if backend is not None:
        return _validated(backend, "backend"), "argument"
    raw = env.get(ENV_VAR)
    if raw is None or raw.strip() == "":  # an empty variable means "not set", as in most shells' habits
        return "auto", "auto"
    return _validated(raw, ENV_VAR), ENV_VAR


def _validated(raw: str, key: str) -> str:
    name = raw.strip().lower()
    if name in VALID_NAMES:
        return name
    hint = ""
    if ":" in name and name.split(":", 1)[0] in ("cuda", "npu"):
        hint = " (choose the device with CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES)"
    raise ConfigError(key, f"{raw!r} is not a backend; valid names: {', '.join(VALID_NAMES)}{hint}")


Availability = Mapping[str, tuple[bool, str | None, str | None]]  # name -> (available, reason, hint)


def select_backend(requested: str, requested_by: str, availability: Availability) -> str:
    """The backend to use: the forced one if it can run, else the first available in SELECTION_ORDER."""
    if requested == "auto":
        for name in SELECTION_ORDER:
            if availability[name][0]:
                return name
        raise BackendUnavailableError("no backend can run here, not even cpu")  # cpu is always available
    available, reason, hint = availability[requested]
    if available:
        return requested
    source = "the backend argument (--backend)" if requested_by == "argument" else requested_by
    message = f"backend {requested!r} (forced by {source}) is unavailable: {reason}"
    if hint:
        message += f"; to get it: {hint}"
    raise BackendUnavailableError(message)
