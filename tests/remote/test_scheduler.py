"""Adaptive thread partitioning: the policy, the busy meter, and the fixed-cap baseline."""
from __future__ import annotations

import pytest

from hyspec.remote.scheduler import BusyMeter, ThreadPolicy, choose_threads

P = ThreadPolicy(busy_threshold=0.95, min_cores=4, deadline_s=0.05)


def test_idle_worker_holds_the_floor():
    assert choose_threads(P, current=16, cores=16, busy=0.5, queued=0, draft_seconds=0.0) == 4


def test_saturated_target_cuts_to_the_floor_not_below():
    assert choose_threads(P, 16, 16, busy=0.97, queued=8, draft_seconds=0.04) == 4


def test_busy_below_threshold_keeps_cores():
    # 0.9 busy cut drafters to 2 cores in the field report; with threshold 0.95 it does not cut at all.
    assert choose_threads(P, 16, 16, busy=0.9, queued=8, draft_seconds=0.02) == 16


def test_queue_pressure_grows_and_shrinks_within_bounds():
    grown = choose_threads(P, 4, 16, busy=0.5, queued=8, draft_seconds=0.04)  # 80 % of the deadline
    assert grown == 6
    assert choose_threads(P, 14, 16, 0.5, 8, 0.04) == 16  # never above the cores
    assert choose_threads(P, 8, 16, 0.5, 8, 0.001) == 7  # cheap drafts give a thread back
    assert choose_threads(P, 4, 16, 0.5, 8, 0.001) == 4  # ... never below the floor
    assert choose_threads(P, 8, 16, 0.5, 8, 0.015) == 8  # in between: hold


def test_floor_above_the_node_is_the_node():
    assert choose_threads(P, 1, 2, busy=0.99, queued=3, draft_seconds=0.0) == 2


def test_fixed_cap_ignores_load():
    fixed = ThreadPolicy(min_cores=4, deadline_s=0.05, fixed=2)
    for busy, queued, t in [(0.1, 8, 0.049), (0.99, 0, 0.0)]:
        assert choose_threads(fixed, 16, 16, busy, queued, t) == 2
    assert choose_threads(ThreadPolicy(fixed=8), 1, 4, 0.0, 1, 0.0) == 4


@pytest.mark.parametrize("kw", [{"busy_threshold": 0.0}, {"busy_threshold": 1.5}, {"min_cores": 0},
                                {"deadline_s": 0}, {"fixed": 0}])
def test_policy_validates(kw):
    with pytest.raises(ValueError):
        ThreadPolicy(**kw)


def test_busy_meter_from_step_cycles():
    m = BusyMeter(alpha=1.0)
    m.on_draft(0.0, 0.01)
    m.on_draft(0.10, 0.11)  # 10 ms drafting, 90 ms target in a 100 ms cycle
    assert m.value == pytest.approx(0.9)
    m.on_draft(5.0, 5.01)  # a 4.9 s pause is the engine idling: ignored
    assert m.value == pytest.approx(0.9)


def test_busy_meter_prefers_reported_forward_time():
    m = BusyMeter(alpha=1.0)
    m.on_draft(0.0, 0.01)
    m.observe_forward(0.05)
    m.on_draft(0.10, 0.11)
    assert m.value == pytest.approx(0.5)
