"""hyspec.policy: the hybrid dispatcher (per-step method choice from live signals).

Stdlib only at import time, so the engine and server may import it freely.
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
