"""Method name -> proposer, through the method registry (``hyspec.spec.registry``).

Each method's factory lives in its package (``hyspec.drafters.<method>``) and
is imported the first time a config asks for the method, so a drafter's code
loads only when it is used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hyspec.spec import registry
from hyspec.spec.proposer import Proposer

if TYPE_CHECKING:
    from hyspec.engine.target import TargetContext
    from hyspec.spec.config import SpeculativeConfig


@dataclass(frozen=True)
class MethodSpec:
    """What a factory needs to build one method's proposer."""

    method: str
    model: str | None  # draft weights; None = the embedded default for the method
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int
    config: "SpeculativeConfig"  # the whole config (tree, remote, ... sections)


Factory = registry.Factory  # (target, spec) -> proposer


def build_proposer(target: "TargetContext", spec: MethodSpec) -> Proposer:
    """``spec.method``'s proposer from its registered factory (remote placement wraps it in a RemoteProposer)."""
    if spec.config.draft_placement == "remote":
        # Drafts come from Ray CPU workers; the local proposer is built only as the failover path.
        from hyspec.remote.factory import build_remote_proposer

        return build_remote_proposer(target, spec)
    return registry.get(spec.method).load_factory()(target, spec)


def draft_dir(spec: MethodSpec):
    """The drafter weights for ``spec``: its ``model``, else the embedded default for the method."""
    if spec.model is not None:
        return spec.model
    from hyspec.assets import default_drafter

    return default_drafter(spec.method)
