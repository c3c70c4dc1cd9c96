"""hyspec's options inside vLLM: the JSON file ``HYSPEC_VLLM_CONFIG`` names (vLLM's own config has no place
for a third-party proposer's options), read once at start-up; a bad file or key is an error naming it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hyspec.errors import ConfigError

OPTIONS_ENV = "HYSPEC_VLLM_CONFIG"
LOCAL = ("suffix", "ngram")  # drafted in the proposer's own process
DRAFTING = (*LOCAL, "remote")  # remote: a drafter on Ray CPU workers (core/vllm/remote_arm.py)
METHODS = (*DRAFTING, "hybrid")  # hybrid: per step and row, the hybrid_arms' draft tokens that pay (or none)
# What remote workers may host inside vLLM: drafters that read token ids alone.  vLLM's hook hands the proposer
# no target hidden states, so eagle, eagle3, mtp, dflash and dspark cannot be fed from here.
REMOTE_METHODS = ("draft_model", "ngram", "suffix")


@dataclass(frozen=True)
class RemoteArmOptions:
    """The ``remote`` section: where the Ray cluster is, what its CPU workers draft with, and the deadlines."""

    ray_address: str | None = None  # null: start a local Ray (one worker) in vLLM's drafting process
    method: str = "draft_model"  # the drafter each worker hosts (REMOTE_METHODS)
    model: str | None = None  # its weights on the worker nodes; null: hyspec's embedded drafter for the method
    num_workers: int | None = None  # null: one per node offering the hyspec_draft resource (`hyspec draft-worker`)
    draft_deadline_ms: int = 50  # a later draft: no draft for that step's rows
    ping_interval_ms: int = 200  # health checks: a ping every interval ...
    max_missed_pings: int = 3  # ... and a worker this many pings late is down (its rows fail over)
    startup_timeout_s: float = 120.0  # actor start and drafter load; a later worker joins when it answers
    pipelining: bool = True  # workers draft step t+1 while vLLM verifies step t
    fallback: str = "suffix"  # while no worker is up: "suffix", "ngram" (drafted here) or "none" (no drafts)

    def __post_init__(self) -> None:
        if self.method not in REMOTE_METHODS:
            raise ConfigError("remote.method", f"{self.method!r}: remote workers inside vLLM host one of "
                                               f"{', '.join(REMOTE_METHODS)} (vLLM's hook gives no target hidden "
                                               "states to feed the others)")
        if self.fallback not in (*LOCAL, "none"):
            raise ConfigError("remote.fallback", f"{self.fallback!r} is not one of {', '.join(LOCAL)}, none")
        for name in ("draft_deadline_ms", "ping_interval_ms", "max_missed_pings"):
            if not 1 <= getattr(self, name) <= 60_000:
                raise ConfigError(f"remote.{name}", f"must be in 1..60000, got {getattr(self, name)}")
        if self.num_workers is not None and self.num_workers < 1:
            raise ConfigError("remote.num_workers", f"must be >= 1 or null, got {self.num_workers}")
        if not self.startup_timeout_s > 0:
            raise ConfigError("remote.startup_timeout_s", f"must be > 0, got {self.startup_timeout_s}")
        if self.ray_address is not None and not self.ray_address.strip():
            raise ConfigError("remote.ray_address", "empty: give HOST:PORT, \"auto\", or null for a local Ray")


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
    # a read-only corpus of the target's earlier answers (hyspec.drafters.suffix.corpus): "" or "none": none,
    # "default": the one shipped for hyspec's default model, else its directory
    suffix_corpus: str = ""
    metrics_port: int = 0  # a Prometheus endpoint on 127.0.0.1 for hyspec's counters (core/vllm/metrics.py); 0: off
    hybrid_arms: tuple[str, ...] = LOCAL  # hybrid: the drafting methods weighed against no draft (core/vllm/hybrid.py)
    load_threshold: float = 0.75  # hybrid: no drafts while the batch holds more than this share of max_num_seqs
    # hybrid: after this many steps in a row that sent no draft while drafts were there, one step verifies the
    # likeliest row's chain whole, so a stale acceptance estimate cannot keep drafting off; 0: never
    explore_interval: int = 64
    min_gain: float = 0.02  # hybrid: drafts are sent only where the predicted goodput beats plain's by this share
    # hybrid: a batch whose requests were all admitted together (a wave: LLM.generate over a list, a burst of
    # clients) and that nothing joins ends with its slowest row, so drafts go only to rows within a chain of it
    # (core/vllm/hybrid.py, "Waves"); false: every row is judged as if a finished row were replaced at once
    wave_makespan: bool = True
    # steps where no request has drafts are prepared and sampled as plain vLLM does them, not through vLLM's
    # speculative path (spec-decode metadata, rejection sampler); core/vllm/plain_steps.py
    plain_steps_without_drafts: bool = True
    # the canary: this share of requests (by a hash of the request id) is decoded without drafts, the control
    # group (the seed ran 0.05); 0: every request may draft
    control_fraction: float = 0.0
    canary_salt: str = ""  # another salt draws an independent split
    quality_min_acceptance: float = 0.6  # alert when a method's acceptance EWMA stays below this ...
    quality_max_std: float = 0.15  # ... or its std over the window exceeds this (hyspec.spec.quality)
    quality_window: int = 100  # steps per judgement
    remote: RemoteArmOptions = field(default_factory=RemoteArmOptions)  # method "remote" / a hybrid arm

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
        if len(set(self.hybrid_arms)) != len(self.hybrid_arms):
            raise ConfigError("hybrid_arms", f"{list(self.hybrid_arms)} names an arm twice")
        if not 0.0 < self.load_threshold <= 1.0:
            raise ConfigError("load_threshold", f"must be in (0, 1], got {self.load_threshold}")
        if not 0 <= self.explore_interval <= 1_000_000:
            raise ConfigError("explore_interval", f"must be in 0..1000000 (0: never), got {self.explore_interval}")
        if not 0.0 <= self.min_gain <= 10.0:
            raise ConfigError("min_gain", f"must be in [0, 10], got {self.min_gain}")
        if self.suffix_max_cached_requests < 0:
            raise ConfigError("suffix_max_cached_requests", f"must be >= 0, got {self.suffix_max_cached_requests}")
        if not 0.0 <= self.control_fraction < 1.0:
            raise ConfigError("control_fraction", f"must be in [0, 1), got {self.control_fraction}")
        if len(self.canary_salt.encode("utf-8")) > 64:  # BLAKE2b's key limit (hyspec.policy.canary)
            raise ConfigError("canary_salt", "must be at most 64 bytes")
        if not 0.0 <= self.quality_min_acceptance <= 1.0:
            raise ConfigError("quality_min_acceptance", f"must be in [0, 1], got {self.quality_min_acceptance}")
        if not 0.0 <= self.quality_max_std <= 0.5:  # a rate in [0, 1] has a std of at most 0.5
            raise ConfigError("quality_max_std", f"must be in [0, 0.5], got {self.quality_max_std}")
        if not 2 <= self.quality_window <= 100_000:
            raise ConfigError("quality_window", f"must be in 2..100000, got {self.quality_window}")

    @property
    def uses_remote(self) -> bool:
        return self.method == "remote" or (self.method == "hybrid" and "remote" in self.hybrid_arms)

    @property
    def corpus_setting(self) -> str | None:
        """The corpus to load: None for none, "default", or a directory."""
        setting = self.suffix_corpus.strip()
        return None if setting.lower() in ("", "none") else setting


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
    remote = raw.pop("remote", None)
    values = _checked(VllmOptions, raw, "", path)
    if remote is not None:
        if not isinstance(remote, dict):
            raise ConfigError("remote", f"must be a JSON object of remote settings, got {remote!r} (in {path})")
        values["remote"] = RemoteArmOptions(**_checked(RemoteArmOptions, remote, "remote.", path))
    return VllmOptions(**values)


def _checked(cls: type, raw: dict[str, Any], prefix: str, path: str) -> dict[str, Any]:
    """``raw``'s values for ``cls``, once every key is known and every value has its default's JSON type."""
    defaults = {f.name: getattr(cls(), f.name) for f in fields(cls) if f.name != "remote"}
    unknown = sorted(set(raw) - set(defaults))
    if unknown:
        raise ConfigError(prefix + unknown[0], f"unknown option in {path} ({OPTIONS_ENV}); known: "
                                               f"{', '.join(prefix + k for k in defaults)}")
    values = dict(raw)
    for name, value in raw.items():
        expected = type(defaults[name])
        if name in _NULLABLE.get(cls, {}):
            expected = _NULLABLE[cls][name]
            if value is None:
                continue
        if expected is tuple:  # a JSON list of names
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(prefix + name, f"must be a list of names, got {value!r} (in {path})")
            values[name] = tuple(value)
        elif isinstance(value, bool) != (expected is bool) or not isinstance(
                value, (expected, int) if expected is float else expected):
            raise ConfigError(prefix + name, f"must be a {expected.__name__}, got {value!r} (in {path})")
    return values


# keys whose default is null: the type a non-null value must have
_NULLABLE: dict[type, dict[str, type]] = {RemoteArmOptions: {"ray_address": str, "model": str, "num_workers": int}}
