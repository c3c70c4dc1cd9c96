"""Every drafting method, at temperature 0.8 with top-k and top-p, emits the target's law through LLM.generate.

The default run sends DEFAULT_SAMPLES seeded requests per method (power <= 5 points in any outcome); the
slow tier sends FULL_SAMPLES (30,000: ~1.6 points).  Each test also requires that speculation ran on the very
steps the law covers (drafts verified), or the test would only be testing plain sampling.
"""
from __future__ import annotations

import logging

import pytest

from hyspec import LLM
from hyspec.conformance.distribution import (DEFAULT_SAMPLES, FULL_SAMPLES, compare, exact_law, lookup_prompt,
                                             sample_through_generate)
from hyspec.conformance.methods import CONTROLLER_OFF, method_config, methods_to_check
from hyspec.conformance.tiny import prompts

REMOTE = "remote (draft_model on an in-process worker)"
METHODS = [*methods_to_check(), REMOTE]


def engine(ws, spec=None):
    return LLM(str(ws.target_dir), dtype="float32", kv_cache_bytes=32 << 20, max_model_len=256, max_num_seqs=256,
               speculative_config=spec)


@pytest.fixture(scope="module")
def law_and_prompt(workspace):
    plain = engine(workspace)
    prompt = lookup_prompt(plain.engine, prompts(6)[3])
    return exact_law(plain.engine, prompt), prompt


def method_llm(ws, method):
    if method == REMOTE:
        from tests.remote.conftest import inprocess_handles, remote_placement

        spec = {**CONTROLLER_OFF, "method": "draft_model", "model": str(ws.drafter("draft_model")),
                "num_speculative_tokens": 4, "draft_placement": "remote", "remote": {"draft_deadline_ms": 5000}}
        with remote_placement(inprocess_handles()):
            return engine(ws, spec)
    try:
        spec = method_config(method, ws)
    except Exception as exc:  # a method missing from this build
        pytest.skip(f"{method}: {exc}")
    return engine(ws, {**CONTROLLER_OFF, **spec})


def run_and_compare(ws, law_and_prompt, method, n):
    law, prompt = law_and_prompt
    llm = method_llm(ws, method)
    quality = logging.getLogger("hyspec.spec.quality")
    level = quality.level
    quality.setLevel(logging.ERROR)  # random drafters are rejected on purpose
    try:
        samples = sample_through_generate(llm, prompt, n)
        drafted = llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"]
        pool = llm.engine.pool
        assert pool.num_free == pool.num_pages, "requests finished but KV pages are still held"
    finally:
        quality.setLevel(level)
        llm.engine.spec.close()
    result = compare(samples, law)
    assert drafted >= n // 4, f"{method}: only {drafted} draft tokens in {n} requests: the law would be plain's"
    assert result.passed, f"{method}: {result.describe()}"
    return result


def suffix_trees_follow(law, llm, prompt) -> dict:
    """Sample ``prompt`` through ``llm`` (a suffix engine) and require the target's law; the drafter's stats."""
    try:
        # 8 tokens, not 3: after the first token a draft may then hold more than one node (a fork)
        samples = sample_through_generate(llm, prompt, DEFAULT_SAMPLES, max_tokens=8)
        stats = llm.engine.spec.proposers["suffix"].stats
    finally:
        llm.engine.spec.close()
    result = compare(samples, law)
    assert result.passed, f"suffix trees: {result.describe()}"
    print(f"suffix trees: {result.describe()}; {stats}")  # shown with -s
    return stats


def test_suffix_trees_emit_the_target_law(workspace):
    """Suffix drafts are trees where earlier responses to the same prompt went different ways.  With a
    prompt that its own tokens do not continue (no lookup tokens appended), the drafts come from the
    cache of earlier responses, forks included, and the law must still be the target's."""
    prompt = list(prompts(6)[3])
    law = exact_law(engine(workspace).engine, prompt)
    stats = suffix_trees_follow(law, engine(workspace, {**CONTROLLER_OFF, "method": "suffix"}), prompt)
    assert stats["drafts_cache"] >= DEFAULT_SAMPLES // 4, stats
    assert stats["branching_drafts"] >= DEFAULT_SAMPLES // 20, stats


def test_suffix_corpus_trees_emit_the_target_law(workspace, tmp_path):
    """Drafts from a shipped corpus (suffix_decoding_corpus) only: the cache is off, and the corpus holds the
    target's own sampled answers to the prompt, which fork -- the law must still be the target's."""
    from hyspec.drafters.suffix.corpus import save_corpus
    from hyspec.model.tokenizer import Tokenizer

    prompt = list(prompts(6)[3])
    plain = engine(workspace)
    law = exact_law(plain.engine, prompt)
    answers = sample_through_generate(plain, prompt, 64, seed=7, max_tokens=8)  # other seeds than the test's
    save_corpus(tmp_path, [prompt + a for a in answers], Tokenizer(workspace.target_dir), {"built_by": "this test"},
                vocab_size=plain.engine.target.vocab_size)
    llm = engine(workspace, {**CONTROLLER_OFF, "method": "suffix", "suffix_decoding_max_cached_requests": 0,
                             "suffix_decoding_corpus": str(tmp_path)})
    stats = suffix_trees_follow(law, llm, prompt)
    assert stats["drafts_corpus"] >= DEFAULT_SAMPLES // 4 and stats["drafts_cache"] == 0, stats
    assert stats["branching_drafts"] >= DEFAULT_SAMPLES // 20, stats


@pytest.mark.parametrize("method", METHODS)
def test_method_emits_the_target_law_through_generate(workspace, law_and_prompt, method):
    result = run_and_compare(workspace, law_and_prompt, method, DEFAULT_SAMPLES)
    assert result.power <= 0.05, f"the default run must detect a 5-point shift; it detects {result.power:.1%}"


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_method_emits_the_target_law_at_full_power(workspace, law_and_prompt, method):
    result = run_and_compare(workspace, law_and_prompt, method, FULL_SAMPLES)
    assert result.power <= 0.02, f"the slow tier must detect a 2-point shift; it detects {result.power:.1%}"


def test_suffix_trees_cut_by_draft_sizing_emit_the_target_law(workspace, monkeypatch):
    """With the controller on, suffix trees are cut node by node before verification (draft_sizing.py); the
    cut trees must emit the target's law too.  A cost model where a verified row costs 1 ms against a
    0.5 s step makes the cut bite at the batch sizes this test runs (~256 requests at once): a node pays
    only while its calibrated path acceptance is above ~0.35."""
    from hyspec.policy.cost_model import CostModel, StepSample
    from hyspec.seam.tree import DraftTree

    prompt = list(prompts(6)[3])
    law = exact_law(engine(workspace).engine, prompt)
    llm = engine(workspace, {"method": "suffix", "controller": {"profile_at_startup": False}})
    controller = llm.engine.spec.controller
    controller.cost_model = CostModel(
        [StepSample(b, n, 0.5 + 0.001 * b * n) for b in (1, 8, 64, 256) for n in (1, 2, 5, 9, 17)])
    # the costs stay the ones above: measured step, host and draft times would rescale them run by run,
    # and which trees get cut would then depend on this machine's timing
    for name in ("observe_step_time", "observe_host_time", "observe_draft_time"):
        monkeypatch.setattr(controller, name, lambda *args, **kwargs: None)
    # so is the drafting value (draft_value.py), which weighs measured drafting seconds: pinned to "draft", or how
    # many steps draft depends on this machine's speed (one CI run drafted 1323 tokens and cut 10 trees)
    monkeypatch.setattr(controller, "should_draft", lambda method: True)
    cuts = {"n": 0}
    keep = DraftTree.keep

    def counted(self, nodes):
        cuts["n"] += 1
        return keep(self, nodes)

    monkeypatch.setattr(DraftTree, "keep", counted)
    try:
        samples = sample_through_generate(llm, prompt, DEFAULT_SAMPLES, max_tokens=8)
        drafted = llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"]
    finally:
        llm.engine.spec.close()
    result = compare(samples, law)
    print(f"sized suffix trees: {result.describe()}; {drafted} draft tokens, {cuts['n']} trees cut")  # -s
    assert result.passed, f"sized suffix trees: {result.describe()}"
    assert drafted >= DEFAULT_SAMPLES // 4 and cuts["n"] >= 40, (drafted, cuts)  # 1642 and 173 (deterministic)
