"""hyspec's options inside vLLM: the JSON file ``HYSPEC_VLLM_CONFIG`` names (vLLM's own config has no place
for a third-party proposer's options), read once at start-up; a bad file or key is an error naming it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hyspec.errors import ConfigError

OPTIONS_ENV = "HYSPEC_VLLM_CONFIG"
DRAFTING = ("suffix", "ngram")
METHODS = (*DRAFTING, "hybrid")  # hybrid: a bandit picks among hybrid_arms and no draft, step by step


@dataclass(frozen=True)
class VllmOptions:
    """What a vLLM user sets for hyspec's proposer (the JSON file ``HYSPEC_VLLM_CONFIG`` names)."""

    method: str = "suffix"
    prompt_lookup_min: int = 2  # ngram: vLLM's own ngram bounds
    prompt_lookup_max: int = 5
    suffix_max_tree_depth: int = 24  # suffix: vLLM's suffix_decoding_* defaults
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1
    suffix_max_cached_requests: int = 10000  # finished responses kept to draft from (vLLM's default); 0: none
    metrics_port: int = 0  # a Prometheus endpoint on 127.0.0.1 for hyspec's counters (core/vllm/metrics.py); 0: off
    hybrid_arms: tuple[str, ...] = DRAFTING  # hybrid: the drafting methods the bandit weighs against no draft
    load_threshold: float = 0.75  # hybrid: no drafts while the batch holds more than this share of max_num_seqs
    bandit_explore_fraction: float = 0.1  # hybrid: hyspec.policy.bandit's exploration bound

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError("method", f"{self.method!r} is not one of {', '.join(METHODS)} ({OPTIONS_ENV})")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ConfigError("prompt_lookup_min", f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                                                   f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port", f"must be a TCP port (1-65535) or 0 for none, got {self.metrics_port}")
        unknown_arms = [a for a in self.hybrid_arms if a not in DRAFTING]
        if unknown_arms or not self.hybrid_arms:
            raise ConfigError("hybrid_arms", f"{unknown_arms or 'none'}: choose among {', '.join(DRAFTING)}")
        if not 0.0 < self.load_threshold <= 1.0:
            raise ConfigError("load_threshold", f"must be in (0, 1], got {self.load_threshold}")
        if not 0.0 < self.bandit_explore_fraction <= 0.5:
            raise ConfigError("bandit_explore_fraction", f"must be in (0, 0.5], got {self.bandit_explore_fraction}")
        if self.suffix_max_cached_requests < 0:
            raise ConfigError("suffix_max_cached_requests", f"must be >= 0, got {self.suffix_max_cached_requests}")


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
        if expected is tuple:  # a JSON list of names
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(name, f"must be a list of names, got {value!r} (in {path})")
            raw[name] = tuple(value)
        elif isinstance(value, bool) or not isinstance(value, (expected, int) if expected is float else expected):
            raise ConfigError(name, f"must be a {expected.__name__}, got {value!r} (in {path})")
    return VllmOptions(**raw)
