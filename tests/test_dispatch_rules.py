"""Rule files: reading, and errors that point at the exact line and column."""
from __future__ import annotations

import json

import pytest

from hyspec.policy.rules import RuleFileError, default_rules_path, load_rules, parse_rules
from hyspec.policy.signals import StepSignals


def error_of(text: str) -> RuleFileError:
    with pytest.raises(RuleFileError) as info:
        parse_rules(text, "rules.json")
    return info.value


def test_the_default_rules_are_exactly_the_field_rules():
    rules = load_rules(default_rules_path())
    assert [(r.method, r.when) for r in rules] == [
        ("dflash", "context_length > 4096 and mem_usage < 0.70"),
        ("mtp", "context_length <= 1024 and batch_size <= 8"),
        ("eagle", "remote_health < 0.9"),
        ("eagle", None),
    ]
    assert rules[-1].predicate is None


def test_rules_keep_their_position_and_compile():
    text = '[\n  {"when": "load > 0.5", "method": "none", "comment": "busy"},\n    {"method": "mtp"}\n]'
    first, second = parse_rules(text)
    assert (first.line, first.column, second.line, second.column) == (2, 3, 3, 5)
    assert first.predicate(StepSignals(load=0.6)) and not first.predicate(StepSignals(load=0.4))
    assert second.predicate is None


def test_condition_errors_point_into_the_file():
    text = (
        "[\n"
        '  {"when": "context_length > 4096", "method": "dflash"},\n'
        '  {"when": "batch_size <= 8 and bogus > 1", "method": "mtp"}\n'
        "]\n"
    )
    err = error_of(text)
    col = text.splitlines()[2].index("bogus") + 1
    assert (err.line, err.column) == (3, col)
    assert str(err).startswith(f"rules.json:3:{col}: rule 2 \"when\": unknown name 'bogus'")


def test_escapes_inside_the_condition_string_are_counted_in_the_column():
    # \u0020 is one character of the condition but six in the file; \" is one but two.
    text = '[{"when": "load\\u0020> \\"x", "method": "eagle"}]'
    err = error_of(text)
    assert text[err.column - 1] == '\\' and text[err.column] == '"'  # the column lands on the escaped quote
    assert err.line == 1 and "strings are not part" in err.message


def test_surrogate_pairs_count_as_one_condition_character():
    text = '[{"when": "\\ud83d\\ude00 > 1", "method": "eagle"}]'
    err = error_of(text)
    assert err.column == text.index("\\ud83d") + 1  # the emoji itself is the bad character
    text = '[{"when": "load > 1 \\ud83d\\ude00", "method": "eagle"}]'
    assert error_of(text).column == text.index("\\ud83d") + 1


def test_an_error_at_the_end_of_a_condition_points_at_the_closing_quote():
    text = '[\n {"when": "load > 0.5 and", "method": "eagle"}]'
    err = error_of(text)
    assert (err.line, err.column) == (2, text.splitlines()[1].index('and"') + 4)


@pytest.mark.parametrize("text, line, column, fragment", [
    ('[\n  {"when": "load > 1", "method": "eagle",}\n]', 2, 42, "invalid JSON: Expecting property name"),
    ('[\n  {"when": "load > 1" "method": "eagle"}\n]', 2, 23, "invalid JSON: Expecting ',' delimiter"),
    ("", 1, 1, "invalid JSON: Expecting value"),
    ('{"rules": []}', 1, 1, "a JSON list of rules, not an object"),
    ('\n\n  "eagle"', 3, 3, "a JSON list of rules, not a string"),
    ("[]", 1, 1, "the rule list is empty"),
    ('[\n  {"method": "eagle"},\n  "mtp"\n]', 3, 3, "rule 2 must be an object"),
    ('[{"when": "load > 1"}]', 1, 2, 'rule 1 has no "method"'),
    ('[{"method": 3}]', 1, 13, '"method" must be a string, not a number'),
    ('[\n {"method": "eagel"}]', 2, 14, "unknown method 'eagel'"),
    ('[{"method": "hybrid"}]', 1, 14, "unknown method 'hybrid'"),
    ('[{"wen": "load > 1", "method": "eagle"}]', 1, 3, "unknown key 'wen'"),
    ('[{"when": "load > 1", "method": "eagle", "when": "load > 2"}]', 1, 50, "has the key 'when' twice"),
    ('[{"when": true, "method": "eagle"}]', 1, 11, '"when" must be a condition string, not a boolean'),
    ('[{"when": "", "method": "eagle"}]', 1, 12, "the condition is empty"),
    ('[{"method": "eagle", "comment": 1}]', 1, 33, '"comment" must be a string'),
])
def test_file_errors_have_line_and_column(text, line, column, fragment):
    err = error_of(text)
    assert (err.line, err.column) == (line, column), str(err)
    assert fragment in err.message
    assert str(err).startswith(f"rules.json:{line}:{column}: ")


def test_load_rules_reports_missing_and_undecodable_files(tmp_path):
    with pytest.raises(RuleFileError, match="does not exist") as info:
        load_rules(tmp_path / "absent.json")
    assert info.value.line is None
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'[{"method": "eagle", "comment": "caf\xe9"}]')
    with pytest.raises(RuleFileError, match="cannot read"):
        load_rules(bad)


def test_a_utf8_bom_is_accepted_and_columns_ignore_it(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"when": "load >", "method": "eagle"}]).encode())
    with pytest.raises(RuleFileError) as info:
        load_rules(path)
    assert (info.value.line, info.value.column) == (1, len('[{"when": "load >') + 1)
    assert str(info.value).startswith(f"{path}:1:")
