"""Temperature 0 with sampling controls: every method returns plain decoding's (controlled) tokens.

Default tier: random trees built around the controlled greedy continuation (deep acceptances along
non-first siblings, so a penalty must count the accepted drafts before each verified position) and
prompt lookup, with the penalties together and with logit_bias + min_tokens.  Slow tier: every method
x every control (hyspec.conformance.controls, the matrix of docs/results/2026-12-06/sampling-controls/).
"""
from __future__ import annotations

import pytest

from hyspec import LLM, SamplingParams
from tests.spec.conftest import PROMPTS
from tests.spec.oracle_tree import OracleTreeProposer

FAST = {"controller": {"enabled": False, "profile_at_startup": False}}
BATCH = PROMPTS[:4]
PENALTIES = dict(repetition_penalty=1.3, presence_penalty=0.8, frequency_penalty=0.6)


def bias_and_min_tokens(plain: list[list[int]]) -> dict:
    stop = plain[0][2]  # plain decoding's third token of the first prompt becomes a stop token held back
    return dict(logit_bias={t: 3.0 for t in range(5, 300, 29)}, min_tokens=12, stop_token_ids=[stop],
                ignore_eos=False)


def greedy(llm, **fields):
    params = SamplingParams(**{"temperature": 0, "max_tokens": 24, "ignore_eos": True, **fields})
    return [o.outputs[0].token_ids for o in llm.generate(BATCH, params)]


@pytest.fixture(scope="module")
def plain_llm(target_dir):
    return LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)


@pytest.mark.parametrize("controls", ["penalties", "logit_bias+min_tokens"])
def test_random_trees_with_controls_identical_to_plain(target_dir, plain_llm, controls):
    uncontrolled = greedy(plain_llm)
    fields = PENALTIES if controls == "penalties" else bias_and_min_tokens(uncontrolled)
    expected = greedy(plain_llm, **fields)
    assert expected != uncontrolled  # the controls bite
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
              speculative_config={**FAST, "method": "ngram", "num_speculative_tokens": 8})
    tok = llm.tokenizer
    refs = {tuple(tok.encode(p)): out for p, out in zip(BATCH, expected)}
    llm.engine.spec.proposers["ngram"] = OracleTreeProposer(refs, llm.engine.config.vocab_size, seed=1)
    assert greedy(llm, **fields) == expected
    t = llm.engine.spec.metrics.snapshot()["totals"]
    assert t["accepted_per_position"][2] > 0  # deep paths were accepted: the counts included earlier drafts


def test_a_verifier_forgetting_the_drafts_on_the_path_is_caught(target_dir, plain_llm, monkeypatch):
    """The mutant penalises every tree row as if it came right after the committed output."""
    import hyspec.spec.verify_controls as verify_controls

    monkeypatch.setattr(verify_controls, "node_paths", lambda tree: [[] for _ in range(tree.num_nodes)])
    with pytest.raises(AssertionError, match="=="):
        test_random_trees_with_controls_identical_to_plain(target_dir, plain_llm, "penalties")


def test_prompt_lookup_with_controls_identical_to_plain(target_dir, plain_llm):
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
              speculative_config={**FAST, "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 3})
    fields = {**PENALTIES, **bias_and_min_tokens(greedy(plain_llm))}
    assert greedy(llm, **fields) == greedy(plain_llm, **fields)
    assert llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > 0


@pytest.mark.slow
def test_every_method_with_every_control_identical_to_plain():
    from hyspec.conformance.controls import control_matrix
    from hyspec.conformance.methods import Workspace, methods_to_check

    ws = Workspace.create()
    try:
        rows = control_matrix(ws, methods_to_check())
    finally:
        ws.close()
    wrong = [r for r in rows if not r["identical"]]
    assert not wrong, wrong
    assert all(r["changed_vs_uncontrolled"] > 0 for r in rows)
