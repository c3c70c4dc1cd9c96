"""A bare {"method": "hybrid"}: the bandit over ngram, suffix and every drafter in assets/, suffix at its own
ceiling and the others at the default draft length; rules only when a rules file (or policy) says so."""
from __future__ import annotations

from hyspec.spec.config import DEFAULT_NUM_SPECULATIVE_TOKENS, SpeculativeConfig

from tests.model.test_default_model import needs_default


def test_a_bare_hybrid_resolves_to_the_bandit_with_suffixs_ceiling_and_default_trees():
    cfg = SpeculativeConfig.from_dict({"method": "hybrid"})
    assert cfg.hybrid.policy == "bandit"
    assert cfg.num_speculative_tokens == cfg.suffix_decoding_max_tree_depth == 24
    assert cfg.tree.depth == DEFAULT_NUM_SPECULATIVE_TOKENS  # EAGLE trees as alone, not 24 deep
    assert cfg.controller.max_draft_tokens == 24


def test_a_rules_file_or_an_explicit_policy_keeps_rules_and_explicit_lengths_are_kept(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text('[{"method": "ngram"}]')
    assert SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": {"rules_path": str(rules)}}).hybrid.policy \
        == "rules"
    assert SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": {"policy": "rules"}}).hybrid.policy == "rules"
    cfg = SpeculativeConfig.from_dict({"method": "hybrid", "num_speculative_tokens": 8})
    assert cfg.num_speculative_tokens == 8 and cfg.tree.depth == 8
    listed = SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": {"methods": ["ngram", "suffix"]}})
    assert listed.num_speculative_tokens == DEFAULT_NUM_SPECULATIVE_TOKENS  # as before when methods are listed


@needs_default
def test_the_bare_hybrid_on_the_default_model_loads_suffix_and_stays_identical_to_plain():
    from hyspec import LLM, SamplingParams

    prompts = ["def fibonacci(n):", "Explain what a hash map is."]
    greedy = SamplingParams(temperature=0, max_tokens=24)
    plain = LLM(kv_cache_bytes=256 << 20, max_model_len=2048)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, greedy)]
    plain.close()
    # the start-up profile of the target's step costs is skipped: it is slow here and beside the point
    llm = LLM(kv_cache_bytes=256 << 20, max_model_len=2048,
              speculative_config={"method": "hybrid", "controller": {"profile_at_startup": False}})
    spec = llm.engine.spec
    assert {"ngram", "suffix"} <= set(spec.proposers)
    assert spec.dispatcher.bandit is not None
    caps = spec.controller._caps
    assert caps["suffix"] == 24 and caps["ngram"] == DEFAULT_NUM_SPECULATIVE_TOKENS
    assert all(caps[m] == DEFAULT_NUM_SPECULATIVE_TOKENS for m in spec.proposers if m not in ("suffix",))
    for _ in range(2):  # the second time suffix's cache holds the answers
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == want
    llm.close()
