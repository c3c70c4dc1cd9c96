"""hyspec.drafters: the trained drafting methods.

``hyspec.spec.methods.build_proposer`` imports this package the first time a
config asks for a method it does not know, so every method registers its
factory here (the heavy modules load only when a factory runs).  Importing
the package also registers each method's training recipe
(``hyspec.train.base.RECIPES``) for ``hyspec train-draft``.
"""
from __future__ import annotations

from typing import Any

from hyspec.spec.methods import MethodSpec, register_method
from hyspec.spec.proposer import Proposer


# -- mtp, dflash, dspark -------------------------------------------------------------------------

@register_method("mtp")
def _mtp(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.mtp_proposer import MTPProposer

    return MTPProposer.from_spec(engine, spec)


@register_method("dflash")
def _dflash(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.dflash_proposer import DFlashProposer

    return DFlashProposer.from_spec(engine, spec)


@register_method("dspark")
def _dspark(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.dspark_proposer import DSparkProposer

    return DSparkProposer.from_spec(engine, spec)


from hyspec.drafters import dflash_recipe, dspark_recipe, mtp_recipe  # noqa: E402,F401  (register recipes)
