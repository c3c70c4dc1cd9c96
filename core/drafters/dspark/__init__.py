"""DSpark: DFlash's block drafter with a low-rank sequential decoder over the block."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.dspark.proposer import DSparkProposer
    from hyspec.drafters.methods import MethodSpec
    from hyspec.seam.target import TargetContext


def build(target: "TargetContext", spec: "MethodSpec", weights: Path) -> "DSparkProposer":
    """The ``dspark`` factory (hyspec.drafters.methods): the drafter in ``weights``."""
    from hyspec.drafters.dspark.proposer import DSparkProposer  # torch: loaded when used

    return DSparkProposer.from_spec(target, spec, weights)
