"""Temperature 0.8 under a grammar: speculation emits the law of plain constrained decoding, through LLM.generate.

The law of the first three tokens is computed from the target's own logits on every prefix in the support,
each row masked by the grammar after that prefix (a fresh processor that committed it) and then processed as
the requests ask (temperature 0.8, top-k 8, top-p 0.9) -- the same construction as
tests/conformance/test_engine_distribution.py, with the grammar in it.  The regex keeps end-of-sequence out
of the first three tokens (it needs 30 characters first) and allows only lowercase letters, '_' and spaces.

The mutant masks only the verification root row, not the rows after accepted drafts: the positions after an
accepted draft are then sampled from the unconstrained law, and the test must catch it.
"""
from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("llguidance")

import hyspec.engine.controls.build as controls_build  # noqa: E402
from hyspec import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402
from hyspec.conformance.distribution import (DEFAULT_SAMPLES, PARAMS, ExactLaw, compare)  # noqa: E402
from hyspec.conformance.identity import reference_logits  # noqa: E402
from hyspec.conformance.methods import CONTROLLER_OFF, Workspace, method_config  # noqa: E402
from hyspec.ops.sampling import process_logits  # noqa: E402
from hyspec.structured import GrammarProcessor, GrammarViolation, build_grammar_processor  # noqa: E402

GRAMMAR = StructuredOutputsParams(regex="[a-z_ ]{30,60}")
BASE_PROMPT = "def read_config(path):\n    with open(path) as handle:\n        return "


@pytest.fixture(scope="module")
def ws():
    workspace = Workspace.create()
    yield workspace
    workspace.close()


def _engine_llm(ws, spec=None) -> LLM:
    return LLM(str(ws.target_dir), dtype="float32", kv_cache_bytes=32 << 20, max_model_len=256, max_num_seqs=256,
               speculative_config=None if spec is None else {**CONTROLLER_OFF, **spec})


def _masked_law(engine, prompt: list[int], prefixes: list[list[int]]) -> list[torch.Tensor]:
    """Per prefix, ``[V]`` fp64: the requests' law of the next token after ``prompt + prefix`` under the grammar."""
    rows = reference_logits(engine, [prompt] * len(prefixes), [[*p, 0] for p in prefixes])
    out = []
    for prefix, r in zip(prefixes, rows):
        row = r[len(prefix):len(prefix) + 1].clone()  # [1, V]
        reference = build_grammar_processor(GRAMMAR, engine.tokenizer, vocab_size=row.shape[1],
                                            eos_ids=engine.eos_ids)
        reference.commit(prefix)
        row[0, ~reference.allowed_tokens()] = float("-inf")
        probs = process_logits(row, torch.full((1,), PARAMS["temperature"]),
                               torch.full((1,), PARAMS["top_k"], dtype=torch.int64),
                               torch.full((1,), PARAMS["top_p"]), torch.zeros(1))
        out.append(probs[0].double())
    return out


def grammar_law(engine, prompt: list[int]) -> ExactLaw:
    (p1,) = _masked_law(engine, prompt, [[]])
    firsts = p1.nonzero().flatten().tolist()
    joint12, y2, y3, pairs = {}, {}, {}, []
    for t1, p2 in zip(firsts, _masked_law(engine, prompt, [[t] for t in firsts])):
        for t2 in p2.nonzero().flatten().tolist():
            joint12[(t1, t2)] = float(p1[t1] * p2[t2])
            y2[t2] = y2.get(t2, 0.0) + joint12[(t1, t2)]
            pairs.append((t1, t2))
    for (t1, t2), p3 in zip(pairs, _masked_law(engine, prompt, [list(p) for p in pairs])):
        for t3 in p3.nonzero().flatten().tolist():
            y3[t3] = y3.get(t3, 0.0) + joint12[(t1, t2)] * float(p3[t3])
    return ExactLaw(joint12, y2, y3)


@pytest.fixture(scope="module")
def law_and_prompt(ws):
    engine = _engine_llm(ws).engine
    base = engine.tokenizer.encode(BASE_PROMPT, add_special_tokens=False)
    # the prompt ends with every token y1 can be, so prompt lookup finds a draft after any of them
    (p1,) = _masked_law(engine, base, [[]])
    prompt = base + p1.nonzero().flatten().tolist()
    law = grammar_law(engine, prompt)
    assert len(law.y3) >= 4, "the law has almost no support: the test would prove little"
    return law, prompt


def sample(llm: LLM, prompt: list[int], n: int) -> list[list[int]]:
    params = [SamplingParams(**PARAMS, seed=i, max_tokens=6, structured_outputs=GRAMMAR) for i in range(n)]
    return [o.outputs[0].token_ids[:3] for o in llm.generate([prompt] * n, params)]


def run_ngram(ws, prompt, n):
    llm = _engine_llm(ws, method_config("ngram", ws))
    quality = logging.getLogger("hyspec.spec.quality")
    level = quality.level
    quality.setLevel(logging.ERROR)
    try:
        samples = sample(llm, prompt, n)
        totals = llm.engine.spec.metrics.snapshot()["totals"]
    finally:
        quality.setLevel(level)
        llm.engine.spec.close()
    assert totals["accepted_tokens"] >= n // 4, f"only {totals['accepted_tokens']} drafts accepted in {n} requests"
    return samples


# the default tier's run detects a shift of ~10 points in any outcome (the slow tier's, the engine suite's ~5);
# the mutant needs fewer: every unmasked row it samples puts mass on outcomes of probability 0
QUICK_SAMPLES = 1000


@pytest.mark.parametrize("n", [QUICK_SAMPLES, pytest.param(DEFAULT_SAMPLES, marks=pytest.mark.slow)])
def test_ngram_under_a_grammar_follows_plain_constrained_law(ws, law_and_prompt, n):
    law, prompt = law_and_prompt
    result = compare(run_ngram(ws, prompt, n), law)
    assert result.passed, result.describe()
    print(result.describe())  # shown with -s


class SkipsMaskOnDrafts(GrammarProcessor):
    """The bug: the grammar masks the root row only; rows reached through accepted drafts go unmasked.  Its
    commit swallows the forbidden tokens that then come out (the real one refuses them), so the run finishes
    and the law check, not an exception, has to catch it."""

    def process(self, paths, logits):
        roots = [j for j, path in enumerate(paths) if not path]
        rows = logits[roots]
        super().process([[] for _ in roots], rows)
        logits[roots] = rows

    def commit(self, tokens):
        for token in tokens:
            try:
                super().commit([token])
            except GrammarViolation:
                pass


def test_the_law_check_catches_a_mask_skipped_on_accepted_drafts(ws, law_and_prompt, monkeypatch):
    law, prompt = law_and_prompt
    real = controls_build.build_grammar_processor

    def mutant(*args, **kwargs):
        processor = real(*args, **kwargs)
        processor.__class__ = SkipsMaskOnDrafts
        return processor

    monkeypatch.setattr(controls_build, "build_grammar_processor", mutant)
    result = compare(run_ngram(ws, prompt, QUICK_SAMPLES), law)
    assert not result.passed, f"the mutant passed: {result.describe()}"
    print(f"mutant: {result.describe()}")  # shown with -s
