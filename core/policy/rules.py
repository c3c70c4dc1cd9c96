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
as ``\\u0041`` are accounted for), other errors at the offending value.
"""
from __future__ import annotations

import json
import json.decoder
import json.scanner
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyspec.policy.conditions import ConditionError, Predicate, compile_condition
from hyspec.policy.signals import METHODS, NONE
from hyspec.errors import HyspecError

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
        document = _LocatingDecoder().decode(text)
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
        if not isinstance(document, _LocatedList):
            first = len(self.text) - len(self.text.lstrip(" \t\r\n"))
            raise self.error(first, f"a rule file is a JSON list of rules, not {_json_type(document)}")
        if not document:
            raise self.error(document.start, "the rule list is empty; end it with a rule such as {\"method\": \"none\"}")
        return tuple(self.rule(number, item, start)
                     for number, (item, start) in enumerate(zip(document, document.item_starts), 1))

    def rule(self, number: int, item: Any, start: int) -> Rule:
        where = f"rule {number}"
        if not isinstance(item, _LocatedDict):
            raise self.error(start, f"{where} must be an object like {{\"when\": ..., \"method\": ...}}, "
                                    f"not {_json_type(item)}")
        if item.duplicates:
            key, value_start = item.duplicates[0]
            raise self.error(value_start, f"{where} has the key {key!r} twice")
        for key in item:
            if key not in RULE_KEYS:
                raise self.error(self.key_offset(item, key), f"{where} has an unknown key {key!r}; "
                                                             f"keys are {', '.join(RULE_KEYS)}")
        if "method" in item and "policy" in item:
            raise self.error(item.value_starts["policy"], f"{where} has both \"method\" and \"policy\": a rule "
                                                          "pins a method or hands its steps to a policy, not both")
        if "policy" in item:
            policy = item["policy"]
            policy_start = item.value_starts["policy"]
            if not isinstance(policy, str) or policy not in POLICIES:
                raise self.error(policy_start, f"{where}: unknown policy {policy!r}; policies are "
                                               f"{', '.join(POLICIES)}")
            method = POLICIES[policy]
        else:
            if "method" not in item:
                raise self.error(item.start, f"{where} has no \"method\" (nor \"policy\")")
            method = item["method"]
            method_start = item.value_starts["method"]
            if not isinstance(method, str):
                raise self.error(method_start, f"{where}: \"method\" must be a string, not {_json_type(method)}")
            if method not in METHODS and method != NONE:
                raise self.error(method_start + 1, f"{where}: unknown method {method!r}; "
                                                   f"methods are {', '.join((*METHODS, NONE))}")
        if "comment" in item and not isinstance(item["comment"], str):
            raise self.error(item.value_starts["comment"], f"{where}: \"comment\" must be a string")
        when = item.get("when")
        predicate = None
        if "when" in item:
            when_start = item.value_starts["when"]
            if not isinstance(when, str):
                raise self.error(when_start, f"{where}: \"when\" must be a condition string, not {_json_type(when)}")
            try:
                predicate = compile_condition(when)
            except ConditionError as exc:
                offset = _raw_offset(self.text, when_start, exc.offset)
                raise self.error(offset, f"{where} \"when\": {exc.message}") from None
        line = self.text.count("\n", 0, item.start) + 1
        column = item.start - (self.text.rfind("\n", 0, item.start) + 1) + 1
        return Rule(method, when, predicate, line, column)

    def key_offset(self, item: _LocatedDict, key: str) -> int:
        """Where ``key`` is written (found by its plain spelling), else where its value starts."""
        value_start = item.value_starts[key]
        found = self.text.rfind(json.dumps(key, ensure_ascii=False), item.start, value_start)
        return found if found >= 0 else value_start


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


# -- JSON with positions ----------------------------------------------------
# The stdlib decoder keeps JSON's semantics and error messages; these hooks
# into its pure-Python scanner only record where each object, list and value
# starts, which the rule errors need.


class _LocatedDict(dict):
    start: int  # offset of '{'
    value_starts: dict[str, int]
    duplicates: list[tuple[str, int]]


class _LocatedList(list):
    start: int  # offset of '['
    item_starts: list[int]


def _located_object(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
    value_starts: list[int] = []

    def scan_value(string: str, idx: int):
        value_starts.append(idx)
        return scan_once(string, idx)

    pairs, end = json.decoder.JSONObject(s_and_end, strict, scan_value, None, list, memo)
    obj = _LocatedDict()
    obj.start = s_and_end[1] - 1
    obj.value_starts = {}
    obj.duplicates = []
    for (key, value), value_start in zip(pairs, value_starts):
        if key in obj:
            obj.duplicates.append((key, value_start))
        obj[key] = value
        obj.value_starts[key] = value_start
    return obj, end


def _located_array(s_and_end, scan_once):
    item_starts: list[int] = []

    def scan_item(string: str, idx: int):
        item_starts.append(idx)
        return scan_once(string, idx)

    items, end = json.decoder.JSONArray(s_and_end, scan_item)
    located = _LocatedList(items)
    located.start = s_and_end[1] - 1
    located.item_starts = item_starts[:len(items)]
    return located, end


class _LocatingDecoder(json.JSONDecoder):
    def __init__(self) -> None:
        super().__init__()
        self.parse_object = _located_object
        self.parse_array = _located_array
        self.scan_once = json.scanner.py_make_scanner(self)
