"""EAGLE and EAGLE-3: a one-layer head on target features, dynamic draft trees."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.eagle.proposer import Eagle3Proposer, EagleProposer
    from hyspec.engine.target import TargetContext
    from hyspec.spec.methods import MethodSpec


def build_eagle(target: "TargetContext", spec: "MethodSpec") -> "EagleProposer":
    """The ``eagle`` factory (hyspec.spec.registry)."""
    from hyspec.drafters.eagle.proposer import EagleProposer
    from hyspec.spec.methods import draft_dir

    return EagleProposer(target, draft_dir(spec), spec.config)


def build_eagle3(target: "TargetContext", spec: "MethodSpec") -> "Eagle3Proposer":
    """The ``eagle3`` factory (hyspec.spec.registry)."""
    from hyspec.drafters.eagle.proposer import Eagle3Proposer
    from hyspec.spec.methods import draft_dir

    return Eagle3Proposer(target, draft_dir(spec), spec.config)
