"""The rule condition language: a hand-written tokenizer and recursive-descent
parser that compiles a condition straight into a tree of closures.

Nothing here calls eval, exec or compile: a condition can only read the
signals listed in ``hyspec.policy.signals`` and do arithmetic and
comparisons on them.  Grammar (lowest precedence first)::

    condition  := and_expr ("or" and_expr)*
    and_expr   := not_expr ("and" not_expr)*
    not_expr   := "not" not_expr | comparison
    comparison := sum (("<" | "<=" | ">" | ">=" | "==" | "!=") sum)*
    sum        := product (("+" | "-") product)*
    product    := unary (("*" | "/") unary)*
    unary      := "-" unary | primary
    primary    := NUMBER | "true" | "false" | SIGNAL | FAMILY "." METHOD | "(" condition ")"

SIGNAL is a name in ``SIGNAL_NAMES``, FAMILY one of ``accept_rate`` /
``goodput`` and METHOD a name in ``METHODS``.  Comparisons chain as in
Python: ``0.5 < mem_usage <= 0.9`` means ``0.5 < mem_usage and mem_usage <=
0.9``.  Two types exist, number and truth value; ordering and arithmetic
take numbers, ``and``/``or``/``not`` take truth values, ``==``/``!=`` take
two of the same type, and a whole condition must be a truth value.  ``x / 0``
gives +-inf (NaN for 0 / 0) rather than failing mid-step.  There are no
strings, calls, subscripts or ``in``.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hyspec.policy.signals import METHODS, PER_METHOD_SIGNALS, SIGNAL_NAMES
from hyspec.errors import HyspecError

Predicate = Callable[[Any], bool]  # takes a StepSignals

MAX_CONDITION_CHARS = 4096
MAX_NESTING = 64  # keeps a hostile '((((...' from exhausting the Python stack

_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_TWO_CHAR_OPS = ("<=", ">=", "==", "!=")
_ONE_CHAR_OPS = "<>()+-*/."
_KEYWORDS = ("and", "or", "not", "true", "false")
_HINTS = {
    "&": "use 'and'", "|": "use 'or'", "!": "use 'not' (or '!=')", "=": "use '==' to compare",
    "'": "strings are not part of the condition language", '"': "strings are not part of the condition language",
    "[": "write accept_rate.eagle, not accept_rate['eagle']",
}
_NAME_HINTS = {"True": "true", "False": "false", "AND": "and", "OR": "or", "NOT": "not"}


class ConditionError(HyspecError):
    """A condition does not parse or does not type-check; ``offset`` is the
    0-based index in the condition text where the problem is."""

    def __init__(self, message: str, offset: int):
        self.message = message
        self.offset = offset
        super().__init__(f"{message} (at character {offset + 1})")


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "num", "name", "op", "end"
    text: str
    offset: int


def tokenize(text: str) -> Iterator[_Token]:
    """Yield tokens lazily, so that errors are reported in reading order."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            match = _NUMBER.match(text, i)
            end = match.end()
            if end < n and (text[end].isalnum() or text[end] in "_."):
                raise ConditionError(f"malformed number {text[i:end + 1]!r}", i)
            yield _Token("num", text[i:end], i)
            i = end
        elif c.isascii() and (c.isalpha() or c == "_"):
            end = i + 1
            while end < n and text[end].isascii() and (text[end].isalnum() or text[end] == "_"):
                end += 1
            yield _Token("name", text[i:end], i)
            i = end
        elif text[i:i + 2] in _TWO_CHAR_OPS:
            yield _Token("op", text[i:i + 2], i)
            i += 2
        elif c in _ONE_CHAR_OPS:
            yield _Token("op", c, i)
            i += 1
        else:
            hint = _HINTS.get(c)
            raise ConditionError(f"unexpected character {c!r}" + (f": {hint}" if hint else ""), i)
    yield _Token("end", "", n)


@dataclass(frozen=True, slots=True)
class _Node:
    """A typed, compiled sub-expression."""

    kind: str  # "number" or "truth value"
    fn: Callable[[Any], Any]
    offset: int
    const: Any = None  # the value when the expression is constant (folded)
    is_const: bool = False


def _constant(value: Any, offset: int) -> _Node:
    kind = "truth value" if isinstance(value, bool) else "number"
    return _Node(kind, lambda s: value, offset, value, True)


# One closure shape per operator, so that evaluating `signal > 4096` costs a
# single Python call plus an attrgetter (no operator.gt indirection).
_CMP_WITH_CONST = {
    "<": lambda f, c: lambda s: f(s) < c,
    "<=": lambda f, c: lambda s: f(s) <= c,
    ">": lambda f, c: lambda s: f(s) > c,
    ">=": lambda f, c: lambda s: f(s) >= c,
    "==": lambda f, c: lambda s: f(s) == c,
    "!=": lambda f, c: lambda s: f(s) != c,
}
_CMP_PAIR = {
    "<": lambda f, g: lambda s: f(s) < g(s),
    "<=": lambda f, g: lambda s: f(s) <= g(s),
    ">": lambda f, g: lambda s: f(s) > g(s),
    ">=": lambda f, g: lambda s: f(s) >= g(s),
    "==": lambda f, g: lambda s: f(s) == g(s),
    "!=": lambda f, g: lambda s: f(s) != g(s),
}
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_CMP_FN = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
           "!=": operator.ne}


def _divide(a: float, b: float) -> float:
    if b == 0:
        return math.nan if a == 0 or a != a else math.copysign(math.inf, a)
    return a / b


_ARITH_FN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": _divide}


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self._tokens = tokenize(text)
        self.tok = next(self._tokens)
        self.depth = 0

    # -- token helpers -------------------------------------------------
    def _advance(self) -> None:
        self.tok = next(self._tokens)

    def _at(self, kind: str, *texts: str) -> bool:
        tok = self.tok
        return tok.kind == kind and (not texts or tok.text in texts)

    def _describe(self, tok: _Token) -> str:
        return "the end of the condition" if tok.kind == "end" else repr(tok.text)

    def _require(self, node: _Node, kind: str, role: str) -> _Node:
        if node.kind != kind:
            raise ConditionError(f"{role} must be a {kind}, but this is a {node.kind}", node.offset)
        return node

    # -- grammar -------------------------------------------------------
    def parse(self) -> _Node:
        if not self.text.strip():
            raise ConditionError("the condition is empty (omit \"when\" for a rule that always holds)", 0)
        node = self._or()
        if self.tok.kind != "end":
            raise ConditionError(f"unexpected {self._describe(self.tok)} after a complete condition", self.tok.offset)
        return self._require(node, "truth value", "a condition")

    def _or(self) -> _Node:
        return self._junction("or", self._and)

    def _and(self) -> _Node:
        return self._junction("and", self._not)

    def _junction(self, word: str, operand: Callable[[], _Node]) -> _Node:
        nodes = [operand()]
        while self._at("name", word):
            self._advance()
            nodes.append(operand())
        if len(nodes) == 1:
            return nodes[0]
        for node in nodes:
            self._require(node, "truth value", f"each side of '{word}'")
        return _junction_node(word, nodes)

    def _not(self) -> _Node:
        if self._at("name", "not"):
            offset = self.tok.offset
            self._advance()
            inner = self._require(self._nested(self._not, offset), "truth value", "the operand of 'not'")
            if inner.is_const:
                return _constant(not inner.const, offset)
            f = inner.fn
            return _Node("truth value", lambda s: not f(s), offset)
        return self._comparison()

    def _comparison(self) -> _Node:
        operands = [self._sum()]
        ops: list[_Token] = []
        while self._at("op", *_MIRROR):
            ops.append(self.tok)
            self._advance()
            operands.append(self._sum())
        if not ops:
            return operands[0]
        links = [self._compare(op, left, right) for op, left, right in zip(ops, operands, operands[1:])]
        return links[0] if len(links) == 1 else _junction_node("and", links)

    def _compare(self, op: _Token, left: _Node, right: _Node) -> _Node:
        if op.text in ("==", "!="):
            if left.kind != right.kind:
                raise ConditionError(f"'{op.text}' compares a {left.kind} with a {right.kind}", op.offset)
        else:
            self._require(left, "number", f"the left side of '{op.text}'")
            self._require(right, "number", f"the right side of '{op.text}'")
        if left.is_const and right.is_const:
            return _constant(_CMP_FN[op.text](left.const, right.const), left.offset)
        if right.is_const:
            fn = _CMP_WITH_CONST[op.text](left.fn, right.const)
        elif left.is_const:
            fn = _CMP_WITH_CONST[_MIRROR[op.text]](right.fn, left.const)
        else:
            fn = _CMP_PAIR[op.text](left.fn, right.fn)
        return _Node("truth value", fn, left.offset)

    def _sum(self) -> _Node:
        return self._arithmetic(("+", "-"), self._product)

    def _product(self) -> _Node:
        return self._arithmetic(("*", "/"), self._unary)

    def _arithmetic(self, symbols: tuple[str, ...], operand: Callable[[], _Node]) -> _Node:
        node = operand()
        while self._at("op", *symbols):
            op = self.tok
            self._advance()
            right = operand()
            self._require(node, "number", f"the left side of '{op.text}'")
            self._require(right, "number", f"the right side of '{op.text}'")
            if op.text == "/" and right.is_const and right.const == 0:
                raise ConditionError("division by zero", op.offset)
            fn_op = _ARITH_FN[op.text]
            if node.is_const and right.is_const:
                node = _constant(fn_op(node.const, right.const), node.offset)
            else:
                f, g = node.fn, right.fn
                node = _Node("number", lambda s: fn_op(f(s), g(s)), node.offset)
        return node

    def _unary(self) -> _Node:
        if self._at("op", "-"):
            offset = self.tok.offset
            self._advance()
            inner = self._require(self._nested(self._unary, offset), "number", "the operand of '-'")
            if inner.is_const:
                return _constant(-inner.const, offset)
            f = inner.fn
            return _Node("number", lambda s: -f(s), offset)
        return self._primary()

    def _nested(self, rule: Callable[[], _Node], opened_at: int) -> _Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise ConditionError(f"the condition nests deeper than {MAX_NESTING} levels", opened_at)
        try:
            return rule()
        finally:
            self.depth -= 1

    def _primary(self) -> _Node:
        tok = self.tok
        if tok.kind == "num":
            self._advance()
            is_int = not any(ch in tok.text for ch in ".eE")
            return _constant(int(tok.text) if is_int else float(tok.text), tok.offset)
        if self._at("op", "("):
            self._advance()
            inner = self._nested(self._or, tok.offset)
            if not self._at("op", ")"):
                raise ConditionError(
                    f"expected ')' to close the '(' at character {tok.offset + 1}, found {self._describe(self.tok)}",
                    self.tok.offset,
                )
            self._advance()
            return _Node(inner.kind, inner.fn, tok.offset, inner.const, inner.is_const)
        if tok.kind == "name":
            self._advance()
            return self._name(tok)
        raise ConditionError(f"expected a number, a signal or '(', found {self._describe(tok)}", tok.offset)

    def _name(self, tok: _Token) -> _Node:
        name = tok.text
        if name in ("true", "false"):
            return _constant(name == "true", tok.offset)
        if name in _OPTIONAL_SIGNALS:  # None (not measured) reads as NaN: every comparison but != is false
            return _Node("number", _optional_getter(name), tok.offset)
        if name in SIGNAL_NAMES:
            return _Node("number", operator.attrgetter(name), tok.offset)
        if name in PER_METHOD_SIGNALS:
            if not self._at("op", "."):
                raise ConditionError(f"{name} is per method: write {name}.<method>, e.g. {name}.eagle", tok.offset)
            self._advance()
            method_tok = self.tok
            if method_tok.kind != "name" or method_tok.text not in METHODS:
                raise ConditionError(
                    f"unknown method {self._describe(method_tok)} after '{name}.'; methods are {', '.join(METHODS)}",
                    method_tok.offset,
                )
            self._advance()
            return _Node("number", _per_method_getter(name, method_tok.text), tok.offset)
        if name in _KEYWORDS:
            raise ConditionError(f"expected a number, a signal or '(', found {name!r}", tok.offset)
        hint = _NAME_HINTS.get(name)
        known = ", ".join((*SIGNAL_NAMES, *(f"{family}.<method>" for family in PER_METHOD_SIGNALS)))
        raise ConditionError(
            f"unknown name {name!r}" + (f" (did you mean {hint!r}?)" if hint else f"; signals are {known}"),
            tok.offset,
        )


#: scalar signals that are None when nothing measured them
_OPTIONAL_SIGNALS = frozenset({"match_length"})


def _optional_getter(name: str) -> Callable[[Any], float]:
    get = operator.attrgetter(name)
    nan = math.nan

    def read(s: Any) -> float:
        value = get(s)
        return nan if value is None else value
    return read


def _per_method_getter(family: str, method: str) -> Callable[[Any], float]:
    nan = math.nan
    if family == "accept_rate":
        return lambda s: s.accept_rate.get(method, nan)
    return lambda s: s.goodput.get(method, nan)


def _junction_node(word: str, nodes: list[_Node]) -> _Node:
    offset = nodes[0].offset
    if all(node.is_const for node in nodes):
        values = [node.const for node in nodes]
        return _constant(all(values) if word == "and" else any(values), offset)
    fns = tuple(node.fn for node in nodes)
    if word == "and":
        if len(fns) == 2:
            a, b = fns
            return _Node("truth value", lambda s: a(s) and b(s), offset)

        def all_hold(s: Any) -> bool:
            for f in fns:
                if not f(s):
                    return False
            return True

        return _Node("truth value", all_hold, offset)
    if len(fns) == 2:
        a, b = fns
        return _Node("truth value", lambda s: a(s) or b(s), offset)

    def any_holds(s: Any) -> bool:
        for f in fns:
            if f(s):
                return True
        return False

    return _Node("truth value", any_holds, offset)


def compile_condition(text: str) -> Predicate:
    """Parse and type-check ``text``; return a predicate over ``StepSignals``.

    Raises ``ConditionError`` (with the 0-based offset of the problem).
    """
    if len(text) > MAX_CONDITION_CHARS:
        raise ConditionError(f"the condition is longer than {MAX_CONDITION_CHARS} characters", MAX_CONDITION_CHARS)
    node = _Parser(text).parse()
    if node.is_const:
        value = bool(node.const)
        return lambda s: value
    return node.fn
