"""Building a method's proposer beside the target: resolve its weights, call its factory.

The remote workers and the remote fallback build here too (``hyspec.remote``);
``hyspec.spec.methods.build_proposer`` adds the routing of remote placements.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from hyspec.assets import default_drafter
from hyspec.drafters.methods import MethodInfo, MethodSpec, get

if TYPE_CHECKING:
    from hyspec.seam.proposer import Proposer
    from hyspec.seam.target import TargetContext


def resolve_weights(info: MethodInfo, spec: MethodSpec, target: "TargetContext") -> Optional[Path]:
    """The drafter weights for ``spec``: its ``model``; else the target's own checkpoint when it holds them
    (``weights_in_target``: DeepSeek's MTP layout); else the embedded default for the method.  None for a
    method without weights."""
    if not info.weights:
        return None
    if spec.model is not None:
        return Path(spec.model)
    model_path = getattr(target, "model_path", None)
    if info.weights_in_target is not None and model_path is not None and info.weights_in_target(Path(model_path)):
        return Path(model_path)
    return default_drafter(spec.method)


def build_local(target: "TargetContext", spec: MethodSpec) -> "Proposer":
    """``spec.method``'s proposer, drafting beside ``target`` (whatever ``spec.remote`` says)."""
    info = get(spec.method)
    return info.factory(target, spec, resolve_weights(info, spec, target))
