"""suffix: suffix decoding over the prompt and previous responses (no weights)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyspec.drafters.suffix.proposer import SuffixProposer
    from hyspec.engine.target import TargetContext
    from hyspec.spec.methods import MethodSpec


def build(target: "TargetContext", spec: "MethodSpec") -> "SuffixProposer":
    """The ``suffix`` factory (hyspec.spec.registry): vLLM's suffix_decoding_* keys from the config."""
    from hyspec.drafters.suffix.proposer import SuffixProposer, SuffixSettings

    c = spec.config
    settings = SuffixSettings(c.suffix_decoding_max_tree_depth, c.suffix_decoding_max_cached_requests,
                              c.suffix_decoding_max_spec_factor, c.suffix_decoding_min_token_prob)
    return SuffixProposer(settings, spec.num_speculative_tokens, target.vocab_size)
