"""Rule files: a JSON list of ``{"when": "<condition>", "method": "<name>"}`` or ``{"when": ..., "policy": "bandit"}``.

The dispatcher walks the rules in order and takes the first one whose
condition holds and whose method is loaded.  A rule without ``"when"``
always holds; since rules for methods that are not loaded are skipped,
several ``"when"``-less rules at the end form a preference list
(``dflash`` if loaded, else ``eagle``, ...).  ``"method": "none"`` asks for
plain decoding.  ``"policy": "bandit"`` instead of a method hands the steps the
rule matches to the learned policy (``hybrid.policy: "bandit"``, which must be
configured; ``hyspec.policy.bandit``), and a rule naming a method pins it.  An
optional ``"comment"`` string is kept for people and ignored by the dispatcher.

Every error names the file, line and column (1-based, in characters, as
editors count): JSON syntax errors where the JSON parser stopped, condition
errors at the offending character inside the ``"when"`` string (escapes such
as ``\\u0041`` are accounted for), other errors at the offending value.  The
standard decoder reads the file; where each rule, key and value starts is found
afterwards by stepping over the (by then valid) JSON with its ``raw_decode``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from hyspec.errors import HyspecError
from hyspec.policy.conditions import ConditionError, Predicate, compile_condition
from hyspec.policy.signals import METHODS, NONE

RULE_KEYS = ("when", "method", "policy", "comment")
#: the target of a rule that hands its steps to the bandit policy (never a method name: see signals.METHODS)
BANDIT = "policy:bandit"
POLICIES = {"bandit": BANDIT}
DEFAULT_RULES_FILE = "default_rules.json"


def default_rules_path() -> Path:
    """The packaged default rules (field experience, see the issue tracker)."""
    return Path(__file__).with_name(DEFAULT_RULES_FILE)


class RuleFileError(HyspecError):
    """A rule file cannot be read, is not valid JSON, or holds an invalid rule."""

    def __init__(self, source: str, message: str, line: int | None = None, column: int | None = None):
        self.source = source
        self.message = message
        self.line = line
        self.column = column
        where = f"{source}:{line}:{column}" if line is not None else source
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class Rule:
    method: str  # a name in METHODS, "none", or BANDIT (the bandit policy decides)
    when: str | None  # the condition text; None: always holds
    predicate: Predicate | None  # compiled ``when``; None: always holds
    line: int  # where the rule's '{' is in its file
    column: int


def load_rules(path: str | os.PathLike[str]) -> tuple[Rule, ...]:
    """Read and compile a rule file; raise ``RuleFileError`` naming the problem."""
    source = os.fspath(path)
    try:
        # utf-8-sig: a BOM some editors write is not the user's error.
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise RuleFileError(source, "the rule file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleFileError(source, f"cannot read the rule file: {exc}") from None
    return parse_rules(text, source)


def parse_rules(text: str, source: str = "<rules>") -> tuple[Rule, ...]:
    """Compile the rules in ``text`` (a rule file's contents)."""
    try:
        document = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise RuleFileError(source, f"invalid JSON: {exc.msg}", exc.lineno, exc.colno) from None
    return _RuleReader(text, source).read(document)


class _RuleReader:
    def __init__(self, text: str, source: str):
        self.text = text
        self.source = source

    def error(self, offset: int, message: str) -> RuleFileError:
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return RuleFileError(self.source, message, line, column)

    def read(self, document: Any) -> tuple[Rule, ...]:
        start = _skip_space(self.text, 0)
        if not isinstance(document, list):
            raise self.error(start, f"a rule file is a JSON list of rules, not {_json_type(document)}")
        if not document:
            raise self.error(start, "the rule list is empty; end it with a rule such as {\"method\": \"none\"}")
        return tuple(self.rule(number, item, item_start)
                     for number, (item, item_start) in enumerate(zip(document, _item_starts(self.text, start)), 1))

    def rule(self, number: int, item: Any, start: int) -> Rule:
        where = f"rule {number}"
        if not isinstance(item, dict):
            raise self.error(start, f"{where} must be an object like {{\"when\": ..., \"method\": ...}}, "
                                    f"not {_json_type(item)}")
        key_starts: dict[str, int] = {}
        value_starts: dict[str, int] = {}  # a key given twice: where its last value starts (json keeps that one)
        for key, key_start, value_start in _members(self.text, start):
            if key in value_starts:
                raise self.error(value_start, f"{where} has the key {key!r} twice")
            key_starts[key], value_starts[key] = key_start, value_start
        for key in item:
            if key not in RULE_KEYS:
                raise self.error(key_starts[key], f"{where} has an unknown key {key!r}; "
                                                  f"keys are {', '.join(RULE_KEYS)}")
        if "method" in item and "policy" in item:
            raise self.error(value_starts["policy"], f"{where} has both \"method\" and \"policy\": a rule "
                                                     "pins a method or hands its steps to a policy, not both")
        if "policy" in item:
            policy = item["policy"]
            if not isinstance(policy, str) or policy not in POLICIES:
                raise self.error(value_starts["policy"], f"{where}: unknown policy {policy!r}; policies are "
                                                          f"{', '.join(POLICIES)}")
            method = POLICIES[policy]
        else:
            if "method" not in item:
                raise self.error(start, f"{where} has no \"method\" (nor \"policy\")")
            method = item["method"]
            method_start = value_starts["method"]
            if not isinstance(method, str):
                raise self.error(method_start, f"{where}: \"method\" must be a string, not {_json_type(method)}")
            if method not in METHODS and method != NONE:
                raise self.error(method_start + 1, f"{where}: unknown method {method!r}; "
                                                   f"methods are {', '.join((*METHODS, NONE))}")
        if "comment" in item and not isinstance(item["comment"], str):
            raise self.error(value_starts["comment"], f"{where}: \"comment\" must be a string")
        when = item.get("when")
        predicate = None
        if "when" in item:
            when_start = value_starts["when"]
            if not isinstance(when, str):
                raise self.error(when_start, f"{where}: \"when\" must be a condition string, not {_json_type(when)}")
            try:
                predicate = compile_condition(when)
            except ConditionError as exc:
                offset = _raw_offset(self.text, when_start, exc.offset)
                raise self.error(offset, f"{where} \"when\": {exc.message}") from None
        line = self.text.count("\n", 0, start) + 1
        column = start - (self.text.rfind("\n", 0, start) + 1) + 1
        return Rule(method, when, predicate, line, column)


def _raw_offset(text: str, literal_start: int, index: int) -> int:
    """Offset in ``text`` of character ``index`` of the JSON string literal whose
    opening quote is at ``literal_start`` (``index`` may be its length: the closing quote)."""
    pos = literal_start + 1
    for _ in range(index):
        if text[pos] != "\\":
            pos += 1
        elif text[pos + 1] != "u":
            pos += 2
        else:
            code = int(text[pos + 2:pos + 6], 16)
            pos += 6
            # json decodes a \\uD8xx\\uDCxx surrogate pair into one character
            if 0xD800 <= code <= 0xDBFF and text[pos:pos + 2] == "\\u":
                if 0xDC00 <= int(text[pos + 2:pos + 6], 16) <= 0xDFFF:
                    pos += 6
    return pos


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


# -- where things are in a valid JSON text --------------------------------------------------------
# Called only on text the decoder accepted, so between two values there is nothing but white space
# and one ',' or ':'; raw_decode steps over each value.

_DECODER = json.JSONDecoder()
_JSON_SPACE = " \t\n\r"


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _JSON_SPACE:
        i += 1
    return i


def _item_starts(text: str, start: int) -> Iterator[int]:
    """Where each item of the list whose '[' is at ``start`` begins."""
    i = _skip_space(text, start + 1)
    while text[i] != "]":
        yield i
        i = _skip_space(text, _DECODER.raw_decode(text, i)[1])
        if text[i] == ",":
            i = _skip_space(text, i + 1)


def _members(text: str, start: int) -> Iterator[tuple[str, int, int]]:
    """(key, where the key starts, where its value starts) for each member of the object whose '{' is
    at ``start``, repeated keys included, in file order."""
    i = _skip_space(text, start + 1)
    while text[i] != "}":
        key, end = _DECODER.raw_decode(text, i)
        value_start = _skip_space(text, _skip_space(text, end) + 1)  # past the ':'
        yield key, i, value_start
        i = _skip_space(text, _DECODER.raw_decode(text, value_start)[1])
        if text[i] == ",":
            i = _skip_space(text, i + 1)
