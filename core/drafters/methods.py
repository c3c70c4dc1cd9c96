"""The drafting methods: a plain table, method name -> :class:`MethodInfo` (its factory and the facts about it).

Everything that lists or builds methods reads :data:`METHODS` when it runs:
config validation (``hyspec.spec.config``), the policy's signals and rules,
the probe, the bench, the embedded drafters (``hyspec.assets``), ``hyspec
train-draft`` and :func:`build`.  Adding a method is its package plus one
entry here, or ``register(MethodInfo(...))`` from outside (a plugin, a test).

A factory is ``factory(target, spec, weights) -> Proposer``: the engine's
``TargetContext``, the method's own section of the config (:class:`MethodSpec`)
and the resolved weight directory (``None`` for a method without weights;
``hyspec.drafters.build`` resolves it and calls the factory).
The meta-method ``hybrid`` is not in the table: it combines these methods and
builds no proposer of its own (``hyspec.spec.registry``).

Torch-free at import (the CLI and the probe read the table before torch
loads): each package's ``__init__`` holds only its factory, which imports the
proposer, and with it torch, when it runs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from hyspec.drafters import dflash, draft_model, dspark, eagle, mtp, ngram, suffix
from hyspec.errors import ConfigError, HyspecError

if TYPE_CHECKING:
    from hyspec.seam.proposer import Proposer
    from hyspec.seam.target import TargetContext

#: The name that means "plain decoding" in rules, the bench and remote.fallback_method: never a method.
NONE = "none"
#: The meta-method: one of the others per step.  Reserved: no entry of the table may take it.
HYBRID = "hybrid"
# a method name is a rule-condition name (``accept_rate.<method>``): lower-case identifier
_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")


# Largest draft tree per sequence: the verification query length is budget + 1 and
# the tree mask is [budget + 1]^2 per sequence; 256 bounds that at 66k entries.
# Backends with a tighter kernel limit check their own at start-up.
MAX_TREE_BUDGET = 256


@dataclass(frozen=True)
class TreeShape:
    """The resolved ``tree`` section: EAGLE-2 dynamic trees of at most ``budget`` nodes."""

    budget: int = 32
    depth: int = 4
    topk: int = 8


@dataclass(frozen=True)
class SuffixOptions:
    """vLLM's ``suffix_decoding_*`` keys (plus hyspec's corpus): suffix decoding's section."""

    max_tree_depth: int = 24
    max_cached_requests: int = 10000
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1
    corpus: Optional[str] = None


@dataclass(frozen=True)
class MethodSpec:
    """One method's own section of ``speculative_config``: all its factory builds from (with the weights)."""

    method: str
    model: Optional[str]  # draft weights as configured; None = the default (hyspec.drafters.build.resolve_weights)
    num_speculative_tokens: int
    prompt_lookup_min: Optional[int] = None  # ngram
    prompt_lookup_max: Optional[int] = None
    tree: TreeShape = field(default_factory=TreeShape)  # tree drafters (eagle, eagle3)
    speculative_token_tree: Optional[tuple[tuple[int, ...], ...]] = None  # vLLM's static tree, when given
    suffix: SuffixOptions = field(default_factory=SuffixOptions)
    #: placement: None = beside the target; else the ``remote`` section (hyspec.spec.config.RemoteConfig)
    remote: Any = None
    ray_address: Optional[str] = None


Factory = Callable[["TargetContext", MethodSpec, Optional[Path]], "Proposer"]


@dataclass(frozen=True)
class MethodInfo:
    """One drafting method: its factory and what the rest of hyspec needs to know about it."""

    name: str
    summary: str  # one line: what drafts (docs/architecture.md §5 has the longer table)
    factory: Factory
    weights: bool = True  # takes draft weights (the `model` key); False: ngram, suffix
    drafter_dir: Optional[str] = None  # directory in assets/ of the drafter trained for the default model
    recipe: Optional[str] = None  # module that registers the method's `hyspec train-draft` recipe (imported by it)
    chain_only: bool = False  # drafts one chain/block per step: a static token tree means nothing to it
    #: position in the load order of a bare {"method": "hybrid"} (when the embedded drafter exists); None: not loaded
    default_hybrid_rank: Optional[int] = None
    #: whether a target checkpoint holds this method's weights itself (DeepSeek's MTP layout): then it is the default
    weights_in_target: Optional[Callable[[Path], bool]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name) or self.name in (NONE, HYBRID):
            raise HyspecError(f"method name {self.name!r} must be a lower-case identifier other than {NONE!r} "
                              f"and {HYBRID!r}")
        if not callable(self.factory):
            raise HyspecError(f"method {self.name!r} needs a factory (target, spec, weights) -> Proposer")
        if not self.weights and (self.drafter_dir or self.recipe or self.weights_in_target):
            raise HyspecError(f"method {self.name!r} has no weights, so no drafter_dir, recipe or weights_in_target")
        if self.default_hybrid_rank is not None and not self.drafter_dir:
            raise HyspecError(f"method {self.name!r}: a bare hybrid loads only methods with an embedded drafter "
                              "(drafter_dir)")

    @property
    def builds_trees(self) -> bool:
        """Whether a static ``speculative_token_tree`` applies (a drafter that is not chain-only)."""
        return not self.chain_only


#: name -> MethodInfo, in table order.  Change it with register() / unregister(); tests may also
#: ``monkeypatch.setitem`` an entry (every reader looks names up here when it runs).
METHODS: dict[str, MethodInfo] = {m.name: m for m in (
    MethodInfo("ngram", "prompt lookup", ngram.build, weights=False, chain_only=True),
    MethodInfo("draft_model", "a small independent LM with the target's tokenizer", draft_model.build,
               drafter_dir="smollm2-draft-model", recipe="hyspec.drafters.draft_model.recipe", default_hybrid_rank=5),
    MethodInfo("eagle", "EAGLE head over target hidden states, EAGLE-2 dynamic trees", eagle.build_eagle,
               drafter_dir="smollm2-eagle", recipe="hyspec.drafters.eagle.recipe", default_hybrid_rank=2),
    MethodInfo("eagle3", "EAGLE-3 head fusing three target layers, EAGLE-2 dynamic trees", eagle.build_eagle3,
               drafter_dir="smollm2-eagle3", recipe="hyspec.drafters.eagle.recipe", default_hybrid_rank=3),
    MethodInfo("mtp", "DeepSeek-V3-style MTP modules chained k times", mtp.build, drafter_dir="smollm2-mtp",
               recipe="hyspec.drafters.mtp.recipe", default_hybrid_rank=1, weights_in_target=mtp.in_target),
    MethodInfo("dflash", "block-parallel drafter: one forward drafts a block", dflash.build,
               drafter_dir="smollm2-dflash", recipe="hyspec.drafters.dflash.recipe", chain_only=True,
               default_hybrid_rank=0),
    MethodInfo("dspark", "DFlash backbone + Markov head + confidence cut", dspark.build,
               drafter_dir="smollm2-dspark", recipe="hyspec.drafters.dspark.recipe", chain_only=True,
               default_hybrid_rank=4),
    MethodInfo("suffix", "suffix decoding: frequency-scored trees over the prompt and previous responses",
               suffix.build, weights=False),
)}
#: the drafting methods' names, a live view of the table (a method registered later is in it at once)
NAMES = METHODS.keys()


def register(info: MethodInfo, *, replace: bool = False) -> Optional[MethodInfo]:
    """Add ``info`` (or, with ``replace=True``, swap an existing entry); returns the entry it replaced."""
    if not isinstance(info, MethodInfo):
        raise HyspecError(f"register() takes a MethodInfo, got {info!r}")
    previous = METHODS.get(info.name)
    if previous is not None and not replace:
        raise HyspecError(f"method {info.name!r} is already registered (pass replace=True to swap it)")
    METHODS[info.name] = info
    return previous


def unregister(name: str) -> MethodInfo:
    """Remove a method; returns its entry."""
    try:
        return METHODS.pop(name)
    except KeyError:
        raise HyspecError(f"method {name!r} is not registered") from None


def get(name: str) -> MethodInfo:
    """The entry for ``name``; ConfigError (key ``speculative_config.method``) for anything else."""
    info = METHODS.get(name)
    if info is None:
        if name == HYBRID:
            raise ConfigError("speculative_config.method", f"{HYBRID!r} combines other methods and builds no "
                                                           "proposer of its own")
        raise ConfigError("speculative_config.method", f"unknown method {name!r}; one of {', '.join(METHODS)}")
    return info


def _select(keep: Callable[[MethodInfo], bool]) -> tuple[str, ...]:
    return tuple(m.name for m in METHODS.values() if keep(m))


def drafter_methods() -> tuple[str, ...]:
    """Methods that load drafter weights (the `model` key): not ngram, not suffix."""
    return _select(lambda m: m.weights)


def chain_only_methods() -> tuple[str, ...]:
    """Methods that draft one chain/block per step (a static token tree does not apply)."""
    return _select(lambda m: m.chain_only)


def tree_methods() -> tuple[str, ...]:
    """Methods a static ``speculative_token_tree`` applies to."""
    return _select(lambda m: m.builds_trees)


def trainable_methods() -> tuple[str, ...]:
    """Methods ``hyspec train-draft`` can train (those with a recipe module)."""
    return _select(lambda m: m.recipe is not None)


def default_hybrid_methods() -> tuple[str, ...]:
    """What a bare ``{"method": "hybrid"}`` loads besides ngram and suffix, in order, when each one's embedded
    drafter exists."""
    ranked = sorted((m for m in METHODS.values() if m.default_hybrid_rank is not None),
                    key=lambda m: m.default_hybrid_rank)
    return tuple(m.name for m in ranked)


def drafter_dirs() -> dict[str, str]:
    """method -> its directory in assets/ (the drafter trained for the default model)."""
    return {m.name: m.drafter_dir for m in METHODS.values() if m.drafter_dir}


def recipe_modules() -> dict[str, str]:
    """method -> the module that registers its training recipe."""
    return {m.name: m.recipe for m in METHODS.values() if m.recipe}

