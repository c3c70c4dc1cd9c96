"""The rule condition language: a whitelisted subset of Python expressions, parsed by :mod:`ast` and
compiled straight into a tree of closures.

Nothing here calls eval, exec or compile: a condition can only read the
signals listed in ``hyspec.policy.signals`` and do arithmetic and
comparisons on them.  The language, lowest precedence first (Python's own
precedence, which is why Python's parser can read it)::

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

Three passes, each reporting the 0-based offset of what it refuses: a scan of
the characters (what Python would accept but the language does not: ``&``,
quotes, ``[``, non-ASCII names, ``4096k``); a check of the token order
(operand, operator, operand ..., parentheses closed, nesting bounded), which
says what was expected where -- Python's own syntax errors do not, and their
positions change between Python versions; then :func:`ast.parse`, whose tree
may hold only the node types :class:`_Compiler` handles.
"""
from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hyspec.errors import HyspecError
from hyspec.policy.signals import METHODS, PER_METHOD_SIGNALS, SIGNAL_NAMES

Predicate = Callable[[Any], bool]  # takes a StepSignals

MAX_CONDITION_CHARS = 4096
MAX_NESTING = 64  # parentheses, 'not' and '-' inside one another: keeps a hostile '((((...' cheap

_TOKEN = re.compile(r"(?P<space>[ \t\r\n]+)|(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op><=|>=|==|!=|[<>()+\-*/.])")
_BINARY_OPS = frozenset({"<", "<=", ">", ">=", "==", "!=", "+", "-", "*", "/"})
_WORDS = ("and", "or", "not")  # the language's keywords besides true and false
_UNREAD = "unread"  # _check_order: the next token is not read yet
_HINTS = {
    "&": "use 'and'", "|": "use 'or'", "!": "use 'not' (or '!=')", "=": "use '==' to compare",
    "'": "strings are not part of the condition language", '"': "strings are not part of the condition language",
    "[": "write accept_rate.eagle, not accept_rate['eagle']",
}
_NAME_HINTS = {"True": "true", "False": "false", "AND": "and", "OR": "or", "NOT": "not"}
_COMPARE_OPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_ARITH_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class ConditionError(HyspecError):
    """A condition does not parse or does not type-check; ``offset`` is the
    0-based index in the condition text where the problem is."""

    def __init__(self, message: str, offset: int):
        self.message = message
        self.offset = offset
        super().__init__(f"{message} (at character {offset + 1})")


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "num", "name", "op"
    text: str
    offset: int


def _scan(text: str) -> Iterator[_Token]:
    """The condition's tokens, lazily (so that problems are reported in reading order); refuses
    characters and numbers the language does not have."""
    i, n = 0, len(text)
    while i < n:
        match = _TOKEN.match(text, i)
        if match is None:
            c = text[i]
            hint = _HINTS.get(c)
            raise ConditionError(f"unexpected character {c!r}" + (f": {hint}" if hint else ""), i)
        end = match.end()
        if match.lastgroup == "num" and end < n and (text[end].isalnum() or text[end] in "_."):
            raise ConditionError(f"malformed number {text[i:end + 1]!r}", i)
        if match.lastgroup != "space":
            yield _Token(match.lastgroup, match.group(), i)
        i = end


def _describe(token: _Token | None) -> str:
    return "the end of the condition" if token is None else repr(token.text)


def _check_order(tokens: Iterator[_Token], end: int) -> None:
    """Operands and operators alternate, parentheses pair up, names are signals, nesting stays under
    MAX_NESTING.  What is refused is named with what was expected there."""
    expect_operand = True
    opened: list[tuple[int, int]] = []  # per open '(': its offset, and the depth its ')' returns to
    depth = 0  # enclosing '(', 'not' and '-' (a 'not' lasts to the next and/or, a '-' to its operand)
    nots = [0]  # per parenthesis level: the 'not's still open
    minus = 0  # '-' prefixes waiting for their operand
    previous: str | None = None
    tok = next(tokens, None)
    while tok is not None:
        word = tok.text
        ahead: _Token | None | str = _UNREAD
        if expect_operand:
            prefix_not = word == "not" and previous in (None, "(", "and", "or", "not")
            if prefix_not or (tok.kind == "op" and word in ("-", "(")):
                depth += 1
                if depth > MAX_NESTING:
                    raise ConditionError(f"the condition nests deeper than {MAX_NESTING} levels", tok.offset)
                if prefix_not:
                    nots[-1] += 1
                elif word == "-":
                    minus += 1
                else:  # the '-'s before a '(' close with it
                    opened.append((tok.offset, depth - 1 - minus))
                    nots.append(0)
                    minus = 0
            elif tok.kind == "num" or tok.kind == "name":
                if tok.kind == "name":  # a name is judged with the token after it read (reading order)
                    ahead = _check_name(tok, next(tokens, None), tokens, end)
                depth -= minus
                minus = 0
                expect_operand = False
            else:
                raise ConditionError(f"expected a number, a signal or '(', found {_describe(tok)}", tok.offset)
        elif (tok.kind == "op" and word in _BINARY_OPS) or word in ("and", "or"):
            if word in ("and", "or"):
                depth -= nots[-1]
                nots[-1] = 0
            expect_operand = True
        elif word == ")" and opened:
            nots.pop()
            depth = opened.pop()[1]
        elif opened:
            raise ConditionError(f"expected ')' to close the '(' at character {opened[-1][0] + 1}, "
                                 f"found {_describe(tok)}", tok.offset)
        else:
            raise ConditionError(f"unexpected {_describe(tok)} after a complete condition", tok.offset)
        # the next token is read only now, so that problems are reported in reading order
        previous, tok = word, next(tokens, None) if ahead is _UNREAD else ahead
    if expect_operand:
        raise ConditionError("expected a number, a signal or '(', found the end of the condition", end)
    if opened:
        raise ConditionError(f"expected ')' to close the '(' at character {opened[-1][0] + 1}, "
                             "found the end of the condition", end)


def _check_name(tok: _Token, following: _Token | None, tokens: Iterator[_Token], end: int) -> _Token | None:
    """A name in an operand's place must be a signal, true/false, or FAMILY.METHOD (``following``
    the '.'; the method's name is read here); returns the token after the operand."""
    name = tok.text
    if name in _WORDS:  # 'not' too here: a prefix 'not' never gets here, one after an operator does
        raise ConditionError(f"expected a number, a signal or '(', found {name!r}", tok.offset)
    if name in PER_METHOD_SIGNALS:
        if following is None or following.text != ".":
            raise ConditionError(f"{name} is per method: write {name}.<method>, e.g. {name}.eagle", tok.offset)
        method = next(tokens, None)
        if method is None or method.kind != "name" or method.text not in METHODS:
            raise ConditionError(f"unknown method {_describe(method)} after '{name}.'; "
                                 f"methods are {', '.join(METHODS)}", end if method is None else method.offset)
        return next(tokens, None)
    if name not in SIGNAL_NAMES and name not in ("true", "false"):
        raise ConditionError(_unknown_name(name), tok.offset)
    return following


def _unknown_name(name: str) -> str:
    hint = _NAME_HINTS.get(name)
    known = ", ".join((*SIGNAL_NAMES, *(f"{family}.<method>" for family in PER_METHOD_SIGNALS)))
    return f"unknown name {name!r}" + (f" (did you mean {hint!r}?)" if hint else f"; signals are {known}")


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


def _evaluate_terms(first: Callable[[Any], Any],
                    steps: list[tuple[Callable[[Any, Any], Any], Callable[[Any], Any]]]) -> Callable[[Any], Any]:
    """``first`` combined with each term in turn, left to right, in one loop (a closure per term would
    nest as deep as the sum is long)."""
    if len(steps) == 1:
        (fn_op, g), = steps
        return lambda s: fn_op(first(s), g(s))
    terms = tuple(steps)

    def evaluate(s: Any) -> Any:
        value = first(s)
        for fn_op, g in terms:
            value = fn_op(value, g(s))
        return value

    return evaluate


def _divide(a: float, b: float) -> float:
    if b == 0:
        return math.nan if a == 0 or a != a else math.copysign(math.inf, a)
    return a / b


_ARITH_FN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": _divide}


class _Compiler:
    """Type-checks and compiles the tree :func:`ast.parse` made of a condition that passed
    :func:`_check_order`; any node type not handled here is refused."""

    def __init__(self, source: str, number_starts: dict[int, int]):
        self.text = source  # the condition inside parentheses: positions here are one past the condition's
        self.number_starts = number_starts

    @staticmethod
    def at(position: int) -> int:
        """The condition's offset of ``position`` in the parenthesised source."""
        return position - 1

    # -- where things are: ast positions leave out parentheses, and operators have none ------------------
    def _skip_space(self, i: int, step: int) -> int:
        while 0 <= i < len(self.text) and self.text[i] in " \t\r\n":
            i += step
        return i

    def paren_start(self, node: ast.expr) -> int | None:
        """The offset of the outermost parenthesis around ``node`` (the added ones aside); None: none."""
        start, end, outer = node.col_offset, node.end_col_offset, None
        while True:
            before, after = self._skip_space(start - 1, -1), self._skip_space(end, 1)
            if before < 1 or after >= len(self.text) - 1 or self.text[before] != "(" or self.text[after] != ")":
                return outer
            if not self._balanced(before + 1, after):
                return outer
            start, end, outer = before, after + 1, self.at(before)

    def _balanced(self, start: int, end: int) -> bool:
        """The parentheses in text[start:end] pair up (so '(' before and ')' after enclose it)."""
        level = 0
        for c in self.text[start:end]:
            level += c == "("
            level -= c == ")"
            if level < 0:
                return False
        return level == 0

    def operator_offset(self, left: ast.expr) -> int:
        """The operator written after ``left`` (and its closing parentheses)."""
        i = left.end_col_offset
        while True:
            i = self._skip_space(i, 1)
            if self.text[i] != ")":
                return self.at(i)
            i += 1

    def require(self, node: _Node, kind: str, role: str) -> _Node:
        if node.kind != kind:
            raise ConditionError(f"{role} must be a {kind}, but this is a {node.kind}", node.offset)
        return node

    # -- the node types of the language -----------------------------------------------------------------
    def compile(self, node: ast.expr) -> _Node:
        """``node`` compiled; its offset is that of its first token, a parenthesis included (as
        the error messages count)."""
        compiled = self._compile(node)
        start = self.paren_start(node)
        if start is None or start == compiled.offset:
            return compiled
        return _Node(compiled.kind, compiled.fn, start, compiled.const, compiled.is_const)

    def _compile(self, node: ast.expr) -> _Node:
        if isinstance(node, ast.BoolOp):
            word = "and" if isinstance(node.op, ast.And) else "or"
            nodes = [self.compile(value) for value in node.values]
            for n in nodes:
                self.require(n, "truth value", f"each side of '{word}'")
            return _junction_node(word, nodes, nodes[0].offset)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            return self.unary(node)
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE_OPS for op in node.ops):
            return self.compare(node)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            return self.arithmetic(node)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return _constant(node.value, self.number_starts.get(node.col_offset, self.at(node.col_offset)))
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            family, method = node.value.id, node.attr  # _check_order let only FAMILY.METHOD through
            return _Node("number", _per_method_getter(family, method), self.at(node.col_offset))
        raise ConditionError(f"expected a number, a signal or '(', found "
                             f"{self.text[node.col_offset:node.end_col_offset]!r}", self.at(node.col_offset))

    def unary(self, node: ast.UnaryOp) -> _Node:
        offset = self.at(node.col_offset)  # the operator's
        if isinstance(node.op, ast.Not):
            inner = self.require(self.compile(node.operand), "truth value", "the operand of 'not'")
            if inner.is_const:
                return _constant(not inner.const, offset)
            f = inner.fn
            return _Node("truth value", lambda s: not f(s), offset)
        inner = self.require(self.compile(node.operand), "number", "the operand of '-'")
        if inner.is_const:
            return _constant(-inner.const, offset)
        f = inner.fn
        return _Node("number", lambda s: -f(s), offset)

    def compare(self, node: ast.Compare) -> _Node:
        operands = [node.left, *node.comparators]
        compiled = [self.compile(operand) for operand in operands]
        links = []
        for i, op in enumerate(node.ops):
            symbol = _COMPARE_OPS[type(op)]
            links.append(self.link(symbol, self.operator_offset(operands[i]), compiled[i], compiled[i + 1]))
        return links[0] if len(links) == 1 else _junction_node("and", links, links[0].offset)

    def link(self, op: str, op_offset: int, left: _Node, right: _Node) -> _Node:
        if op in ("==", "!="):
            if left.kind != right.kind:
                raise ConditionError(f"'{op}' compares a {left.kind} with a {right.kind}", op_offset)
        else:
            self.require(left, "number", f"the left side of '{op}'")
            self.require(right, "number", f"the right side of '{op}'")
        if left.is_const and right.is_const:
            return _constant(_CMP_FN[op](left.const, right.const), left.offset)
        if right.is_const:
            fn = _CMP_WITH_CONST[op](left.fn, right.const)
        elif left.is_const:
            fn = _CMP_WITH_CONST[_MIRROR[op]](right.fn, left.const)
        else:
            fn = _CMP_PAIR[op](left.fn, right.fn)
        return _Node("truth value", fn, left.offset)

    def arithmetic(self, node: ast.BinOp) -> _Node:
        chain = [node]  # a long left-associative sum is a deep tree: walk it in a loop, not by recursion
        while isinstance(chain[-1].left, ast.BinOp) and type(chain[-1].left.op) in _ARITH_OPS:
            chain.append(chain[-1].left)
        result = self.compile(chain[-1].left)
        first: Callable[[Any], Any] | None = None  # once the value is not constant: its first term,
        steps: list[tuple[Callable[[Any, Any], Any], Callable[[Any], Any]]] = []  # then (operator, term)s
        for step in reversed(chain):
            op = _ARITH_OPS[type(step.op)]
            right = self.compile(step.right)
            self.require(result, "number", f"the left side of '{op}'")
            self.require(right, "number", f"the right side of '{op}'")
            if op == "/" and right.is_const and right.const == 0:
                raise ConditionError("division by zero", self.operator_offset(step.left))
            if result.is_const and right.is_const:
                result = _constant(_ARITH_FN[op](result.const, right.const), result.offset)
                continue
            if first is None:
                first = result.fn
            steps.append((_ARITH_FN[op], right.fn))
            result = _Node("number", _evaluate_terms(first, steps), result.offset)
        return result

    def name(self, node: ast.Name) -> _Node:
        name, offset = node.id, self.at(node.col_offset)  # _check_order let signals and true/false through
        if name in ("true", "false"):
            return _constant(name == "true", offset)
        if name in _OPTIONAL_SIGNALS:  # None (not measured) reads as NaN: every comparison but != is false
            return _Node("number", _optional_getter(name), offset)
        return _Node("number", operator.attrgetter(name), offset)


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


def _junction_node(word: str, nodes: list[_Node], offset: int) -> _Node:
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
    if not text.strip():
        raise ConditionError("the condition is empty (omit \"when\" for a rule that always holds)", 0)
    tokens: list[_Token] = []
    _check_order((tokens.append(tok) or tok for tok in _scan(text)), len(text))
    # Parsed inside parentheses, on one line: to the language, leading spaces are no indentation and a
    # line break is a space.  ast's offsets are then one more than the condition's (_Compiler.at).
    source = list(text.translate(_LINE_BREAKS_AS_SPACES))
    for tok in tokens:  # '007' is 7 to the language; Python refuses it (octal ambiguity): blank the zeros
        if tok.kind == "num" and tok.text.isdigit() and tok.text[0] == "0" and tok.text.strip("0"):
            zeros = len(tok.text) - len(tok.text.lstrip("0"))
            source[tok.offset:tok.offset + zeros] = " " * zeros
    source = "(" + "".join(source) + ")"
    number_starts = {tok.offset + 1 + len(tok.text) - len(tok.text.lstrip("0")): tok.offset for tok in tokens
                     if tok.kind == "num"}  # ast's offset of a number (past blanked zeros) -> where it is written
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:  # what _check_order lets through and Python still refuses, e.g. '01'
        raise ConditionError(f"not a condition: {exc.msg}", max(0, (exc.offset or 2) - 2)) from None
    compiler = _Compiler(source, number_starts)
    node = compiler.require(compiler.compile(tree.body), "truth value", "a condition")
    if node.is_const:
        value = bool(node.const)
        return lambda s: value
    return node.fn


_LINE_BREAKS_AS_SPACES = str.maketrans("\t\r\n", "   ")
