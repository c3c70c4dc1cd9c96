"""Whether drafting pays (hyspec.policy.draft_value): a scored method that spends more time drafting than its drafts
are expected to save drafts one step in PROBE_EVERY, and every step again once they pay."""
from __future__ import annotations

from hyspec.policy.controller import GoodputController
from hyspec.policy.draft_value import MIN_SAMPLES, PROBE_EVERY, DraftingValue
from hyspec.spec.config import SpeculativeConfig


def drafting_steps(tracker: DraftingValue, steps: int, cost: float, value: float) -> int:
    """``steps`` steps of a method whose drafting costs ``cost`` and saves ``value``: how many drafted."""
    drafted = 0
    for _ in range(steps):
        if tracker.should_draft():
            tracker.expect(value)
            tracker.drafted(cost)
            drafted += 1
    return drafted


def test_drafting_that_saves_less_than_it_costs_is_probed_one_step_in_sixteen():
    tracker = DraftingValue()
    assert drafting_steps(tracker, MIN_SAMPLES, cost=3e-4, value=0.0) == MIN_SAMPLES  # measured before judged
    assert not tracker.pays()
    assert drafting_steps(tracker, 10 * PROBE_EVERY, cost=3e-4, value=0.0) == 10
    assert tracker.skipped == 10 * PROBE_EVERY - 10


def test_drafting_that_pays_drafts_every_step_and_recovers_after_a_bad_spell():
    tracker = DraftingValue()
    assert drafting_steps(tracker, 100, cost=3e-4, value=2e-3) == 100
    drafting_steps(tracker, 200, cost=3e-4, value=0.0)  # the workload stops repeating itself
    assert not tracker.pays()
    drafting_steps(tracker, 60 * PROBE_EVERY, cost=3e-4, value=2e-3)  # ... and starts again: the probes see it
    assert tracker.pays() and drafting_steps(tracker, 50, cost=3e-4, value=2e-3) == 50


def test_a_step_without_an_expected_saving_counts_as_none():
    tracker = DraftingValue()
    tracker.expect(1e-3)
    tracker.drafted(1e-4)
    tracker.drafted(1e-4)  # the sizer kept nothing this step: no expect() call
    assert tracker.value < 1e-3 and tracker.samples == 2


def test_the_controller_always_drafts_when_it_is_off():
    off = GoodputController(SpeculativeConfig.from_dict({"method": "suffix", "controller": {"enabled": False}}))
    tracker = off.drafting_value("suffix")
    drafting_steps(tracker, 100, cost=1.0, value=0.0)
    assert all(off.should_draft("suffix") for _ in range(50))
