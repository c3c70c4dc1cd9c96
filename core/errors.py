"""Errors hyspec raises for bad input.  Each names the thing that is wrong.

They derive from ValueError (bad input, not a bug) so callers that already
catch ValueError keep working; the CLI prints them without a traceback.
"""
from __future__ import annotations


class HyspecError(ValueError):
    """Base class: a problem with input, configuration or environment."""


class ConfigError(HyspecError):
    """A configuration key is unknown or its value is out of range."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


class CheckpointError(HyspecError):
    """A checkpoint directory is missing files, corrupt, or does not match its config."""


class BackendUnavailableError(HyspecError):
    """A backend was forced (--backend / HYSPEC_BACKEND) but cannot run here."""


class RequestError(HyspecError):
    """A single request is invalid (prompt too long, bad sampling parameters, ...).

    The engine rejects that request and keeps serving the others.
    """


class KVOwnershipError(RuntimeError):
    """A KV write touched a block owned by someone else.

    Not a user error: the speculative step that caused it is redone without
    speculation and counted as rejection cause ``kv_cache_mismatch``.
    """
