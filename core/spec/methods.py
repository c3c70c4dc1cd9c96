"""Method name -> proposer factory.

``ngram`` and ``draft_model`` live in ``hyspec.spec``; the trained drafters
(eagle, eagle3, mtp, dflash, dspark) register themselves from
``hyspec.drafters`` (imported on first use, so their code loads only when a
config asks for them).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from hyspec.errors import ConfigError
from hyspec.spec.proposer import Proposer


@dataclass(frozen=True)
class MethodSpec:
    """What a factory needs to build one method's proposer."""

    method: str
    model: str | None  # draft weights; None = the embedded default for the method
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int
    config: Any  # the whole SpeculativeConfig (tree, remote, ... sections)


Factory = Callable[[Any, MethodSpec], Proposer]  # (engine, spec) -> proposer
_FACTORIES: dict[str, Factory] = {}


def register_method(name: str) -> Callable[[Factory], Factory]:
    def deco(factory: Factory) -> Factory:
        _FACTORIES[name] = factory
        return factory

    return deco


def build_proposer(engine: Any, spec: MethodSpec) -> Proposer:
    if getattr(spec.config, "draft_placement", "local") == "remote":
        # Drafts come from Ray CPU workers; the local proposer is built only as the failover path.
        from hyspec.remote.factory import build_remote_proposer

        return build_remote_proposer(engine, spec)
    if spec.method not in _FACTORIES:
        try:
            importlib.import_module("hyspec.drafters")
        except ImportError:
            pass
    factory = _FACTORIES.get(spec.method)
    if factory is None:
        raise ConfigError("speculative_config.method",
                          f"method {spec.method!r} is not available in this build; available: {', '.join(sorted(_FACTORIES))}")
    return factory(engine, spec)


def draft_dir(spec: MethodSpec):
    if spec.model is not None:
        return spec.model
    from hyspec.assets import default_drafter

    return default_drafter(spec.method)


@register_method("ngram")
def _ngram(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.ngram.proposer import NgramProposer

    return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max, spec.num_speculative_tokens,
                         engine.config.vocab_size)


@register_method("draft_model")
def _draft_model(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.draft_model.proposer import DraftModelProposer

    return DraftModelProposer(engine, draft_dir(spec), spec.num_speculative_tokens)
