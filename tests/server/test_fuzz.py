"""Schemathesis fuzzes the server's own OpenAPI schema against the real server: no input gets a 5xx, every
error has an OpenAI error body, and responses match the schema (status codes, content types, bodies).

The server runs at its model's own context length (the tiny model's 256 tokens here; the default model's
8,192 in the slow tier), not a shrunken one: what bounds each case's work is the server's own per-request
ceiling, ``--max-tokens`` (``create_app(max_tokens=...)``), as in a deployment.
"""
from __future__ import annotations

import time

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,  # noqa: E402
                                               status_code_conformance)

POSITIVE_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
NEGATIVE_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]


#: OpenAI's named error codes the server uses (core/server/auth.py, core/server/serving.py)
NAMED_CODES = {"invalid_api_key", "model_not_found"}


#: the per-request ceiling the fuzzed servers run with (hyspec serve --max-tokens)
FUZZ_MAX_TOKENS = 16


@pytest.fixture(scope="module")
def fuzz_server(make_server):
    # max_model_len None: the model's own context (256 tokens for the tiny model)
    srv = make_server(max_queue=64, max_tokens=FUZZ_MAX_TOKENS,
                      engine_overrides={"max_model_len": None, "max_num_seqs": 8})
    assert srv.app.state.async_engine.engine.max_model_len == 256
    yield srv
    srv.stop()


def fuzz(server, examples: int) -> int:
    """Run ``examples`` positive and ``examples`` negative cases per operation; returns the cases run."""
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    ran = 0
    for operation in operations:
        for mode, checks in ((GenerationMode.POSITIVE, POSITIVE_CHECKS), (GenerationMode.NEGATIVE, NEGATIVE_CHECKS)):
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case) -> None:
                nonlocal ran
                ran += 1
                response = case.call_and_validate(base_url=server.url, checks=checks, timeout=60)
                if response.status_code >= 400:
                    error = response.json()["error"]
                    assert isinstance(error["message"], str) and error["message"], error
                    # the HTTP status, or one of OpenAI's named codes for the cases that have one
                    assert error["code"] == response.status_code or error["code"] in NAMED_CODES, error

            try:
                check()
            except Unsatisfiable:
                # nothing to get wrong in a GET without parameters (/health, /metrics, /v1/models)
                assert mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET", operation.path
    assert server.app.state.async_engine.failed is None
    return ran


def test_fuzz_quick(fuzz_server):
    assert fuzz(fuzz_server, examples=8) > 40


@pytest.mark.slow
def test_fuzz_thorough(fuzz_server):
    fuzz(fuzz_server, examples=300)


@pytest.mark.slow
def test_fuzz_the_default_model_at_its_full_context():
    """SmolLM2 at its 8,192-token context, --max-tokens 32: zero 5xx; prints the case count and duration."""
    from hyspec.assets import default_model
    from hyspec.errors import CheckpointError
    from hyspec.server.app import create_app
    from hyspec.server.launcher import BackgroundServer

    try:
        model = default_model()
    except CheckpointError as exc:
        pytest.skip(str(exc))
    app = create_app({"model": str(model), "max_num_seqs": 8}, served_model_name="smollm2", max_queue=64,
                     max_tokens=32)
    server = BackgroundServer(app).start()
    try:
        assert server.app.state.async_engine.engine.max_model_len == 8192
        start = time.monotonic()
        ran = fuzz(server, examples=100)
        print(f"fuzzed the default model at 8192 tokens of context: {ran} cases in {time.monotonic() - start:.0f} s,"
              " 0 server errors")
    finally:
        server.stop()
