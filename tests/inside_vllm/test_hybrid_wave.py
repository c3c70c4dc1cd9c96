"""The hybrid in a wave (requests admitted together, nothing joining): the batch lasts as long as its slowest row,
so only rows that could still be the last are offered drafts.  A simulated wave shows the rule saves the
verification the goodput rule spent on rows ahead; the proposer tells a wave from a batch that requests join."""
from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
from hyspec.policy.wave import WAVE_STEPS
from hyspec.vllm import HyspecProposer
from hyspec.vllm.hybrid import VllmHybrid

from tests.inside_vllm.test_hybrid import hybrid_proposer, ngram_chain, step_seconds


def trained_hybrid() -> VllmHybrid:
    """A hybrid that learnt, at batch 1, that ngram chains are accepted at 0.9 a token and drafting pays."""
    hybrid = VllmHybrid(max_num_seqs=256, load_threshold=0.75, explore_interval=0, min_gain=0.02)
    now = 0.0
    for step in range(40):
        chain = {"a": ngram_chain()} if step % 2 else {}
        hybrid.sent(["a"], chain, now)
        now += step_seconds(1 + sum(len(c.tokens) for c in chain.values()))
        hybrid.observe(["a"], [5 if chain else 1], now)
    return hybrid


def test_rows_more_than_a_chain_ahead_of_the_slowest_get_no_draft():
    hybrid = trained_hybrid()
    candidates = {rid: [ngram_chain()] for rid in "abcd"}
    assert set(hybrid.plan(candidates, 4)) == set("abcd")  # as a full batch: every row's chain pays
    remaining = {"a": 40, "b": 41, "c": 20, "d": 45, "e": 42}  # e: a row with nothing to draft
    assert set(hybrid.plan(candidates, 5, remaining)) == {"d"}  # within 4 tokens of the 45 left, more than e's 42
    assert hybrid.wave_steps == 1 and hybrid.wave_cut_tokens == 12
    remaining["e"] = 45  # the row with the most left has nothing to draft: no draft can shorten the wave
    assert hybrid.plan(candidates, 5, remaining) == {}


def simulate_wave(wave_rule: bool, rows: int = 8, max_tokens: int = 48, seed: int = 0,
                  drafting_rows: int = 1) -> tuple[int, float, int]:
    """A wave of ``rows`` requests of ``max_tokens``: every row (``drafting_rows`` 2) or every other one (1) finds
    ngram chains accepted at 0.9 a token, the rest nothing.  Returns (steps, seconds, draft tokens sent) until the
    last row finishes."""
    hybrid, rng = trained_hybrid(), random.Random(seed)
    left = {f"r{i}": max_tokens for i in range(rows)}
    now, steps, sent_tokens, sampled = 0.0, 0, 0, {}
    while left:
        ids = list(left)
        hybrid.observe(ids, [sampled.get(r, 1) for r in ids], now)
        candidates = {rid: [ngram_chain()] for rid in ids if int(rid[1:]) % 2 < drafting_rows}
        sent = hybrid.plan(candidates, len(ids), dict(left) if wave_rule else None)
        hybrid.sent(ids, sent, now)
        drafted = sum(len(c.tokens) for c in sent.values())
        now, steps, sent_tokens = now + step_seconds(len(ids) + drafted), steps + 1, sent_tokens + drafted
        sampled = {}
        for rid in ids:
            accepted = 0
            chain = sent.get(rid)
            while chain is not None and accepted < len(chain.tokens) and rng.random() < 0.9:
                accepted += 1
            sampled[rid] = accepted + 1
            left[rid] -= min(sampled[rid], left[rid])
            if not left[rid]:
                del left[rid]
    return steps, now, sent_tokens


def test_in_a_wave_drafting_rows_ahead_buys_no_step_and_the_rule_stops_it():
    steps_all, seconds_all, sent_all = simulate_wave(wave_rule=False)
    steps_wave, seconds_wave, sent_wave = simulate_wave(wave_rule=True)
    assert steps_all == steps_wave == 48  # the rows with nothing to draft decide the wave's length either way
    assert sent_all > 100 and sent_wave == 0 and seconds_wave < seconds_all


def test_in_a_wave_where_every_row_drafts_the_drafts_still_shorten_it():
    steps_all, _, _ = simulate_wave(wave_rule=False, drafting_rows=2)
    steps_wave, _, sent_wave = simulate_wave(wave_rule=True, drafting_rows=2)
    assert sent_wave > 0 and steps_wave < 48 and steps_wave <= steps_all + 2


class WaveRunner:
    """vLLM's model runner as the proposer reads it, with each request's sampling params (max_tokens)."""

    def __init__(self, proposer: HyspecProposer):
        self.proposer, self.requests = proposer, {}
        self.input_batch = SimpleNamespace(req_ids=[], num_prompt_tokens=np.array([], dtype=np.int64))

    def step(self, ids: list[str], context_len: int = 12) -> list[list[int]]:
        for rid in ids:
            self.requests.setdefault(rid, SimpleNamespace(sampling_params=SimpleNamespace(max_tokens=48)))
        self.input_batch.req_ids = ids
        self.input_batch.num_prompt_tokens = np.array([4] * len(ids))
        context = np.array([[5, 6, 7, 8] * (context_len // 4)] * len(ids), dtype=np.int32)
        return self.propose_draft_token_ids(ids, context)

    def propose_draft_token_ids(self, ids: list[str], context: np.ndarray) -> list[list[int]]:
        return self.proposer.propose([[8]] * len(ids), np.array([context.shape[1]] * len(ids)), context)


def test_the_proposer_plans_a_wave_only_while_nothing_joins_and_below_max_num_seqs():
    assert WAVE_GAP > WAVE_STEPS
    proposer = hybrid_proposer(max_num_seqs=8)
    runner = WaveRunner(proposer)
    for _ in range(3):
        runner.step(["a", "b", "c"])
    assert proposer.stats["hybrid_wave_steps"] == 3
    for _ in range(WAVE_GAP):
        runner.step(["a", "b"])  # c finished: still a wave
    assert proposer.stats["hybrid_wave_steps"] == 3 + WAVE_GAP
    runner.step(["a", "b", "d"])  # d joined long after a and b: not a wave any more
    assert proposer.stats["hybrid_wave_steps"] == 3 + WAVE_GAP

    full = hybrid_proposer(max_num_seqs=2)  # a full batch: a request may be waiting for a row
    WaveRunner(full).step(["a", "b"])
    assert full.stats["hybrid_wave_steps"] == 0
    off = hybrid_proposer(max_num_seqs=8, wave_makespan=False)
    WaveRunner(off).step(["a", "b"])
    assert off.stats["hybrid_wave_steps"] == 0


WAVE_GAP = 5  # steps between the wave's admission and d's: more than the proposer's WAVE_STEPS
