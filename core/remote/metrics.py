"""Remote-drafting metrics: plain counters on the hot path, Prometheus families at scrape time.

    hyspec_remote_calls / _steps                       counters   calls to workers, drafting steps
    hyspec_remote_bytes_sent / _bytes_received         counters   exact message bytes
    hyspec_remote_draft_timeouts                       counter    sequence drafts lost to the deadline
    hyspec_remote_failovers / _rejoins                 counters   worker down / back
    hyspec_remote_worker_restarts                      counter    new worker incarnations seen (a restarted process)
    hyspec_remote_invalid_drafts {kind}                counter    garbage from workers, by problem
    hyspec_remote_drafts {source}                      counter    drafts served: remote, pipelined, fallback
    hyspec_remote_rtt_seconds                          histogram  call round trip (submit -> answer)
    hyspec_remote_failover_seconds                     gauge      last detection time (last good ping -> down)
    hyspec_remote_health, hyspec_remote_target_busy    gauges
    hyspec_remote_worker_threads / _cpu_utilisation / _up / _missed_pings {worker}   gauges

Every family carries a ``method`` label (one RemoteProposer per method).
"""
from __future__ import annotations

import bisect
import threading
import weakref
from collections import defaultdict
from typing import Any, Iterator

RTT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
COUNTERS = ("calls", "steps", "bytes_sent", "bytes_received", "draft_timeouts", "failovers", "rejoins",
            "worker_restarts", "resyncs", "worker_errors", "connect_failures", "incompatible_workers")
SOURCES = ("remote", "pipelined", "fallback")


class RemoteMetrics:
    def __init__(self, method: str):
        self.method = method
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Start counting afresh (a benchmark's measured phase after its warm-up)."""
        with self._lock:
            self._zero()

    def _zero(self) -> None:
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.invalid: dict[str, int] = defaultdict(int)
        self.drafts = dict.fromkeys(SOURCES, 0)
        self._rtt_counts = [0] * (len(RTT_BUCKETS) + 1)
        self._rtt_sum = 0.0
        self.failover_seconds: list[float] = []
        self.health = 1.0
        self.target_busy = 0.0
        self.workers: dict[str, dict[str, Any]] = {}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def add_drafts(self, source: str, n: int) -> None:
        with self._lock:
            self.drafts[source] += n

    def add_invalid(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.invalid[kind] += n

    def observe_call(self, rtt: float, sent: int, received: int) -> None:
        with self._lock:
            self._rtt_counts[bisect.bisect_left(RTT_BUCKETS, rtt)] += 1
            self._rtt_sum += rtt
            self.counters["bytes_sent"] += sent
            self.counters["bytes_received"] += received

    def observe_failover(self, detect_seconds: float) -> None:
        with self._lock:
            self.counters["failovers"] += 1
            self.failover_seconds.append(detect_seconds)

    def set_worker(self, name: str, **fields: Any) -> None:
        with self._lock:
            self.workers.setdefault(name, {}).update(fields)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            running, buckets = 0, []
            for bound, n in zip((*RTT_BUCKETS, float("inf")), self._rtt_counts):
                running += n
                buckets.append([bound, running])
            steps = self.counters["steps"]
            return {
                "method": self.method,
                **self.counters,
                "bytes_per_step": (self.counters["bytes_sent"] + self.counters["bytes_received"]) / steps
                if steps else 0.0,
                "invalid_drafts": dict(self.invalid),
                "drafts": dict(self.drafts),
                "rtt_seconds": {"count": running, "sum": self._rtt_sum, "buckets": buckets,
                                "mean": self._rtt_sum / running if running else 0.0},
                "failover_seconds": list(self.failover_seconds),
                "health": self.health,
                "target_busy": self.target_busy,
                "workers": {k: dict(v) for k, v in self.workers.items()},
            }

    def register_prometheus(self, registry: Any = None) -> Any:
        """Export these metrics at scrape time (default registry: prometheus_client's REGISTRY); returns the
        collector.  Every RemoteMetrics registered with one registry shares one collector, so the methods of
        a hybrid that all draft remotely make one family per metric, one label value per method."""
        from prometheus_client import REGISTRY

        reg = registry if registry is not None else REGISTRY
        with _COLLECTORS_LOCK:
            collector = _COLLECTORS.get(reg)
            if collector is None:
                collector = _COLLECTORS[reg] = _RemoteCollector()
                reg.register(collector)
        collector.add(self)
        return collector


class _RemoteCollector:
    """prometheus_client collector over every registered RemoteMetrics (held weakly: a closed engine's go)."""

    def __init__(self) -> None:
        self._metrics: weakref.WeakSet[RemoteMetrics] = weakref.WeakSet()

    def add(self, metrics: RemoteMetrics) -> None:
        self._metrics.add(metrics)

    def collect(self) -> Iterator[Any]:
        snaps = sorted((m.snapshot() for m in list(self._metrics)), key=lambda s: s["method"])
        return _families(snaps) if snaps else iter(())


_COLLECTORS: "weakref.WeakKeyDictionary[Any, _RemoteCollector]" = weakref.WeakKeyDictionary()
_COLLECTORS_LOCK = threading.Lock()


def _families(snaps: list[dict[str, Any]]) -> Iterator[Any]:
    """One family per metric, a sample per method (and worker / source / kind) across ``snaps``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    for name, doc in (("calls", "Draft calls sent to workers."),
                      ("steps", "Drafting steps with at least one remote sequence."),
                      ("bytes_sent", "Message bytes sent to workers."),
                      ("bytes_received", "Message bytes received from workers."),
                      ("draft_timeouts", "Sequence drafts lost to the deadline (the step went plain)."),
                      ("failovers", "Workers declared down after missed pings."),
                      ("rejoins", "Workers back after a failover."),
                      ("worker_restarts", "New worker incarnations seen (the worker's process restarted)."),
                      ("resyncs", "Sequence histories resent after a gap or a worker restart."),
                      ("worker_errors", "Draft calls that failed at the worker."),
                      ("connect_failures", "Failed attempts to reach the Ray cluster."),
                      ("incompatible_workers", "Workers whose drafter does not match the target's vocabulary.")):
        fam = CounterMetricFamily(f"hyspec_remote_{name}", doc, labels=["method"])
        for snap in snaps:
            fam.add_metric([snap["method"]], snap[name])
        yield fam
    fam = CounterMetricFamily("hyspec_remote_invalid_drafts", "Unusable drafts from workers, by problem.",
                              labels=["method", "kind"])
    for snap in snaps:
        for kind, n in sorted(snap["invalid_drafts"].items()):
            fam.add_metric([snap["method"], kind], n)
    yield fam
    fam = CounterMetricFamily("hyspec_remote_drafts", "Drafts served, by source.", labels=["method", "source"])
    for snap in snaps:
        for source, n in snap["drafts"].items():
            fam.add_metric([snap["method"], source], n)
    yield fam
    fam = HistogramMetricFamily("hyspec_remote_rtt_seconds", "Draft call round trip.", labels=["method"])
    for snap in snaps:
        rtt = snap["rtt_seconds"]
        fam.add_metric([snap["method"]], [("+Inf" if b == float("inf") else repr(b), n) for b, n in rtt["buckets"]],
                       rtt["sum"])
    yield fam
    for name, doc, value in (
            ("failover_seconds", "Last failover's detection time (last good ping to down).",
             lambda snap: snap["failover_seconds"][-1] if snap["failover_seconds"] else 0.0),
            ("health", "Remote drafting health score, 0..1 (the hybrid dispatcher's remote_health).",
             lambda snap: snap["health"]),
            ("target_busy", "Fraction of wall time the target spends in its own work.",
             lambda snap: snap["target_busy"])):
        fam = GaugeMetricFamily(f"hyspec_remote_{name}", doc, labels=["method"])
        for snap in snaps:
            fam.add_metric([snap["method"]], value(snap))
        yield fam
    for name, key, doc in (("worker_threads", "threads", "Threads the scheduler gives the worker."),
                           ("worker_cpu_utilisation", "cpu_util", "Worker CPU time per wall second per thread."),
                           ("worker_up", "up", "1 while the worker serves drafts."),
                           ("worker_missed_pings", "misses", "Pings the worker missed in a row (0 after a good one).")):
        fam = GaugeMetricFamily(f"hyspec_remote_{name}", doc, labels=["method", "worker"])
        for snap in snaps:
            for worker, w in sorted(snap["workers"].items()):
                if key in w:
                    fam.add_metric([snap["method"], worker], float(w[key]))
        yield fam
