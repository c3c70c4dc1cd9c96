"""hyspec.drafters: the trained drafting methods.

One package per method (``eagle/`` serves eagle and eagle3): ``model``,
``checkpoint``, ``proposer`` and, imported only by ``hyspec train-draft``,
``recipe``.  ``hyspec.spec.methods.build_proposer`` imports this package the
first time a config asks for a method it does not know, so every method
registers its factory here (the heavy modules load only when a factory runs).
"""
from __future__ import annotations

from typing import Any

from hyspec.spec.methods import MethodSpec, draft_dir, register_method
from hyspec.spec.proposer import Proposer


# -- eagle, eagle3 -------------------------------------------------------------------------------

@register_method("eagle")
def _eagle(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.eagle.proposer import EagleProposer

    return EagleProposer(engine, draft_dir(spec), spec.config)


@register_method("eagle3")
def _eagle3(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.eagle.proposer import Eagle3Proposer

    return Eagle3Proposer(engine, draft_dir(spec), spec.config)


# -- mtp, dflash, dspark -------------------------------------------------------------------------

@register_method("mtp")
def _mtp(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.mtp.proposer import MTPProposer

    return MTPProposer.from_spec(engine, spec)


@register_method("dflash")
def _dflash(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.dflash.proposer import DFlashProposer

    return DFlashProposer.from_spec(engine, spec)


@register_method("dspark")
def _dspark(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.dspark.proposer import DSparkProposer

    return DSparkProposer.from_spec(engine, spec)

