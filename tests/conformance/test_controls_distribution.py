"""A penalty at temperature 0.8 (top-k and top-p on too) through LLM.generate: every method emits the
target's *penalised* law, the penalty written out here as vLLM defines it (not hyspec's processor).

y2 and y3 come from verification, so the penalty must be applied at every verified position with the
output before it (y1, then y1 y2 -- the earlier draft on the path).  A verifier that ignores the
penalty must fail it.  (One that forgets the drafts on a row's path shifts this law by ~1.5 points only,
below what 3,500 samples resolve: tests/spec/test_controls_identity.py catches that one token for token.)
Default tier: prompt lookup (ngram) and the mutant; slow tier: every method.
"""
from __future__ import annotations

import logging

import pytest
import torch

from hyspec.conformance.distribution import (DEFAULT_SAMPLES, compare, exact_law, lookup_prompt, power,
                                             sample_through_generate)
from hyspec.conformance.methods import methods_to_check
from hyspec.conformance.tiny import prompts
from tests.conformance.test_engine_distribution import engine, method_llm

# strong enough to move the law by 11 points (3x what the default sample count resolves)
PENALTY = dict(presence_penalty=2.0, frequency_penalty=2.0, repetition_penalty=1.5)


def penalised(logits: torch.Tensor, output: list[int], prompt: list[int]) -> torch.Tensor:
    """vLLM's penalties on one position: repetition over prompt + output, presence / frequency over output."""
    out = logits.clone()
    for t in set(prompt) | set(output):
        out[t] = out[t] / PENALTY["repetition_penalty"] if out[t] > 0 else out[t] * PENALTY["repetition_penalty"]
    for t in set(output):
        out[t] -= PENALTY["frequency_penalty"] * output.count(t) + PENALTY["presence_penalty"]
    return out


@pytest.fixture(scope="module")
def penalised_law(workspace):
    plain = engine(workspace)
    prompt = lookup_prompt(plain.engine, prompts(6)[3])
    law = exact_law(plain.engine, prompt, adjust=lambda logits, output: penalised(logits, output, prompt))
    return law, prompt


def sample_and_compare(ws, law_and_prompt, method):
    law, prompt = law_and_prompt
    llm = method_llm(ws, method)
    quality = logging.getLogger("hyspec.spec.quality")
    level = quality.level
    quality.setLevel(logging.ERROR)  # random drafters are rejected on purpose
    try:
        samples = sample_through_generate(llm, prompt, DEFAULT_SAMPLES, **PENALTY)
        drafted = llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"]
    finally:
        quality.setLevel(level)
        llm.engine.spec.close()
    assert drafted >= DEFAULT_SAMPLES // 4, f"{method}: only {drafted} draft tokens: the law would be plain's"
    return compare(samples, law)


def test_the_penalised_law_differs_from_the_unpenalised_one(workspace, penalised_law):
    law, prompt = penalised_law
    plain = exact_law(engine(workspace).engine, prompt)
    shift = max(abs(a.get(t, 0.0) - b.get(t, 0.0)) for a, b in ((law.y2, plain.y2), (law.y3, plain.y3))
                for t in set(a) | set(b))
    resolved = power(law, DEFAULT_SAMPLES)
    assert shift > 2 * resolved, f"the penalty moves the law by {shift:.3f}, the test resolves {resolved:.3f}"


def test_ngram_with_a_penalty_emits_the_penalised_law(workspace, penalised_law):
    result = sample_and_compare(workspace, penalised_law, "ngram")
    assert result.passed, f"ngram + penalty: {result.describe()}"


def test_a_verifier_ignoring_the_penalty_is_caught(workspace, penalised_law, monkeypatch):
    import hyspec.spec.decoder as decoder

    monkeypatch.setattr(decoder, "apply_tree_processors", lambda logits, seqs, trees: logits)
    result = sample_and_compare(workspace, penalised_law, "ngram")
    assert not result.passed, f"the mutant went unnoticed: {result.describe()}"


@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m in methods_to_check() if m != "ngram"])
def test_every_method_with_a_penalty_emits_the_penalised_law(workspace, penalised_law, method):
    result = sample_and_compare(workspace, penalised_law, method)
    assert result.passed, f"{method} + penalty: {result.describe()}"
