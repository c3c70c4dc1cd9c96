"""The TTFT objective as a speculation switch: p99 over a sliding window, with hysteresis.

A speculative step is longer than a plain one, and a prompt waiting for its first token shares
that step (chunked prefill runs beside the decodes).  When the p99 time to first token of the
requests finished in the last ``slo.window_s`` seconds exceeds ``slo.ttft_p99_ms``, every step
decodes plainly (rejection cause ``ttft_slo``) until the p99 falls under ``resume_fraction`` of
the ceiling -- the same switch the hybrid's load fallback throws, driven by latency.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Callable

from hyspec.spec.ops_config import SLOConfig
from hyspec.spec.ops_metrics import OperatorMetrics

log = logging.getLogger(__name__)


class TTFTGuard:
    def __init__(self, config: SLOConfig, ops: OperatorMetrics, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.ops = ops
        self.clock = clock
        self.active = False  # True: speculation is off
        self._samples: deque[tuple[float, float]] = deque()  # (finished at, ttft seconds)

    @property
    def enabled(self) -> bool:
        return self.config.ttft_p99_ms is not None

    def observe(self, ttft_seconds: float | None) -> None:
        if self.enabled and ttft_seconds is not None:
            self._samples.append((self.clock(), ttft_seconds))

    def p99(self) -> float | None:
        """Nearest-rank p99 of the window's TTFTs, or None with fewer than ``min_samples``."""
        horizon = self.clock() - self.config.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
        n = len(self._samples)
        if n < self.config.min_samples:
            return None
        ordered = sorted(t for _, t in self._samples)
        return ordered[max(1, math.ceil(0.99 * n)) - 1]

    def speculation_off(self) -> bool:
        """Judge the window; True while the objective is breached (with hysteresis)."""
        if not self.enabled:
            return False
        p99 = self.p99()
        self.ops.set_ttft_p99(p99)
        ceiling = self.config.ttft_p99_ms / 1000.0
        if p99 is None:
            changed = self.active
            self.active = False  # too few requests to judge: nothing is breached
        elif self.active:
            changed = p99 < self.config.resume_fraction * ceiling
            self.active = not changed
        else:
            changed = p99 > ceiling
            self.active = changed
        if changed:
            log.warning("TTFT p99 %s: speculation %s", "n/a" if p99 is None else f"{p99 * 1000:.0f} ms",
                        f"off (objective {self.config.ttft_p99_ms:.0f} ms)" if self.active else "back on")
            self.ops.set_fallback("ttft_slo", self.active)
        return self.active
