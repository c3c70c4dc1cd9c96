"""Decision latency: a fixed ring of the most recent durations, read as percentiles.

Recording is one array store and an index bump (no allocation), so it can sit
on the dispatcher's hot path; sorting happens only when someone asks.
"""
from __future__ import annotations

import math
from array import array


class LatencyRing:
    """The last ``capacity`` durations in nanoseconds."""

    __slots__ = ("capacity", "_samples", "_next", "_count")

    def __init__(self, capacity: int = 4096):
        if capacity < 1:
            raise ValueError(f"latency ring capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._samples = array("q", bytes(8 * capacity))
        self._next = 0
        self._count = 0  # samples ever recorded (the ring holds min(count, capacity))

    def record(self, duration_ns: int) -> None:
        i = self._next
        self._samples[i] = duration_ns
        self._next = 0 if i + 1 == self.capacity else i + 1
        self._count += 1

    def __len__(self) -> int:
        return min(self._count, self.capacity)

    def percentile(self, q: float) -> int | None:
        """Nearest-rank ``q``-th percentile (0 < q <= 100) of the held samples; None when empty."""
        return self.percentiles(q)[0]

    def percentiles(self, *qs: float) -> tuple[int | None, ...]:
        for q in qs:
            if not 0.0 < q <= 100.0:
                raise ValueError(f"percentile must be in (0, 100], got {q}")
        n = len(self)
        if n == 0:
            return tuple(None for _ in qs)
        ordered = sorted(self._samples[:n])
        # nearest rank: the smallest sample with at least q% of the samples <= it
        return tuple(ordered[max(1, math.ceil(n * q / 100.0)) - 1] for q in qs)

    def clear(self) -> None:
        self._next = 0
        self._count = 0
