"""The hybrid with policy "bandit" in the engine: identical to plain decoding while it learns, and it learns."""
from __future__ import annotations

from hyspec import LLM, SamplingParams
from tests.model.tiny_checkpoint import make_checkpoint

PROMPTS = ["def add(a, b):", "x = [1, 2, 3, 1, 2, 3, 1, 2,", "class Foo:\n    def", "import os\n"]


def test_a_bandit_hybrid_is_identical_to_plain_and_learns_goodput(tmp_path):
    make_checkpoint(tmp_path, "llama_gqa")
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(str(tmp_path), dtype="float32", kv_cache_bytes=8 << 20)
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, greedy)]
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_bytes=8 << 20, speculative_config={
        "method": "hybrid", "num_speculative_tokens": 4,
        "controller": {"enabled": False, "profile_at_startup": False},
        "hybrid": {"policy": "bandit", "methods": ["ngram", "suffix"]}})
    for _ in range(3):
        for prompt, want in zip(PROMPTS, expected):
            assert llm.generate([prompt], greedy)[0].outputs[0].token_ids == want
    snap = llm.engine.spec.dispatcher.snapshot()
    arms = {arm for (_, arm) in snap.bandit.choices}
    assert arms == {"ngram", "suffix", "none"}  # every arm tried in the warm-up
    assert all(v > 0 for v in snap.bandit.goodput.values())
    assert sum(snap.decisions.values()) == sum(snap.bandit.choices.values())  # no rule: the bandit chose every step
    # suffix measures the match length for the classes: the repeating prompt copies, the others barely
    classes = {klass for (klass, _) in snap.bandit.choices}
    assert all(",match" in k for k in classes) and any("match>15" in k or "match<=15" in k for k in classes)
    llm.engine.pool.assert_all_free()
