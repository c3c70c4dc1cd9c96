"""ngram: prompt lookup (no weights)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.ngram.proposer import NgramProposer
    from hyspec.engine.target import TargetContext
    from hyspec.spec.methods import MethodSpec


def build(target: "TargetContext", spec: "MethodSpec") -> "NgramProposer":
    """The ``ngram`` factory (hyspec.spec.registry)."""
    from hyspec.drafters.ngram.proposer import NgramProposer

    return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max, spec.num_speculative_tokens,
                         target.vocab_size)
