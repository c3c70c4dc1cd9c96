"""The hybrid inside vLLM: the bandit's arm from the goodput vLLM's steps show, the load fallback, and which
steps teach it (none where a request joined or a row prefilled)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from hyspec.errors import ConfigError
from hyspec.vllm import HyspecProposer, VllmOptions, load_options
from hyspec.vllm.hybrid import VllmHybrid


def test_the_arm_that_commits_more_per_second_wins():
    hybrid = VllmHybrid(("suffix", "ngram"), max_num_seqs=8, load_threshold=0.75, explore_fraction=0.1)
    rate = {"suffix": 3, "ngram": 1, "none": 1}  # tokens one step commits per row, each step 10 ms
    now, ids, chosen = 0.0, ["a", "b"], []
    for _ in range(200):
        arm = hybrid.choose(ids, mean_context=100.0, match_length=8, now=now)
        chosen.append(arm)
        now += 0.01
        hybrid.observe(ids, [rate[arm]] * len(ids), now)
    assert chosen[-100:].count("suffix") >= 85  # the rest: bounded exploration
    assert set(chosen[:6]) == {"suffix", "ngram", "none"}  # each tried in the warm-up


def test_a_step_where_a_request_joined_or_prefilled_teaches_nothing():
    hybrid = VllmHybrid(("suffix",), max_num_seqs=8, load_threshold=0.75, explore_fraction=0.1)
    hybrid.choose(["a"], 10.0, 0, now=0.0)
    hybrid.observe(["a", "b"], [1, 1], now=1.0)  # b joined: its prefill was in that step
    hybrid.choose(["a", "b"], 10.0, 0, now=1.0)
    hybrid.observe(["a", "b"], [1, 0], now=2.0)  # b is still prefilling
    assert not hybrid.bandit.snapshot().goodput
    hybrid.choose(["a", "b"], 10.0, 0, now=2.0)
    hybrid.observe(["a", "b"], [2, 1], now=3.0)
    assert len(hybrid.bandit.snapshot().goodput) == 1


def test_no_drafts_above_the_load_threshold():
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                             model_config=SimpleNamespace(max_model_len=256),
                             scheduler_config=SimpleNamespace(max_num_seqs=4))
    proposer = HyspecProposer(config, VllmOptions(method="hybrid", load_threshold=0.5))

    class Runner:  # vLLM's model runner, as far as the proposer reads it
        input_batch = SimpleNamespace(req_ids=["a", "b", "c"], num_prompt_tokens=np.array([1, 1, 1]))

        def propose_draft_token_ids(self, n):
            rep = [5, 6, 7, 8, 5, 6, 7]
            ids = np.array([rep] * n, dtype=np.int32)
            return proposer.propose([[7]] * n, np.array([len(rep)] * n), ids)

    assert Runner().propose_draft_token_ids(3) == [[], [], []]  # 3 rows > 0.5 x 4
    assert proposer.stats["load_fallback_steps"] == 1


def test_hybrid_options_from_the_file(tmp_path):
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"method": "hybrid", "hybrid_arms": ["ngram"]}))
    assert load_options(str(path)).hybrid_arms == ("ngram",)
    path.write_text(json.dumps({"method": "hybrid", "hybrid_arms": ["eagle"]}))
    with pytest.raises(ConfigError, match="hybrid_arms"):
        load_options(str(path))
    path.write_text(json.dumps({"hybrid_arms": "suffix"}))
    with pytest.raises(ConfigError, match="list of names"):
        load_options(str(path))
    with pytest.raises(ConfigError, match="load_threshold"):
        VllmOptions(load_threshold=0.0)
