"""RequestOutput.metrics counts what speculation did for that request, and the counts add up to the engine's."""
from __future__ import annotations

from hyspec import LLM, SamplingParams
from tests.spec.conftest import PROMPTS


def test_per_request_draft_and_accepted_tokens_sum_to_the_engine_totals(target_dir):
    # prompt lookup on repetitive prompts: drafts are made and some are accepted
    prompts = [p * 3 for p in PROMPTS[:3]]
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 3,
                                  "controller": {"enabled": False, "profile_at_startup": False}})
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    totals = llm.engine.spec.metrics.snapshot()["totals"]
    assert totals["draft_tokens"] > 0 and totals["accepted_tokens"] > 0
    assert sum(o.metrics.num_draft_tokens for o in outs) == totals["draft_tokens"]
    assert sum(o.metrics.num_accepted_tokens for o in outs) == totals["accepted_tokens"]
    for o in outs:
        m = o.metrics
        assert 0 <= m.num_accepted_tokens <= m.num_draft_tokens
        assert 0 < m.num_spec_steps <= len(o.outputs[0].token_ids)  # each verified step emits a token at least
    llm.close()
