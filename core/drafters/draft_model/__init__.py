"""draft_model: a small independent LM with the target's tokenizer."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.draft_model.proposer import DraftModelProposer
    from hyspec.engine.target import TargetContext
    from hyspec.spec.methods import MethodSpec


def build(target: "TargetContext", spec: "MethodSpec") -> "DraftModelProposer":
    """The ``draft_model`` factory (hyspec.spec.registry)."""
    from hyspec.drafters.draft_model.proposer import DraftModelProposer
    from hyspec.spec.methods import draft_dir

    return DraftModelProposer(target, draft_dir(spec), spec.num_speculative_tokens)
