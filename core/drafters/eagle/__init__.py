"""EAGLE and EAGLE-3: a one-layer head on target features, dynamic draft trees."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.eagle.proposer import Eagle3Proposer, EagleProposer
    from hyspec.drafters.methods import MethodSpec
    from hyspec.seam.target import TargetContext


def build_eagle(target: "TargetContext", spec: "MethodSpec", weights: Path) -> "EagleProposer":
    """The ``eagle`` factory (hyspec.drafters.methods): the head in ``weights``, trees shaped by ``spec.tree``."""
    from hyspec.drafters.eagle.proposer import EagleProposer  # torch: loaded when used

    return EagleProposer(target, weights, spec)


def build_eagle3(target: "TargetContext", spec: "MethodSpec", weights: Path) -> "Eagle3Proposer":
    """The ``eagle3`` factory (hyspec.drafters.methods)."""
    from hyspec.drafters.eagle.proposer import Eagle3Proposer  # torch: loaded when used

    return Eagle3Proposer(target, weights, spec)
