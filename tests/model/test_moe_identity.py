"""Temperature 0 on a mixture-of-experts target: every speculative method returns plain decoding's tokens.

Default tier: prompt lookup, a separate draft model, the target drafting for itself (every draft accepted)
and random trees around the greedy continuation (deep acceptances, so the routed blocks see tree-shaped
verification batches), on a Qwen2-MoE target (shared expert, renormalisation off).  Slow tier: the
conformance suite's every-method check (hyspec.conformance.methods, drafters built for the target) on one
target of each MoE architecture.
"""
from __future__ import annotations

import pytest

from hyspec import LLM, SamplingParams
from tests.model.moe_fixtures import make_moe_checkpoint, make_moe_model
from tests.spec.conftest import PROMPTS
from tests.spec.oracle_tree import OracleTreeProposer

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
FAST = {"controller": {"enabled": False, "profile_at_startup": False}}
BATCH = PROMPTS[:6]


@pytest.fixture(scope="module")
def moe_target(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe_target")
    make_moe_checkpoint(path, "qwen2_moe_a", seed=3)
    return path


@pytest.fixture(scope="module")
def plain(moe_target):
    llm = LLM(str(moe_target), dtype="float32", kv_cache_bytes=8 << 20)
    return [o.outputs[0].token_ids for o in llm.generate(BATCH, GREEDY)]


def _generate(target, spec, prompts=BATCH):
    llm = LLM(str(target), dtype="float32", kv_cache_bytes=8 << 20, speculative_config={**FAST, **spec})
    return llm, [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


def test_prompt_lookup_identical_to_plain(moe_target, plain):
    llm, out = _generate(moe_target, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                      "prompt_lookup_max": 3})
    assert out == plain
    assert llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > 0
    llm.engine.pool.assert_all_free()


def test_draft_model_identical_to_plain(moe_target, plain, tmp_path):
    from tests.model.tiny_checkpoint import make_checkpoint

    make_checkpoint(tmp_path, "llama_gqa", layers=1, seed=7)
    llm, out = _generate(moe_target, {"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3})
    assert out == plain
    assert llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > 0


def test_self_draft_accepts_everything(moe_target, plain):
    llm, out = _generate(moe_target, {"method": "draft_model", "model": str(moe_target), "num_speculative_tokens": 4,
                                      "quantization": "none"})
    assert out == plain
    t = llm.engine.spec.metrics.snapshot()["totals"]
    assert t["draft_tokens"] > 0 and t["accepted_tokens"] == t["draft_tokens"]


def test_random_trees_identical_to_plain(moe_target, plain):
    llm = LLM(str(moe_target), dtype="float32", kv_cache_bytes=8 << 20,
              speculative_config={**FAST, "method": "ngram", "num_speculative_tokens": 8})
    refs = {tuple(llm.tokenizer.encode(p)): out for p, out in zip(BATCH, plain)}
    llm.engine.spec.proposers["ngram"] = OracleTreeProposer(refs, llm.engine.config.vocab_size, seed=1)
    assert [o.outputs[0].token_ids for o in llm.generate(BATCH, GREEDY)] == plain
    assert llm.engine.spec.metrics.snapshot()["totals"]["accepted_per_position"][2] > 0


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral_a", "qwen2_moe_a", "qwen3_moe_a"])
def test_every_method_identical_to_plain(family, tmp_path):
    """hyspec's conformance check for every method it lists (random drafters built for the target), CPU backend:
    batch 1 and a ragged batch equal plain decoding, near-tie rate, KV pool clean.  The conformance byte
    tokenizer and its short prompts (tests.model.hf_fixtures.identity_workspace), so the hybrid rule switches."""
    from hyspec.conformance.methods import MethodSettings, check_method, check_plain, methods_to_check
    from hyspec.conformance.targets import resolve
    from hyspec.conformance.tiny import VOCAB, write_tokenizer
    from tests.model.hf_fixtures import identity_workspace

    target_dir = tmp_path / "target"
    make_moe_model(family, target_dir, vocab_size=VOCAB, seed=7, initializer_range=0.08)
    write_tokenizer(target_dir)
    target = resolve("cpu")[0]
    ws = identity_workspace(tmp_path / "ws", target_dir)
    settings = MethodSettings()
    results = [check_plain(target, ws, settings)] + [check_method(target, ws, m, settings) for m in methods_to_check()]
    failed = [(r.name, r.status, r.detail) for r in results
              if r.status != "pass" and not (r.status == "skip" and "not in this build" in r.detail)]
    assert not failed, failed
