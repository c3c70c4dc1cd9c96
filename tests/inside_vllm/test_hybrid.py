"""The hybrid inside vLLM: from synthetic step times (a fixed 60 ms plus 11 ms per token scored: vLLM's CPU step
with a dear token; it measured ~4-5 ms a token here, which moves the thresholds, not the logic) and a known
acceptance, it drafts where a drafted token returns more than it costs and not where
it does not; what one batch size taught decides the next from its first step; which steps teach the cost; the
load fallback; the per-batch-size decisions on the metrics port; the options."""
from __future__ import annotations

import json
import random
from types import SimpleNamespace

import numpy as np
import pytest

from hyspec.errors import ConfigError
from hyspec.vllm import HyspecProposer, VllmOptions, load_options
from hyspec.vllm.hybrid import NGRAM_SOURCE, Candidate, VllmHybrid, batch_class

FIXED, PER_TOKEN = 0.060, 0.011  # seconds: a step's fixed part, and each token it scores


def step_seconds(tokens: int) -> float:
    return FIXED + PER_TOKEN * tokens


def ngram_chain(k: int = 4, match: int = 3) -> Candidate:
    return Candidate("ngram", tuple(range(100, 100 + k)), (1.0,) * k, NGRAM_SOURCE, match)


def suffix_chain(conditional: float, k: int = 4, source: int = 0) -> Candidate:
    return Candidate("suffix", tuple(range(200, 200 + k)), (conditional,) * k, source, 8)


class Simulation:
    """vLLM's loop around the hybrid: each step takes step_seconds(rows + drafts sent); each sent token is
    accepted with ``accept(chain)`` given the ones before it were."""

    def __init__(self, hybrid: VllmHybrid, accept=lambda chain: 0.7, seed: int = 0):
        self.hybrid, self.accept, self.rng = hybrid, accept, random.Random(seed)
        self.now, self.sampled = 0.0, {}

    def step(self, rows: int, chains=lambda rid: [ngram_chain()]) -> dict[str, Candidate]:
        ids = [f"r{i}" for i in range(rows)]
        self.hybrid.observe(ids, [self.sampled.get(r, 1) for r in ids], self.now)
        sent = self.hybrid.plan({rid: chains(rid) for rid in ids}, rows)
        self.hybrid.sent(ids, sent, self.now)
        self.now += step_seconds(rows + sum(len(c.tokens) for c in sent.values()))
        self.sampled = {}
        for rid, chain in sent.items():
            accepted = 0
            while accepted < len(chain.tokens) and self.rng.random() < self.accept(chain):
                accepted += 1
            self.sampled[rid] = accepted + 1
        return sent


def drafted_share(sends: list[dict]) -> float:
    return sum(bool(s) for s in sends) / len(sends)


def test_drafting_pays_at_batch_1_and_is_turned_off_at_batch_32():
    """Acceptance 0.7 per token: at batch 1 a drafted token (11 ms) against a 71 ms step pays down the chain; at
    batch 32 a token must be accepted with P > ~0.85 to pay for itself, so no draft is sent but the probes."""
    sim = Simulation(VllmHybrid(max_num_seqs=256, load_threshold=0.75, explore_interval=64, min_gain=0.02))
    at_1 = [sim.step(1) for _ in range(60)]
    assert drafted_share(at_1[10:]) == 1.0
    assert np.mean([len(c.tokens) for s in at_1[10:] for c in s.values()]) >= 2  # 0.7^3 = 0.34 > 11/71
    at_32 = [sim.step(32) for _ in range(130)]
    assert drafted_share(at_32) <= 3 / 130  # the probes (one row each, every 64 steps)
    assert all(len(s) <= 1 for s in at_32)
    # at batch 1 one plain step was taken to measure the cost (the first steps all drafted whole chains)
    assert sim.hybrid.decisions[("1", True)] == 59 and sim.hybrid.cost_probes == 1
    assert sim.hybrid.decisions[("17-32", False)] >= 127


def test_batch_8_keeps_the_tokens_that_pay_and_cuts_the_rest():
    """At batch 8 a step is ~150 ms for 8 tokens: a token pays when P > ~0.6 (~0.65 once eight are sent), so of
    chains accepted at 0.75 per token the first token is sent and the second (0.56) is not."""
    sim = Simulation(VllmHybrid(max_num_seqs=256, load_threshold=0.75, explore_interval=64, min_gain=0.02),
                     accept=lambda chain: 0.75)
    for _ in range(40):
        sim.step(1)
    sends = [sim.step(8) for _ in range(40)]
    lengths = [len(c.tokens) for s in sends[5:] for c in s.values()]
    assert drafted_share(sends[5:]) == 1.0 and lengths and set(lengths) == {1}


def test_what_batch_1_taught_decides_batch_32_from_its_first_step():
    """One cost model for every batch size, in the tokens a step scores: no batch-32 step is spent learning."""
    sim = Simulation(VllmHybrid(max_num_seqs=256, load_threshold=0.75, explore_interval=64, min_gain=0.02))
    for _ in range(60):
        sim.step(1)
    assert sim.step(32) == {}


def test_drafts_that_are_accepted_whole_are_sent_even_at_batch_32():
    """The auto-off is the cost against the acceptance, not a batch-size cut-off: a row re-running an earlier
    answer (its suffix chain sure and always accepted) pays at batch 32 too."""
    sim = Simulation(VllmHybrid(max_num_seqs=256, load_threshold=0.75, explore_interval=64, min_gain=0.02),
                     accept=lambda chain: 1.0 if chain.method == "suffix" else 0.3)
    sure = {"r0", "r1", "r2", "r3"}
    chains = lambda rid: [ngram_chain()] + ([suffix_chain(1.0, source=1)] if rid in sure else [])  # noqa: E731
    for _ in range(40):
        sim.step(1, chains)
        sim.step(2, chains)
    sends = [sim.step(32, chains) for _ in range(30)]
    assert all(set(s) == sure and all(c.method == "suffix" and len(c.tokens) == 4 for c in s.values())
               for s in sends[2:])


def test_each_row_keeps_the_arm_with_the_likelier_chain():
    hybrid = VllmHybrid(max_num_seqs=256, load_threshold=0.75, explore_interval=64, min_gain=0.02)
    ngram, suffix = ngram_chain(), suffix_chain(0.3)
    for _ in range(30):  # ngram's chains accepted whole, suffix's low-estimate ones rejected at once
        for chain, n in ((ngram, 5), (suffix, 1)):
            hybrid.sent(["a"], {"a": chain}, 0.0)
            hybrid.observe(["a"], [n], 0.0)
    assert hybrid.plan({"a": [suffix, ngram]}, 1)["a"].method == "ngram"


def test_a_step_where_a_request_joined_or_prefilled_teaches_no_cost():
    hybrid = VllmHybrid(max_num_seqs=8, load_threshold=0.75, explore_interval=64, min_gain=0.02)
    hybrid.sent(["a"], {"a": ngram_chain()}, 0.0)
    hybrid.observe(["a", "b"], [3, 1], now=1.0)  # b joined: its prefill was in that step
    hybrid.sent(["a", "b"], {}, 1.0)
    hybrid.observe(["a", "b"], [1, 0], now=2.0)  # b is still prefilling
    assert not hybrid.cost_terms() and hybrid.cost._online == type(hybrid.cost._online)(maxlen=256)
    # the acceptance of a's chain (2 of 4) was learnt all the same: positions 0 and 1 accepted, 2 rejected
    assert hybrid.calibration.acceptance(ngram_chain().cells()[0]) == pytest.approx((2 + 0.9 * 2) / (3 + 2), abs=0.01)
    hybrid.sent(["a", "b"], {}, 2.0)
    hybrid.observe(["a", "b"], [1, 1], now=2.1)
    assert len(hybrid.cost._online) == 1
    # the learnt steps are kept as (rows, draft tokens sent, seconds) for the A/B script's verify-cost fit
    hybrid.sent(["a", "b"], {"a": ngram_chain()}, 2.1)
    hybrid.observe(["a", "b"], [2, 1], now=2.35)
    assert [(r, d) for r, d, _ in hybrid.step_log] == [(2, 0), (2, 4)]
    assert [s for *_, s in hybrid.step_log] == pytest.approx([0.1, 0.25])


def test_after_explore_interval_steps_without_drafts_one_row_is_probed():
    hybrid = VllmHybrid(max_num_seqs=256, load_threshold=0.75, explore_interval=4, min_gain=0.02)
    hybrid.sent(["a"], {}, 0.0)
    hybrid.observe(["a"], [1], 0.5)  # a step of one token: 0.5 s
    hybrid.sent(["a"], {"a": ngram_chain()}, 0.5)
    hybrid.observe(["a"], [1], 2.5)  # a step of five tokens: 2 s, and the chain rejected
    plans = [hybrid.plan({"a": [ngram_chain()], "b": [ngram_chain(2)]}, 2) for _ in range(8)]
    assert [bool(p) for p in plans] == [False, False, False, True] * 2
    assert plans[3] == {"a": ngram_chain()} and hybrid.probes == 2


def test_batch_classes():
    assert [batch_class(n) for n in (1, 2, 4, 5, 8, 9, 16, 17, 32, 33, 256)] == \
        ["1", "2-4", "2-4", "5-8", "5-8", "9-16", "9-16", "17-32", "17-32", "33+", "33+"]


def hybrid_proposer(max_num_seqs: int = 4, **options) -> HyspecProposer:
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                             model_config=SimpleNamespace(max_model_len=256),
                             scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))
    return HyspecProposer(config, VllmOptions(method="hybrid", **options))


class Runner:  # vLLM's model runner, as far as the proposer reads it
    REP = [5, 6, 7, 8, 5, 6, 7]

    def __init__(self, proposer: HyspecProposer, ids: list[str]):
        self.proposer = proposer
        self.input_batch = SimpleNamespace(req_ids=ids, num_prompt_tokens=np.array([1] * len(ids)))

    def propose_draft_token_ids(self, n: int) -> list[list[int]]:
        ids = np.array([self.REP] * n, dtype=np.int32)
        return self.proposer.propose([[7]] * n, np.array([len(self.REP)] * n), ids)


def test_no_drafts_above_the_load_threshold():
    proposer = hybrid_proposer(load_threshold=0.5)
    assert Runner(proposer, ["a", "b", "c"]).propose_draft_token_ids(3) == [[], [], []]  # 3 rows > 0.5 x 4
    assert proposer.stats["load_fallback_steps"] == 1 and proposer.stats["hybrid_batch_2-4_plain"] == 1


def test_the_decisions_per_batch_size_and_the_cost_fit_are_scrapeable():
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from hyspec.vllm.metrics import collector

    proposer = hybrid_proposer()
    runner = Runner(proposer, ["a"])
    # suffix drafts at most its match's length (3: 5 6 7), ngram the whole budget: ngram's longer chain is kept
    assert runner.propose_draft_token_ids(1) == [[8, 5, 6, 7]]
    registry = CollectorRegistry()
    registry.register(collector(lambda: proposer.stats, proposer.gauges))
    text = generate_latest(registry).decode()
    assert 'hyspec_vllm_hybrid_decisions_total{batch="1",drafted="true"} 1.0' in text
    assert 'hyspec_vllm_hybrid_decisions_total{batch="17-32",drafted="false"} 0.0' in text
    assert 'hyspec_vllm_hybrid_steps_total{arm="ngram"} 1.0' in text
    assert "hyspec_vllm_propose_seconds_total" in text
    assert 'hyspec_vllm_step_cost_seconds' in text
    assert proposer.stats["drafts_own"] == 0 and proposer.stats["drafted_tokens"] == 4


def test_hybrid_options_from_the_file(tmp_path):
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"method": "hybrid", "hybrid_arms": ["ngram"], "explore_interval": 0,
                                "min_gain": 0.1}))
    options = load_options(str(path))
    assert (options.hybrid_arms, options.explore_interval, options.min_gain) == (("ngram",), 0, 0.1)
    path.write_text(json.dumps({"method": "hybrid", "hybrid_arms": ["eagle"]}))
    with pytest.raises(ConfigError, match="hybrid_arms"):
        load_options(str(path))
    path.write_text(json.dumps({"hybrid_arms": "suffix"}))
    with pytest.raises(ConfigError, match="list of names"):
        load_options(str(path))
    path.write_text(json.dumps({"method": "hybrid", "bandit_explore_fraction": 0.1}))  # the bandit is gone
    with pytest.raises(ConfigError, match="unknown option") as err:
        load_options(str(path))
    assert err.value.key == "bandit_explore_fraction"
    with pytest.raises(ConfigError, match="load_threshold"):
        VllmOptions(load_threshold=0.0)
    with pytest.raises(ConfigError, match="explore_interval"):
        VllmOptions(explore_interval=-1)
    with pytest.raises(ConfigError, match="min_gain"):
        VllmOptions(min_gain=-0.5)
