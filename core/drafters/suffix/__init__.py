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
    """``suffix_decoding_corpus``: null or "none" = no corpus; "default" = the one shipped in assets/ for the
    default model (refused for a target with another vocabulary); else a directory, which must fit the
    target (errors name both vocabularies)."""
    from hyspec.drafters.suffix.corpus import default_corpus_dir, load_corpus
    from hyspec.errors import CheckpointError, ConfigError

    if setting is None or setting.strip().lower() == "none":
        return None
    path = default_corpus_dir() if setting.strip().lower() == "default" else setting
    try:
        return load_corpus(path, target.tokenizer, target.vocab_size)
    except CheckpointError as exc:
        raise ConfigError("speculative_config.suffix_decoding_corpus", str(exc)) from None
