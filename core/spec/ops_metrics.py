"""What an operator watches besides acceptance: drafter residency and SLO fallbacks.

Held by :class:`~hyspec.spec.metrics.SpecMetrics` (``metrics.ops``) and exported with its collector:

- ``hyspec_spec_drafter_resident{method}`` 1 while the drafter's weights are loaded;
- ``hyspec_spec_drafter_transitions_total{method, transition}`` released / reloaded / reload_failed;
- ``hyspec_spec_fallback_active{reason}`` 1 while speculation is off for ``reason`` (ttft_slo);
- ``hyspec_spec_ttft_p99_seconds`` the TTFT p99 the SLO guard last judged (absent before it has one).

The KV pool's fragmentation figure is the engine's (``core/kv/fragmentation.py``, exported by the server).
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, Iterator

TRANSITIONS = ("released", "reloaded", "reload_failed")
FALLBACK_REASONS = ("ttft_slo", "memory_pressure")


class OperatorMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.resident: dict[str, bool] = {}
        self.transitions: dict[tuple[str, str], int] = defaultdict(int)
        self.fallback: dict[str, bool] = {}
        self.ttft_p99: float | None = None

    def register_drafter(self, method: str) -> None:
        """A releasable drafter, loaded: its series exist from the start (transitions at 0), as Prometheus
        counters should."""
        with self._lock:
            self.resident[method] = True
            for t in TRANSITIONS:
                self.transitions.setdefault((method, t), 0)

    def set_resident(self, method: str, resident: bool) -> None:
        with self._lock:
            self.resident[method] = resident

    def record_transition(self, method: str, transition: str) -> None:
        if transition not in TRANSITIONS:
            raise ValueError(f"unknown drafter transition {transition!r}; one of {TRANSITIONS}")
        with self._lock:
            self.transitions[(method, transition)] += 1

    def set_fallback(self, reason: str, active: bool) -> None:
        if reason not in FALLBACK_REASONS:
            raise ValueError(f"unknown fallback reason {reason!r}; one of {FALLBACK_REASONS}")
        with self._lock:
            self.fallback[reason] = active

    def set_ttft_p99(self, seconds: float | None) -> None:
        with self._lock:
            self.ttft_p99 = seconds

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"resident": dict(self.resident),
                    "transitions": {f"{m}:{t}": n for (m, t), n in sorted(self.transitions.items())},
                    "fallback": dict(self.fallback), "ttft_p99_seconds": self.ttft_p99}

    def families(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            resident = dict(self.resident)
            transitions = dict(self.transitions)
            fallback = dict(self.fallback)
            ttft = self.ttft_p99
        fam = GaugeMetricFamily("hyspec_spec_drafter_resident", "1 while the drafter's weights are loaded.",
                                labels=["method"])
        for method, on in sorted(resident.items()):
            fam.add_metric([method], 1.0 if on else 0.0)
        yield fam
        fam = CounterMetricFamily("hyspec_spec_drafter_transitions",
                                  "Drafters released under memory pressure, reloaded, or failing to reload.",
                                  labels=["method", "transition"])
        for (method, transition), n in sorted(transitions.items()):
            fam.add_metric([method, transition], n)
        yield fam
        fam = GaugeMetricFamily("hyspec_spec_fallback_active", "1 while speculation is off for this reason.",
                                labels=["reason"])
        for reason in FALLBACK_REASONS:
            fam.add_metric([reason], 1.0 if fallback.get(reason) else 0.0)
        yield fam
        if ttft is not None:
            yield GaugeMetricFamily("hyspec_spec_ttft_p99_seconds",
                                    "TTFT p99 over the SLO window, as the guard last judged it.", value=ttft)
