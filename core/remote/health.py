"""Worker health: a ping every interval from a background thread, failover and rejoin.

State of a worker (:class:`WorkerSlot`)::

    joining --one ok--> up --max_missed misses--> down --rejoin_after consecutive oks--> up
       any --new incarnation with a foreign drafter--> incompatible --new compatible incarnation--> up

A ping counts as missed when its answer has not arrived by the next tick
(one interval later) or it failed.  ``down`` routes the worker's sequences
to local drafting at the next step; ``up`` again routes them back.  A new
incarnation (the actor restarted) means its sequence histories are gone:
they are resent in full.  The monitor holds no reference to the proposer,
so a forgotten engine is still collected (its finalizer stops the thread).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from hyspec.remote.metrics import RemoteMetrics
from hyspec.remote.transport import WorkerGone, WorkerHandle, runtime_up

log = logging.getLogger(__name__)

JOINING, UP, DOWN, INCOMPATIBLE = "joining", "up", "down", "incompatible"
TIMEOUT_EWMA_ALPHA = 0.1


class WorkerSlot:
    """The target's view of one worker (fields guarded by the proposer's lock)."""

    def __init__(self, handle: WorkerHandle):
        self.handle = handle
        self.name = handle.name
        self.state = JOINING
        self.problem: str | None = None
        self.incarnation: str | None = None
        self.misses = 0
        self.successes = 0
        self.last_ok = time.monotonic()
        self.down_at: float | None = None  # when the last failover was declared
        self.stats: dict[str, Any] = {}
        self.sent: dict[str, int] = {}  # request id -> history tokens this incarnation has received
        self.assigned = 0
        self.releases: list[str] = []
        self.threads: int | None = None
        self.scheduler: Any = None  # its ThreadScheduler, made once its core count is known
        self.timeout_ewma = 0.0
        self._ping: Any = None
        self._ping_age = 0

    @property
    def cores(self) -> int:
        return int(self.stats.get("cores", 1))

    def note_call(self, timed_out: bool) -> None:
        self.timeout_ewma += TIMEOUT_EWMA_ALPHA * (float(timed_out) - self.timeout_ewma)

    def score(self, max_missed: int) -> float:
        if self.state != UP:
            return 0.0
        return max(0.0, 1.0 - self.misses / max_missed) * (1.0 - self.timeout_ewma)


class HealthMonitor:
    def __init__(self, slots: list[WorkerSlot], lock: threading.Lock, metrics: RemoteMetrics, interval_s: float,
                 max_missed: int, compatible: Callable[[dict], str | None], rejoin_after: int = 2):
        self.slots = slots
        self.lock = lock
        self.metrics = metrics
        self.interval_s = interval_s
        self.max_missed = max_missed
        self.rejoin_after = rejoin_after
        self.compatible = compatible  # stats -> why the worker's drafter cannot serve this target, or None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hyspec-remote-health", daemon=True)
        self.runtime_gone = False  # set once by runtime_lost(): no worker can answer again

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.interval_s + 1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for slot in self.slots:
                if not runtime_up(slot.handle):
                    self.runtime_lost(f"{type(slot.handle).__name__}: the runtime is not running in this process")
                    return
                try:
                    self.tick(slot)
                except Exception:  # the monitor must outlive any one bad answer
                    log.exception("health check of %s failed", slot.name)

    def runtime_lost(self, why: str) -> None:
        """The workers' runtime went away (e.g. ``ray.shutdown()`` under a live engine): every worker is
        down for good, pings stop, and one warning says so; later calls are no-ops."""
        with self.lock:
            if self.runtime_gone:
                return
            self.runtime_gone = True
            now = time.monotonic()
            for slot in self.slots:
                if slot.state != DOWN:
                    slot.state, slot.down_at = DOWN, now
                    self.metrics.observe_failover(now - slot.last_ok)
        for slot in self.slots:
            self.metrics.set_worker(slot.name, up=0.0)
        log.warning("remote drafting stopped: the workers' runtime is gone (%s); drafting continues with the local "
                    "fallback method (plain steps if it is \"none\") for this engine's life", why)
        self._stop.set()

    def tick(self, slot: WorkerSlot) -> None:
        """Collect the previous ping's answer (or count a miss) and send the next ping."""
        pending = slot._ping
        if pending is not None:
            try:
                answered = pending.done()
            except Exception as exc:  # the transport itself failed: a miss, asked again next tick
                slot._ping = None
                self.miss(slot, f"ping failed: {type(exc).__name__}: {exc}")
                return
            if answered:
                slot._ping = None
                try:
                    self.ok(slot, pending.result(0))
                except (WorkerGone, TimeoutError) as exc:
                    self.miss(slot, str(exc))
            else:
                slot._ping_age += 1
                self.miss(slot, "no answer within the ping interval")
                if slot._ping_age > self.max_missed:  # a ping lost in a restart never answers: ask again
                    slot._ping = None
        if slot._ping is None:
            try:
                slot._ping, slot._ping_age = slot.handle.ping(), 0
            except Exception as exc:
                self.miss(slot, f"ping not sent: {exc}")

    def ok(self, slot: WorkerSlot, stats: dict) -> None:
        with self.lock:
            slot.misses = 0
            slot.stats = stats
            slot.last_ok = time.monotonic()
            if stats.get("incarnation") != slot.incarnation:
                if slot.incarnation is not None:
                    self.metrics.add("worker_restarts")
                    log.warning("draft worker %s restarted: resending sequence histories", slot.name)
                slot.incarnation = stats.get("incarnation")
                slot.sent.clear()
                slot.releases.clear()
                problem = self.compatible(stats)
                if problem is not None:
                    if slot.state != INCOMPATIBLE:
                        self.metrics.add("incompatible_workers")
                        log.error("draft worker %s cannot serve this target: %s", slot.name, problem)
                    slot.state, slot.problem = INCOMPATIBLE, problem
                    self.metrics.set_worker(slot.name, up=0.0, misses=0)
                    return
                slot.problem = None
                if slot.state == INCOMPATIBLE:
                    slot.state = DOWN
            slot.successes += 1
            if slot.state == JOINING:
                slot.state = UP
            elif slot.state == DOWN and slot.successes >= self.rejoin_after:  # hysteresis against flapping
                self.metrics.add("rejoins")
                log.warning("draft worker %s is healthy again: its sequences draft remotely", slot.name)
                slot.state = UP
        self.metrics.set_worker(slot.name, threads=stats.get("threads", 0), cpu_util=stats.get("cpu_util", 0.0),
                                cores_used=stats.get("cores_used", 0.0), up=float(slot.state == UP), misses=0,
                                spec_hits=stats.get("spec_hits", 0), spec_misses=stats.get("spec_misses", 0))

    def miss(self, slot: WorkerSlot, why: str) -> None:
        with self.lock:
            slot.misses += 1
            slot.successes = 0
            if slot.state == UP and slot.misses >= self.max_missed:
                slot.state = DOWN
                slot.down_at = time.monotonic()
                detect = slot.down_at - slot.last_ok
                self.metrics.observe_failover(detect)
                log.warning("draft worker %s missed %d pings (%s): its sequences draft locally", slot.name,
                            slot.misses, why)
        self.metrics.set_worker(slot.name, up=float(slot.state == UP), misses=slot.misses)
