"""The drafting methods hyspec knows: one :class:`MethodInfo` per method, in one place.

Everything that lists methods reads it, live: config validation
(``hyspec.spec.config``), the dispatcher's signals and rules
(``hyspec.policy.signals.METHODS``), the probe (``hyspec.backends.records
.DRAFTING_METHODS``), the bench (``hyspec.bench.settings``), the embedded
drafters (``hyspec.assets.DRAFTER_DIRS``), ``hyspec train-draft``
(``hyspec.train.registry``) and the proposer factory lookup
(``hyspec.spec.methods.build_proposer``).  Adding a method is one
:func:`register` call (or one entry in ``_BUILTIN`` below) plus its package:

    register(MethodInfo("lookahead", "Jacobi lookahead drafting",
                        factory="hyspec.drafters.lookahead:build", weights=False, chain_only=True))

Torch-free at import (the CLI and the probe read it before torch loads):
factories and recipes are named by module path and imported only when used.
A factory is called ``factory(target, spec)`` with the engine's
``TargetContext`` and a ``hyspec.spec.methods.MethodSpec`` and returns a
``Proposer``.

The helpers return tuples of the registry as it is now; :class:`MethodNames`
and :class:`MethodMap` are live views of it for module constants, so a method
registered later is in every one of them at once (importers that did
``from ... import METHODS`` see it too).
"""
from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from hyspec.errors import ConfigError, HyspecError

if TYPE_CHECKING:
    from hyspec.engine.target import TargetContext
    from hyspec.spec.methods import MethodSpec
    from hyspec.spec.proposer import Proposer

    Factory = Callable[[TargetContext, MethodSpec], Proposer]
else:
    Factory = Callable[[Any, Any], Any]

#: The name that means "plain decoding" in rules, the bench and remote.fallback_method: never a method.
NONE = "none"
# a method name is a rule-condition name (``accept_rate.<method>``): lower-case identifier
_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")


@dataclass(frozen=True)
class MethodInfo:
    """One drafting method (or the meta-method ``hybrid``)."""

    name: str
    summary: str  # one line: what drafts (docs/architecture.md §5 has the longer table)
    #: "package.module:function" (imported when first built), or a callable (tests); None for a meta-method
    factory: Union[str, Factory, None]
    weights: bool = True  # takes draft weights (the `model` key); False: ngram (prompt lookup)
    drafter_dir: str | None = None  # directory in assets/ of the drafter trained for the default model
    recipe: str | None = None  # module that registers the method's `hyspec train-draft` recipe
    chain_only: bool = False  # drafts one chain/block per step: a static token tree means nothing to it
    #: position in the load order of a bare {"method": "hybrid"} (when the embedded drafter exists); None: not loaded
    default_hybrid_rank: int | None = None
    meta: bool = False  # combines the other methods (hybrid): builds no proposer of its own

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name) or self.name == NONE:
            raise HyspecError(f"method name {self.name!r} must be a lower-case identifier other than {NONE!r}")
        if self.meta:
            if self.factory is not None or self.recipe or self.drafter_dir or self.default_hybrid_rank is not None:
                raise HyspecError(f"meta-method {self.name!r} has no factory, recipe, drafter or hybrid rank")
            return
        if isinstance(self.factory, str):
            module, sep, attr = self.factory.partition(":")
            if not (module and sep and attr.isidentifier()):
                raise HyspecError(f"method {self.name!r}: factory {self.factory!r} is not 'package.module:function'")
        elif not callable(self.factory):
            raise HyspecError(f"method {self.name!r} needs a factory ('package.module:function' or a callable)")
        if not self.weights and (self.drafter_dir or self.recipe):
            raise HyspecError(f"method {self.name!r} has no weights, so no drafter_dir or recipe")
        if self.default_hybrid_rank is not None and not self.drafter_dir:
            raise HyspecError(f"method {self.name!r}: a bare hybrid loads only methods with an embedded drafter "
                              "(drafter_dir)")

    @property
    def builds_trees(self) -> bool:
        """Whether a static ``speculative_token_tree`` applies (a drafter that is not chain-only)."""
        return not self.meta and not self.chain_only

    def load_factory(self) -> Factory:
        """The factory function, importing its module; ConfigError when this build lacks it."""
        if self.factory is None:
            raise ConfigError("speculative_config.method", f"{self.name!r} combines other methods and builds "
                                                           "no proposer of its own")
        if callable(self.factory):
            return self.factory
        module, _, attr = self.factory.partition(":")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
                raise ConfigError("speculative_config.method", f"method {self.name!r} is not available in this "
                                                               f"build: its module {module} is missing") from None
            raise
        factory = getattr(mod, attr, None)
        if not callable(factory):
            raise ConfigError("speculative_config.method", f"method {self.name!r} is not available in this build: "
                                                           f"{module} has no factory {attr!r}")
        return factory


_BUILTIN = (
    MethodInfo("ngram", "prompt lookup", "hyspec.drafters.ngram:build",
               weights=False, chain_only=True),
    MethodInfo("draft_model", "a small independent LM with the target's tokenizer",
               "hyspec.drafters.draft_model:build", drafter_dir="smollm2-draft-model",
               recipe="hyspec.drafters.draft_model.recipe", default_hybrid_rank=5),
    MethodInfo("eagle", "EAGLE head over target hidden states, EAGLE-2 dynamic trees",
               "hyspec.drafters.eagle:build_eagle", drafter_dir="smollm2-eagle",
               recipe="hyspec.drafters.eagle.recipe", default_hybrid_rank=2),
    MethodInfo("eagle3", "EAGLE-3 head fusing three target layers, EAGLE-2 dynamic trees",
               "hyspec.drafters.eagle:build_eagle3", drafter_dir="smollm2-eagle3",
               recipe="hyspec.drafters.eagle.recipe", default_hybrid_rank=3),
    MethodInfo("mtp", "DeepSeek-V3-style MTP modules chained k times",
               "hyspec.drafters.mtp:build", drafter_dir="smollm2-mtp",
               recipe="hyspec.drafters.mtp.recipe", default_hybrid_rank=1),
    MethodInfo("dflash", "block-parallel drafter: one forward drafts a block",
               "hyspec.drafters.dflash:build", drafter_dir="smollm2-dflash",
               recipe="hyspec.drafters.dflash.recipe", chain_only=True, default_hybrid_rank=0),
    MethodInfo("dspark", "DFlash backbone + Markov head + confidence cut",
               "hyspec.drafters.dspark:build", drafter_dir="smollm2-dspark",
               recipe="hyspec.drafters.dspark.recipe", chain_only=True, default_hybrid_rank=4),
    MethodInfo("suffix", "suffix decoding: frequency-scored trees over the prompt and previous responses",
               "hyspec.drafters.suffix:build", weights=False),
    MethodInfo("hybrid", "one of the others per step, from JSON rules, load and live metrics", None,
               weights=False, meta=True),
)

#: name -> MethodInfo, in table order.  Change it with register() / unregister(); tests may also
#: ``monkeypatch.setitem`` an entry (every view below reads this dict on each use).
METHODS: dict[str, MethodInfo] = {m.name: m for m in _BUILTIN}

#: vLLM methods hyspec does not implement, with what to use instead (config errors say so).
UNSUPPORTED_METHODS = {
    "medusa": "use 'eagle' (a trained head over target hidden states)",
    "mlp_speculator": "use 'eagle' or 'draft_model'",
    "ngram_gpu": "use 'ngram' (hyspec's prompt lookup runs on every backend)",
    "custom_class": "write a hyspec Proposer instead",
    "extract_hidden_states": "hyspec has no hidden-state export mode",
}


# ---------------------------------------------------------------- changing it

def register(info: MethodInfo, *, replace: bool = False) -> MethodInfo | None:
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


# ---------------------------------------------------------------- reading it

def get(name: str) -> MethodInfo:
    """The entry for ``name``; ConfigError (key ``speculative_config.method``) for an unknown one."""
    info = METHODS.get(name)
    if info is None:
        raise ConfigError("speculative_config.method", f"unknown method {name!r}; one of {', '.join(method_names())}")
    return info


def _meta_last(m: MethodInfo) -> int:
    return int(m.meta)  # meta-methods last (hybrid ends every table), otherwise registration order


def _hybrid_rank(m: MethodInfo) -> int:
    return m.default_hybrid_rank if m.default_hybrid_rank is not None else 1 << 30


def _names(select: Callable[[MethodInfo], bool], order: Callable[[MethodInfo], int] = _meta_last) -> tuple[str, ...]:
    return tuple(m.name for m in sorted(METHODS.values(), key=order) if select(m))


def _any(m: MethodInfo) -> bool:
    return True


def _proposer(m: MethodInfo) -> bool:
    return not m.meta


def _drafter(m: MethodInfo) -> bool:
    return m.weights and not m.meta


def _chain_only(m: MethodInfo) -> bool:
    return m.chain_only


def _tree(m: MethodInfo) -> bool:
    return m.builds_trees


def _trainable(m: MethodInfo) -> bool:
    return m.recipe is not None


def _in_default_hybrid(m: MethodInfo) -> bool:
    return m.default_hybrid_rank is not None


def method_names() -> tuple[str, ...]:
    """Every method, the meta-method hybrid last: what ``speculative_config.method`` accepts."""
    return _names(_any)


def proposer_methods() -> tuple[str, ...]:
    """Methods that build a proposer (all but hybrid): what a rule, a signal or ``hybrid.methods`` may name."""
    return _names(_proposer)


def drafter_methods() -> tuple[str, ...]:
    """Methods that load drafter weights (the `model` key): not ngram, not hybrid."""
    return _names(_drafter)


def chain_only_methods() -> tuple[str, ...]:
    """Methods that draft one chain/block per step (a static token tree does not apply)."""
    return _names(_chain_only)


def tree_methods() -> tuple[str, ...]:
    """Methods a static ``speculative_token_tree`` applies to."""
    return _names(_tree)


def trainable_methods() -> tuple[str, ...]:
    """Methods ``hyspec train-draft`` can train (those with a recipe module)."""
    return _names(_trainable)


def default_hybrid_methods() -> tuple[str, ...]:
    """What a bare ``{"method": "hybrid"}`` loads besides ngram, in order, when each one's embedded drafter exists."""
    return _names(_in_default_hybrid, _hybrid_rank)


def drafter_dirs() -> dict[str, str]:
    """method -> its directory in assets/ (the drafter trained for the default model)."""
    return {m.name: m.drafter_dir for m in sorted(METHODS.values(), key=_meta_last) if m.drafter_dir}


def recipe_modules() -> dict[str, str]:
    """method -> the module that registers its training recipe."""
    return {m.name: m.recipe for m in sorted(METHODS.values(), key=_meta_last) if m.recipe}


# ---------------------------------------------------------------- live views

class MethodNames(Sequence):
    """A tuple-like view of the registered methods ``select`` picks, re-read on every use.

    Module constants such as ``hyspec.policy.signals.METHODS`` are these, so
    ``from ... import METHODS`` stays right after a later :func:`register`.
    ``name in view`` is one dict lookup (signals check it every step).
    Compares equal to a tuple or list with the same names.
    """

    __slots__ = ("_select", "_order", "_prefix")

    def __init__(self, select: Callable[[MethodInfo], bool] = _any, *, prefix: tuple[str, ...] = (),
                 order: Callable[[MethodInfo], int] = _meta_last):
        self._select = select
        self._order = order
        self._prefix = tuple(prefix)

    def _tuple(self) -> tuple[str, ...]:
        return self._prefix + _names(self._select, self._order)

    def __contains__(self, name: object) -> bool:
        if name in self._prefix:
            return True
        info = METHODS.get(name) if isinstance(name, str) else None
        return info is not None and self._select(info)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tuple())

    def __len__(self) -> int:
        return len(self._tuple())

    def __getitem__(self, index):  # type: ignore[override]
        return self._tuple()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (MethodNames, tuple, list)):
            return self._tuple() == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # the contents change with the registry

    def __add__(self, other: Sequence[str]) -> tuple[str, ...]:
        return self._tuple() + tuple(other)

    def __radd__(self, other: Sequence[str]) -> tuple[str, ...]:
        return tuple(other) + self._tuple()

    def __repr__(self) -> str:
        return repr(self._tuple())


class MethodMap(Mapping):
    """A read-only dict-like view of ``items()`` (method -> value) that re-reads the registry on every use."""

    __slots__ = ("_items",)

    def __init__(self, items: Callable[[], dict[str, str]]):
        self._items = items

    def __getitem__(self, name: str) -> str:
        return self._items()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __repr__(self) -> str:
        return repr(self._items())


# Live views of the lists above, for module constants elsewhere (signals.METHODS, bench DRAFTER_METHODS, ...).
ALL_METHODS = MethodNames()
PROPOSER_METHODS = MethodNames(_proposer)
DRAFTER_METHODS = MethodNames(_drafter)
CHAIN_ONLY_METHODS = MethodNames(_chain_only)
TRAINABLE_METHODS = MethodNames(_trainable)
#: What a bare hybrid loads (besides ngram) when the embedded drafter exists.
DEFAULT_HYBRID_METHODS = MethodNames(_in_default_hybrid, order=_hybrid_rank)
DRAFTER_DIRS = MethodMap(drafter_dirs)
RECIPE_MODULES = MethodMap(recipe_modules)

__all__ = [
    "ALL_METHODS", "CHAIN_ONLY_METHODS", "DEFAULT_HYBRID_METHODS", "DRAFTER_DIRS", "DRAFTER_METHODS", "METHODS",
    "PROPOSER_METHODS", "RECIPE_MODULES", "TRAINABLE_METHODS", "MethodInfo", "MethodMap", "MethodNames", "NONE", "UNSUPPORTED_METHODS",
    "chain_only_methods", "default_hybrid_methods", "drafter_dirs", "drafter_methods", "get", "method_names",
    "proposer_methods", "recipe_modules", "register", "trainable_methods", "tree_methods", "unregister",
]
