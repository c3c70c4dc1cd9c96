"""Ping-based failover and rejoin, driven tick by tick with a scripted worker."""
from __future__ import annotations

import threading
from concurrent.futures import Future

from hyspec.remote.health import DOWN, INCOMPATIBLE, JOINING, UP, HealthMonitor, WorkerSlot
from hyspec.remote.metrics import RemoteMetrics
from hyspec.remote.transport import FuturePending, WorkerGone


class ScriptedWorker:
    """Answers pings with whatever the test sets: stats, an error, or silence."""

    name = "w0"

    def __init__(self):
        self.mode = "ok"
        self.incarnation = "one"
        self.fingerprint = "fp"

    def ping(self):
        f: Future = Future()
        if self.mode == "ok":
            f.set_result({"incarnation": self.incarnation, "fingerprint": self.fingerprint, "threads": 2,
                          "cpu_util": 0.5})
        elif self.mode == "dead":
            f.set_exception(WorkerGone("actor died"))
        return FuturePending(f)  # "silent": never resolves


def _monitor(worker, max_missed=3, rejoin_after=2):
    slot = WorkerSlot(worker)
    metrics = RemoteMetrics("draft_model")
    compat = lambda stats: None if stats.get("fingerprint") == "fp" else "foreign tokenizer"  # noqa: E731
    mon = HealthMonitor([slot], threading.Lock(), metrics, 0.2, max_missed, compat, rejoin_after)
    return slot, mon, metrics


def test_joins_on_first_answer_then_fails_over_after_three_misses():
    w = ScriptedWorker()
    slot, mon, metrics = _monitor(w)
    assert slot.state == JOINING
    mon.tick(slot)  # sends the first ping
    mon.tick(slot)  # collects it
    assert slot.state == UP and slot.score(3) == 1.0
    w.mode = "dead"
    mon.tick(slot)  # collects the answer sent before the death
    assert slot.state == UP
    mon.tick(slot)
    mon.tick(slot)
    assert slot.state == UP and slot.misses == 2 and 0 < slot.score(3) < 1
    mon.tick(slot)
    assert slot.state == DOWN and slot.misses == 3
    assert metrics.snapshot()["failovers"] == 1 and slot.score(3) == 0.0


def test_silence_counts_as_misses():
    w = ScriptedWorker()
    slot, mon, metrics = _monitor(w)
    mon.tick(slot)
    mon.tick(slot)
    w.mode = "silent"
    mon.tick(slot)  # collects the last good answer, sends a ping that never answers
    for _ in range(3):
        mon.tick(slot)
    assert slot.state == DOWN
    assert len(metrics.snapshot()["failover_seconds"]) == 1


def test_rejoin_needs_consecutive_good_pings_and_new_incarnation_resends_histories():
    w = ScriptedWorker()
    slot, mon, metrics = _monitor(w, rejoin_after=2)
    mon.tick(slot)
    mon.tick(slot)
    slot.sent["r1"] = 10
    w.mode = "dead"
    while slot.state != DOWN:
        mon.tick(slot)
    w.mode, w.incarnation = "ok", "two"  # Ray restarted the actor
    mon.tick(slot)
    mon.tick(slot)
    assert slot.state == DOWN and slot.sent == {}  # one good ping is not enough; histories must be resent
    mon.tick(slot)
    assert slot.state == UP and metrics.snapshot()["rejoins"] == 1


def test_foreign_drafter_is_incompatible_until_replaced():
    w = ScriptedWorker()
    w.fingerprint = "other"
    slot, mon, metrics = _monitor(w)
    mon.tick(slot)
    mon.tick(slot)
    assert slot.state == INCOMPATIBLE and "foreign" in slot.problem
    mon.tick(slot)
    assert metrics.snapshot()["incompatible_workers"] == 1  # counted once
    w.fingerprint, w.incarnation = "fp", "fixed"
    for _ in range(3):
        mon.tick(slot)
    assert slot.state == UP


def test_monitor_thread_starts_and_stops():
    w = ScriptedWorker()
    slot, mon, _ = _monitor(w)
    mon.interval_s = 0.01
    mon.start()
    try:
        for _ in range(200):
            if slot.state == UP:
                break
            threading.Event().wait(0.01)
        assert slot.state == UP
    finally:
        mon.stop()
    assert not mon._thread.is_alive()
