"""suffix: suffix decoding over the prompt and previous responses (no weights)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from hyspec.drafters.suffix.corpus import SuffixCorpus, default_corpus_dir, load_corpus
from hyspec.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from hyspec.drafters.methods import MethodSpec
    from hyspec.drafters.suffix.proposer import SuffixProposer
    from hyspec.seam.target import TargetContext


def build(target: "TargetContext", spec: "MethodSpec", weights: Optional[Path]) -> "SuffixProposer":
    """The ``suffix`` factory (hyspec.drafters.methods): vLLM's suffix_decoding_* keys (``spec.suffix``)."""
    from hyspec.drafters.suffix.proposer import SuffixProposer, SuffixSettings  # torch: loaded when used

    o = spec.suffix
    settings = SuffixSettings(o.max_tree_depth, o.max_cached_requests, o.max_spec_factor, o.min_token_prob)
    corpus = _corpus(target, o.corpus)
    return SuffixProposer(settings, spec.num_speculative_tokens, target.vocab_size,
                          corpus=corpus.sequences if corpus is not None else None)


def _corpus(target: "TargetContext", setting: Optional[str]) -> Optional[SuffixCorpus]:
    """``suffix_decoding_corpus``: null or "none" = no corpus; "default" = the one shipped in assets/ for the
    default model (refused for a target with another vocabulary); else a directory, which must fit the
    target (errors name both vocabularies)."""
    if setting is None or setting.strip().lower() == "none":
        return None
    path = default_corpus_dir() if setting.strip().lower() == "default" else setting
    try:
        return load_corpus(path, target.tokenizer, target.vocab_size)
    except CheckpointError as exc:
        raise ConfigError("speculative_config.suffix_decoding_corpus", str(exc)) from None
