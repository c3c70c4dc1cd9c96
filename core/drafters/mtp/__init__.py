"""MTP: DeepSeek-V3-style modules on the target hidden state and the next token's embedding."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.methods import MethodSpec
    from hyspec.drafters.mtp.proposer import MTPProposer
    from hyspec.seam.target import TargetContext


def build(target: "TargetContext", spec: "MethodSpec", weights: Path) -> "MTPProposer":
    """The ``mtp`` factory (hyspec.drafters.methods): the modules in ``weights`` (the target's own checkpoint
    when it holds them, see :func:`in_target`)."""
    from hyspec.drafters.mtp.proposer import MTPProposer  # torch: loaded when used

    return MTPProposer.from_spec(target, spec, weights)


def in_target(path: Path) -> bool:
    """Whether the target checkpoint ``path`` holds MTP modules itself (DeepSeek's layout): then, with no
    ``model`` given, they are the drafter."""
    from hyspec.drafters.mtp.checkpoint import is_mtp_checkpoint  # torch: loaded when a config asks for mtp

    return is_mtp_checkpoint(path)
