"""ngram: prompt lookup (no weights)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from hyspec.drafters.methods import MethodSpec
    from hyspec.drafters.ngram.proposer import NgramProposer
    from hyspec.seam.target import TargetContext


def build(target: "TargetContext", spec: "MethodSpec", weights: Optional[Path]) -> "NgramProposer":
    """The ``ngram`` factory (hyspec.drafters.methods): prompt_lookup_min/max and the draft length."""
    from hyspec.drafters.ngram.proposer import NgramProposer  # torch: loaded when a config asks for the method

    return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max, spec.num_speculative_tokens,
                         target.vocab_size)
