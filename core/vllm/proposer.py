"""hyspec's drafting inside vLLM, through vLLM's third-party proposer hook.

    vllm serve DIR --speculative-config \
        '{"method": "custom_class", "model": "hyspec.vllm.HyspecProposer", "num_speculative_tokens": 4}'

vLLM builds the class with its ``VllmConfig``, calls ``load_model`` once, then each step
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` and verifies the
drafts itself with its own rejection sampler: whatever is proposed here, the output is vLLM's.  Drafts
are chains (the hook has no trees), so a suffix tree is cut to its likeliest path.

hyspec's own options come from the JSON file that ``HYSPEC_VLLM_CONFIG`` names (unset: suffix decoding
with vLLM's suffix defaults).  This first step proposes with ``suffix`` (the request's own tokens) or
``ngram``, and keeps no state between steps: the hook passes batch rows, not request ids, and a row's
context is rebuilt from ``token_ids_cpu`` each step, so nothing can follow the wrong request.  Not yet
here (issue 46): the cache of finished responses and the corpus, remote drafting, the hybrid, metrics.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hyspec.drafters.ngram.proposer import find_continuation
from hyspec.drafters.suffix.proposer import MAX_PER_KEY, Draft, SuffixProposer, SuffixSettings
from hyspec.drafters.suffix.store import TokenStore
from hyspec.errors import ConfigError

OPTIONS_ENV = "HYSPEC_VLLM_CONFIG"
METHODS = ("suffix", "ngram")


@dataclass(frozen=True)
class VllmOptions:
    """What a vLLM user sets for hyspec's proposer (the JSON file ``HYSPEC_VLLM_CONFIG`` names)."""

    method: str = "suffix"
    prompt_lookup_min: int = 2  # ngram: vLLM's own ngram bounds
    prompt_lookup_max: int = 5
    suffix_max_tree_depth: int = 24  # suffix: vLLM's suffix_decoding_* defaults
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError("method", f"{self.method!r} is not one of {', '.join(METHODS)} ({OPTIONS_ENV})")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ConfigError("prompt_lookup_min", f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                                                   f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")


def load_options(path: str | None) -> VllmOptions:
    """The options in the JSON file at ``path`` (None: the defaults); a clear error for a bad file or key."""
    if not path:
        return VllmOptions()
    file = Path(path)
    try:
        raw = json.loads(file.read_text())
    except OSError as exc:
        raise ConfigError(OPTIONS_ENV, f"cannot read {path} ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(OPTIONS_ENV, f"{path} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(OPTIONS_ENV, f"{path} must hold a JSON object of options")
    known = VllmOptions.__dataclass_fields__
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(unknown[0], f"unknown option in {path} ({OPTIONS_ENV}); known: {', '.join(known)}")
    for name, value in raw.items():
        expected = type(getattr(VllmOptions(), name))
        if isinstance(value, bool) or not isinstance(value, (expected, int) if expected is float else expected):
            raise ConfigError(name, f"must be a {expected.__name__}, got {value!r} (in {path})")
    return VllmOptions(**raw)


class HyspecProposer:
    """vLLM's ``custom_class`` proposer backed by hyspec's drafters."""

    def __init__(self, vllm_config: Any, options: VllmOptions | None = None):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.options = options if options is not None else load_options(os.environ.get(OPTIONS_ENV))
        o = self.options
        self._suffix = SuffixProposer(SuffixSettings(o.suffix_max_tree_depth, 0, o.suffix_max_spec_factor,
                                                     o.suffix_min_token_prob), self.k, vocab_size=1 << 31)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: suffix and ngram draft from the tokens."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        """One draft chain per batch row (``[]``: none), at most ``num_speculative_tokens`` long."""
        drafts: list[list[int]] = []
        for row, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[row])
            budget = min(self.k, self.max_model_len - n)
            if not len(sampled) or budget < 1:  # a row still prefilling, or at the context's end
                drafts.append([])
                continue
            context = token_ids_cpu[row, :n]
            drafts.append(self.draft(context, budget))
        return drafts

    def draft(self, context: np.ndarray, budget: int) -> list[int]:
        """A chain of at most ``budget`` tokens to follow ``context`` (a request's prompt and output so far)."""
        o = self.options
        if o.method == "ngram":
            return find_continuation(np.asarray(context), o.prompt_lookup_min, o.prompt_lookup_max, budget)
        tokens = [int(t) for t in context]
        store = TokenStore(MAX_PER_KEY)
        store.extend(0, tokens)
        return likeliest_path(self._suffix.draft(store, tokens, budget, exclude_end=(0, len(tokens) - 1)))


def likeliest_path(draft: Draft) -> list[int]:
    """The chain from the root that takes each node's likeliest child (a tree's best single path)."""
    best_child: dict[int, int] = {}  # draft node (0 = the root) -> its likeliest child's index (1-based)
    for i, parent in enumerate(draft.parents, start=1):
        current = best_child.get(parent)
        if current is None or draft.conditional[i - 1] > draft.conditional[current - 1]:
            best_child[parent] = i
    path, node = [], 0
    while node in best_child:
        node = best_child[node]
        path.append(draft.tokens[node - 1])
    return path
