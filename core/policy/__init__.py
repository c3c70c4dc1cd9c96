"""hyspec.policy: whether a step speculates, with which method and how deep (docs/policy.md).

One chain of gates, run once per step in the order ``chain.GATE_ORDER`` declares (``build.build_policy``
assembles it from the speculative config): drafter residency under KV pressure, the TTFT guard, the
method (the hybrid dispatcher -- load fallback, JSON rules, bandit -- or the configured one), and the
goodput controller's budget; the canary splits requests once, at admission.

This package's front imports no torch (the dispatcher, rules, signals and canary below), so the
server and the config may import it freely; ``build``, ``chain``, ``controller`` and ``profiling``
are imported by name.
"""
from hyspec.policy.canary import CONTROL, SPEC, Canary, request_share
from hyspec.policy.conditions import ConditionError, compile_condition
from hyspec.policy.dispatcher import DispatchSnapshot, HybridDispatcher
from hyspec.policy.load import LOAD_SIGNALS, LoadFallback
from hyspec.policy.rules import Rule, RuleFileError, default_rules_path, load_rules, parse_rules
from hyspec.policy.signals import METHODS, NONE, StepSignals

__all__ = [
    "CONTROL", "SPEC", "Canary", "request_share",
    "ConditionError", "compile_condition",
    "DispatchSnapshot", "HybridDispatcher",
    "LOAD_SIGNALS", "LoadFallback",
    "Rule", "RuleFileError", "default_rules_path", "load_rules", "parse_rules",
    "METHODS", "NONE", "StepSignals",
]
