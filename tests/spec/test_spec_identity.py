"""Temperature 0: every speculative configuration returns exactly plain decoding's tokens."""
from __future__ import annotations

import json

import pytest

from hyspec import LLM, SamplingParams
from hyspec.errors import ConfigError
from hyspec.seam.proposer import Proposer
from tests.spec.conftest import PROMPTS
from tests.spec.oracle_tree import OracleTreeProposer

GREEDY = SamplingParams(temperature=0, max_tokens=60)
# The goodput controller is off in most tests: it reacts to measured step times, which are
# noise on a shared CI box; the tests here are about what is emitted, not when to speculate.
FAST = {"controller": {"enabled": False, "profile_at_startup": False}}


def spec_llm(target_dir, config, **kw):
    return LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20, speculative_config={**FAST, **config}, **kw)


def token_ids(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("batch", [1, 8])
def test_ngram_identical_to_plain(target_dir, plain_outputs, batch):
    llm = spec_llm(target_dir, {"method": "ngram", "num_speculative_tokens": 4,
                                "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    for i in range(0, len(PROMPTS), batch):
        assert token_ids(llm.generate(PROMPTS[i:i + batch], GREEDY)) == plain_outputs[i:i + batch]
    snap = llm.engine.spec.metrics.snapshot()["totals"]
    assert snap["draft_tokens"] > 0 and snap["accepted_tokens"] > 0  # it really speculated
    llm.engine.pool.assert_all_free()


@pytest.mark.parametrize("batch", [1, 8])
def test_draft_model_identical_to_plain(target_dir, draft_dir, plain_outputs, batch):
    llm = spec_llm(target_dir, {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 3})
    for i in range(0, len(PROMPTS), batch):
        assert token_ids(llm.generate(PROMPTS[i:i + batch], GREEDY)) == plain_outputs[i:i + batch]
    assert llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > 0
    pool = llm.engine.pool
    pool.assert_all_free()


def test_with_live_controller_still_identical(target_dir, plain_outputs):
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 3})  # profiles the step cost at start-up
    assert llm.engine.spec.controller.cost_model.fitted
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs


def test_self_draft_accepts_everything(target_dir, plain_outputs):
    """The target as its own dense draft model: every draft is the argmax, so all are accepted."""
    llm = spec_llm(target_dir, {"method": "draft_model", "model": str(target_dir), "num_speculative_tokens": 4,
                                "quantization": "none",
                                "controller": {"enabled": False, "profile_at_startup": False}})
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
    t = llm.engine.spec.metrics.snapshot()["totals"]
    assert t["accepted_tokens"] == t["draft_tokens"]


def test_self_draft_quantized_by_default_stays_identical(tmp_path):
    """By default the drafter's linears run on the backend's int8 kernels: its drafts may differ from the
    target's argmax at near-ties, which verification rejects, so the output is still plain decoding's.
    (A target whose widths 32-wide blocks divide: the default quantizes a drafter whole or not at all.)"""
    from tests.model.tiny_checkpoint import make_checkpoint

    make_checkpoint(tmp_path, "llama_gqa", layers=2, seed=3, intermediate_size=128)
    plain = token_ids(LLM(str(tmp_path), dtype="float32", kv_cache_bytes=8 << 20).generate(PROMPTS, GREEDY))
    llm = spec_llm(tmp_path, {"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 4,
                              "controller": {"enabled": False, "profile_at_startup": False}})
    drafter = llm.engine.spec.proposers["draft_model"].model
    kinds = {type(m).__name__ for m in drafter.modules()}
    assert kinds & {"BlockLinear", "Int8Linear"}, kinds  # the CPU backend quantized them
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain
    t = llm.engine.spec.metrics.snapshot()["totals"]
    assert t["accepted_tokens"] >= 0.9 * t["draft_tokens"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_trees_with_compaction_identical_to_plain(target_dir, plain_outputs, seed):
    llm = spec_llm(target_dir, {"method": "ngram", "num_speculative_tokens": 8,
                                "controller": {"enabled": False, "profile_at_startup": False}})
    refs = {tuple(llm.tokenizer.encode(p)): out for p, out in zip(PROMPTS, plain_outputs)}
    llm.engine.spec.proposers["ngram"] = OracleTreeProposer(refs, llm.engine.config.vocab_size, seed=seed)
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
    t = llm.engine.spec.metrics.snapshot()["totals"]
    assert t["accepted_per_position"][2] > 0  # deep paths were accepted


def test_method_switch_mid_generation(target_dir, draft_dir, plain_outputs, tmp_path):
    """Hybrid: ngram for short contexts, draft_model after; every sequence switches while generating."""
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"when": "max_context_length < 30", "method": "ngram"},
                                 {"method": "draft_model"}]))
    llm = spec_llm(target_dir, {"method": "hybrid", "num_speculative_tokens": 3,
                                "hybrid": {"rules_path": str(rules), "methods": [
                                    {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3},
                                    {"method": "draft_model", "model": str(draft_dir)}]}})
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
    decisions = llm.engine.spec.dispatcher.snapshot().decisions
    assert decisions.get("ngram", 0) > 0 and decisions.get("draft_model", 0) > 0


class _Exploding(Proposer):
    """Fails every other call and returns garbage every third; the lifecycle hooks are the base class's."""

    method = "ngram"

    def __init__(self, inner, fail_every=2):
        self.inner, self.calls, self.fail_every = inner, 0, fail_every

    def max_budget(self):
        return 4

    def propose(self, requests, sampling):
        self.calls += 1
        if self.calls % self.fail_every == 0:
            raise RuntimeError("drafter blew up")
        if self.calls % 3 == 0:  # garbage: ids out of vocabulary
            from hyspec.seam.tree import DraftTree
            return [DraftTree.chain(r.seq.last_token, [10**6, 5]) for r in requests]
        return self.inner.propose(requests, sampling)



def test_failing_proposer_degrades_to_plain_and_counts(target_dir, plain_outputs):
    llm = spec_llm(target_dir, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                "prompt_lookup_max": 3, "controller": {"enabled": False, "profile_at_startup": False}})
    llm.engine.spec.proposers["ngram"] = _Exploding(llm.engine.spec.proposers["ngram"])
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
    causes = llm.engine.spec.metrics.snapshot()["totals"]["rejections"]
    assert causes.get("draft_unavailable", 0) > 0


def test_kv_ownership_violation_redoes_step_plainly(target_dir, plain_outputs, monkeypatch):
    from hyspec.errors import KVOwnershipError
    from hyspec.kv.sequence_kv import SequenceKV

    llm = spec_llm(target_dir, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                "prompt_lookup_max": 3, "controller": {"enabled": False, "profile_at_startup": False}})
    real = SequenceKV.check_writable
    calls = {"n": 0}

    def flaky(self, start, count):
        if count > 1 and self.num_tokens > 0:  # a tree feed (prefill chunks start at 0)
            calls["n"] += 1
            if calls["n"] % 2:
                raise KVOwnershipError("injected: page owned by another model")
        return real(self, start, count)

    monkeypatch.setattr(SequenceKV, "check_writable", flaky)
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
    assert llm.engine.spec.metrics.snapshot()["totals"]["rejections"].get("kv_cache_mismatch", 0) > 0


@pytest.mark.parametrize("config, key", [
    ({"method": "draft_model", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 100000}, "num_speculative_tokens"),
    ({"method": "telepathy"}, "method"),
    ({"method": "eagle", "tree": {"budget": 100000}}, "tree.budget"),
    ({"method": "ngram", "bogus_key": 1}, "bogus_key"),
])
def test_bad_speculative_config_names_the_key(target_dir, config, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        spec_llm(target_dir, config)


def test_draft_model_with_another_vocabulary_is_rejected(target_dir, tmp_path):
    from tests.model.hf_fixtures import make_hf_model
    from tests.model.tiny_checkpoint import write_tokenizer

    other = tmp_path / "other"
    other.mkdir()
    make_hf_model("llama_gqa", other, vocab_size=300, layers=1)
    write_tokenizer(other, vocab_size=300)
    with pytest.raises(ConfigError, match="tokenizer"):
        spec_llm(target_dir, {"method": "draft_model", "model": str(other)})
