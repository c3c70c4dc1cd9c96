"""The grammar TokenProcessor on its own: every verified row equals the matcher stepped token by token.

The tiny test tokenizer (byte-level BPE, 320 ids, EOS = 2) and llguidance; no model.  The reference for a
row after path ``p`` is a fresh processor that committed ``p`` one token at a time and reports the tokens it
allows next: ``process`` must mask each row exactly so, ``allowed_prefix`` must stop at the first token the
stepped matcher refuses, and neither may move the committed state.
"""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("llguidance")

from hyspec.model.tokenizer import Tokenizer  # noqa: E402
from hyspec.structured import (GrammarViolation, StructuredOutputError, StructuredOutputsParams,  # noqa: E402
                               build_grammar_processor)
from tests.model.tiny_checkpoint import VOCAB, write_tokenizer  # noqa: E402

EOS = 2
PADDED_VOCAB = VOCAB + 16  # a model's logits may be wider than its tokenizer: the padding stays masked
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc"]}}},
          "required": ["name", "age"], "additionalProperties": False}
CONSTRAINTS = {
    "json": StructuredOutputsParams(json=SCHEMA),
    "json_object": StructuredOutputsParams(json_object=True),
    "regex": StructuredOutputsParams(regex=r"(ab|c)+[0-9]{2}"),
    "choice": StructuredOutputsParams(choice=["yes", "no", "maybe so"]),
    "grammar": StructuredOutputsParams(grammar='root ::= "(" item ("," item)* ")"\nitem ::= [a-z]+'),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    path = tmp_path_factory.mktemp("grammar_tok")
    write_tokenizer(path)
    return Tokenizer(path)


def _processor(tokenizer: Tokenizer, params: StructuredOutputsParams):
    return build_grammar_processor(params, tokenizer, vocab_size=PADDED_VOCAB, eos_ids=[EOS])


def _stepped_allowed(tokenizer, params, path) -> torch.Tensor | None:
    """The reference: commit ``path`` token by token; None where the grammar refuses a token of it."""
    ref = _processor(tokenizer, params)
    for token in path:
        if not bool(ref.allowed_tokens()[token]):
            return None
        ref.commit([token])
    return ref.allowed_tokens()


def _random_walk(processor, rng: random.Random, steps: int) -> list[int]:
    """A path of allowed tokens from the processor's committed state (looked up, then rolled back)."""
    path: list[int] = []
    for _ in range(steps):
        row = torch.zeros(1, PADDED_VOCAB)
        processor.process([path], row)
        choices = [t for t in torch.isfinite(row[0]).nonzero().flatten().tolist() if t != EOS]
        if not choices:
            break
        path.append(rng.choice(choices))
    return path


@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_process_rows_equal_the_matcher_stepped_token_by_token(tokenizer, kind):
    params = CONSTRAINTS[kind]
    rng = random.Random(0)
    processor = _processor(tokenizer, params)
    committed = _random_walk(processor, rng, 3)
    processor.commit(committed)
    before = processor.allowed_tokens().clone()
    # a tree: two allowed branches (sharing their first tokens), plus a forbidden token and an EOS branch
    branch = _random_walk(processor, rng, 6)
    other = branch[:2] + _random_walk(_advanced(tokenizer, params, committed + branch[:2]), rng, 3)
    forbidden = next(t for t in range(3, VOCAB) if not bool(before[t]))
    paths = [[]] + [branch[:k] for k in range(1, len(branch) + 1)] + [other[:k] for k in range(3, len(other) + 1)]
    paths += [[forbidden], branch[:1] + [EOS]]
    logits = torch.randn(len(paths), PADDED_VOCAB, generator=torch.Generator().manual_seed(1))
    raw = logits.clone()
    processor.process(paths, logits)
    for row, path in enumerate(paths):
        expected = None if EOS in path else _stepped_allowed(tokenizer, params, committed + path)
        if expected is None:  # unreachable row (forbidden token or past EOS): left as it was
            assert torch.equal(logits[row], raw[row]), path
            continue
        assert torch.equal(torch.isfinite(logits[row]), expected), (kind, path)
        assert torch.equal(logits[row][expected], raw[row][expected])
        assert not expected[VOCAB:].any()
    assert torch.equal(processor.allowed_tokens(), before), "process moved the committed state"


def test_the_torch_path_masks_as_the_numpy_path(tokenizer):
    """float32 CPU logits are masked in place with numpy; other dtypes (and devices) go through torch: same rows."""
    params = CONSTRAINTS["json"]
    processor = _processor(tokenizer, params)
    branch = _random_walk(processor, random.Random(3), 5)
    paths = [branch[:k] for k in range(len(branch) + 1)]
    fp32 = torch.randn(len(paths), PADDED_VOCAB, generator=torch.Generator().manual_seed(2))
    fp64 = fp32.double()
    processor.process(paths, fp32)
    processor.process(paths, fp64)
    assert torch.equal(torch.isfinite(fp32), torch.isfinite(fp64))
    assert torch.equal(fp32.double()[torch.isfinite(fp32)], fp64[torch.isfinite(fp64)])
    assert not torch.isfinite(fp32).all(), "the grammar masked nothing: the test shows nothing"


def _advanced(tokenizer, params, path):
    processor = _processor(tokenizer, params)
    processor.commit(path)
    return processor


@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_allowed_prefix_stops_at_the_first_token_the_grammar_refuses(tokenizer, kind):
    params = CONSTRAINTS[kind]
    rng = random.Random(2)
    processor = _processor(tokenizer, params)
    for trial in range(6):
        path = _random_walk(processor, rng, 5)
        cut = rng.randrange(len(path) + 1)
        path = path[:cut] + [rng.randrange(3, VOCAB)] + path[cut:]  # a random token in the middle
        expected = len(path)
        for k in range(len(path)):
            if _stepped_allowed(tokenizer, params, path[:k + 1]) is None:
                expected = k
                break
        before = processor.allowed_tokens().clone()
        assert processor.allowed_prefix(path) == expected, (kind, path)
        assert torch.equal(processor.allowed_tokens(), before)


def test_end_of_sequence_only_where_the_grammar_accepts(tokenizer):
    processor = _processor(tokenizer, StructuredOutputsParams(choice=["yes", "yes please"]))
    yes = tokenizer.encode("yes", add_special_tokens=False)
    assert not bool(processor.allowed_tokens()[EOS])
    assert processor.allowed_prefix([*yes[:-1], EOS, 5]) == len(yes) - 1
    assert processor.allowed_prefix([*yes, EOS, 5]) == len(yes) + 1  # the EOS counts; nothing after it
    with pytest.raises(GrammarViolation):
        _processor(tokenizer, StructuredOutputsParams(choice=["yes"])).commit([*yes[:-1], EOS])
    processor.commit(yes)
    assert bool(processor.allowed_tokens()[EOS]) and not processor.is_complete  # " please" may follow
    full = tokenizer.encode(" please", add_special_tokens=False)
    processor.commit(full)
    assert processor.is_complete
    assert processor.allowed_tokens().nonzero().flatten().tolist() == [EOS]
    processor.commit([EOS])
    with pytest.raises(GrammarViolation):
        processor.commit([5])


def test_commit_refuses_a_forbidden_token(tokenizer):
    processor = _processor(tokenizer, StructuredOutputsParams(regex="[0-9]+"))
    letter = tokenizer.encode("x", add_special_tokens=False)
    with pytest.raises(GrammarViolation, match="forbids"):
        processor.commit(letter)


def test_the_committed_output_is_valid_json(tokenizer):
    """Greedy decoding of random logits through the mask ends in text the schema accepts."""
    jsonschema = pytest.importorskip("jsonschema")
    import json

    processor = _processor(tokenizer, CONSTRAINTS["json"])
    gen = torch.Generator().manual_seed(3)
    out: list[int] = []
    for _ in range(200):
        row = torch.randn(1, PADDED_VOCAB, generator=gen)
        row[0, EOS] += 4.0  # end as soon as the grammar lets it
        processor.process([[]], row)
        token = int(row.argmax())
        processor.commit([token])
        if token == EOS:
            break
        out.append(token)
    assert out and processor.is_complete
    jsonschema.validate(json.loads(tokenizer.decode(out)), SCHEMA)


@pytest.mark.parametrize("params, message", [
    (dict(json={"type": "objekt"}), r"json: invalid JSON schema at \$\.type"),
    (dict(json={"type": "object", "properties": {"a": {"minLength": "x"}}}),
     r"at \$\.properties\.a\.minLength: 'x' is not of type 'integer'"),
    (dict(json='{"type": }'), r"not valid JSON: Expecting value at line 1 column 10"),
    (dict(json=False), "admits no value"),
    (dict(regex="ab[c-"), "unclosed character class"),
    (dict(regex="a{3,2}"), "invalid repetition count"),
    (dict(grammar="start: x\nx: /[^\\x00-\\x{10FFFF}]/"), "no output satisfies"),
    (dict(choice=[]), "non-empty list"),
    (dict(json={}, regex="a"), "exactly one of"),
    (dict(), "exactly one of"),
    (dict(structural_tag="{}"), "structural_tag: not implemented"),
    (dict(regex="a", whitespace_pattern=" "), "applies to json and json_object only"),
])
def test_bad_constraints_are_refused_naming_the_problem(tokenizer, params, message):
    with pytest.raises(StructuredOutputError, match=message):
        _processor(tokenizer, StructuredOutputsParams(**params))


def test_disable_additional_properties_and_whitespace(tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    strict = _processor(tokenizer, StructuredOutputsParams(json=schema, disable_additional_properties=True,
                                                           disable_any_whitespace=True))
    loose = _processor(tokenizer, StructuredOutputsParams(json=schema))
    text = tokenizer.encode('{"a":1,"b":2}', add_special_tokens=False)
    assert strict.allowed_prefix(text) < loose.allowed_prefix(text) == len(text)
    spaced = tokenizer.encode('{ "a": 1}', add_special_tokens=False)
    assert strict.allowed_prefix(spaced) < len(spaced) == loose.allowed_prefix(spaced)
