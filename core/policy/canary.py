"""Canary rollout: speculate for a stable, hash-chosen share of requests.

A request id is hashed with BLAKE2b (not Python's ``hash()``, which is salted
per process) to a number in [0, 1); requests below ``fraction`` are in the
``"spec"`` arm, the rest in ``"control"`` and always decode plainly.  The
assignment is therefore the same in every process and after restarts, and
raising the fraction only moves requests from control to spec, never back.
A ``salt`` draws an independent split (a new experiment, other canaries).
"""
from __future__ import annotations

import hashlib

from hyspec.errors import ConfigError

SPEC = "spec"
CONTROL = "control"
_TWO_TO_53 = float(1 << 53)


def request_share(request_id: str | bytes | int, salt: str = "") -> float:
    """Where ``request_id`` falls in [0, 1), the same on every machine and run."""
    if isinstance(request_id, int):
        request_id = str(request_id)
    data = request_id.encode("utf-8") if isinstance(request_id, str) else bytes(request_id)
    digest = hashlib.blake2b(data, digest_size=8, key=salt.encode("utf-8")).digest()
    # keep 53 bits: a float holds them exactly, so the result stays below 1.0
    return (int.from_bytes(digest, "big") >> 11) / _TWO_TO_53


class Canary:
    """Splits requests into the ``spec`` and ``control`` arms."""

    __slots__ = ("fraction", "salt")

    def __init__(self, fraction: float = 1.0, salt: str = ""):
        if not 0.0 <= fraction <= 1.0:
            raise ConfigError("hybrid.speculative_fraction", f"must be in [0, 1], got {fraction}")
        if len(salt.encode("utf-8")) > 64:  # BLAKE2b's key limit
            raise ConfigError("hybrid.canary_salt", "must be at most 64 bytes")
        self.fraction = fraction
        self.salt = salt

    def arm(self, request_id: str | bytes | int) -> str:
        """``"spec"`` or ``"control"`` for this request; stable across processes."""
        return SPEC if self.speculates(request_id) else CONTROL

    def speculates(self, request_id: str | bytes | int) -> bool:
        if self.fraction >= 1.0:
            return True
        return request_share(request_id, self.salt) < self.fraction
