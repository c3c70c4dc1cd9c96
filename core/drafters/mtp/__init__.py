"""MTP: DeepSeek-V3-style modules on the target hidden state and the next token's embedding."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.mtp.proposer import MTPProposer
    from hyspec.engine.target import TargetContext
    from hyspec.spec.methods import MethodSpec


def build(target: "TargetContext", spec: "MethodSpec") -> "MTPProposer":
    """The ``mtp`` factory (hyspec.spec.registry)."""
    from hyspec.drafters.mtp.proposer import MTPProposer

    return MTPProposer.from_spec(target, spec)
