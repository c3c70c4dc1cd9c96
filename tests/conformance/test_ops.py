"""Every op of every available backend against the pure-torch reference, within the one tolerance table.

The CPU runs every case; the Triton interpreter runs the quick set by
default (every scenario, GQA ratio and dtype at least once, ~1 s per
interpreted attention call) and the whole sweep when slow tests run.
"""
from __future__ import annotations

import pytest

from hyspec.conformance.op_checks import check_op
from hyspec.conformance.targets import INTERPRETER
from hyspec.ops import OP_NAMES
from tests.conformance.conftest import BACKENDS, assert_passed


@pytest.mark.parametrize("op", OP_NAMES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_op_matches_reference(target, backend, op):
    result = check_op(target, op, quick=target.mode == INTERPRETER)
    assert_passed(result)
    assert result.source == target.ops.sources[op]
    assert all(c.atol is not None for c in result.cases)  # every case says which tolerance it was held to


@pytest.mark.slow
@pytest.mark.parametrize("op", ["attention", "write_kv", "compact_kv", "rms_norm", "rotary"])
@pytest.mark.parametrize("backend", ["cuda"])
def test_full_sweep_under_the_interpreter(target, backend, op):
    if target.mode != INTERPRETER:
        pytest.skip("a real GPU runs the full sweep in test_op_matches_reference")
    assert_passed(check_op(target, op, quick=False))
