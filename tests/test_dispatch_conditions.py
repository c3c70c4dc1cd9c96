"""The rule condition language: what it accepts, what it means, what it rejects (and where)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hyspec.policy as dispatch_pkg
from hyspec.policy.conditions import ConditionError, compile_condition
from hyspec.policy.signals import StepSignals


def holds(condition: str, **signals) -> bool:
    return compile_condition(condition)(StepSignals(**signals))


@pytest.mark.parametrize("condition, signals, expected", [
    ("context_length > 4096", dict(context_length=5000), True),
    ("context_length > 4096", dict(context_length=4096), False),
    ("context_length >= 4096", dict(context_length=4096), True),
    ("batch_size <= 8", dict(batch_size=8), True),
    ("batch_size < 8", dict(batch_size=8), False),
    ("queue_depth == 0", dict(queue_depth=0), True),
    ("queue_depth != 0", dict(queue_depth=0), False),
    ("4096 < context_length", dict(context_length=5000), True),  # constant on the left
    ("max_context_length > 8000", dict(context_length=100, max_context_length=9000), True),
    ("max_context_length == context_length", dict(context_length=100), True),  # defaults to the mean
    ("context_length > 4096 and mem_usage < 0.70", dict(context_length=5000, mem_usage=0.5), True),
    ("context_length > 4096 and mem_usage < 0.70", dict(context_length=5000, mem_usage=0.7), False),
    ("load > 0.5 or queue_depth > 3", dict(load=0.1, queue_depth=4), True),
    ("not remote_health < 0.9", dict(remote_health=0.95), True),
    # precedence: not > and > or, as in Python
    ("load > 0.5 or batch_size > 2 and queue_depth > 2", dict(load=0.9), True),
    ("(load > 0.5 or batch_size > 2) and queue_depth > 2", dict(load=0.9), False),
    ("not load > 0.5 and batch_size > 2", dict(load=0.1, batch_size=3), True),
    # chained comparisons mean what they do in Python
    ("0.5 < mem_usage <= 0.9", dict(mem_usage=0.9), True),
    ("0.5 < mem_usage <= 0.9", dict(mem_usage=0.95), False),
    ("0.5 < mem_usage <= 0.9", dict(mem_usage=0.5), False),
    # arithmetic
    ("context_length * batch_size > 10000", dict(context_length=2000, batch_size=6), True),
    ("context_length / 2 + 1 == 51", dict(context_length=100), True),
    ("-load < -0.5", dict(load=0.6), True),
    ("2 + 3 * 4 == 14", {}, True),
    ("(2 + 3) * 4 == 20", {}, True),
    ("10 - 4 - 3 == 3", {}, True),  # left-associative
    ("context_length / batch_size > 100", dict(context_length=500, batch_size=0), True),  # x/0 = inf
    ("1.5e3 == 1500", {}, True),
    (".5 == 0.5", {}, True),
    ("true", {}, True),
    ("false or load >= 0", {}, True),
    ("(load > 0.5) == (mem_usage > 0.5)", dict(load=0.9, mem_usage=0.9), True),
    # per-method EWMA values
    ("accept_rate.eagle > 0.6", dict(accept_rate={"eagle": 0.7}), True),
    ("goodput.mtp > 1.1 * goodput.eagle", dict(goodput={"mtp": 120.0, "eagle": 100.0}), True),
    ("goodput.mtp > 1.1 * goodput.eagle", dict(goodput={"mtp": 105.0, "eagle": 100.0}), False),
    # sums of several signals (the hand-written parser's closures called themselves: RecursionError mid-step)
    ("load + mem_usage + load > 1", dict(load=0.5, mem_usage=0.1), True),
    ("load + mem_usage + load > 1", dict(load=0.4, mem_usage=0.1), False),
    ("context_length - batch_size * 2 - queue_depth / 2 == 93", dict(context_length=100, batch_size=3, queue_depth=2), True),
    # line breaks and leading spaces are white space, and leading zeros do not make a number octal
    ("\n  load > 0.5\n  and mem_usage < 0.9", dict(load=0.6, mem_usage=0.5), True),
    ("batch_size == 007", dict(batch_size=7), True),
])
def test_meaning(condition, signals, expected):
    assert holds(condition, **signals) is expected


def test_match_length_reads_as_nan_when_nothing_measured_it():
    assert holds("match_length >= 8", match_length=12) is True
    assert holds("match_length >= 8", match_length=3) is False
    assert holds("match_length >= 8 or match_length < 8") is False  # None: no model-free drafter loaded
    with pytest.raises(Exception, match="match_length"):
        StepSignals(match_length=-1)


def test_a_method_without_data_reads_as_nan_so_its_comparisons_do_not_fire():
    # Otherwise "accept_rate.eagle < 0.3 -> none" would fire before eagle ever ran, and it never would.
    for condition in ("accept_rate.eagle < 0.3", "accept_rate.eagle >= 0.3", "accept_rate.eagle == 0"):
        assert holds(condition, accept_rate={"mtp": 0.9}) is False
    assert holds("accept_rate.eagle != 0", accept_rate={}) is True
    assert holds("goodput.dflash > 0 or goodput.dflash <= 0") is False


def test_a_condition_is_a_closure_reading_signals_live():
    predicate = compile_condition("load > 0.5")
    signals = StepSignals(load=0.2)
    assert predicate(signals) is False
    signals.load = 0.8  # engines may reuse one record per step
    assert predicate(signals) is True


@pytest.mark.parametrize("condition, offset, fragment", [
    ("context_length > > 4", 17, "expected a number, a signal or '(', found '>'"),
    ("context_lenght > 4", 0, "unknown name 'context_lenght'"),
    ("load > 0.5 and", 14, "found the end of the condition"),
    ("load > 0.5 extra", 11, "unexpected 'extra' after a complete condition"),
    ("(load > 0.5", 11, "expected ')' to close the '(' at character 1"),
    ("load > 0.5)", 10, "unexpected ')'"),
    ("load", 0, "a condition must be a truth value, but this is a number"),
    ("load > 0.5 and 3", 15, "each side of 'and' must be a truth value"),
    ("not load", 4, "the operand of 'not' must be a truth value"),
    ("(load > 1) > 2", 0, "the left side of '>' must be a number"),
    ("load == (batch_size > 1)", 5, "'==' compares a number with a truth value"),
    ("load + (batch_size > 1) > 0", 7, "the right side of '+' must be a number"),
    ("load / 0 > 1", 5, "division by zero"),
    ("load > 0.5 && batch_size > 1", 11, "unexpected character '&': use 'and'"),
    ("load = 0.5", 5, "use '=='"),
    ("accept_rate['eagle'] > 0.5", 11, "write accept_rate.eagle"),
    ("accept_rate > 0.5", 0, "accept_rate is per method"),
    ("accept_rate.eagel > 0.5", 12, "unknown method 'eagel' after 'accept_rate.'"),
    ("load.real > 0", 4, "unexpected '.'"),
    ("4096k < context_length", 0, "malformed number '4096k'"),
    ("1.2.3 < load", 0, "malformed number '1.2.'"),
    ("load > 0.5 AND batch_size > 1", 11, "unexpected 'AND'"),
    ("True", 0, "did you mean 'true'?"),
    ("", 0, "the condition is empty"),
    ("   ", 0, "the condition is empty"),
    ("load > 0.5 and and", 15, "found 'and'"),
    ("load > é", 7, "unexpected character 'é'"),
    ("(" * 70 + "load > 0" + ")" * 70, 64, "nests deeper than 64 levels"),
])
def test_rejections_name_the_problem_and_its_offset(condition, offset, fragment):
    with pytest.raises(ConditionError) as info:
        compile_condition(condition)
    assert fragment in info.value.message
    assert info.value.offset == offset


@pytest.mark.parametrize("condition", [
    "__import__('os')",
    "__import__('os').system('true')",
    "().__class__.__bases__[0].__subclasses__()",
    "load.__class__ == 1",
    "eval('1') > 0",
    "exec",
    "lambda: 1",
    "[x for x in ()]",
    "'a' == 'a'",
    "load if load else 1",
])
def test_python_is_not_the_condition_language(condition):
    with pytest.raises(ConditionError):
        compile_condition(condition)


def test_the_dispatch_package_never_evaluates_code():
    # A structural guard: no eval/exec/compile/__import__ anywhere in hyspec.policy
    # (re.compile, an attribute, is fine: it compiles a regular expression, not code).
    builtins = {"eval", "exec", "compile", "__import__"}
    for path in Path(dispatch_pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Name):
                assert node.id not in builtins, f"{path.name}:{node.lineno} uses {node.id}"
            if isinstance(node, ast.Attribute):
                assert node.attr not in {"eval", "exec", "__import__"}, f"{path.name}:{node.lineno} uses {node.attr}"


def test_a_long_sum_is_evaluated_in_a_loop_not_by_recursion():
    predicate = compile_condition(" + ".join(["load"] * 500) + " > 100")  # 3,506 characters
    assert predicate(StepSignals(load=0.5)) is True


def test_overlong_conditions_are_refused():
    with pytest.raises(ConditionError, match="longer than"):
        compile_condition("load > 0 or " * 500 + "load > 0")
