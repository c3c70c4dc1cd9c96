"""DFlash: a block drafter that drafts a whole block in one forward from target features."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.dflash.proposer import DFlashProposer
    from hyspec.drafters.methods import MethodSpec
    from hyspec.seam.target import TargetContext


def build(target: "TargetContext", spec: "MethodSpec", weights: Path) -> "DFlashProposer":
    """The ``dflash`` factory (hyspec.drafters.methods): the drafter in ``weights``."""
    from hyspec.drafters.dflash.proposer import DFlashProposer  # torch: loaded when used

    return DFlashProposer.from_spec(target, spec, weights)
