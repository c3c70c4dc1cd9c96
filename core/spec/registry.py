"""The methods ``speculative_config`` may name: the drafting methods' table plus the meta-method ``hybrid``.

The table itself (name -> factory and facts) is :mod:`hyspec.drafters.methods`;
this module adds what the config and the policy know on top of it: ``hybrid``,
which combines the others, and vLLM's methods hyspec refuses with a reason.
Everything here reads the table when called, so a method registered later is
in every answer at once.
"""
from __future__ import annotations

from hyspec.drafters.methods import (HYBRID, METHODS, NAMES, NONE, MethodInfo, chain_only_methods,
                                     default_hybrid_methods, drafter_dirs, drafter_methods, get, recipe_modules,
                                     register, trainable_methods, tree_methods, unregister)

#: one line on hybrid, as each method's ``summary`` (docs/architecture.md §5)
HYBRID_SUMMARY = "one of the others per step, from JSON rules, load and live metrics"
#: The drafting methods (all but hybrid): what a rule, a signal or ``hybrid.methods`` may name.  A live view
#: of the table's keys (``name in PROPOSER_METHODS`` is a dict lookup: signals check it every step).
PROPOSER_METHODS = NAMES

#: vLLM methods hyspec does not implement, with what to use instead (config errors say so).
UNSUPPORTED_METHODS = {
    "medusa": "use 'eagle' (a trained head over target hidden states)",
    "mlp_speculator": "use 'eagle' or 'draft_model'",
    "ngram_gpu": "use 'ngram' (hyspec's prompt lookup runs on every backend)",
    "custom_class": "write a hyspec Proposer instead",
    "extract_hidden_states": "hyspec has no hidden-state export mode",
}


def method_names() -> tuple[str, ...]:
    """Every method, hybrid last: what ``speculative_config.method`` accepts."""
    return (*METHODS, HYBRID)


def proposer_methods() -> tuple[str, ...]:
    """The drafting methods (all but hybrid), in table order."""
    return tuple(METHODS)


__all__ = [
    "HYBRID", "HYBRID_SUMMARY", "METHODS", "NONE", "PROPOSER_METHODS", "UNSUPPORTED_METHODS", "MethodInfo",
    "chain_only_methods", "default_hybrid_methods", "drafter_dirs", "drafter_methods", "get", "method_names",
    "proposer_methods", "recipe_modules", "register", "trainable_methods", "tree_methods", "unregister",
]
