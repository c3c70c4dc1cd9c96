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
    corpus = _corpus(target, c.suffix_decoding_corpus)
    return SuffixProposer(settings, spec.num_speculative_tokens, target.vocab_size,
                          corpus=corpus.sequences if corpus is not None else None)


def _corpus(target: "TargetContext", setting: str | None):
    """``suffix_decoding_corpus``: null = the shipped corpus when it was built for this target's
    vocabulary; "none" = no corpus; else a directory, which must fit the target (errors name both)."""
    from hyspec.drafters.suffix.corpus import default_corpus, load_corpus
    from hyspec.errors import CheckpointError, ConfigError

    if setting is None:
        return default_corpus(target.tokenizer, target.vocab_size)
    if setting.strip().lower() == "none":
        return None
    try:
        return load_corpus(setting, target.tokenizer, target.vocab_size)
    except CheckpointError as exc:
        raise ConfigError("speculative_config.suffix_decoding_corpus", str(exc)) from None
