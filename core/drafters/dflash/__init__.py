"""DFlash: a block drafter that drafts a whole block in one forward from target features."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.dflash.proposer import DFlashProposer
    from hyspec.engine.target import TargetContext
    from hyspec.spec.methods import MethodSpec


def build(target: "TargetContext", spec: "MethodSpec") -> "DFlashProposer":
    """The ``dflash`` factory (hyspec.spec.registry)."""
    from hyspec.drafters.dflash.proposer import DFlashProposer

    return DFlashProposer.from_spec(target, spec)
