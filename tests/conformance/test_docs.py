"""docs/conformance.md prints the tolerance table the code applies."""
from __future__ import annotations

from pathlib import Path

from hyspec.conformance.tolerances import markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


def test_the_documented_tolerance_table_is_the_one_in_code():
    assert markdown_table() in DOC.read_text(), "regenerate the table with hyspec.conformance.tolerances.markdown_table()"
