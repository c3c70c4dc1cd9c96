"""hyspec.drafters: the drafting methods, one package per method (``eagle/`` serves eagle and eagle3).

Each package has ``proposer`` (inference), ``model``/``checkpoint`` where it
has weights, ``recipe`` (imported only by ``hyspec train-draft``) and, in its
``__init__``, the factory ``hyspec.spec.registry`` names for it
(``build(target, spec) -> Proposer``).  Importing a package loads nothing
heavy: each factory imports its proposer when it runs.
"""
