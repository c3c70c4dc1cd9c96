"""Adaptive thread partitioning: floor rules, the measured hill climb, the fixed-cap baseline, busy meter."""
from __future__ import annotations

import pytest

from hyspec.remote.scheduler import EXPLORE_EVERY, TRIAL_CALLS, BusyMeter, ThreadPolicy, ThreadScheduler

P = ThreadPolicy(busy_threshold=0.95, min_cores=4)


def run(s: ThreadScheduler, cost_per_token, calls: int, busy: float = 0.5) -> list[int]:
    """Drive ``calls`` draft calls whose compute cost per token is ``cost_per_token(threads)``."""
    seen = []
    for _ in range(calls):
        t = s.choose(busy, queued=8)
        s.observe(t, cost_per_token(t) * 32, tokens=32)
        seen.append(t)
    return seen


def test_idle_or_saturated_target_gets_the_floor_never_below():
    s = ThreadScheduler(P, cores=16)
    assert s.choose(busy=0.5, queued=0) == 4
    assert s.choose(busy=0.97, queued=8) == 4
    # 0.9 busy cut drafters to 2 cores in the field report; with threshold 0.95 nothing is cut
    assert s.choose(busy=0.9, queued=8) == 16


def test_floor_above_the_node_is_the_node():
    s = ThreadScheduler(P, cores=2)
    assert s.floor == 2 and run(s, lambda t: 1.0, 50) == [2] * 50


def test_compute_bound_drafts_keep_all_cores():
    s = ThreadScheduler(ThreadPolicy(min_cores=1), cores=16)
    seen = run(s, lambda t: 1.0 / t, 200)  # perfect scaling: every trial of fewer threads is worse
    assert seen[-1] == 16 and seen.count(16) > 0.8 * len(seen)


def test_oversubscribed_host_sheds_threads_to_the_floor():
    s = ThreadScheduler(ThreadPolicy(min_cores=2), cores=16)
    run(s, lambda t: 1.0 + 0.5 * t, 400)  # every extra thread waits at barriers: cost grows with threads
    assert s.current == 2


def test_flat_cost_prefers_fewer_threads():
    s = ThreadScheduler(ThreadPolicy(min_cores=1), cores=8)
    run(s, lambda t: 1.0 if t >= 3 else 2.0, 600)  # scales to 3 threads, flat after
    assert s.current == 3


def test_trials_are_short_and_spaced():
    s = ThreadScheduler(ThreadPolicy(min_cores=1), cores=8)
    seen = run(s, lambda t: 1.0 / t, 2 * TRIAL_CALLS + EXPLORE_EVERY + TRIAL_CALLS + 2 * EXPLORE_EVERY)
    assert seen[:TRIAL_CALLS] == [8] * TRIAL_CALLS  # all cores, then an early probe one step down (8 - 8 // 4)
    assert seen[TRIAL_CALLS:2 * TRIAL_CALLS] == [6] * TRIAL_CALLS
    rest = seen[2 * TRIAL_CALLS:]  # the probe lost: back to 8 for EXPLORE_EVERY calls, probe again, then wait 2x
    assert rest[:EXPLORE_EVERY] == [8] * EXPLORE_EVERY
    assert rest[EXPLORE_EVERY:EXPLORE_EVERY + TRIAL_CALLS] == [6] * TRIAL_CALLS
    assert rest[EXPLORE_EVERY + TRIAL_CALLS:] == [8] * (2 * EXPLORE_EVERY)


def test_fixed_cap_ignores_load():
    s = ThreadScheduler(ThreadPolicy(min_cores=4, fixed=2), cores=16)
    assert {s.choose(b, q) for b, q in [(0.1, 8), (0.99, 0), (0.5, 3)]} == {2}
    assert ThreadScheduler(ThreadPolicy(fixed=8), cores=4).choose(0.0, 1) == 4


@pytest.mark.parametrize("kw", [{"busy_threshold": 0.0}, {"busy_threshold": 1.5}, {"min_cores": 0}, {"fixed": 0}])
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


def test_an_abandoned_call_triggers_a_probe_at_once():
    s = ThreadScheduler(ThreadPolicy(min_cores=1), cores=8)
    assert s.choose(0.5, 8) == 8
    s.observe(8, 0.5, 16, abandoned=True)
    assert s.choose(0.5, 8) == 6


def test_a_clearly_worse_trial_ends_after_one_call():
    s = ThreadScheduler(ThreadPolicy(min_cores=1), cores=8)
    run(s, lambda t: 1.0, TRIAL_CALLS)  # home cost measured at 8 threads
    assert s.choose(0.5, 8) == 6
    s.observe(6, 10.0 * 32, 32)  # ten times worse
    assert s.choose(0.5, 8) == 8
