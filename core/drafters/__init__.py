"""hyspec.drafters: the trained drafting methods.

``hyspec.spec.methods.build_proposer`` imports this package the first time a
config asks for a method it does not know, so every method registers its
factory here (the heavy modules load only when a factory runs).  Importing
the package also registers each method's training recipe
(``hyspec.train.base.RECIPES``) for ``hyspec train-draft``.
"""
from __future__ import annotations

from typing import Any

from hyspec.spec.methods import MethodSpec, draft_dir, register_method
from hyspec.spec.proposer import Proposer


# -- eagle, eagle3 -------------------------------------------------------------------------------

@register_method("eagle")
def _eagle(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.eagle_proposer import EagleProposer

    return EagleProposer(engine, draft_dir(spec), spec.config)


@register_method("eagle3")
def _eagle3(engine: Any, spec: MethodSpec) -> Proposer:
    from hyspec.drafters.eagle_proposer import Eagle3Proposer

    return Eagle3Proposer(engine, draft_dir(spec), spec.config)


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
from hyspec.drafters import eagle_recipe  # noqa: E402,F401  (registers the eagle and eagle3 recipes)
