"""DSpark: DFlash's block drafter with a low-rank sequential decoder over the block."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.dspark.proposer import DSparkProposer
    from hyspec.engine.target import TargetContext
    from hyspec.spec.methods import MethodSpec


def build(target: "TargetContext", spec: "MethodSpec") -> "DSparkProposer":
    """The ``dspark`` factory (hyspec.spec.registry)."""
    from hyspec.drafters.dspark.proposer import DSparkProposer

    return DSparkProposer.from_spec(target, spec)
