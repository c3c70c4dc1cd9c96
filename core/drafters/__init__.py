"""hyspec.drafters: the drafting methods, one package per method (``eagle/`` serves eagle and eagle3).

Each package has ``proposer`` (inference), ``model``/``checkpoint`` where it
has weights, ``recipe`` (imported only by ``hyspec train-draft``) and, in its
``__init__``, the factory the method table (``methods.py``) names for it
(``build(target, spec, weights) -> Proposer``).  Importing a package loads
nothing heavy: each factory imports its proposer, and torch, when it runs.
"""
