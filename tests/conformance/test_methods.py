"""Greedy identity of every drafting method in the build on every available backend; the KV pool left clean.

Methods being built elsewhere are discovered at run time and skipped with
the reason when absent.  Under the Triton interpreter only plain decoding
runs by default (the interpreter is ~1 s per attention call); slow runs add
ngram and self-drafting there.
"""
from __future__ import annotations

import pytest

from hyspec.conformance.methods import (INTERPRETER_METHODS, MethodSettings, check_method, check_plain,
                                        methods_to_check)
from hyspec.conformance.targets import INTERPRETER
from tests.conformance.conftest import BACKENDS, assert_passed


@pytest.mark.parametrize("backend", BACKENDS)
def test_plain_decoding_equals_the_reference_model(target, backend, workspace):
    result = check_plain(target, workspace, MethodSettings.for_target(target, quick=True))
    assert_passed(result)


@pytest.mark.parametrize("method", methods_to_check())
@pytest.mark.parametrize("backend", BACKENDS)
def test_method_is_greedy_identical_and_leaves_kv_clean(target, backend, method, workspace):
    settings = MethodSettings.for_target(target, quick=True)
    result = check_method(target, workspace, method, settings)
    assert_passed(result)
    assert {c.label for c in result.cases} >= {"batch size 1", "kv pool"}


@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m in INTERPRETER_METHODS if m != "plain"])
@pytest.mark.parametrize("backend", ["cuda"])
def test_methods_on_the_triton_interpreter(target, backend, method, workspace):
    if target.mode != INTERPRETER:
        pytest.skip("on a GPU every method runs in test_method_is_greedy_identical_and_leaves_kv_clean")
    assert_passed(check_method(target, workspace, method, MethodSettings.for_target(target, quick=False)))
