"""Waves in hyspec's engine (hyspec.policy.wave): in a batch admitted together that nothing waits to join, only
the rows that could still finish last are drafted for; outputs stay those of plain decoding."""
from __future__ import annotations

from hyspec import LLM, SamplingParams
from hyspec.policy.wave import WaveTracker, critical_rows
from hyspec.seam.proposer import Proposer

from tests.spec.conftest import PROMPTS

BUDGET = 4


def test_critical_rows_are_near_the_most_left_and_ahead_of_every_undrafted_row():
    remaining = {"a": 40, "b": 41, "c": 20, "d": 45, "e": 42}
    drafts = {"a": 4, "b": 4, "c": 4, "d": 4}  # e: nothing to draft
    assert critical_rows(remaining, drafts) == {"d"}  # within 4 of 45, and more left than e's 42
    assert critical_rows({**remaining, "e": 45}, drafts) == set()  # the last row cannot be sped up
    assert critical_rows({"a": 10, "b": 12}, {"a": 3, "b": 3}) == {"a", "b"}
    assert critical_rows({}, {}) == set()


def test_a_wave_is_requests_first_seen_within_a_few_steps_with_none_joining_after():
    waves = WaveTracker(within_steps=4)
    for _ in range(2):
        waves.follow(["a", "b"])
    waves.follow(["a", "b", "c"])  # c's prompt prefilled a step later: still the same wave
    assert waves.admitted_together()
    for _ in range(5):
        waves.follow(["a", "b"])  # c finished
    assert waves.admitted_together()
    waves.follow(["a", "b", "d"])  # d joined long after
    assert not waves.admitted_together()
    waves.follow(["d"])
    assert waves.admitted_together()


class Recording(Proposer):
    """Wraps a proposer: records the prompts each step asked drafts for; ``silent`` prompts get none."""

    def __init__(self, inner: Proposer, silent: frozenset[str] = frozenset()):
        self.inner, self.silent, self.asked = inner, silent, []
        self.method = inner.method

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, requests, sampling):
        self.asked.append({r.seq.prompt for r in requests})
        drafts = self.inner.propose(requests, sampling)
        return [None if r.seq.prompt in self.silent else d for r, d in zip(requests, drafts)]


def wave_llm(target_dir, wave_makespan: bool = True, **kw) -> LLM:
    """ngram at a fixed budget: the goodput controller stays on (the wave rule is its), its choice pinned so
    that only the wave rule decides who drafts."""
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20, speculative_config={
        "method": "ngram", "num_speculative_tokens": BUDGET, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "controller": {"profile_at_startup": False, "wave_makespan": wave_makespan, "explore_interval": 0}}, **kw)
    llm.engine.spec.controller.choose = lambda method, batch: BUDGET
    return llm


def run(llm: LLM, max_tokens: list[int], silent: frozenset[str] = frozenset()) -> tuple[list, Recording, dict]:
    spec = llm.engine.spec
    spec.proposers["ngram"] = recording = Recording(spec.proposers["ngram"], silent)
    outs = llm.generate(PROMPTS[:len(max_tokens)], [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens])
    return [o.outputs[0].token_ids for o in outs], recording, spec.metrics.snapshot()["totals"]


def test_in_a_wave_a_row_far_ahead_is_never_drafted_for_and_outputs_are_plain(target_dir, plain_outputs):
    llm = wave_llm(target_dir)
    tokens, recording, totals = run(llm, [12, 40, 40])
    assert tokens == [plain_outputs[0][:12], plain_outputs[1][:40], plain_outputs[2][:40]]
    assert set().union(*recording.asked) == set(PROMPTS[1:3])  # the 12-token row is more than a draft ahead
    assert totals["drafts"] > 0
    llm.close()


def test_without_a_wave_every_row_drafts(target_dir, plain_outputs):
    for llm in (wave_llm(target_dir, wave_makespan=False),  # the rule off
                wave_llm(target_dir, max_num_seqs=3)):  # a full batch: a request could be waiting for a row
        tokens, recording, _ = run(llm, [12, 40, 40])
        assert tokens == [plain_outputs[0][:12], plain_outputs[1][:40], plain_outputs[2][:40]]
        assert set().union(*recording.asked) == set(PROMPTS[:3])
        llm.close()


def test_when_the_slowest_row_has_nothing_to_draft_no_row_can_shorten_the_wave(target_dir, plain_outputs):
    llm = wave_llm(target_dir)
    tokens, recording, totals = run(llm, [40, 40, 40], silent=frozenset({PROMPTS[0], PROMPTS[2]}))
    assert tokens == [plain_outputs[i][:40] for i in range(3)]
    assert recording.asked and totals["rejections"].get("off_critical_path", 0) > 0
    assert totals["drafts"] == 0  # the second row's drafts were all cut: the silent rows set the wave's length
    llm.close()


class RowByRow(Recording):
    """A Recording proposer that declares it drafts rows independently: the engine asks one row at a time."""

    drafts_rows_independently = True


def test_a_row_by_row_drafter_is_not_asked_past_a_row_that_ends_the_wave(target_dir, plain_outputs):
    llm = wave_llm(target_dir)
    spec = llm.engine.spec
    spec.proposers["ngram"] = recording = RowByRow(spec.proposers["ngram"], frozenset({PROMPTS[1]}))
    outs = llm.generate(PROMPTS[:3], [SamplingParams(temperature=0, max_tokens=40)] * 3)
    assert [o.outputs[0].token_ids for o in outs] == [plain_outputs[i][:40] for i in range(3)]
    assert recording.asked and all(len(asked) == 1 for asked in recording.asked)  # one row a call
    # rows have equal tokens left, so the engine asks in row order and stops at the silent second row:
    # the third is never asked, and no draft is verified (the first row's is cut: it cannot end the wave early)
    assert {PROMPTS[2]} not in recording.asked and {PROMPTS[1]} in recording.asked
    assert spec.metrics.snapshot()["totals"]["drafts"] == 0
    llm.close()
