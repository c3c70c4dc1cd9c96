"""draft_model: a small independent LM with the target's tokenizer."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.draft_model.proposer import DraftModelProposer
    from hyspec.drafters.methods import MethodSpec
    from hyspec.seam.target import TargetContext


def build(target: "TargetContext", spec: "MethodSpec", weights: Path) -> "DraftModelProposer":
    """The ``draft_model`` factory (hyspec.drafters.methods): the draft LM in ``weights``."""
    from hyspec.drafters.draft_model.proposer import DraftModelProposer  # torch: loaded when used

    return DraftModelProposer(target, weights, spec.num_speculative_tokens)
