"""Temperature 0 under a JSON schema: every speculative method returns plain constrained decoding's tokens.

The tiny target of the conformance suite (random weights, byte-level BPE) and its random drafters, built
through each method's training recipe.  The prompts hold JSON the schema accepts, so prompt lookup and the
suffix cache draft tokens the grammar allows (and the self-drafting run drafts unconstrained argmaxes the
grammar often forbids: those are cut before verification).  The default tier runs the weightless methods
and the self-drafting one; the slow tier runs every method ``hyspec conformance`` knows.
"""
from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("llguidance")

from hyspec import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402
from hyspec.conformance.methods import CONTROLLER_OFF, SELF_DRAFT, Workspace, method_config, methods_to_check  # noqa: E402

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "kind": {"enum": ["cat", "dog", "fish"]},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "kind", "age"], "additionalProperties": False}
PROMPTS = ['{"name":"rex","kind":"dog","age":3}\n{"name":"tom","kind":"cat","age":7}\n{"name":"',
           'def pet():\n    return {"name":"bo","kind":"fish","age":1}\n# as JSON:\n']
MAX_TOKENS = 28
DEFAULT_METHODS = ("ngram", "suffix", SELF_DRAFT)


@pytest.fixture(scope="module")
def ws():
    workspace = Workspace.create()
    yield workspace
    workspace.close()


def _llm(ws, spec=None) -> LLM:
    return LLM(str(ws.target_dir), dtype="float32", kv_cache_bytes=16 << 20, max_model_len=256,
               speculative_config=None if spec is None else {**CONTROLLER_OFF, **spec})


def constrained(llm: LLM, params: StructuredOutputsParams) -> list[list[int]]:
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, structured_outputs=params))
    return [o.outputs[0].token_ids for o in outs]


JSON = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)


@pytest.fixture(scope="module")
def plain(ws):
    llm = _llm(ws)
    out = constrained(llm, JSON)
    unconstrained = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, SamplingParams(temperature=0,
                                                                                        max_tokens=MAX_TOKENS))]
    assert out != unconstrained, "the grammar changed nothing: this test would prove nothing"
    _check_valid(llm, out)
    return out


def _check_valid(llm: LLM, outputs: list[list[int]]) -> None:
    """Every finished output is JSON the schema accepts; an unfinished one is a prefix of such JSON."""
    jsonschema = pytest.importorskip("jsonschema")
    tok = llm.engine.tokenizer
    for ids in outputs:
        text = tok.decode([t for t in ids if t not in llm.engine.eos_ids])
        if ids and ids[-1] in llm.engine.eos_ids:
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            assert text.startswith("{"), text


def _check_method(ws, plain, method):
    try:
        spec = method_config(method, ws)
    except Exception as exc:  # a method missing from this build
        pytest.skip(f"{method}: {exc}")
    quality = logging.getLogger("hyspec.spec.quality")
    level = quality.level
    quality.setLevel(logging.ERROR)  # random drafters are rejected on purpose
    llm = _llm(ws, spec)
    try:
        assert constrained(llm, JSON) == plain, method
        totals = llm.engine.spec.metrics.snapshot()["totals"]
        assert totals["draft_tokens"] > 0, f"{method} drafted nothing: the test would be plain decoding's"
        llm.engine.pool.assert_all_free()
    finally:
        quality.setLevel(level)
        llm.engine.spec.close()


@pytest.mark.parametrize("method", DEFAULT_METHODS)
def test_constrained_speculation_is_plain_constrained_decoding(ws, plain, method):
    _check_method(ws, plain, method)


@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m in methods_to_check() if m not in DEFAULT_METHODS])
def test_every_method_under_a_json_schema(ws, plain, method):
    _check_method(ws, plain, method)


def test_regex_and_choice_under_ngram(ws):
    """The other constraint kinds through the same path (cheap: one method)."""
    plain_llm, spec_llm = _llm(ws), _llm(ws, method_config("ngram", ws))
    for params in (StructuredOutputsParams(regex=r'\{"name":"[a-z]{1,8}","age":[0-9]{1,2}\}'),
                   StructuredOutputsParams(choice=['{"name":"rex"}', '{"name":"tom","age":7}', "none"])):
        assert constrained(spec_llm, params) == constrained(plain_llm, params)
    spec_llm.engine.spec.close()


def test_each_parallel_sample_has_its_own_grammar_state(ws):
    """n samples fork one prompt: each keeps its own matcher (dict form of the constraint, as vLLM's)."""
    choices = ["alpha beta", "alpha gamma", "delta"]
    llm = _llm(ws, method_config("ngram", ws))
    out = llm.generate(PROMPTS[:1], SamplingParams(n=6, temperature=1.5, seed=3, max_tokens=16,
                                                   structured_outputs={"choice": choices}))[0]
    assert {c.text for c in out.outputs} <= set(choices) and all(c.finish_reason == "stop" for c in out.outputs)
    llm.engine.spec.close()


def test_sampling_params_refuse_what_a_grammar_cannot_do():
    from hyspec.errors import RequestError

    with pytest.raises(RequestError, match="ignore_eos cannot be combined"):
        SamplingParams(ignore_eos=True, structured_outputs=StructuredOutputsParams(regex="a+"))
    with pytest.raises(RequestError, match="unexpected keyword argument 'jsn'"):
        SamplingParams(structured_outputs={"jsn": {}})
    with pytest.raises(RequestError, match="must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs="a+")
